"""Testing helpers for users' pipelines: Run.steps() details, drain(skip_delays=True),
what DrainTimeout says, and the pytest plugin, on SQLite, PostgreSQL and MySQL.

Checks: INV-CLK-1 (skip_delays moves the one injectable clock, an OffsetClock; the
engine's retry and limit decisions are unchanged), INV-EXE-4 (retry budget: attempts
and halt after max_retry, read back from Run.steps()).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, Step, faults
from ductwork.db import schema
from ductwork.db.clock import ManualClock, OffsetClock
from ductwork.errors import ConfigError, DrainTimeout
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.testing import drain, waiting_for
from tests.conftest import installed, make_app
from tests.workloads import Echo, Fails, Fan, Takes

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[2]


class FailsFirst(Step):
    """Raises on its first ``fails`` executions (counted in the run's Context), then returns the count."""

    def __init__(self, fails):
        self.fails = fails

    def execute(self):
        tries = (self.context.get("tries") or 0) + 1
        self.context.set("tries", tries, overwrite=True)
        if tries <= self.fails:
            raise RuntimeError(f"try {tries} fails")
        return tries


class Flaky(Pipeline):
    @classmethod
    def define(cls, pipeline):
        pipeline.start(FailsFirst)


class Split(Echo):
    pass


class Pause(Echo):
    pass


class Call(Echo):
    pass


class Vendor(Echo):
    pass


class Later(Echo):
    pass


class WaitsTwoWays(Pipeline):
    """One branch dampens; the other calls a vendor behind a rate of one per hour."""

    @classmethod
    def define(cls, pipeline):
        pause, call = pipeline.start(Split).divide(to=[Pause, Call])
        pause.dampen(before=Later)
        call.chain(to=Vendor, limit_by="vendor")


@pytest.fixture
def offset_app(db_url):
    """An app on an OffsetClock (what the plugin's ductwork_app uses), 1 h retry delays."""
    yield from installed(make_app(db_url, clock=OffsetClock(), job_worker={
        "retry_delay": 3600, "max_retry": 3, "limits": {"vendor": {"rate": {"limit": 1, "per": "1h"}}}}))


# --------------------------------------------------------------------------- Run.steps()


def test_steps_report_attempts_error_and_times_of_a_retried_step(offset_app):
    run = Flaky.trigger(2)
    drain(offset_app, timeout=60, skip_delays=True)
    assert run.refresh().status == "completed"
    (step,) = run.steps()
    assert (step.status, step.output, step.attempts, step.error) == ("completed", 3, 3, None)
    assert step.started_at is not None
    assert step.finished_at is not None
    assert step.created_at <= step.started_at <= step.finished_at
    assert step.klass.endswith(":FailsFirst")
    assert step.input == [2]


def test_steps_report_the_last_error_of_a_step_that_ran_out_of_retries(offset_app):
    run = Flaky.trigger(10)
    drain(offset_app, timeout=60, skip_delays=True)
    assert run.refresh().status == "halted"
    assert run.halt_reasons == ["job_retries_exhausted"]
    (step,) = run.steps()
    assert (step.status, step.output, step.attempts) == ("failed", None, 4)  # the first run and 3 retries
    assert step.error is not None
    assert (step.error.klass, step.error.message, step.error.outcome) == ("builtins.RuntimeError", "try 4 fails",
                                                                          "failure")
    assert step.finished_at is not None
    assert step.started_at is not None
    assert step.started_at < step.finished_at


# --------------------------------------------------------------------------- skip_delays


def test_skip_delays_moves_the_clock_past_retry_delays(offset_app):
    """Three failures 1 h apart: without skip_delays this drain would time out."""
    run = Flaky.trigger(3)
    drain(offset_app, timeout=60, skip_delays=True)
    assert run.refresh().status == "completed"
    assert run.steps()[0].attempts == 4
    # the clock skipped the three hours (less the real time the drain itself took, under 60 s)
    assert offset_app.clock.offset.total_seconds() > 3 * 3600 - 60


def test_skip_delays_needs_a_clock_it_can_move(app):
    with pytest.raises(ConfigError, match=r"clock=DatabaseClock\(\): drain\(skip_delays=True\) needs a clock"):
        drain(app, timeout=1, skip_delays=True)


# --------------------------------------------------------------------------- DrainTimeout


def _vendor_key_tried(app) -> bool:
    """Both runs' Vendor steps exist and a claim of key 'vendor' has stamped its next token."""
    k, s = schema.limit_keys, schema.steps
    with app.begin() as tx:
        stamped = tx.execute(sa.select(k.c.blocked_until).where(k.c.key == "vendor")).scalar()
        vendors = tx.execute(sa.select(sa.func.count()).where(s.c.node.like("Vendor#%"))).scalar_one()
    return stamped is not None and vendors == 2


def _timed_out_once(app, timeout: float, reached, **kwargs) -> DrainTimeout:
    """Drains of ``timeout`` s, each expected to time out, until ``reached(app)`` (the work has
    gone as far as it can; on a loaded machine one short drain may end before), at most a
    minute; the last drain's DrainTimeout."""
    deadline = time.monotonic() + 60
    while True:
        with pytest.raises(DrainTimeout) as raised:
            drain(app, timeout=timeout, **kwargs)
        if reached(app) or time.monotonic() > deadline:
            return raised.value


def test_drain_timeout_says_what_each_run_waits_for(offset_app):
    runs = [WaitsTwoWays.trigger(1), WaitsTwoWays.trigger(2)]
    # a rate's wait is never skipped
    message = str(_timed_out_once(offset_app, 1, _vendor_key_tried, skip_delays=True))
    # the key's bucket starts empty [INV-LIM-2]: no vendor call gets a token, both runs wait
    waiting = [run for run in runs if run.refresh().status == "in_progress"]
    assert waiting == runs
    assert message.startswith("drain: runs still in progress after 1 s:\n")
    lines = message.splitlines()[1:]
    assert len(lines) == len(waiting), message
    for run, line in zip(sorted(waiting, key=lambda r: r.triggered_at), lines, strict=True):
        assert line.startswith(f"- run {run.id} (tests.integration.test_testing:WaitsTwoWays) in_progress: "), line
        assert re.search(r"branch \S+: dampened after Pause#1, waiting for run\.resume\(\)", line), line
        assert re.search(r"branch \S+: step Vendor#\d+ waits for limit key 'vendor': rate-blocked until "
                         r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line), line
    assert waiting_for(offset_app) == [line.removeprefix("- ") for line in lines]


def test_drain_timeout_names_a_pending_retry_and_its_error(offset_app):
    run = Flaky.trigger(10)

    def failed_once(app) -> bool:
        e = schema.executions
        with app.begin() as tx:
            return tx.execute(sa.select(sa.func.count()).where(e.c.outcome == "failure")).scalar_one() == 1

    raised = _timed_out_once(offset_app, 0.5, failed_once)  # the retry is an hour away
    assert re.search(rf"run {run.id} \(\S+:Flaky\) in_progress: branch \S+: step FailsFirst#0 retry 1 at "
                     r"\S+ \S+ after failure: builtins\.RuntimeError: try 1 fails", str(raised)), raised


# --------------------------------------------------------------------------- waiting_for, state by state
#
# Each test puts a run in one state with the engine's own parts (a Worker's and an
# Advancer's run_once, a reap, a fault checkpoint) and asserts the exact line
# waiting_for gives it, the ids and times read back from the tables it reads.

#: callables a Probe step runs while it executes (its worker's claim held), results kept
DURING: list = []
SEEN: list = []


class Probe(Takes):
    """Runs each callable of DURING while its execution is claimed, keeping the results in SEEN."""

    def execute(self):
        while DURING:
            SEEN.append(DURING.pop(0)())
        return self.value


class Twice(Pipeline):
    @classmethod
    def define(cls, pipeline):
        pipeline.start(Probe).chain(to=Later)


class KeyedCall(Pipeline):
    @classmethod
    def define(cls, pipeline):
        pipeline.start(Echo).chain(to=Probe, limit_by="k")


class Delayed(Pipeline):
    @classmethod
    def define(cls, pipeline):
        pipeline.start(Echo).chain(to=Later, delay=3)


@pytest.fixture
def states_app(db_url):
    """Steps left for the advancer (no inline chains), expands one child per batch, no
    retries, a crash re-run an hour later, key ``k`` one at a time."""
    DURING.clear()
    SEEN.clear()
    yield from installed(make_app(db_url, pipeline_advancer={"inline_linear": False, "expand_batch": 1,
                                                             "advance_batch": 1},
                                  job_worker={"max_retry": 0, "max_crash": 2, "crash_backoff": 3600,
                                              "limits": {"k": {"concurrency": 1}}}))


def _branches(app, run):
    """The run's active branches' ids, in waiting_for's order."""
    from ductwork.db import schema

    b = schema.branches
    with app.begin(readonly=True) as tx:
        return list(tx.execute(sa.select(b.c.id).where(b.c.run_id == run.id, b.c.status != "completed")
                               .order_by(b.c.started_at, b.c.id)).scalars())


def _open_execution(app, run, node):
    """The open execution of the run's step ``node`` (eligible_at, claimed_at, process_id)."""
    from ductwork.db import schema

    e, s = schema.executions, schema.steps
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(e.c.eligible_at, e.c.claimed_at, e.c.process_id)
                          .join(s, s.c.id == e.c.step_id)
                          .where(s.c.run_id == run.id, s.c.node == node, e.c.completed_at.is_(None))).one()


