"""Top-level test configuration: hypothesis profiles.

``HYPOTHESIS_PROFILE`` picks how hard property tests search:

- ``dev`` (default): quick feedback while editing.
- ``ci``: fixed seed (``derandomize``), reproduction blobs printed, sized so the
  whole suite fits the CI budget on 2 cores.
- ``deep``: long searches for a night run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from hypothesis import HealthCheck, Phase, settings

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    phases=list(Phase),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# --------------------------------------------------------------------------- databases
#
# One suite, parametrised over the three databases. SQLite always runs (a file
# per xdist worker); PostgreSQL and MySQL/MariaDB come from tests/databases.py
# (URL from the environment, else a testcontainers container, else a skip that
# says why). Each xdist worker migrates its own database once per session and
# every test starts from empty tables.

import pytest  # noqa: E402
import sqlalchemy as sa  # noqa: E402

BACKENDS = ("sqlite", "postgresql", "mysql")


def _migrated_url(kind: str, tmp_path_factory: pytest.TempPathFactory, worker_id: str, purpose: str = "") -> str:
    """A fresh migrated database of ``kind`` for this worker; ``purpose`` names another one
    beside the session's (a module's own, e.g. ``web``)."""
    from tests import databases

    if kind == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite' + purpose)}/ductwork.sqlite3"
    else:
        server = databases.server_for_session(kind, worker_id)
        if isinstance(server, str):
            databases.skip_or_fail(server)
        # DUCTWORK_TEST_DB_PREFIX lets two checkouts share one server without
        # dropping each other's databases (default: ductwork_test_<worker>).
        prefix = os.environ.get("DUCTWORK_TEST_DB_PREFIX", "ductwork_test") + (f"_{purpose}" if purpose else "")
        url = databases.fresh_database(server, databases.database_name(worker_id, prefix=prefix))
    return migrated(url)



@pytest.fixture(scope="session")
def worker_id(request: pytest.FixtureRequest) -> str:
    """pytest-xdist's worker id ("master" without xdist)."""
    return getattr(request.config, "workerinput", {}).get("workerid", "master")


@pytest.fixture(scope="session", params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> str:
    """A migrated database of each backend, private to this xdist worker."""
    return _migrated_url(request.param, tmp_path_factory, worker_id)


# The engine's configuration in tests, and emptying the tables between them: the conformance
# machines' own (ductwork_proof/conformance/factories.py, shipped with `ductwork verify`).
from ductwork_proof.conformance.factories import CONFIG as TEST_CONFIG  # noqa: E402
from ductwork_proof.conformance.factories import reset_tables  # noqa: E402
from ductwork_proof.scratch import migrated  # noqa: E402  (tests import it from here)


def spelled(value: object) -> str:
    """A parameter's id that shows it as ``repr`` does, with ``^`` for each backslash
    (``'x^t'`` for ``"x\\t"``): pytest cannot select by node id a test whose id holds a
    backslash, and mutmut selects each test that way (``python -m tests.mutation``)."""
    return repr(value).replace("\\", "^")


def installed(application):  # type: ignore[no-untyped-def]
    """For a fixture: ``application``'s tables emptied, it the default app while the test
    runs (``yield from installed(make_app(...))``), then disposed."""
    from ductwork.app import set_default_app

    reset_tables(application.engine)
    sa.event.listen(application.engine, "before_cursor_execute", _reads_only)
    set_default_app(application)
    try:
        yield application
    finally:
        set_default_app(None)
        application.dispose()


def _reads_only(conn, _cursor, statement: str, *_) -> None:  # type: ignore[no-untyped-def]
    """A read-only block (``App.begin(readonly=True)``) that writes fails the test: on
    PostgreSQL it runs outside a transaction block, so each write would commit alone."""
    verb = statement.lstrip().split(None, 1)[0].upper()
    reads = ("SELECT", "WITH", "BEGIN", "SHOW", "PRAGMA")
    if conn.get_execution_options().get("ductwork_readonly") and verb not in reads:
        raise AssertionError(f"a read-only block wrote: {statement[:120]}")


def migrated_sqlite(directory, name: str) -> str:  # type: ignore[no-untyped-def]
    """The URL of a fresh, migrated SQLite database ``<directory>/<name>.sqlite3``: for a test
    where one database is enough (what it checks is the same code on all three)."""
    return migrated(f"sqlite:///{directory}/{name}.sqlite3")


def race(fns):  # type: ignore[no-untyped-def]
    """Run the callables at once, each in its own thread, released together by a barrier;
    return their results in order (an exception in any is raised here)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    barrier = threading.Barrier(len(fns))

    def go(fn):  # type: ignore[no-untyped-def]
        barrier.wait(timeout=30)
        return fn()

    with ThreadPoolExecutor(len(fns)) as pool:
        return [f.result(timeout=60) for f in [pool.submit(go, fn) for fn in fns]]


def race_processes(target, *args, count: int = 3) -> list:  # type: ignore[no-untyped-def]
    """Run ``target(*args, start, out)`` in ``count`` spawned processes, released together by
    the ``start`` event; return what each put on the ``out`` queue (each must exit 0).
    ``target`` is a module-level function: a spawned process imports it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, start, out)) for _ in range(count)]
    for proc in procs:
        proc.start()
    start.set()
    got = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    return got


