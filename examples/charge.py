"""An idempotent charge: a step that runs twice charges the card once.

    python examples/charge.py [--database-url URL] [--orders N]

What it shows:

- ``ChargeCard`` calls a fake payment API with ``idempotency_key=self.idempotency_key``.
  The API keeps its charges in a table keyed by that key, as real payment APIs do:
  a request with a key it has already seen returns the first charge and creates
  nothing.
- The API carries out each order's first request and then loses the response (it raises
  ``TimeoutError`` after committing the charge, like a network timeout). ductwork
  records a failure and runs the step again. The second execution has the same
  idempotency key, so the API returns the existing charge.
- ``NaiveChargeCard`` does the same with a new key on every attempt. Its retry charges
  the card a second time. It is here to show what the key prevents.
- One side effect per step: the receipt is sent by ``SendReceipt``, a second step
  chained after the charge, with its own key. A retry of the charge therefore never
  sends a second receipt.

The fake API keeps its data in its own SQLite file, apart from ductwork's database,
because it stands for a system outside ductwork's transactions. Everything runs in
this process (``ductwork.testing.drain``), on a fresh SQLite file unless
``--database-url`` names another database. Exits 0 when every order has one
charge and one receipt although each ``ChargeCard`` ran twice, and when the naive
step did charge twice. Otherwise it exits 1 and says what went wrong.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import uuid
from contextlib import closing
from pathlib import Path

import ductwork
from ductwork import Pipeline, Step
from ductwork.db import migrate
from ductwork.errors import DrainTimeout
from ductwork.testing import drain

CONFIG = {"default": {"job_worker": {"retry_delay": 0.1}}}


def _sqlite(path: Path) -> closing[sqlite3.Connection]:
    """A connection to one of the fake services' files, closed on leaving the ``with``."""
    return closing(sqlite3.connect(path, timeout=30, isolation_level=None))