def _claimed_at(app, branch):
    from ductwork.db import schema

    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(schema.branches.c.claimed_at).where(schema.branches.c.id == branch)).scalar_one()


def _head(run, branch):
    return f"run {run.id} ({run.pipeline}) in_progress: branch {branch}: "


def test_waiting_for_an_unclaimed_unkeyed_step_then_one_succeeded_waiting_for_an_advancer(states_app):
    run = Twice.trigger(1)
    (branch,) = _branches(states_app, run)
    queued = _open_execution(states_app, run, "Probe#0")
    assert waiting_for(states_app) == [
        _head(run, branch) + f"step Probe#0 queued since {queued.eligible_at}, not claimed by any worker"]
    assert Worker(states_app).run_once() is not None
    assert waiting_for(states_app) == [_head(run, branch) + "step Probe#0 succeeded, waiting for an advancer"]


def test_waiting_for_a_running_step(states_app):
    run = Twice.trigger(1)
    (branch,) = _branches(states_app, run)
    DURING.append(lambda: (waiting_for(states_app), _open_execution(states_app, run, "Probe#0")))
    assert Worker(states_app).run_once() is not None
    ((lines, running),) = SEEN
    assert running.claimed_at is not None
    assert lines == [_head(run, branch) + f"step Probe#0 running since {running.claimed_at} "
                                          f"(attempt 1, process {running.process_id})"]


