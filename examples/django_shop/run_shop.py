"""A Django shop whose orders start their pipeline together with the order.

    python examples/django_shop/run_shop.py [--database-url URL]

What it shows (the code is in ``shop/orders.py``; the project is an ordinary Django
project: ``manage.py``, ``shopsite/settings.py``, the app ``shop``):

- **Way 1, on commit.** ``POST /orders/on-commit`` creates the order in
  ``transaction.atomic()`` and triggers ``FulfilOrder`` from ``transaction.on_commit`` with
  the key ``order-<id>``. A second trigger with the key returns the same run.
- **The sweep.** A crash between the commit and the trigger loses the trigger: the order
  has no run. ``manage.py trigger_missing_runs`` triggers, by key, every order with no run
  recorded. Here one order lost its trigger, and one was triggered but its run's id was
  never recorded: the sweep starts a run for the first and gets the existing run back for
  the second. A second sweep finds nothing to do.
- **Way 2, atomic.** ``POST /orders/atomic`` triggers through a SQLAlchemy ``Connection``
  on Django's own DBAPI connection, inside the same ``transaction.atomic()``. Before the
  commit, ductwork's other connections do not see the run; after it, they do. An atomic
  block that raises leaves neither the order nor the run.

Django and ductwork share one database: a fresh SQLite file unless ``--database-url``
names another (PostgreSQL, or MySQL/MariaDB through PyMySQL standing in for mysqlclient).
Both migrate it (``manage.py migrate`` and ductwork's migrations); the runs are worked
in this process (``ductwork.testing.drain``). Exits 0 when every check holds, else 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a database the example may use alone (default: a fresh SQLite file)")
    args = parser.parse_args(argv)
    url = args.database_url or f"sqlite:///{Path(tempfile.mkdtemp()) / 'shop.sqlite3'}"

    sys.path.insert(0, str(HERE))  # manage.py's directory: shopsite and shop import from it
    os.environ["SHOP_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "shopsite.settings"
    import django

    django.setup()  # shop.apps connects ductwork to the same URL

    from django.apps import apps
    from django.core.management import call_command
    from django.db import transaction
    from django.test import Client
    from ductwork_django import ductwork_connection
    from shop.models import Order
    from shop.pipelines import FulfilOrder

    import ductwork
    from ductwork.db import migrate
    from ductwork.testing import drain

    app: ductwork.App = apps.get_app_config("shop").ductwork_app
    call_command("migrate", verbosity=0)
    migrate.upgrade(app.engine)
    client = Client()
    failures: list[str] = []

    def check(ok: bool, message: str) -> None:
        print(("" if ok else "FAILED: ") + message)
        if not ok:
            failures.append(message)

    def run_exists(run_id: str) -> bool:
        try:
            ductwork.Run(app, run_id)  # read through ductwork's own connection
        except ductwork.UnknownRunError:
            return False
        return True

    # Way 1: on commit.
    placed = client.post("/orders/on-commit", {"item": "kettle"}).json()
    order = Order.objects.get(pk=placed["order"])
    again = FulfilOrder.trigger(order.pk, key=order.trigger_key)
    check(order.run_id == placed["run"] and again.id == order.run_id,
          f"on commit: order {order.pk} has run {order.run_id}; a second trigger returned the same run")

    # The sweep: one order lost its trigger, one lost the record of its run.
    with transaction.atomic():
        lost = Order.objects.create(item="teapot")  # the process died after this commit
    unrecorded = Order.objects.create(item="toaster")
    earlier = FulfilOrder.trigger(unrecorded.pk, key=unrecorded.trigger_key)  # died before recording it
    out = _command(call_command, "trigger_missing_runs")
    lost.refresh_from_db()
    unrecorded.refresh_from_db()
    check(f"[{lost.pk}, {unrecorded.pk}]" in out and lost.run_id is not None and unrecorded.run_id == earlier.id,
          f"sweep: {out.strip()}; order {unrecorded.pk} got its existing run back")
    out = _command(call_command, "trigger_missing_runs")
    check("triggered runs for 0 orders" in out, f"second sweep: {out.strip()}")

    # Way 2: atomic, committed. Invisible to ductwork's own connections until the commit.
    with transaction.atomic():
        committed = Order.objects.create(item="mug")
        with ductwork_connection() as conn:
            run = FulfilOrder.trigger(committed.pk, key=committed.trigger_key, connection=conn)
        committed.run_id = run.id
        committed.save(update_fields=["run_id"])
        check(not run_exists(run.id), f"atomic: run {run.id} is not visible before the commit")
    check(run_exists(run.id) and Order.objects.get(pk=committed.pk).run_id == run.id,
          f"atomic: after the commit, order {committed.pk} and its run {run.id} both exist")

    # Way 2: atomic, rolled back. Neither the order nor the run is left.
    try:
        with transaction.atomic():
            doomed = Order.objects.create(item="vase")
            with ductwork_connection() as conn:
                doomed_run = FulfilOrder.trigger(doomed.pk, key=doomed.trigger_key, connection=conn)
            raise RuntimeError("payment provider said no")
    except RuntimeError:
        pass
    check(not Order.objects.filter(pk=doomed.pk).exists() and not run_exists(doomed_run.id),
          f"atomic rollback: neither order {doomed.pk} nor run {doomed_run.id} exists")

    # Way 2 through the view.
    placed = client.post("/orders/atomic", {"item": "spoon"}).json()
    check(run_exists(placed["run"]), f"POST /orders/atomic: order {placed['order']}, run {placed['run']}")

    drain(app)
    statuses = {o.pk: ductwork.Run(app, o.run_id).status for o in Order.objects.order_by("pk")}
    check(set(statuses.values()) == {"completed"} and len(statuses) == 5, f"runs: {statuses}")
    app.dispose()
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("ok: every order has exactly one run, and a rolled-back order has none")
    return 0


def _command(call_command: Any, name: str) -> str:
    import io

    out = io.StringIO()
    call_command(name, stdout=out)
    return out.getvalue()


if __name__ == "__main__":
    raise SystemExit(main())
