"""Bench-only patches for fleet experiments, applied at interpreter start-up.

    BENCH_PATCHES=no_notify,no_fsync PYTHONPATH=bench/experiments:. python -m ductwork.cli start ...

Used by ``python -m bench.fleet_experiments``: the fleets it starts get ``BENCH_PATCHES``
and bench/probes/sitecustomize.py, which runs this file when that variable is set; it
never runs otherwise: this directory is on no path. Each patch
changes one thing so a fleet's throughput can be compared with and without it:

- ``no_notify``: ``Tx.wake`` sends no ``pg_notify`` (the in-process wakeup stays);
- ``no_fsync``: every PostgreSQL connection sets ``synchronous_commit = off`` (commits
  stop waiting for the WAL flush: the bound on what fewer commits could give);
- ``key_skip_locked``: a keyed claim takes the key's header lock with ``SKIP LOCKED``: a
  key another claimer holds is skipped (refusal "gone", the poll tries the next lane)
  instead of queued behind; completions still wait for the lock;
- ``wake_one``: a wakeup wakes one idle thread of the process instead of all of them;
- ``whole_key_in_a_row``: a thread runs in a row as many of a key's executions as its
  pace-sized batch allows, up to the key's whole ``concurrency`` (not its share of it);
  ``key_halves_in_a_row``: up to half of it (two threads' shares, whatever the threads);
- ``switch_interval``: ``sys.setswitchinterval(0.0005)`` (the GIL is handed to a waiting
  thread after 0.5 ms instead of Python's default 5 ms);
- ``hand_off_no_scan``: a keyed hand-off claims without scanning the lanes first (as if its
  key's lane were the only one: the bound on what the scan under the key's lock costs;
  not exact when another lane has older work);
- ``timeline``: a probe, no change: each worker process writes when each execution's
  hand-off commit returned, was handed to its thread, entered ``_perform``, finished its
  body and was recorded (``timeline-<pid>.txt`` in ``BENCH_STATS_DIR``, read by
  ``python -m bench.slot_timeline``).
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

    if "key_skip_locked" in _patches:
        import sqlalchemy as sa

        from ductwork.db import schema
        from ductwork.limits import claims

        def lock_key(tx, key):  # the claim path's key lock only (claims' binding of executions.lock_key)
            k = schema.limit_keys
            stmt = sa.select(k.c.seq, k.c.config_digest).where(k.c.key == key)
            return tx.execute(dialects.for_update(stmt, tx.conn, skip_locked=True)).first()

        claims.lock_key = lock_key

    if "wake_one" in _patches:
        from ductwork.db import wakeup

        def notify(self):
            with self._cond:
                self._generation += 1
                self._cond.notify(1)

        wakeup.Wakeup.notify = notify

    if _patches & {"whole_key_in_a_row", "key_halves_in_a_row"}:
        from ductwork.fleet import worker

        _shares = 1 if "whole_key_in_a_row" in _patches else 2

        def in_a_row(self, key):
            if self._inbox is None:
                return self.batch
            entry = self.app.config.limits.get(key)
            if entry is not None and entry.rates:
                return 1
            if entry is None or entry.concurrency is None:
                return self.batch
            return max(1, min(self.batch, entry.concurrency // _shares))

        worker.Worker.in_a_row = in_a_row

    if "switch_interval" in _patches:
        sys.setswitchinterval(0.0005)

    if "hand_off_no_scan" in _patches:
        from ductwork.limit_entries import entry_digest
        from ductwork.limits import claims, executions

        _hand_off = claims.hand_off

        def hand_off(app, tx, key, process_id, limit=1, keyed_limit=1):
            if key is None:
                return _hand_off(app, tx, key, process_id, limit, keyed_limit)
            header = executions.lock_key(tx, key)
            if header is None or header.config_digest != entry_digest(app.config.limits.get(key)):
                return []
            outcome = claims.decide_and_claim(app, tx, key, header, process_id, write_refusal=False,
                                              limit=keyed_limit, lanes=[])
            return outcome if isinstance(outcome, list) else []

        claims.hand_off = hand_off

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

        def _timed_perform(self, claimed, group, *args, **kwargs):
            _note("perform", claimed.execution_id)
            try:
                return _perform(self, claimed, group, *args, **kwargs)
            finally:
                _note("recorded", claimed.execution_id)

        _worker.Worker._perform = _timed_perform
        from ductwork.fleet import execute as _execute
        from ductwork.fleet import shared as _shared

        _run_body = _execute.run_body

        def _timed_run_body(app, claimed, definition):
            try:
                return _run_body(app, claimed, definition)
            finally:
                _note("ran", claimed.execution_id)

        _execute.run_body = _timed_run_body
        _record = _shared.KeyedCommits.record

        def _timed_record(self, success, take, commit):
            handed = _record(self, success, take, commit)
            for c in handed:
                _note("handed", c.execution_id)
            return handed

        _shared.KeyedCommits.record = _timed_record
        _complete = _worker.record_successes

        def _timed_complete(*args, **kwargs):
            handed = _complete(*args, **kwargs)
            for c in handed:
                _note("committed", c.execution_id)
            return handed

        _worker.record_successes = _timed_complete

    if "released_to_advancer" in _patches:
        from ductwork.pipelines import outcomes as _outcomes

        def _never(_app, _success):
            return False

        _outcomes.released_later = _never  # every released step left to (and woken for) an advancer, none
        # advanced by its worker (``advanced_later`` asks ``released_later``)