def test_waiting_for_a_failed_step_its_advancer_has_not_halted(states_app):
    run = Fails.trigger(1)
    (branch,) = _branches(states_app, run)
    assert Worker(states_app).run_once() is not None
    assert waiting_for(states_app) == [
        _head(run, branch) + "step Boom#0 failed for good, waiting for an advancer to halt the branch"]


def test_waiting_for_a_branch_held_by_an_advancer(states_app, monkeypatch):
    run = Twice.trigger(1)
    (branch,) = _branches(states_app, run)
    assert Worker(states_app).run_once() is not None
    seen, real = [], faults.hit

    def hit(name):  # the advancer's claim committed, its advancement not begun
        if name == faults.AFTER_BRANCH_CLAIM:
            seen.append((waiting_for(states_app), _claimed_at(states_app, branch)))
        real(name)

    monkeypatch.setattr(faults, "hit", hit)
    assert Advancer(states_app).run_once() == "advanced"
    ((lines, claimed_at),) = seen
    assert lines == [_head(run, branch) + f"held by an advancer since {claimed_at} (at Probe#0), "
                                          "waiting for it to finish or for the reaper"]


def test_waiting_for_an_expand_part_way_through_its_children(states_app):
    run = Fan.trigger(3)
    assert Worker(states_app).run_once() is not None  # Items: the expand's step succeeds
    faults.arm(faults.BETWEEN_EXPAND_BATCHES, "raise")  # its advancer fails after the first batch
    try:
        assert Advancer(states_app).run_once() == "error"
    finally:
        faults.disarm()
    expand, child = _branches(states_app, run)
    queued = _open_execution(states_app, run, "Times10#1")
    assert waiting_for(states_app) == [
        _head(run, expand) + "expand after Items#0 in progress: 1 of 3 children created; "
        f"branch {child}: step Times10#1 queued since {queued.eligible_at}, not claimed by any worker"]


