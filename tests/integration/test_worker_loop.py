"""The job worker's loop (``fleet/worker.py``) around its claims and commits.

- a busy worker polls for a due ``on_halt`` hook before its next claim, not only when idle;
- successes a batch left unrecorded when an error escaped ``run_once`` are recorded at the
  next call, even when that call finds no work;
- a claim that spends a rated key's last token sets the process's token alarm for the next
  one, and a worker with no alarm (in-process, tests) runs the claim all the same;
- a group commit hands the lane's next executions to its worker, in the same call.

Each found by generated mutants of ``fleet/worker.py`` (``python -m tests.guard_mutation
fleet/worker.py``) that the rest of the integration tier left alive.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from ductwork.fleet import worker as worker_module
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from tests.conftest import installed_on_manual_clock
from tests.workloads import Boom, Fails, OnKey, Unkeyed
from tests.workloads.hooks import halted_with_owed_hook


class Ticked(OnKey):
    """One Echo on key ``tick``: one claim a second, burst 1."""

    key = "tick"


@pytest.fixture
def clocked(db_url):
    """A ManualClock app with the rated key ``tick``."""
    yield from installed_on_manual_clock(
        db_url, job_worker={"limits": {"tick": {"rate": {"limit": 1, "per": "1s", "burst": 1}}}})


def test_a_busy_worker_runs_a_due_hook_before_its_next_claim(clocked):
    """A worker with work waiting still polls for due hooks (at most once a second while
    busy): its first call runs the owed hook, the next one the waiting execution."""
    halted_with_owed_hook(clocked)
    run = Unkeyed.trigger(1)
    worker = Worker(clocked)
    first = worker.run_once()
    assert first is not None
    assert first.node == "on_halt", first
    second = worker.run_once()
    assert second is not None
    assert second.node == "Echo#0", second
    Advancer(clocked).run_once()
    assert run.refresh().status == "completed"


def test_successes_an_escaping_error_left_unrecorded_are_recorded_at_the_next_call(clocked, monkeypatch):
    """A batch's success waits for its group commit; when recording a later failure of the
    batch raises (the database gone for that moment), the error leaves ``run_once`` with
    the success unrecorded. The next call records it first, though it finds no work."""
    Unkeyed.trigger(0)
    worker = Worker(clocked, batch_size=8)
    assert worker.run_once() is not None  # one execution (no pace yet); now the batch is sized
    ok, fails = Unkeyed.trigger(1), Fails.trigger(2)
    real = worker_module.record_failed

    def database_gone(*_):
        monkeypatch.setattr(worker_module, "record_failed", real)
        raise ConnectionError("database gone while recording a failure")

    monkeypatch.setattr(worker_module, "record_failed", database_gone)
    with pytest.raises(ConnectionError):
        worker.run_once()  # Echo succeeded (in the group), Boom's failure could not be recorded
    assert ok.steps()[0].status == "in_progress"  # not recorded yet: held by the worker
    other = Worker(clocked)
    while other.run_once() is not None:  # another worker takes Boom's re-runs: no work is left
        pass
    assert worker.run_once() is None  # a call that finds no work records what it held
    assert ok.steps()[0].status in ("advancing", "completed")
    assert fails.steps()[0].node == Boom.__name__ + "#0"


def test_a_claim_that_spends_a_keys_last_token_sets_the_alarm_and_runs_without_one(clocked):
    """``tick`` admits one claim a second: the claim that spends the token tells the
    process's alarm when the next one comes; a worker with no alarm runs it as well."""
    told: list[float] = []

    class Alarm:
        def at(self, seconds: float) -> None:
            told.append(seconds)

    first, second = Ticked.trigger(1), Ticked.trigger(2)
    alarmed = Worker(clocked, tokens=Alarm())
    assert alarmed.run_once() is None  # the key's bucket starts empty when first decided
    clocked.clock.advance(timedelta(seconds=1))  # its first token
    performed = alarmed.run_once()
    assert performed is not None
    assert performed.node == "Echo#0"
    assert told, "the claim that spent the last token told the alarm nothing"
    assert 0 < told[-1] <= 1, told
    clocked.clock.advance(timedelta(seconds=1))
    assert Worker(clocked).run_once() is not None  # no alarm: nothing to tell, the claim runs
    assert {first.steps()[0].status, second.steps()[0].status} <= {"advancing", "completed"}


def test_a_group_commit_hands_on_the_lanes_next_executions_in_the_same_call(clocked):
    """A worker that takes hand-offs records its batch's successes in one commit that claims
    the lane's next executions for it, so one ``run_once`` runs five waiting executions: the
    first alone (no pace yet), the other four handed on by its commit."""
    runs = [Unkeyed.trigger(i) for i in range(5)]
    worker = Worker(clocked, batch_size=8, hand_off=lambda: True)
    assert worker.run_once() is not None
    assert all(run.steps()[0].status in ("advancing", "completed") for run in runs), [
        run.steps()[0].status for run in runs]
