"""Testing helpers for users' pipelines: Run.steps() details, drain(skip_delays=True),
what DrainTimeout says, and the pytest plugin, on SQLite, PostgreSQL and MySQL.

Checks: INV-CLK-1 (skip_delays moves the one injectable clock, an OffsetClock; the
engine's retry and limit decisions are unchanged), INV-EXE-4 (retry budget: attempts
and halt after max_retry, read back from Run.steps()).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ductwork import Pipeline, Step
from ductwork.db.clock import OffsetClock
from ductwork.errors import ConfigError, DrainTimeout
from ductwork.testing import drain, waiting_for
from tests.conftest import installed, make_app

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


class Echo(Step):
    def __init__(self, n):
        self.n = n

    def execute(self):
        return self.n


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


def test_drain_timeout_says_what_each_run_waits_for(offset_app):
    runs = [WaitsTwoWays.trigger(1), WaitsTwoWays.trigger(2)]
    with pytest.raises(DrainTimeout) as raised:
        drain(offset_app, timeout=1, skip_delays=True)  # a rate's wait is never skipped
    message = str(raised.value)
    # a run whose vendor call got the hour's token settled, dampened; the others wait for the next
    waiting = [run for run in runs if run.refresh().status == "in_progress"]
    assert waiting
    assert all(run.status == "dampened" for run in runs if run not in waiting)
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
    with pytest.raises(DrainTimeout) as raised:
        drain(offset_app, timeout=0.5)  # the retry is an hour away
    assert re.search(rf"run {run.id} \(\S+:Flaky\) in_progress: branch \S+: step FailsFirst#0 retry 1 at "
                     r"\S+ \S+ after failure: builtins\.RuntimeError: try 1 fails", str(raised.value)), raised.value


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

    (name, target), = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][
        "pytest11"].items()
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