def make_app(url: str, *, clock=None, config=None, **section):  # type: ignore[no-untyped-def]
    """An App on ``url`` with the test config, optionally overridden per section."""
    import copy

    from ductwork.app import App
    from ductwork.config import Config

    body = copy.deepcopy(TEST_CONFIG)
    for name, values in section.items():
        body.setdefault(name, {}).update(values)
    return App(url, config or Config.from_section(body, source="<tests>"), clock)


def skip_ahead(app, by) -> None:  # type: ignore[no-untyped-def]
    """Move the app's OffsetClock ``by`` (a timedelta) ahead of its time now."""
    with app.begin(readonly=True) as tx:
        now = tx.now
    app.clock.skip_to(now + by, now)


@pytest.fixture
def app(db_url: str):  # type: ignore[no-untyped-def]
    """A fresh app (database clock) on each backend, tables empty, made the default."""
    yield from installed(make_app(db_url))


def installed_on_manual_clock(url: str, **section):  # type: ignore[no-untyped-def]
    """For a fixture: ``installed`` for an app on a ManualClock at 2026-01-01 12:00 that only
    moves when a test (or drain) moves it, the test config overridden per section
    (``yield from installed_on_manual_clock(db_url, job_worker={"limits": ...})``)."""
    from datetime import datetime

    from ductwork.db.clock import ManualClock

    yield from installed(make_app(url, clock=ManualClock(datetime(2026, 1, 1, 12, 0, 0)), **section))


@pytest.fixture
def manual_app(db_url: str):  # type: ignore[no-untyped-def]
    """Like ``app`` but on a ManualClock that only moves when a test (or drain) moves it."""
    yield from installed_on_manual_clock(db_url)


def _terminated(signum, _frame):  # type: ignore[no-untyped-def]
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):  # type: ignore[no-untyped-def]
    config.addinivalue_line("markers", "needs(capability): runs only on backends with it (tests/capabilities.py)")
    # A SIGTERM (``timeout``, CI cancelling) ends the session the way Ctrl-C does, so
    # fixtures tear down and ductwork_proof/fleet.py's exit hook kills the fleets this process
    # started; Python's default for SIGTERM is to die at once and leave them running.
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


#: the nightly command's profile: with it, the tests marked ``nightly`` run too
NIGHTLY_PROFILE = "deep"


