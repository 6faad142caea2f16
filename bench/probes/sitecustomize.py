"""Bench-only probes of a fleet's processes, loaded at interpreter start-up.

    BENCH_STATS_DIR=/tmp/x PYTHONPATH=bench/probes:. python -m ductwork.cli start ...

With ``BENCH_STATEMENT_KINDS`` set too, each process also rewrites ``<dir>/<pid>.kinds``
with one line per kind of statement it sent (``count<TAB>its first 70 characters``):
``python -m bench.profile_keyed`` reports them per step.

``bench.harness.ProcessFleet`` puts this directory first on the ``PYTHONPATH`` of every
fleet it starts (the supervisor's children inherit it); nothing else does, and nothing
in ``ductwork/`` knows of it. With ``BENCH_STATS_DIR`` set, each process counts the SQL
statements its SQLAlchemy engines send (one per ``before_cursor_execute``: an
``executemany`` counts once) and rewrites ``<dir>/<pid>.count`` with the running total
every 50 ms when it changed, and at exit, so the bench can read a fleet's total at any moment (at most
50 ms stale: the bench waits that long before its readings). With ``BENCH_PATCHES`` set,
it also applies ``bench/experiments/sitecustomize.py``'s patches (fleet experiments).

With ``BENCH_LOCK_STATS`` set too, each process also measures its key-lock holds (PostgreSQL
and MariaDB: from the statement that locks a ``ductwork_limit_keys`` row ``FOR UPDATE`` to the
end of its transaction) and rewrites ``<dir>/<pid>.locks`` with ``holds wait_s hold_s
statements`` and then one line per kind of statement sent under holds (``count<TAB>its
first 70 characters``) (totals: the lock statement's own time, which is mostly the wait for another
holder; the time from its return to the commit or rollback's end; statements sent under
the hold): ``python -m bench.profile_keyed`` reports them per hold.
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

if _stats_dir:
    def _rewrite_every(interval, write, name):
        """Run ``write`` every ``interval`` seconds on a daemon thread (until it fails: the
        directory is gone), and once more at exit."""
        def loop():
            stop = threading.Event()
            while not stop.wait(interval):
                try:
                    write()
                except OSError:
                    return

        threading.Thread(target=loop, name=name, daemon=True).start()
        atexit.register(write)

if _stats_dir and os.environ.get("BENCH_STATEMENT_KINDS"):
    import collections as _kc

    _all_kinds: _kc.Counter[str] = _kc.Counter()

    @event.listens_for(Engine, "before_cursor_execute")
    def _kind(_conn, _cursor, statement, *_args):
        with _lock:
            _all_kinds[" ".join(statement.split())[:70]] += 1

    _kinds_path = os.path.join(_stats_dir, f"{os.getpid()}.kinds")

    def _write_kinds():
        tmp = _kinds_path + ".tmp"
        with open(tmp, "w") as out:
            for kind, count in list(_all_kinds.items()):
                out.write(f"{count}\t{kind}\n")
        os.replace(tmp, _kinds_path)

    _rewrite_every(0.2, _write_kinds, "bench-statement-kinds")

if _stats_dir and os.environ.get("BENCH_LOCK_STATS"):
    import time as _time

    _locks = [0, 0.0, 0.0, 0]  # holds, wait_s, hold_s, statements under a hold
    _held: dict[int, list[float]] = {}  # connection id -> [lock statement started, lock granted]
    import collections as _collections

    _kinds: _collections.Counter[str] = _collections.Counter()  # statements under holds, by their start

    @event.listens_for(Engine, "before_cursor_execute")
    def _lock_start(conn, _cursor, statement, *_args):
        holding = _held.get(id(conn))
        if holding is not None:
            with _lock:
                _locks[3] += 1
                _kinds[" ".join(statement.split())[:70]] += 1
        elif ("ductwork_limit_keys" in statement and "FOR UPDATE" in statement
              and statement.lstrip().startswith("SELECT")):
            _held[id(conn)] = [_time.perf_counter(), 0.0]

    @event.listens_for(Engine, "after_cursor_execute")
    def _lock_granted(conn, *_args):
        holding = _held.get(id(conn))
        if holding is not None and holding[1] == 0.0:
            holding[1] = _time.perf_counter()

    def _released(conn):
        holding = _held.pop(id(conn), None)
        if holding is not None and holding[1]:
            with _lock:
                _locks[0] += 1
                _locks[1] += holding[1] - holding[0]
                _locks[2] += _time.perf_counter() - holding[1]

    event.listen(Engine, "commit", _released)
    event.listen(Engine, "rollback", _released)
    _lock_path = os.path.join(_stats_dir, f"{os.getpid()}.locks")

    def _write_locks():
        tmp = _lock_path + ".tmp"
        with open(tmp, "w") as out:
            out.write(" ".join(str(v) for v in _locks))
            for kind, count in list(_kinds.items()):
                out.write(f"\n{count}\t{kind}")
        os.replace(tmp, _lock_path)

    _rewrite_every(0.2, _write_locks, "bench-lock-stats")

if os.environ.get("BENCH_PATCHES", "").strip():
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "experiments", "sitecustomize.py"))
