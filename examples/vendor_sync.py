"""A vendor sync under one shared limit: a concurrency cap and two rate entries, two pipelines.

    python examples/vendor_sync.py [--database-url URL] [--orders N] [--pages N]

The vendor allows 3 concurrent requests, 10 per second with no bursts, and 20 per
5 seconds with up to 4 at once. ``ductwork.yml`` would say::

    job_worker:
      limits:
        vendor_api:
          concurrency: 3
          rate:
            - {limit: 10, per: 1s, burst: 1}
            - {limit: 20, per: 5s, burst: 4}

Neither rate entry makes the other redundant (the first is faster, the second
allows a larger burst), so both are kept and a request starts only when both have
a token. Two pipelines call the vendor: ``RefreshCatalog`` fetches catalog pages
(slow requests, 1.2 s each) and ``SyncOrders`` pushes orders (0.2 s each). Both
declare ``limit_by="vendor_api"`` and draw on the same pool.

What to look for in the start times: the pipeline whose pages are created first
takes the slots first. When the slow catalog pages hold all three slots, the 5 s
bucket banks tokens meanwhile, so once slots free the pushes go out 0.1 s apart
(the pace of the 1 s entry, burst 1), and afterwards 0.25 s apart (the pace of the
5 s entry). Which pipeline goes first varies from run to run.

Five worker threads and one advancer thread run in this process, threads of
``ductwork.fleet.supervisor.Loop`` as in ``ductwork start``. The example prints every
request as it starts, with the number in flight. Then it reads the claim and
completion times of the key's executions from ductwork's tables, the same history
the chaos checkers read, and checks three things on the database clock: at most 3
in flight at any moment, and, for each rate entry, no stretch of claims longer
than burst + limit × duration / per. Exits 0 when every limit held and both runs
completed, 1 otherwise. Runs on a fresh SQLite file unless ``--database-url``
names another database; use one the example can have to itself.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import sqlalchemy as sa

import ductwork
from ductwork import Pipeline, Step
from ductwork.db import migrate, schema
from ductwork.db.clock import to_us
from ductwork.fleet.supervisor import Loop
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer

LIMIT = {"concurrency": 3, "rate": [{"limit": 10, "per": "1s", "burst": 1},
                                    {"limit": 20, "per": "5s", "burst": 4}]}
CONFIG = {"default": {"job_worker": {"limits": {"vendor_api": LIMIT}}}}
THREADS = 5

_lock = threading.Lock()
_in_flight = 0
_highest = 0
_t0 = time.monotonic()


def vendor_call(what: str, seconds: float) -> None:
    """The pretend vendor request: counts what is in flight in this process and prints the start."""
    global _in_flight, _highest
    with _lock:
        _in_flight += 1
        _highest = max(_highest, _in_flight)
        print(f"[{time.monotonic() - _t0:5.2f}s] start {what:<18} vendor_api in flight {_in_flight}/3", flush=True)
    try:
        time.sleep(seconds)
    finally:
        with _lock:
            _in_flight -= 1


class ListCatalogPages(Step):
    def __init__(self, pages):
        self.pages = pages

    def execute(self):
        return list(range(1, self.pages + 1))


class FetchCatalogPage(Step):
    def __init__(self, page):
        self.page = page

    def execute(self):
        vendor_call(f"catalog page {self.page}", 1.2)
        return {"page": self.page, "products": 50}


class StoreCatalog(Step):
    def __init__(self, pages):
        self.pages = pages

    def execute(self):
        return sum(page["products"] for page in self.pages)


class FetchPendingOrders(Step):
    def __init__(self, count):
        self.count = count

    def execute(self):
        return list(range(1, self.count + 1))


class PushOrderToVendor(Step):
    def __init__(self, order_id):
        self.order_id = order_id

    def execute(self):
        vendor_call(f"push order {self.order_id}", 0.2)
        return {"order": self.order_id, "vendor_ref": f"V-{self.order_id:04d}"}


class RecordSyncResults(Step):
    def __init__(self, results):
        self.results = results

    def execute(self):
        return len(self.results)


class RefreshCatalog(Pipeline):
    @classmethod
    def define(cls, pipeline):
        (pipeline.start(ListCatalogPages)
                 .expand(to=FetchCatalogPage, limit_by="vendor_api")
                 .collapse(into=StoreCatalog))


class SyncOrders(Pipeline):
    @classmethod
    def define(cls, pipeline):
        (pipeline.start(FetchPendingOrders)
                 .expand(to=PushOrderToVendor, limit_by="vendor_api")
                 .collapse(into=RecordSyncResults))


def key_history(app: ductwork.App, key: str) -> list[tuple[int, int]]:
    """(claimed, completed) database times in µs of every execution of ``key``, by claim time."""
    e = schema.executions
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(e.c.claimed_at, e.c.completed_at)
                            .where(e.c.limit_key == key, e.c.claimed_at.is_not(None))
                            .order_by(e.c.claimed_at)).all()
    return [(to_us(claimed), to_us(completed)) for claimed, completed in rows]


def most_in_flight(history: list[tuple[int, int]]) -> int:
    """The most executions claimed and not completed at one moment (a completion frees first)."""
    events = sorted([(done, -1) for _, done in history] + [(claimed, 1) for claimed, _ in history])
    highest = current = 0
    for _, change in events:
        current += change
        highest = max(highest, current)
    return highest


def rate_violations(claims: list[int], limit: int, per_s: int, burst: int) -> list[str]:
    """Stretches of claims i..j with more than burst + limit × (t_j − t_i) / per claims (exact)."""
    out = []
    for i in range(len(claims)):
        for j in range(i, len(claims)):
            count, span_us = j - i + 1, claims[j] - claims[i]
            if (count - burst) * per_s * 1_000_000 > limit * span_us:
                out.append(f"{count} claims within {span_us / 1e6:.3f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a database the example may use alone (default: a fresh SQLite file)")
    parser.add_argument("--orders", type=int, default=8, help="orders to push (default 8)")
    parser.add_argument("--pages", type=int, default=4, help="catalog pages to fetch (default 4)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ductwork-vendor-sync-") as workdir:
        return demonstrate(args.database_url or f"sqlite:///{Path(workdir) / 'ductwork.sqlite3'}",
                           args.orders, args.pages)


def demonstrate(url: str, orders: int, pages: int) -> int:
    global _t0
    app = ductwork.connect(url, CONFIG)
    migrate.upgrade(app.engine)
    print(f"ductwork on {app.engine.url.render_as_string(hide_password=True)}, {THREADS} worker threads")
    print("vendor_api: concurrency 3; rate 10 per 1s (burst 1) and 20 per 5s (burst 4)\n")
    since = app.now()
    _t0 = time.monotonic()
    runs = [RefreshCatalog.trigger(pages), SyncOrders.trigger(orders)]
    stop = threading.Event()

    def worker_loop(name: str, worker: Worker) -> Loop:
        return Loop(name, lambda: worker.run_once() is not None, 0.2, stop, app.wakeup, lambda: worker.next_due_s)

    loops = [worker_loop(f"worker-{i}", Worker(app)) for i in range(THREADS)]
    advancer = Advancer(app)
    loops.append(Loop("advancer", lambda: advancer.run_once() != "idle", 0.2, stop, app.wakeup))
    for loop in loops:
        loop.start()
    deadline = time.monotonic() + 120
    while any(run.refresh().status == "in_progress" for run in runs) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    app.wakeup.notify()
    for loop in loops:
        loop.join(10)

    history = [(claimed, done) for claimed, done in key_history(app, "vendor_api") if claimed >= to_us(since)]
    claims = [claimed for claimed, _ in history]
    problems = [f"{run.pipeline} is {run.status}" for run in runs if run.status != "completed"]
    span = (claims[-1] - claims[0]) / 1e6 if len(claims) > 1 else 0.0
    print("\nruns: " + ", ".join(f"{run.pipeline.split(':')[-1]} {run.status}" for run in runs))
    print(f"requests: {len(claims)}, claimed over {span:.2f} s of database time")
    entry = app.config.limits["vendor_api"]
    assert entry.concurrency is not None  # configured above
    in_flight = most_in_flight(history)
    print(f"highest in flight: {in_flight} by the database's claim history, {_highest} seen by the steps "
          f"(limit {entry.concurrency})")
    if in_flight > entry.concurrency or _highest > entry.concurrency:
        problems.append(f"concurrency exceeded: {max(in_flight, _highest)} in flight")
    for rate in entry.rates:  # the entries ductwork kept after dropping dominated ones: both
        bad = rate_violations(claims, rate.limit, rate.per_s, rate.burst)
        print(f"rate {rate.limit} per {rate.per_s}s, burst {rate.burst}: "
              + ("every stretch of claims fits burst + limit × duration / per" if not bad else bad[0]))
        if bad:
            problems.append(f"rate {rate.limit} per {rate.per_s}s exceeded: {bad[0]}")
    app.dispose()
    if len(claims) != orders + pages:
        problems.append(f"expected {orders + pages} claims of vendor_api, found {len(claims)}")
    if problems:
        print("\nFAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("\nok: every limit held")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
