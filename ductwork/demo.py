"""``ductwork demo``: a pipeline with an exact shared limit, on an embedded SQLite file.

    $ ductwork demo --orders 12

Syncs orders to a pretend vendor whose API allows 2 concurrent connections and
5 requests per second. ``FetchPendingOrders`` returns order ids, each order is
pushed by its own ``PushOrderToVendor`` step (``limit_by="vendor_api"``), and
``RecordSyncResults`` receives every result, in order. ``RefreshVendorCatalog``,
another pipeline, draws from the same ``vendor_api`` pool. The first push of
order 3 fails once, on purpose, and is retried with the same idempotency key: the
demo says so before it starts, and prints one line when it happens; the warning
with its traceback goes to the log, ``ductwork-demo.log`` in the current directory
(every warning the fleet logs goes there, each also summed up in one console line).
Four worker threads and one advancer thread run in this process; every push prints
the in-flight count it observed, which never exceeds 2.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ductwork import logs
from ductwork.pipelines.definition import PipelineBuilder
from ductwork.pipelines.pipeline import Pipeline
from ductwork.pipelines.step import Step

if TYPE_CHECKING:
    from ductwork.fleet.worker import Worker

CONFIG = {
    "default": {
        "job_worker": {
            "retry_delay": 0.2,
            "limits": {"vendor_api": {"concurrency": 2, "rate": {"limit": 5, "per": "1s"}}},
        },
    }
}

_lock = threading.Lock()
_output_lock = threading.Lock()
_in_flight = 0
_max_in_flight = 0
_started = time.monotonic()
_pushes: list[float] = []

#: where the demo's log goes (in the current directory), replaced at each demo
LOG_FILE = "ductwork-demo.log"
#: the error of order 3's first push, the demo's one deliberate failure
PLANNED_FAILURE = "vendor timed out (first attempt of order 3)"


def _write(text: str) -> None:
    """``text`` and its newline written whole, under the one console lock: steps of several
    worker threads say things while the main thread reports, and ``print`` writes a line
    and its newline separately (a main-thread line and a step's line ran together)."""
    with _output_lock:
        sys.stdout.write(f"{text}\n")
        sys.stdout.flush()


def _say(text: str) -> None:
    """One timestamped line from a step or the log summary."""
    _write(f"[{time.monotonic() - _started:6.2f}s] {text}")


class FetchPendingOrders(Step):
    def __init__(self, count: int) -> None:
        self.count = count

    def execute(self) -> list[int]:
        _say(f"fetched {self.count} pending orders")
        return list(range(1, self.count + 1))


class PushOrderToVendor(Step):
    def __init__(self, order_id: int) -> None:
        self.order_id = order_id

    def execute(self) -> dict[str, Any]:
        global _in_flight, _max_in_flight
        with _lock:
            _in_flight += 1
            _max_in_flight = max(_max_in_flight, _in_flight)
            seen = _in_flight
            _pushes.append(time.monotonic())
        try:
            _say(f"push order {self.order_id:>3}  vendor_api in flight {seen}/2  "
                 f"idempotency_key …{self.idempotency_key[-12:]}")
            time.sleep(0.3)  # the vendor call
            if self.order_id == 3 and self.context.get("order-3-failed-once") is None:
                self.context.set("order-3-failed-once", True)
                raise ConnectionError(PLANNED_FAILURE)
            return {"order": self.order_id, "vendor_ref": f"V-{self.order_id:04d}"}
        finally:
            with _lock:
                _in_flight -= 1


class RecordSyncResults(Step):
    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.results = results

    def execute(self) -> int:
        _say(f"recorded {len(self.results)} results: {[r['vendor_ref'] for r in self.results][:4]} …")
        return len(self.results)


class RefreshVendorCatalog(Step):
    def __init__(self, _: object) -> None:
        pass

    def execute(self) -> str:
        _say("refresh vendor catalog (shares the vendor_api pool)")
        return "ok"


class SyncOrders(Pipeline):
    @classmethod
    def define(cls, pipeline: PipelineBuilder) -> None:
        (pipeline.start(FetchPendingOrders)
         .expand(to=PushOrderToVendor, limit_by="vendor_api")
         .collapse(into=RecordSyncResults))


class RefreshCatalog(Pipeline):
    @classmethod
    def define(cls, pipeline: PipelineBuilder) -> None:
        pipeline.start(RefreshVendorCatalog, limit_by="vendor_api")


class _Summary(logging.Handler):
    """Each warning logged while the demo runs, as one console line (its traceback is in the log file):
    the planned failure labelled as planned, any other in full, never hidden."""

    def __init__(self, log_path: Path) -> None:
        super().__init__(logging.WARNING)
        self.log_path = log_path

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if getattr(record, "outcome", None) == "failure" and PLANNED_FAILURE in message:
            then = "it will be retried" if getattr(record, "next", None) == "retry" else "it will not be retried"
            _say(f"order 3: first attempt failed as planned, ConnectionError: {PLANNED_FAILURE}; {then} "
                 f"(traceback in the log)")
        else:
            _say(f"{record.levelname}: {message} (traceback, if any, in {self.log_path})")


def _worked(worker: Worker) -> bool:
    return worker.run_once() is not None


def _stop(stop: threading.Event, loops: list[Any]) -> None:
    stop.set()
    for loop in loops:
        loop.join(5)


def main(database_url: str | None = None, orders: int = 12, timeout: float = 120.0,
         log_level: str = "WARNING", log_format: str = "text") -> int:
    """Run the demo; the process's log goes to :data:`LOG_FILE` (at ``log_level``, in
    ``log_format``) while it runs, and each warning is summed up on the console."""
    log_path = Path(LOG_FILE).resolve()
    with log_path.open("w", encoding="utf-8") as log_file:
        restore = logs.configure(log_level, log_format, log_file)
        summary = _Summary(log_path)
        logging.getLogger().addHandler(summary)
        try:
            return _demo(database_url, orders, timeout, log_path)
        finally:
            logging.getLogger().removeHandler(summary)
            restore()


def _demo(database_url: str | None, orders: int, timeout: float, log_path: Path) -> int:
    from ductwork.app import connect
    from ductwork.db import migrate
    from ductwork.fleet.supervisor import Loop
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer

    if database_url is None:
        path = Path("ductwork-demo.sqlite3").resolve()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        database_url = f"sqlite:///{path}"
    app = connect(database_url, CONFIG)
    migrate.upgrade(app.engine)
    _write(f"ductwork demo on {app.engine.url.render_as_string(hide_password=True)}")
    _write("limit vendor_api: concurrency 2, rate 5 per 1s (burst 5); 4 worker threads, 1 advancer")
    _write(f"log: {log_path} (warnings with their tracebacks)")
    _write("order 3's first push fails on purpose (a pretend vendor timeout), to show a retry that keeps "
          "its idempotency key\n")
    sync = SyncOrders.trigger(orders)
    refresh = RefreshCatalog.trigger(None)
    stop = threading.Event()
    workers = [Worker(app) for _ in range(4)]
    loops = [Loop(f"worker-{i}", functools.partial(_worked, w), 0.5, stop, app.wakeup)
             for i, w in enumerate(workers)]
    advancer = Advancer(app)
    loops.append(Loop("advancer", lambda: advancer.run_once() != "idle", 0.5, stop, app.advancer_wakeup))
    for loop in loops:
        loop.start()
    deadline = time.monotonic() + timeout
    while sync.refresh().status == "in_progress" or refresh.refresh().status == "in_progress":
        if time.monotonic() > deadline:
            _write(f"demo: runs did not finish within {timeout:g} s (--timeout)")
            _stop(stop, loops)
            app.dispose()
            return 1
        time.sleep(0.05)
    _stop(stop, loops)
    span = (_pushes[-1] - _pushes[0]) if len(_pushes) > 1 else 0.0
    _write(f"\nSyncOrders run {sync.id}: {sync.status}; RefreshCatalog: {refresh.status}")
    _write(f"pushes: {len(_pushes)} (one retry), highest in flight {_max_in_flight} (limit 2), "
          f"{len(_pushes)} starts in {span:.2f}s (rate limit 5/s, burst 5)")
    _write(f"result recorded: {sync.steps()[-1].output} orders")
    app.dispose()
    return 0 if sync.status == "completed" and _max_in_flight <= 2 else 1


if __name__ == "__main__":
    raise SystemExit(main(os.environ.get("DUCTWORK_DATABASE_URL")))  # pragma: no cover  `ductwork demo` runs main()