class FakePaymentAPI:
    """A payment API that honours idempotency keys, in a SQLite file of its own.

    ``charges`` is keyed by idempotency key. ``requests`` logs every call. The first
    request for each order is carried out and then answered with ``TimeoutError``, as
    if the response were lost on the way back.
    """

    def __init__(self, path: Path):
        self.path = path
        with _sqlite(self.path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS charges (idempotency_key TEXT PRIMARY KEY, "
                       "charge_id TEXT NOT NULL, order_id INTEGER NOT NULL, amount_cents INTEGER NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS requests (idempotency_key TEXT NOT NULL, "
                       "order_id INTEGER NOT NULL)")

    def charge(self, order_id: int, amount_cents: int, idempotency_key: str) -> dict:
        with _sqlite(self.path) as db:
            db.execute("BEGIN IMMEDIATE")
            first = db.execute("SELECT count(*) FROM requests WHERE order_id = ?", (order_id,)).fetchone()[0] == 0
            db.execute("INSERT INTO requests VALUES (?, ?)", (idempotency_key, order_id))
            row = db.execute("SELECT charge_id FROM charges WHERE idempotency_key = ?",
                             (idempotency_key,)).fetchone()
            if row is not None:
                db.execute("COMMIT")
                print(f"  payments: key …{idempotency_key[-8:]} seen before: returning charge {row[0]}")
                return {"id": row[0], "order": order_id}
            charge_id = f"ch_{uuid.uuid4().hex[:8]}"
            db.execute("INSERT INTO charges VALUES (?, ?, ?, ?)",
                       (idempotency_key, charge_id, order_id, amount_cents))
            db.execute("COMMIT")
        print(f"  payments: key …{idempotency_key[-8:]} new: charged order {order_id} as {charge_id}"
              + ("; the response is lost" if first else ""))
        if first:
            raise TimeoutError(f"no response from the payment API for order {order_id}")
        return {"id": charge_id, "order": order_id}

    def charges_for(self, order_id: int) -> list[str]:
        with _sqlite(self.path) as db:
            return [r[0] for r in db.execute("SELECT charge_id FROM charges WHERE order_id = ?", (order_id,))]

    def requests_for(self, order_id: int) -> int:
        with _sqlite(self.path) as db:
            return db.execute("SELECT count(*) FROM requests WHERE order_id = ?", (order_id,)).fetchone()[0]


class FakeMailbox:
    """Sent mail keyed by message id: sending a message id twice delivers it once."""

    def __init__(self, path: Path):
        self.path = path
        with _sqlite(self.path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS sent (message_id TEXT PRIMARY KEY, order_id INTEGER)")

    def send(self, message_id: str, order_id: int) -> None:
        with _sqlite(self.path) as db:
            db.execute("INSERT OR IGNORE INTO sent VALUES (?, ?)", (message_id, order_id))

    def sent_for(self, order_id: int) -> int:
        with _sqlite(self.path) as db:
            return db.execute("SELECT count(*) FROM sent WHERE order_id = ?", (order_id,)).fetchone()[0]


#: set by main(); the steps reach the outside world through these
payments: FakePaymentAPI
mailbox: FakeMailbox


class ChargeCard(Step):
    """One side effect: the charge. Safe to repeat because the key is the step's own."""

    def __init__(self, order_id: int, amount_cents: int):
        self.order_id, self.amount_cents = order_id, amount_cents

    def execute(self):
        charge = payments.charge(self.order_id, self.amount_cents, idempotency_key=self.idempotency_key)
        return {"order_id": self.order_id, "charge_id": charge["id"]}


class NaiveChargeCard(ChargeCard):
    """The same call with a fresh key per attempt: a retry is a new charge."""

    def execute(self):
        charge = payments.charge(self.order_id, self.amount_cents, idempotency_key=str(uuid.uuid4()))
        return {"order_id": self.order_id, "charge_id": charge["id"]}


class SendReceipt(Step):
    """One side effect: the receipt, keyed by this step's idempotency key."""

    def __init__(self, charge: dict):
        self.charge = charge

    def execute(self):
        mailbox.send(message_id=self.idempotency_key, order_id=self.charge["order_id"])
        return f"receipt for {self.charge['charge_id']}"


class ChargeOrder(Pipeline):
    @classmethod
    def define(cls, pipeline):
        pipeline.start(ChargeCard).chain(to=SendReceipt)


class NaiveChargeOrder(Pipeline):
    @classmethod
    def define(cls, pipeline):
        pipeline.start(NaiveChargeCard).chain(to=SendReceipt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a database the example may use alone (default: a fresh SQLite file)")
    parser.add_argument("--orders", type=int, default=3, help="orders to charge (default 3)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ductwork-charge-") as workdir:
        return demonstrate(Path(workdir), args.database_url, args.orders)


def demonstrate(workdir: Path, url: str | None, count: int) -> int:
    global payments, mailbox
    payments, mailbox = FakePaymentAPI(workdir / "payments.sqlite3"), FakeMailbox(workdir / "mail.sqlite3")
    app = ductwork.connect(url or f"sqlite:///{workdir / 'ductwork.sqlite3'}", CONFIG)
    migrate.upgrade(app.engine)
    print(f"ductwork on {app.engine.url.render_as_string(hide_password=True)}; "
          "the first charge request of every order loses its response\n")

    orders = {order_id: 1000 + 250 * order_id for order_id in range(1, count + 1)}
    runs = {order_id: ChargeOrder.trigger(order_id, cents) for order_id, cents in orders.items()}
    naive_order = count + 1
    naive = NaiveChargeOrder.trigger(naive_order, 999)
    try:
        drain(app, timeout=120)
    except DrainTimeout as error:
        print(f"FAILED: {error}", file=sys.stderr)
        return 1

    problems = []
    print()
    for order_id, run in runs.items():
        charges, requests = payments.charges_for(order_id), payments.requests_for(order_id)
        receipts = mailbox.sent_for(order_id)
        print(f"order {order_id}: run {run.refresh().status}, {requests} charge requests, "
              f"{len(charges)} charge {charges}, {receipts} receipt")
        if run.status != "completed" or len(charges) != 1 or receipts != 1:
            problems.append(f"order {order_id}: {run.status}, {len(charges)} charges, {receipts} receipts")
        if requests < 2:
            problems.append(f"order {order_id}: the charge step ran {requests} time(s); no retry was shown")
    naive_charges = payments.charges_for(naive_order)
    print(f"naive order {naive_order}: run {naive.refresh().status}, {len(naive_charges)} charges "
          f"{naive_charges} (a new key per attempt)")
    if len(naive_charges) < 2:
        problems.append(f"naive order {naive_order}: {len(naive_charges)} charge(s); expected a double charge")
    app.dispose()

    if problems:
        print("\nFAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(f"\nok: {len(runs)} orders, each charged once and sent one receipt, although every charge step ran twice")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
