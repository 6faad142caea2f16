"""Bench-only patches for fleet experiments, applied at interpreter start-up.

    BENCH_PATCHES=no_notify,no_fsync PYTHONPATH=bench/experiments:. python -m ductwork.cli start ...

Used by ``python -m bench.fleet_experiments``: the fleets it starts get ``BENCH_PATCHES``
and bench/probes/sitecustomize.py, which runs this file when that variable is set; it
never runs otherwise: this directory is on no path. Each patch
changes one thing so a fleet's throughput can be compared with and without it:

- ``no_notify``: ``Tx.wake`` sends no ``pg_notify`` (the in-process wakeup stays);
- ``no_fsync``: every PostgreSQL connection sets ``synchronous_commit = off`` (commits
  stop waiting for the WAL flush: the bound on what fewer commits could give);
- ``switch_interval``: ``sys.setswitchinterval(0.0005)`` (the GIL is handed to a waiting
  thread after 0.5 ms instead of Python's default 5 ms);
- ``timeline``: a probe, no change: each worker process writes when each execution's
  hand-off commit returned, entered ``_perform``, finished its body and was recorded
  (``timeline-<pid>.txt`` in ``BENCH_STATS_DIR``, read by ``python -m bench.slot_timeline``).
"""

import os

_patches = {p.strip() for p in os.environ.get("BENCH_PATCHES", "").split(",") if p.strip()}

if _patches:
    import sys

    from sqlalchemy import event

    from ductwork.db import dialects, engines

    if "no_notify" in _patches:
        dialects.notify_wakeup._impls["postgresql"] = lambda _conn: None

    if "no_fsync" in _patches:
        _create = engines.create_engine

        def create_engine(url, **settings):
            engine = _create(url, **settings)
            if engine.dialect.name == "postgresql":
                @event.listens_for(engine, "connect")
                def _connect(dbapi_connection, _record):
                    with dbapi_connection.cursor() as cursor:
                        cursor.execute("SET synchronous_commit = off")
                    dbapi_connection.commit()
            return engine

        engines.create_engine = create_engine

    if "switch_interval" in _patches:
        sys.setswitchinterval(0.0005)

    if "timeline" in _patches:  # a probe, not a change: when each execution reaches each point
        import threading as _threading
        import time as _time

        from ductwork.fleet import worker as _worker

        _out = open(f"{os.environ['BENCH_STATS_DIR']}/timeline-{os.getpid()}.txt", "a")  # noqa: SIM115
        _out_lock = _threading.Lock()

        def _note(point, execution_id):
            with _out_lock:
                _out.write(f"{point} {execution_id} {_time.time():.6f}\n")
                _out.flush()

        _perform = _worker.Worker._perform

        def _timed_perform(self, claimed, *args, **kwargs):
            _note("perform", claimed.execution_id)
            try:
                return _perform(self, claimed, *args, **kwargs)
            finally:
                _note("recorded", claimed.execution_id)

        _worker.Worker._perform = _timed_perform
        from ductwork.fleet import execute as _execute

        _run_body = _execute.run_body

        def _timed_run_body(app, claimed, definition):
            try:
                return _run_body(app, claimed, definition)
            finally:
                _note("ran", claimed.execution_id)

        _execute.run_body = _timed_run_body
        _complete = _worker.record_successes

        def _timed_complete(*args, **kwargs):
            handed = _complete(*args, **kwargs)
            for c in handed:
                _note("committed", c.execution_id)
            return handed

        _worker.record_successes = _timed_complete
        from ductwork.pipelines import outcomes as _outcomes

        _commit, _routine = _outcomes._commit, _outcomes.release_and_claim

        def _timed_commit(app, successes, hand_off):  # a success's transaction begins
            for s in successes:
                _note("transaction", s.claimed.execution_id)
            return _commit(app, successes, hand_off)

        def _timed_routine(app, tx, key, owner, endings, take=0, **kwargs):  # its statements before the routine done
            for e in endings:
                _note("routine", e.execution_id)
            return _routine(app, tx, key, owner, endings, take, **kwargs)

        _outcomes._commit, _outcomes.release_and_claim = _timed_commit, _timed_routine
