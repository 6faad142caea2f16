"""``ductwork verify`` end to end, as an adopter runs it (docs/verify.md).

- on PostgreSQL and MariaDB: ``ductwork verify --quick`` with an adopter's ``ductwork.yml``
  (a limit with a rate, a key family, a pipeline of their own) passes, writes its report,
  runs the adopter's limit on a synthetic key and the family on a synthetic family, and
  leaves no scratch database behind;
- on SQLite: the same proof through the adopter's pytest plugin (``pytest -m chaos
  --ductwork-verify-url``), one item per invariant, and ``ductwork_chaos`` running an
  adopter's own pipeline under kills;
- an engine with one guard removed (an engine mutant, applied to a copy the fleet runs)
  makes ``ductwork verify`` fail, naming the invariant and printing the replay command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests import databases, mutants

pytestmark = pytest.mark.chaos

SEED = 20261206
ADOPTER_CONFIG = textwrap.dedent("""\
    default:
      pipelines: ["shop:SyncOrders"]
      job_worker:
        limits:
          shop_api: {concurrency: 2, rate: {limit: 5, per: 1s, burst: 2}}
          shop_tenant: {per_partition: {concurrency: 1, rate: {limit: 10, per: 1s}}, concurrency: 2}
""")
ADOPTER_PIPELINES = textwrap.dedent("""\
    from ductwork import Pipeline, Step


    class Fetch(Step):
        def __init__(self, day):
            self.day = day

        def execute(self):
            return [1, 2, 3]


    class Push(Step):
        def __init__(self, order):
            self.order = order

        def execute(self):
            return self.order


    class Count(Step):
        def __init__(self, orders):
            self.orders = orders

        def execute(self):
            return len(self.orders)


    class SyncOrders(Pipeline):
        @classmethod
        def define(cls, p):
            p.start(Fetch).expand(to=Push, limit_by="shop_api").collapse(into=Count)
""")


def _project(tmp_path: Path) -> Path:
    """An adopter's project: their pipelines module and ductwork.yml."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "shop.py").write_text(ADOPTER_PIPELINES)
    (project / "ductwork.yml").write_text(ADOPTER_CONFIG)
    return project


def _server_url(kind: str, worker_id: str) -> str:
    server = databases.server_for_session(kind, worker_id)
    if isinstance(server, str):
        pytest.skip(server)
    return server.url


