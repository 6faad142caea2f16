"""``pytest -m chaos`` in an adopter's repository: ductwork's proof on their database.

    pytest -m chaos --ductwork-verify-url "$DATABASE_URL" --ductwork-verify-config ductwork.yml

Installing ``ductwork[verify]`` registers this plugin (the ``pytest11`` entry point
``ductwork_proof.pytest_plugin``; ``-p no:ductwork_proof.pytest_plugin`` turns it off). It
does nothing unless a URL is given (the option, or ``DUCTWORK_VERIFY_URL``). Then it adds
test items, marked ``chaos``, under ``ductwork-verify``: one for the environment checks,
one per conformance machine and **one per invariant** (``ductwork-verify::INV-LIM-1``…).
The first item to run runs ``ductwork verify`` once (:func:`ductwork_proof.verify.verify`,
in a scratch database on that server); each item then passes, fails with the violations and
the replay command, or skips when verify does not check its invariant.

Options: ``--ductwork-verify-url``, ``--ductwork-verify-config`` (their ``ductwork.yml``:
its limits run on synthetic keys), ``--ductwork-verify-seed``, ``--ductwork-verify-rounds``,
``--ductwork-verify-quick``, ``--ductwork-verify-report DIR``.

For the adopter's own pipelines, the fixture ``ductwork_chaos`` runs one under kills:

    def test_sync_orders_under_kills(ductwork_chaos):
        result = ductwork_chaos(SyncOrders, inputs=["2026-01-01", "2026-01-02"],
                                limits={"shop_api": {"concurrency": 2}})
        assert result.ok, result.violations

It starts two ``ductwork start`` hosts on a scratch database (the verify URL's server, else
a SQLite file), triggers one run per input, SIGKILLs workers, advancers, supervisors and
hosts on a seeded plan while they work, waits until every run has settled and checks the
history: successors created exactly once (INV-ADV-1), fan-ins fired once (INV-ADV-3), the
limits (INV-LIM-1 to 4 on the claims), no lost work and runs that settle (INV-EXE-1,
INV-RUN-1), and the rest of :data:`ductwork_proof.checkers.CHECKERS`. The step bodies are
the adopter's: they run at least once each, and as often again as the kills make them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ductwork_proof.invariants import STATEMENTS

URL_ENV = "DUCTWORK_VERIFY_URL"
#: the items' names besides the invariants'
PARTS = ("environment", "CONF-LIMITS", "CONF-PIPELINES")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ductwork-verify", "ductwork verify: the proof on your database")
    group.addoption("--ductwork-verify-url", default=None, metavar="URL",
                    help=f"run ductwork verify on this server as chaos-marked items (default ${URL_ENV}; "
                         "unset: no items)")
    group.addoption("--ductwork-verify-config", default=None, metavar="PATH",
                    help="your ductwork.yml: its limits run on synthetic keys")
    group.addoption("--ductwork-verify-seed", default=None, type=int, metavar="S")
    group.addoption("--ductwork-verify-rounds", default=None, type=int, metavar="N")
    group.addoption("--ductwork-verify-quick", action="store_true", default=False)
    group.addoption("--ductwork-verify-report", default=None, metavar="DIR",
                    help="write report.json and report.html here")


def _url(config: pytest.Config) -> str | None:
    value = config.getoption("ductwork_verify_url") or os.environ.get(URL_ENV)
    return str(value) if value else None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: ductwork's proof: process kills against a real database")


class _Verification:
    """Runs ``ductwork verify`` once per session, for whichever item asks first."""

    def __init__(self, config: pytest.Config, url: str):
        self.config, self.url = config, url
        self.result: Any = None

    def get(self) -> Any:
        if self.result is None:
            from ductwork_proof.verify import Options, verify

            report = self.config.getoption("ductwork_verify_report")
            opts = Options(self.url, config=self.config.getoption("ductwork_verify_config"),
                           seed=self.config.getoption("ductwork_verify_seed"),
                           rounds=self.config.getoption("ductwork_verify_rounds"),
                           quick=bool(self.config.getoption("ductwork_verify_quick")),
                           report=Path(report) if report else None)
            self.result = verify(opts, out=lambda _line: None)
        return self.result


class VerifyItem(pytest.Item):
    def __init__(self, *, check_id: str, verification: _Verification, **kwargs: Any):
        super().__init__(**kwargs)
        self.check_id, self.verification = check_id, verification
        self.add_marker(pytest.mark.chaos)

    def runtest(self) -> None:
        result = self.verification.get()
        if self.check_id == "environment":
            checks = result.environment
        else:
            checks = [c for c in (*result.conformance, *result.invariants) if c.id == self.check_id]
        failed = [c for c in checks if c.passed is False]
        if failed:
            lines = [f"{c.id}: {c.statement} ({c.checker})" for c in failed]
            lines += [f"  {f}" for c in failed for f in c.findings[:5]]
            lines += [f"  {c.detail}" for c in failed if c.detail]
            raise VerifyFailed("\n".join([*lines, f"seed {result.seed}"]))
        if not any(c.passed for c in checks):
            pytest.skip(f"{self.check_id}: " + ("; ".join(c.detail for c in checks) or "not checked"))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, VerifyFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        return Path("ductwork-verify"), 0, f"ductwork verify: {self.check_id}"


class VerifyFailed(Exception):
    """A check of ``ductwork verify`` did not hold."""


class VerifyCollector(pytest.Collector):
    def __init__(self, *, verification: _Verification, **kwargs: Any):
        super().__init__(**kwargs)
        self.verification = verification

    def collect(self) -> list[pytest.Item]:
        return [VerifyItem.from_parent(self, name=name, check_id=name, verification=self.verification)
                for name in (*PARTS, *STATEMENTS)]


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the items are chaos-marked like any
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    url = _url(config)
    if url is None:
        return
    collector = VerifyCollector.from_parent(session, name="ductwork-verify",
                                            verification=_Verification(config, url))
    items.extend(collector.collect())


# -- the adopter's own pipeline under kills ------------------------------------------------------


@dataclass
class ChaosOutcome:
    """What ``ductwork_chaos`` found: violations by invariant (empty: every checker held),
    the round's counts and its history file."""

    violations: dict[str, list[str]]
    counts: dict[str, int]
    history_path: Path
    seed: int

    @property
    def ok(self) -> bool:
        return not self.violations


@pytest.fixture
def ductwork_chaos(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., ChaosOutcome]:
    """``ductwork_chaos(pipeline, inputs, *, limits=None, seed=1)``: the pipeline's runs
    under a seeded kill plan on a real fleet, then the history checkers (module docstring)."""
    url = _url(request.config)

    def run(pipeline: type, inputs: list[Any], *, limits: Mapping[str, Any] | None = None,
            seed: int = 1) -> ChaosOutcome:
        from ductwork_proof.harness import ChaosRound
        from ductwork_proof.scratch import migrated, scratch_database
        from ductwork_proof.verify import backend_of
        from ductwork_proof.workload import AdopterShapes

        shapes = AdopterShapes(limits=dict(limits or {}), runs=[(pipeline, value) for value in inputs])
        base = url or f"sqlite:///{tmp_path}/chaos.sqlite3"
        with scratch_database(base) as scratch:
            outcome = ChaosRound(seed=seed, url=migrated(scratch), backend=backend_of(scratch), workdir=tmp_path,
                                 adopter=shapes, builtin=False).run()
        return ChaosOutcome(outcome.violations, outcome.counts, outcome.history_path, seed)

    return run