def test_waiting_for_a_crash_back_off(states_app):
    from ductwork.fleet.processes import register
    from ductwork.fleet.reaper import reap

    run = Twice.trigger(1)
    (branch,) = _branches(states_app, run)
    doomed = register(states_app, role="worker", label="doomed")
    DURING.append(lambda: reap(states_app, doomed, force=True))  # its process declared dead mid-step
    performed = Worker(states_app, process_id=doomed).run_once()
    assert performed is not None
    assert performed.outcome == "commit_failed"  # the reaped worker's late success is refused
    assert SEEN == [True]
    rerun = _open_execution(states_app, run, "Probe#0")
    assert waiting_for(states_app) == [
        _head(run, branch) + f"step Probe#0 re-run 1 after a crash (ductwork.ProcessCrash) at {rerun.eligible_at}"]


def test_waiting_for_a_delay_and_drain_moves_a_manual_clock_past_it(db_url):
    from datetime import datetime, timedelta

    start = datetime(2026, 1, 1, 12, 0, 0)
    for app in installed(make_app(db_url, clock=ManualClock(start), pipeline_advancer={"inline_linear": False})):
        run = Delayed.trigger(1)
        (branch,) = _branches(app, run)
        assert Worker(app).run_once() is not None
        assert Advancer(app).run_once() == "advanced"
        assert waiting_for(app) == [
            _head(run, branch) + f"step Later#1 delayed (delay=) until {start + timedelta(seconds=3)}"]
        drain(app, timeout=30)
        assert run.refresh().status == "completed"
        assert app.clock.now() == start + timedelta(seconds=3)  # moved to the delay's end, not past it


def test_waiting_for_a_keyed_step_unclaimed_then_behind_the_keys_concurrency(states_app):
    first, second = KeyedCall.trigger(1), KeyedCall.trigger(2)
    idle = Worker(states_app, hand_off=lambda: False)
    for _ in range(2):  # each run's Echo, then its advance to the keyed Probe
        assert idle.run_once() is not None
        assert Advancer(states_app).run_once() == "advanced"
    (b1,), (b2,) = _branches(states_app, first), _branches(states_app, second)
    q1, q2 = _open_execution(states_app, first, "Probe#1"), _open_execution(states_app, second, "Probe#1")
    assert waiting_for(states_app) == [
        _head(first, b1) + f"step Probe#1 queued on limit key 'k' since {q1.eligible_at}, not claimed by any worker",
        _head(second, b2) + f"step Probe#1 queued on limit key 'k' since {q2.eligible_at}, not claimed by any worker"]
    DURING.append(lambda: waiting_for(states_app))  # the first Probe runs: k's one slot taken
    assert idle.run_once() is not None
    ((first_line, second_line),) = SEEN
    assert first_line.startswith(_head(first, b1) + "step Probe#1 running since "), first_line
    assert second_line == _head(second, b2) + "step Probe#1 waits for limit key 'k': concurrency 1 of 1 in flight"


