"""Wakeups by kind: what a transaction wakes, in its process and (PostgreSQL) in others.

A success that leaves its step ``advancing`` wakes advancers only; a new execution (a
trigger's too) or a slot freed without a hand-off wakes one job worker, and advancers only
when there is a step for them (a step failed for good), and a worker whose claim took
something wakes one more (never every idle thread for one execution). No timing:
generations and the wakes asked for are compared, and a notification from another
process is waited for with a deadline.

Checks: that no job-worker thread is woken by a completion it cannot follow up (the
polling storm of a saturated key, docs/semantics.md "Wakeups").
"""

from __future__ import annotations

import threading
from datetime import datetime

import pytest

from ductwork.db.wakeup import PgListener
from ductwork.fleet.processes import register
from ductwork.fleet.worker import Worker
from ductwork.limits.claims import claim
from ductwork.pipelines.outcomes import record_invalid, record_success
from ductwork.pipelines.payloads import Output
from ductwork.pipelines.runs import trigger_run
from ductwork_proof.fleet import wait_for
from tests.capabilities import needs
from tests.conftest import make_app, reset_tables
from tests.factories import make_executions, make_run
from tests.workloads import Unkeyed

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


def test_a_trigger_wakes_one_worker_and_no_advancer(app):
    """A new run's first step is a job: a worker may claim it, an advancer has nothing to
    do. (Each trigger woke every idle advancer thread of every process before: on
    PostgreSQL, runs triggered one at a time cost the fleet three times the CPU per step
    of runs fed first, bench/RESULTS.md.)"""
    workers, advancers = _generations(app)
    trigger_run(app, Unkeyed, [1])
    assert _generations(app) == (workers + 1, advancers)


def test_a_step_failed_for_good_wakes_advancers_and_a_worker(app):
    """Its slot is free, and an advancer halts its branch."""
    run_id, branch_id = make_run(app)
    make_executions(app, run_id, branch_id, None, AT)
    claimed = claim(app, register(app, role="test", label="w"))
    workers, advancers = _generations(app)
    record_invalid(app, claimed, ValueError("cannot succeed"))
    assert _generations(app) == (workers + 1, advancers + 1)


def test_a_keyed_success_without_a_hand_off_wakes_workers_too(app):
    """Its slot is free and nobody took it over: an idle worker may claim now."""
    run_id, branch_id = make_run(app)
    make_executions(app, run_id, branch_id, "shared", AT)
    process = register(app, role="test", label="w")
    claimed = claim(app, process)
    workers, advancers = _generations(app)
    record_success(app, claimed, Output("null"))
    assert _generations(app) == (workers + 1, advancers + 1)


class _Counting:
    """A stand-in for ``app.wakeup`` that records how many threads each notify wakes (None:
    all of them)."""

    def __init__(self, real):
        self.real, self.asked = real, []

    @property
    def generation(self):
        return self.real.generation

    def notify(self, n=None):
        self.asked.append(n)
        self.real.notify(n)


def test_a_commit_that_makes_work_claimable_wakes_one_idle_worker_not_all(app):
    """A trigger, a retry, a freed slot: one idle thread looks (a key saturated by the time
    it looks costs one scan, not one per idle thread of the process)."""
    run_id, branch_id = make_run(app)
    app.wakeup = _Counting(app.wakeup)
    make_executions(app, run_id, branch_id, None, AT)
    assert app.wakeup.asked == [1]


def test_a_wakeup_of_one_wakes_one_waiting_thread_and_a_wakeup_of_all_every_one():
    """``Wakeup.notify(1)`` (a commit's job-worker wakeup) wakes exactly one of the idle
    threads waiting; ``notify()`` (the advancers') wakes all; a wait whose generation has
    not moved is not woken, one whose generation moved past ``seen`` is at once. (The
    waiting threads are counted on the condition itself: no timing.)"""
    from ductwork.db.wakeup import Wakeup

    wakeup = Wakeup()
    seen = wakeup.generation
    assert wakeup.wait(seen, timeout=0) is False  # nothing happened since seen
    woken: list[bool] = []
    threads = [threading.Thread(target=lambda: woken.append(wakeup.wait(seen, timeout=60))) for _ in range(3)]
    for thread in threads:
        thread.start()

    def waiting() -> int:
        with wakeup._cond:
            return len(wakeup._cond._waiters)  # (threading.Condition's own list of its waiters)

    wait_for(lambda: waiting() == 3, "three threads waiting")
    wakeup.notify(1)
    assert waiting() == 2  # one taken off the condition by the notify, the others still wait
    wait_for(lambda: woken == [True], "the one woken thread returning True")
    wakeup.notify()
    for thread in threads:
        thread.join(10)
    assert woken == [True, True, True]
    assert wakeup.wait(seen, timeout=0) is True  # the generation moved past seen: at once


def test_a_claim_that_took_something_wakes_one_more_thread(db_url):
    """The baton: a thread whose poll claimed wakes one more, which looks for what is left;
    a poll that claims nothing wakes nobody."""
    app = make_app(db_url)
    reset_tables(app.engine)
    try:
        run_id, branch_id = make_run(app)
        make_executions(app, run_id, branch_id, None, AT, 2)
        worker = Worker(app, process_id=register(app, role="test", label="w"))
        app.wakeup = _Counting(app.wakeup)
        worker._claim()  # the claim step alone: running needs real step classes
        worker._claim()
        worker._claim()  # nothing left: no one else is woken
        assert len(worker._queue) == 2
        assert app.wakeup.asked == [1, 1]
    finally:
        app.dispose()


@pytest.mark.parametrize(("threads", "cpu_s", "share"), [(1, 0.0, 10), (5, 0.0, 2), (20, 0.0, 1), (5, 0.0005, 10)])
def test_a_fast_thread_claims_its_share_of_a_wide_key(db_url, threads, cpu_s, share):
    """Fast steps (a body of 0.5 ms: batches of 64), a ``concurrency: 10`` key, a process of
    ``threads`` threads: a claim takes the thread's share, 10 / threads (at least one), to
    run in a row and record in one group commit; of CPU-bound bodies (``cpu_s`` of the
    0.5 ms on the thread's CPU), the process's share, 10 / its one process. The key's
    concurrency still holds (INV-LIM-1)."""
    app = make_app(db_url, job_worker={"limits": {"wide": {"concurrency": 10},
                                                  "paced": {"rate": {"limit": 100, "per": "1s"}}}})
    reset_tables(app.engine)
    try:
        run_id, branch_id = make_run(app)
        ids = make_executions(app, run_id, branch_id, "wide", AT, 12)
        worker = Worker(app, process_id=register(app, role="test", label="w"), batch_size=64, threads=threads)
        worker._paced(0.0005, cpu_s)
        worker._claim()
        assert [c.execution_id for c in worker._queue] == ids[:share]
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