def _verify(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ductwork.cli", "verify", *args], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=600)


def _scratch_databases(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                names = conn.execute(sa.text("SELECT datname FROM pg_database")).scalars()
            else:
                names = conn.execute(sa.text("SHOW DATABASES")).scalars()
            return {n for n in names if n.startswith("ductwork_verify_")}
    finally:
        engine.dispose()


# MariaDB's run is nightly: its scratch database, environment checks, conformance and chaos
# are each proven on it by test_verify_environment.py, test_verify_conformance.py and tests/chaos
@pytest.mark.parametrize("kind", ["postgresql", pytest.param("mysql", marks=pytest.mark.nightly)])
def test_verify_quick_passes_with_the_adopters_limits_and_leaves_no_scratch_database(kind, tmp_path, worker_id):
    url = _server_url(kind, worker_id)
    project = _project(tmp_path)
    done = _verify(["--database-url", url, "-c", "ductwork.yml", "--quick", "--seed", str(SEED),
                    "--report", str(tmp_path / "report")], project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: passed" in done.stdout
    for part in ("environment:", "conformance:", "chaos round 1", "invariants:"):
        assert part in done.stdout, done.stdout
    # what of the adopter's config the rounds run, said before them
    assert "your limits, each on a synthetic key in every round: verify:shop_api, verify:shop_tenant (a key family)" \
        in done.stdout, done.stdout
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["ok"]
    assert report["seed"] == SEED
    assert report["backend"] == kind
    assert report["limits"]["verify:shop_api"] == {"concurrency": 2, "rate": [{"limit": 5, "per": "1s", "burst": 2}]}
    assert report["limits"]["verify:shop_tenant"] == {  # a key family: its partitions and ceiling
        "per_partition": {"concurrency": 1, "rate": [{"limit": 10, "per": "1s", "burst": 10}]}, "concurrency": 2}
    assert report["pipelines"] == ["shop:SyncOrders"]
    assert {c["id"] for c in report["conformance"]} == {"CONF-LIMITS", "CONF-PIPELINES"}
    checked = {c["id"] for c in report["invariants"] if c["passed"]}
    assert {"INV-LIM-1", "INV-LIM-2", "INV-LIM-8", "INV-ADV-1", "INV-EXE-1", "INV-RUN-1"} <= checked
    (chaos_round,) = report["rounds"]
    assert chaos_round["counts"]["kills"] > 0
    assert chaos_round["counts"]["claims"] > 0
    history = Path(chaos_round["history_path"]).read_text()
    assert '"verify:shop_api"' in history  # the adopter's limit ran, on its synthetic key
    assert '"verify:shop_tenant[\\"acct-1\\"]"' in history  # and its family, on a synthetic family's partitions
    assert (tmp_path / "report" / "report.html").stat().st_size > 0
    # each part ran in a scratch database of its own, and each is gone (this run's: a test
    # on another xdist worker may create and drop its own meanwhile)
    used = {make_url(u).database for u in report["databases"]}
    assert len(used) == 3, report["databases"]
    assert all(n.startswith("ductwork_verify_") for n in used), report["databases"]
    assert not used & _scratch_databases(url)


def test_a_broken_engine_fails_verify_naming_the_invariant(tmp_path, worker_id):
    """The lane routine admitting a claim at the key's concurrency (engine mutant
    ``routine_ceiling_off_by_one``), in the copy of ductwork the fleet runs."""
    url = _server_url("postgresql", worker_id)
    copy = mutants.apply("routine_ceiling_off_by_one", tmp_path / "mutant")
    done = _verify(["--database-url", url, "--only", "chaos", "--rounds", "1", "--seed", str(SEED)], tmp_path,
                   env=mutants.environ(copy))
    mutants.check_ran_patched("routine_ceiling_off_by_one", copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL INV-LIM-1" in done.stdout, done.stdout
    assert "verdict: FAILED: INV-LIM-1" in done.stdout
    assert f"ductwork verify --database-url {url.split('://')[0]}" in done.stdout  # the replay command
    assert "--rounds 1 --only chaos" in done.stdout


PLUGIN_TEST = textwrap.dedent("""\
    import pytest

    from shop import SyncOrders


    @pytest.mark.chaos
    def test_sync_orders_under_kills(ductwork_chaos):
        outcome = ductwork_chaos(SyncOrders, inputs=list(range(4)),
                                 limits={"shop_api": {"concurrency": 2}}, seed=3)
        assert outcome.counts["kills"] > 0
        assert outcome.ok, outcome.violations
""")


def test_the_adopters_pytest_runs_the_proof_one_item_per_invariant_on_sqlite(tmp_path):
    project = _project(tmp_path)
    (project / "test_shop.py").write_text(PLUGIN_TEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "chaos", "-p", "no:cacheprovider", "-q", "-rs",
         "--ductwork-verify-url", f"sqlite:///{tmp_path}/verify.sqlite3", "--ductwork-verify-quick",
         "--ductwork-verify-seed", str(SEED), "--ductwork-verify-config", "ductwork.yml",
         "--ductwork-verify-report", str(tmp_path / "report")],
        cwd=project, text=True, capture_output=True, timeout=900,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    not_checked = sum(1 for c in report["invariants"] if c["passed"] is None)
    checked = len(report["invariants"]) - not_checked
    # the environment, two machines, each invariant checked; and the adopter's own test
    assert f"{3 + checked + 1} passed, {not_checked} skipped" in done.stdout, done.stdout
    assert "INV-LIM-7: not checked by ductwork verify" in done.stdout  # skipped, saying why


def test_keep_says_which_scratch_database_it_left(tmp_path):
    """With ``--keep`` the output and the report name the scratch database left behind,
    so it can be opened and then dropped by hand."""
    given = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    done = _verify(["--database-url", given, "--only", "environment", "--keep", "--report",
                    str(tmp_path / "report")], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (kept,) = json.loads((tmp_path / "report" / "report.json").read_text())["databases"]
    assert f"  kept: {kept}" in done.stdout
    assert Path(make_url(kept).database).exists()