def test_waiting_for_names_at_most_the_oldest_runs(states_app):
    from ductwork.testing import DESCRIBED

    runs = [Twice.trigger(n) for n in range(DESCRIBED + 1)]
    lines = waiting_for(states_app)
    assert len(lines) == DESCRIBED + 1
    oldest = sorted(runs, key=lambda r: (r.triggered_at, r.id))[:DESCRIBED]
    assert [line.split(" ")[1] for line in lines[:DESCRIBED]] == [run.id for run in oldest]
    assert lines[-1] == f"and more runs in progress (only the {DESCRIBED} oldest are shown)"


def test_waiting_for_names_at_most_the_oldest_branches_of_a_run(states_app):
    from ductwork.testing import DESCRIBED

    run = Fan.trigger(DESCRIBED + 1)
    assert Worker(states_app).run_once() is not None
    assert Advancer(states_app).run_once() == "advanced"  # the expand, to its last child
    children = _branches(states_app, run)
    assert len(children) == DESCRIBED + 1
    (line,) = waiting_for(states_app)
    assert line.startswith(_head(run, children[0]) + "step Times10#1 queued "), line
    assert [part.split(":")[0] for part in line.split("; ")[1:]] == (
        [f"branch {child}" for child in children[1:DESCRIBED]] + [f"more than {DESCRIBED} active branches"])


def test_drain_stops_advancing_at_its_deadline(states_app):
    """Two branches wait for an advancer that advances one per call: the deadline passed
    after the first, drain advances no more and says what the runs wait for."""
    runs = [Twice.trigger(1), Twice.trigger(2)]
    worker = Worker(states_app)
    assert worker.run_once() is not None
    assert worker.run_once() is not None
    with pytest.raises(DrainTimeout) as raised:
        drain(states_app, timeout=0)
    lines = str(raised.value).splitlines()
    assert lines[0] == "drain: runs still in progress after 0 s:"
    advanced = [line for line in lines[1:] if "Probe#0 succeeded" not in line]
    assert len(advanced) == 1, lines  # one advanced (its Later then ran), the other still waits
    assert len(lines) == 3, lines
    assert {line.split(" ")[2] for line in lines[1:]} == {run.id for run in runs}


def test_drain_waits_while_another_process_holds_a_branch(states_app):
    from ductwork.fleet.processes import register
    from ductwork.pipelines.branches import claim_branch

    run = Twice.trigger(1)
    (branch,) = _branches(states_app, run)
    assert Worker(states_app).run_once() is not None
    claim = claim_branch(states_app, branch, register(states_app, role="advancer", label="elsewhere"))
    assert claim is not None
    with pytest.raises(DrainTimeout) as raised:
        drain(states_app, timeout=0.2)
    assert str(raised.value) == ("drain: runs still in progress after 0.2 s:\n- " + _head(run, branch)
                                 + f"held by an advancer since {_claimed_at(states_app, branch)} (at Probe#0), "
                                   "waiting for it to finish or for the reaper")


def test_drain_registers_again_when_its_process_was_reaped(db_url):
    """A fleet on the same database reaped drain's process (its heartbeat was late): the
    next heartbeat finds the row gone and drain goes on under a new process id. A
    heartbeat interval of 1 µs makes every pass of drain's loop beat, and the manual clock
    moves to Later's delay at once, so nothing waits in real time."""
    from datetime import datetime

    from ductwork.fleet.reaper import reap

    clock = ManualClock(datetime(2026, 1, 1, 12, 0, 0))
    for app in installed(make_app(db_url, clock=clock, pipeline_advancer={"inline_linear": False},
                                  supervisor={"heartbeat_interval": 0.000001})):
        run = Delayed.trigger(1)
        assert Worker(app).run_once() is not None
        assert Advancer(app).run_once() == "advanced"  # Later is delayed by 3 s
        reaped = app.process_id()
        assert reap(app, reaped, force=True)
        drain(app, timeout=30)
        assert run.refresh().status == "completed"
        assert app.process_id() != reaped