def pytest_collection_modifyitems(items):  # type: ignore[no-untyped-def]
    """Skip a ``@pytest.mark.nightly`` test, saying so, unless the nightly command runs
    (``HYPOTHESIS_PROFILE=deep``, CONTRIBUTING.md "Test tiers"): a second path of something
    CI already proves once, kept out of the 30-minute CI budget."""
    if os.environ.get("HYPOTHESIS_PROFILE") == NIGHTLY_PROFILE:
        return
    skip = pytest.mark.skip(reason="nightly: runs with HYPOTHESIS_PROFILE=deep (CONTRIBUTING.md, the nightly command)")
    for item in items:
        if item.get_closest_marker("nightly"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def backend_filter(request):  # type: ignore[no-untyped-def]
    """Skip a ``@needs(...)`` test on a backend without the capability, saying why."""
    marker = request.node.get_closest_marker("needs")
    if marker is None or "db_url" not in request.fixturenames:
        return
    from tests.capabilities import CAPABILITIES

    backends, reason = CAPABILITIES[marker.args[0]]
    backend = request.node.callspec.params.get("db_url") if hasattr(request.node, "callspec") else None
    if backend is not None and backend not in backends:
        pytest.skip(f"{marker.args[0]}: {reason}")


@pytest.fixture(autouse=True)
def no_fleet_left_running(request):  # type: ignore[no-untyped-def]
    """Fail a test that leaves a ``ductwork start`` fleet of its own running (ductwork_proof/fleet.py's
    ``Fleet``), and kill it, children included, so the next tests do not share the machine
    with it. A leaked fleet keeps polling, replacing workers and loading a 2-core machine
    for the rest of the run (a CI run was starved that way by a chaos round that raised
    before stopping its hosts). Only fleets started by this process are seen."""
    yield
    import sys

    fleet_module = sys.modules.get("ductwork_proof.fleet")
    if fleet_module is None:  # no test of this process has started a fleet
        return
    fleets = [fleet for fleet in fleet_module._LIVE if not fleet.shared]  # a module fixture stops a shared one
    running = sorted(f.label for f in fleets if f.proc is not None and f.proc.poll() is None)
    for fleet in fleets:  # exited or not: a stopped supervisor's children may still run
        fleet.kill_host()
    if running:
        pytest.fail(f"{request.node.nodeid} left {len(running)} ductwork fleet(s) running: "
                    f"{', '.join(running)} (killed); stop each in a finally or use it as a context manager")


TIERS = ("lint", "unit", "properties", "integration", "chaos")
TIER_SECONDS: dict[str, float] = {}
TIER_TESTS: dict[str, int] = {}


def tier(nodeid: str) -> str:
    """The tier of a test: its directory under tests/ (``tests/unit/test_x.py::t`` -> ``unit``),
    or ``other`` for a test elsewhere."""
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def pytest_runtest_logreport(report):  # type: ignore[no-untyped-def]
    """Sum each test's setup, call and teardown durations by tier, and count the tests of
    each tier (once each: at its call, or at its setup when that did not pass, as for a
    skip). On pytest-xdist's controller this sees every worker's reports, so the sums are
    over all workers (CPU-ish time, not the run's wall time); the summary prints them as
    ``ci: tier times`` and ``ci: tier tests``."""
    name = tier(report.nodeid)
    TIER_SECONDS[name] = TIER_SECONDS.get(name, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        TIER_TESTS[name] = TIER_TESTS.get(name, 0) + 1


def _tier_order(names: Iterable[str]) -> list[str]:
    """The tiers in TIERS's order, then any other."""
    return [name for name in TIERS if name in names] + sorted(set(names) - set(TIERS))


def tier_times_line(seconds: dict[str, float]) -> str:
    """``ci: tier times unit 12 s, properties 210 s, … (summed test durations)``: each tier
    only if it ran (tests/evidence.py parses it)."""
    return ("ci: tier times " + ", ".join(f"{name} {seconds[name]:.0f} s" for name in _tier_order(seconds))
            + " (summed test durations)")


def tier_tests_line(tests: dict[str, int]) -> str:
    """``ci: tier tests unit 1265, properties 310, … (passed, failed or skipped)``: each
    tier only if it ran (tests/evidence.py parses it)."""
    return ("ci: tier tests " + ", ".join(f"{name} {tests[name]}" for name in _tier_order(tests))
            + " (passed, failed or skipped)")


def pytest_terminal_summary(terminalreporter):  # type: ignore[no-untyped-def]
    """A "chaos evidence" section: what each chaos round did and checked (kills, runs,
    steps, claims, violations), recorded by tests/chaos/test_chaos.py with
    ``record_property``; an "engine mutants" section: INVARIANTS.md's engine-mutant
    table, a row per mutant killed in this run (tests/properties/test_mutants.py); and a
    "tier times" section, a ``ci: tier times …`` and a ``ci: tier tests …`` line
    (:func:`tier_times_line`, :func:`tier_tests_line`). The
    properties travel with pytest-xdist's reports."""
    lines, rows = [], []
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", []):
                if name == "chaos":
                    lines.append(f"{outcome} {report.nodeid.split('::')[-1]}: {value}")
                elif name == "engine_mutant":
                    rows.append(value)
    if lines:
        terminalreporter.section("chaos evidence")
        for line in sorted(lines):
            terminalreporter.line(line)
        kills = sum(int(found.group(1)) for line in lines if (found := re.search(r"\bkills (\d+)", line)))
        terminalreporter.line(f"process kills in all rounds: {kills} ({len(lines)} rounds)")
    if rows:
        terminalreporter.section("engine mutants")
        terminalreporter.line("| mutant | guard removed | detector | killed in |")
        terminalreporter.line("|---|---|---|---:|")
        for row in sorted(rows, key=_mutant_order):
            terminalreporter.line(row)
    if TIER_SECONDS:
        terminalreporter.section("tier times")
        terminalreporter.line(tier_times_line(TIER_SECONDS))
        terminalreporter.line(tier_tests_line(TIER_TESTS))


def _mutant_order(row: str) -> int:
    """The registry's order (tests/mutants.py), which INVARIANTS.md's table follows."""
    from tests.mutants import MUTANTS

    name = row.split("`")[1]
    return list(MUTANTS).index(name)
