"""Bench-only probes of a fleet's processes, loaded at interpreter start-up.

    BENCH_STATS_DIR=/tmp/x PYTHONPATH=bench/probes:. python -m ductwork.cli start ...

``bench.harness.ProcessFleet`` puts this directory first on the ``PYTHONPATH`` of every
fleet it starts (the supervisor's children inherit it); nothing else does, and nothing
in ``ductwork/`` knows of it. With ``BENCH_STATS_DIR`` set, each process counts the SQL
statements its SQLAlchemy engines send (one per ``before_cursor_execute``: an
``executemany`` counts once) and rewrites ``<dir>/<pid>.count`` with the running total
every 50 ms when it changed, and at exit, so the bench can read a fleet's total at any moment (at most
50 ms stale: the bench waits that long before its readings). With ``BENCH_PATCHES`` set,
it also applies ``bench/experiments/sitecustomize.py``'s patches (fleet experiments).
"""

import os

_stats_dir = os.environ.get("BENCH_STATS_DIR")
if _stats_dir:
    import atexit
    import threading

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    _lock = threading.Lock()
    _count = [0]

    @event.listens_for(Engine, "before_cursor_execute")
    def _counted(*_args, **_kwargs):
        with _lock:
            _count[0] += 1

    _path = os.path.join(_stats_dir, f"{os.getpid()}.count")

    def _write():
        tmp = _path + ".tmp"
        with open(tmp, "w") as out:
            out.write(str(_count[0]))
        os.replace(tmp, _path)

    def _writer():
        stop, written = threading.Event(), None
        while not stop.wait(0.05):
            if _count[0] != written:  # an idle process writes nothing
                written = _count[0]
                try:
                    _write()
                except OSError:
                    return

    threading.Thread(target=_writer, name="bench-statement-count", daemon=True).start()
    atexit.register(_write)

if os.environ.get("BENCH_PATCHES", "").strip():
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "experiments", "sitecustomize.py"))
