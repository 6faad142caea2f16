"""Wakeups by kind: what a transaction wakes, in its process and (PostgreSQL) in others.

A success that leaves its step ``advancing`` wakes advancers only; a new execution or a
slot freed without a hand-off wakes job workers too; a keyed batch wakes as many of its
process's threads as it left executions in the inbox. No timing: generations are
compared, and a notification from another process is waited for with a deadline.

Checks: that no job-worker thread is woken by a completion it cannot follow up (the
polling storm of a saturated key, docs/semantics.md "Wakeups").
"""

from __future__ import annotations

import threading
from datetime import datetime

import pytest

from ductwork.db.wakeup import PgListener
from ductwork.fleet.processes import register
from ductwork.fleet.worker import Inbox, Worker
from ductwork.limits.claims import claim
from ductwork.pipelines.outcomes import record_success
from ductwork.pipelines.payloads import Output
from tests.capabilities import needs
from tests.conftest import make_app, reset_tables
from tests.factories import make_executions, make_run
from tests.fleet import wait_for

AT = datetime(2020, 1, 1)


def _generations(app):
    return app.wakeup.generation, app.advancer_wakeup.generation


def test_a_success_left_advancing_wakes_advancers_only(app):
    run_id, branch_id = make_run(app)
    make_executions(app, run_id, branch_id, None, AT)
    process = register(app, role="test", label="w")
    claimed = claim(app, process)
    workers, advancers = _generations(app)
    record_success(app, claimed, Output("null"))
    assert _generations(app) == (workers, advancers + 1)


def test_a_keyed_success_without_a_hand_off_wakes_workers_too(app):
    """Its slot is free and nobody took it over: an idle worker may claim now."""
    run_id, branch_id = make_run(app)
    make_executions(app, run_id, branch_id, "shared", AT)
    process = register(app, role="test", label="w")
    claimed = claim(app, process)
    workers, advancers = _generations(app)
    record_success(app, claimed, Output("null"))
    assert _generations(app) == (workers + 1, advancers + 1)


def test_a_keyed_batch_leaves_the_rest_to_idle_threads(db_url):
    """A thread whose process has two idle threads claims three executions of a
    ``concurrency: 3`` key: it keeps one, leaves two in the inbox and wakes two threads."""
    app = make_app(db_url, job_worker={"limits": {"three": {"concurrency": 3}}})
    reset_tables(app.engine)
    try:
        run_id, branch_id = make_run(app)
        ids = make_executions(app, run_id, branch_id, "three", AT, 5)
        woken: list[int] = []
        inbox = Inbox(woken.append, lambda: 2)
        worker = Worker(app, process_id=register(app, role="test", label="w"), inbox=inbox)
        worker._claim()  # the claim step alone: running needs real step classes
        assert [c.execution_id for c in worker._queue] == ids[:1]
        assert inbox.held() == set(ids[1:3])
        assert woken == [2]
        assert inbox.spare() == 0  # two idle threads, two executions waiting for them
        assert worker.held() == set(ids[:1])
    finally:
        app.dispose()


def test_a_fast_thread_runs_its_share_of_a_wide_key_in_a_row(db_url):
    """Fast steps that mostly wait (a body of 0.5 ms, none of it this thread's CPU), a
    ``concurrency: 10`` key, a process of five threads, two of them idle: a claim takes
    four, keeps two (its share, 10 / 5) to run in a row and record in one group commit,
    and leaves two to the idle threads; a key with a rate, or one whose share is below
    two, is run one execution per thread as before."""
    app = make_app(db_url, job_worker={"limits": {"wide": {"concurrency": 10}, "three": {"concurrency": 3},
                                                  "paced": {"rate": {"limit": 100, "per": "1s"}}}})
    reset_tables(app.engine)
    try:
        run_id, branch_id = make_run(app)
        ids = make_executions(app, run_id, branch_id, "wide", AT, 6)
        inbox = Inbox(lambda _n: None, lambda: 2, threads=5)
        worker = Worker(app, process_id=register(app, role="test", label="w"), inbox=inbox, batch_size=64)
        worker._paced(0.0005, 0.0)  # a fast step was timed, waiting all along: batches of 64
        assert (worker.in_a_row("wide"), worker.in_a_row("three"), worker.in_a_row("paced")) == (2, 1, 1)
        assert worker.in_a_row("nowhere") == 64  # unconfigured: no share to keep to
        worker._claim()
        assert [c.execution_id for c in worker._queue] == ids[:2]
        assert worker._in_a_row == set(ids[:2])  # their successes: one keyed group commit
        assert inbox.held() == set(ids[2:4])
    finally:
        app.dispose()


@pytest.mark.parametrize(("processes", "share"), [(1, 10), (2, 5), (20, 1)])
def test_bodies_that_mostly_run_python_take_the_processes_share_of_a_wide_key(db_url, processes, share):
    """Bodies that mostly run Python (this thread's CPU for at least half their time; a
    no-op's is all of it) hold the GIL: the process's five threads would run them one at
    a time, so one thread runs the process's whole share in a row (``concurrency`` over
    the supervisor's ``job_worker.processes``) and records it in one group commit; the
    key's concurrency still holds (INV-LIM-1: nothing beyond it is claimed)."""
    app = make_app(db_url, job_worker={"processes": processes, "limits": {"wide": {"concurrency": 10},
                                                                          "three": {"concurrency": 3}}})
    reset_tables(app.engine)
    try:
        run_id, branch_id = make_run(app)
        ids = make_executions(app, run_id, branch_id, "wide", AT, 12)
        inbox = Inbox(lambda _n: None, lambda: 0, threads=5)
        worker = Worker(app, process_id=register(app, role="test", label="w"), inbox=inbox, batch_size=64)
        worker._paced(0.0, 0.0)  # a no-op step: nothing but this thread's CPU
        assert worker.in_a_row("wide") == share
        assert worker.in_a_row("three") == max(1, 3 // processes)
        worker._paced(0.002, 0.0006)  # then steps that mostly waited: the average falls below half
        worker._paced(0.002, 0.0)
        assert worker.in_a_row("wide") == 2  # the thread's share again (10 / 5)
        worker._paced(0.0, 0.0)  # a no-op again: more than half
        worker._claim()
        assert [c.execution_id for c in worker._queue] == ids[:share]
        assert worker._in_a_row == (set(ids[:share]) if share > 1 else set())
        assert inbox.held() == set()  # no idle thread asked: nothing beyond the thread's own
    finally:
        app.dispose()


@needs("notify_channel")
def test_the_listener_relays_each_channel_to_its_own_wakeup(db_url):
    """Another process's ``wake_advancers`` reaches this process's advancers, not its workers."""
    app, other = make_app(db_url), make_app(db_url)
    stop = threading.Event()
    listener = PgListener(app, stop)
    listener.start()
    try:
        workers, advancers = _generations(app)

        def advancers_woken() -> bool:
            with other.begin() as tx:  # sent until the listener has started listening
                tx.wake_advancers()
            return app.advancer_wakeup.generation > advancers

        wait_for(advancers_woken, "a NOTIFY ductwork_advance relayed to the advancers' wakeup")
        assert app.wakeup.generation == workers
    finally:
        stop.set()
        listener.join(5)
        app.dispose()
        other.dispose()