# --------------------------------------------------------------------------- the pytest plugin

FRESH = """
import sqlalchemy as sa

from ductwork.db import schema
from orders.pipelines import Checkout


def _runs(app):
    with app.engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(schema.runs)).scalar_one()


def test_first(ductwork_app):
    Checkout.trigger(1, 100)
    assert _runs(ductwork_app) == 1


def test_second(ductwork_app):
    Checkout.trigger(2, 200)
    assert _runs(ductwork_app) == 1
"""


def _run_docs_example(pytester, *args):
    """docs/testing.md's files (pipelines, conftest, tests), and a check that each test
    starts with empty tables, run by pytest in a subprocess with the plugin."""
    from tests.integration.test_examples import read_page

    page = read_page(REPO / "docs" / "testing.md")
    written = [b.directive.removeprefix("file: ") for b in page.blocks if (b.directive or "").startswith("file: ")]
    assert written == ["orders/gateway.py", "orders/pipelines.py", "conftest.py", "test_orders.py"]
    for block in page.blocks:
        if (block.directive or "").startswith("file: "):
            target = pytester.path / block.directive.removeprefix("file: ")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
    (pytester.path / "test_fresh.py").write_text(FRESH)
    # -p: where ductwork is installed its entry point has loaded the plugin already (a no-op then)
    return pytester.runpytest_subprocess("-p", "ductwork.pytest_plugin", "-p", "no:cacheprovider",
                                         "-p", "no:xdist", "-q", *args, timeout=300)


def test_plugin_gives_each_test_a_fresh_sqlite_database(pytester, monkeypatch):
    monkeypatch.delenv("DUCTWORK_TEST_DATABASE_URL", raising=False)
    result = _run_docs_example(pytester)
    result.assert_outcomes(passed=5)


def test_plugin_uses_the_database_url_given(pytester, db_url):
    """The docs' failure-path tests (skip_delays) pass on every database, tables emptied per test."""
    result = _run_docs_example(pytester, f"--ductwork-database-url={db_url}")
    result.assert_outcomes(passed=5)


def test_plugin_loaded_by_its_entry_point_and_by_name_registers_once(pytester, monkeypatch, tmp_path):
    """As when ductwork is installed (the pytest11 entry point of pyproject.toml) and a
    conftest or ``-p`` names the module too: one registration, no "already registered"."""
    import tomllib

    plugins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    target = name = "ductwork.pytest_plugin"  # (the other, ductwork_proof.pytest_plugin, is verify's)
    assert plugins[name] == target
    dist = tmp_path / "site" / "ductwork_entry_point_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ductwork-entry-point-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{name} = {target}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(dist.parent),
                                                                   os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makeconftest('pytest_plugins = ["ductwork.pytest_plugin"]')
    pytester.makepyfile(
        test_app="def test_app(ductwork_app):\n    assert ductwork_app.clock.offset.total_seconds() == 0\n")
    result = pytester.runpytest_subprocess("-p", "ductwork.pytest_plugin", "-p", "no:cacheprovider", "-q",
                                           timeout=300)
    result.assert_outcomes(passed=1)


def test_plugin_fixtures_do_not_collide_with_the_suites_own():
    import ductwork.pytest_plugin as plugin

    names = [name for name in vars(plugin) if hasattr(getattr(plugin, name), "_fixture_function_marker")]
    assert "ductwork_app" in names, names
    assert "ductwork_drain" in names, names
    assert all(name.lstrip("_").startswith("ductwork_") for name in names), names
