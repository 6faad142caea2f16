"""``pytest -m chaos``: a real fleet on each real database, attacked, then checked.

Each round (``ductwork_proof/harness.py``) runs two ``ductwork start`` hosts over the
chaos workload while a kill plan drawn from the seed SIGKILLs workers, advancers,
supervisors and whole hosts (some at armed fault checkpoints), terminates the
fleet's database connections from the server side, prunes the retained runs
(``ductwork prune``, sometimes killed inside a batch) and, where the database runs
in a container, restarts the server; then a quiet phase and a last prune, then the
independent history checkers.

Checks: INV-CLK-1, INV-LIM-1, INV-LIM-2, INV-LIM-3, INV-LIM-4, INV-LIM-8 (a key family's
ceiling; INV-LIM-1 and 2 on each partition), INV-ADV-1, INV-ADV-3,
INV-ADV-4, INV-EXE-1, INV-EXE-2, INV-EXE-3, INV-EXE-4, INV-EXE-5 (witness rows of bodies killed
with their process), INV-RUN-1, INV-REV-1, INV-REV-2, INV-REV-3, INV-HLT-1, INV-HLT-2,
INV-PRN-1, INV-PRN-2 (ductwork_proof/checkers.py), from recorded rows, witness rows and the
harness's reads around each prune. Halted runs of the revive pipelines are revived during
the round, each from two threads at once.

Sizes: ``DUCTWORK_CHAOS_SCALE`` (default 1: about 8 s of faults per round, a fault
every 0.35 s on average); ``DUCTWORK_CHAOS_ROUNDS`` (default 2 rounds per database, seeds
from 20261129 on); ``DUCTWORK_CHAOS_SEED`` (comma-separated seeds and ``a-b`` ranges)
replays a round exactly or soaks over a range. ``DUCTWORK_CHAOS_ARTIFACTS`` keeps the
histories (JSONL). Each round prints its seed and counts; the "chaos evidence" section
at the end of the run totals the process kills.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ductwork_proof.harness import ChaosRound, chaos_seeds, replay_command
from tests import databases, mutants
from tests.conftest import migrated

pytestmark = pytest.mark.chaos

SEEDS = chaos_seeds(dict(os.environ))
SCALE = int(os.environ.get("DUCTWORK_CHAOS_SCALE", "1"))


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def chaos_target(request, worker_id):
    """(backend, server or None): a container where one can be had (its faults need it)."""
    kind = request.param
    if kind == "sqlite":
        return kind, None
    server = databases.server_for_session(kind, worker_id, require_container=True)
    if isinstance(server, str):
        if os.environ.get("DUCTWORK_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"containerized {kind} required for the chaos suite: {server}")
        server = databases.server_for_session(kind, worker_id)
        if isinstance(server, str):
            pytest.skip(server)
    return kind, server


def _database(kind, server, tmp_path: Path, name: str) -> str:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/chaos.sqlite3"
    else:
        url = databases.fresh_database(server, databases.database_name(prefix=name, unique=True))
    return migrated(url)


def _report(record_property, kind: str, result) -> None:
    """Print the round's counts and hand them to the run's "chaos evidence" summary
    (tests/conftest.py), which a CI log keeps even under pytest-xdist."""
    print(result.summary())
    violations = sum(len(v) for v in result.violations.values())
    record_property("chaos", f"{kind}: {result.summary().split(';')[0]}; violations {violations}")


def _workdir(tmp_path: Path) -> Path:
    root = os.environ.get("DUCTWORK_CHAOS_ARTIFACTS")
    if not root:
        return tmp_path
    path = Path(root) / tmp_path.name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_round(chaos_target, seed, tmp_path, record_property):
    kind, server = chaos_target
    url = _database(kind, server, tmp_path, "chaos")
    result = ChaosRound(seed=seed, url=url, backend=kind, server=server, workdir=_workdir(tmp_path),
                        scale=SCALE).run()
    _report(record_property, kind, result)
    assert not result.violations, (
        f"{result.summary()}\nviolated: { {k: v[:5] for k, v in result.violations.items()} }\n"
        f"replay: {replay_command(kind, seed)}")
    assert result.counts["kills"] > 0
    assert result.counts["claims"] > 0


def _container(chaos_target):
    kind, server = chaos_target
    if kind == "sqlite":
        pytest.skip("SQLite has no server to freeze or kill")
    if getattr(server, "container", None) is None:
        pytest.skip(f"{kind} is not in a container here (set DOCKER_HOST; see docs/containers.md)")
    return kind, server


def test_paused_database_longer_than_reaper_timeout(chaos_target, tmp_path, record_property):
    """A frozen server (connections open) for longer than reaper_timeout: every process
    loses its lease and dies before any claim could be reaped from under it; after the
    thaw the fleet recovers on its own, loses nothing and never exceeds a limit."""
    kind, server = _container(chaos_target)
    from ductwork_proof.harness import SETTINGS

    pause_s = SETTINGS["supervisor"]["reaper_timeout"] + 2.0
    plan = [{"at_s": 2.0, "action": "pause_database", "pause_s": pause_s, "pick": 0.0, "host": "host-a",
             "down_s": 0.0}]
    url = _database(kind, server, tmp_path, "paused")
    result = ChaosRound(seed=1, url=url, backend=kind, server=server, workdir=_workdir(tmp_path),
                        plan=plan).run()
    _report(record_property, kind, result)
    assert not result.violations, result.violations


def test_killed_database_container_recovers(chaos_target, tmp_path, record_property):
    """The database server is SIGKILLed mid-run and started again: no manual action."""
    kind, server = _container(chaos_target)
    plan = [{"at_s": 2.0, "action": "kill_database", "down_s": 1.0, "pick": 0.0, "host": "host-a"}]
    url = _database(kind, server, tmp_path, "killed")
    result = ChaosRound(seed=2, url=url, backend=kind, server=server, workdir=_workdir(tmp_path),
                        plan=plan).run()
    _report(record_property, kind, result)
    assert not result.violations, result.violations


MUTANT_RUNS = [m for m in os.environ.get("DUCTWORK_CHAOS_MUTANTS", "").split(",") if m]


@pytest.mark.skipif(not MUTANT_RUNS, reason="opt-in: DUCTWORK_CHAOS_MUTANTS=no_key_lock,stale_fence_commits")
@pytest.mark.parametrize("mutant", MUTANT_RUNS or ["none"])
@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_detects_mutant(chaos_target, mutant, seed, tmp_path):
    """The same round with one guard removed from the fleet's engine must report a violation.

    Opt-in (a race may need several seeds to show): the evidence that the chaos checkers
    can fail. Prints which invariants were reported.
    """
    from ductwork_proof.harness import make_plan

    kind, server = chaos_target
    url = _database(kind, server, tmp_path, "mutant")
    plan = make_plan(seed, 8.0 * SCALE, connections=kind != "sqlite",
                     container=getattr(server, "container", None) is not None)
    # Zombies (a thawed host's threads) are what a fence exists for: freeze each host once.
    plan += [{"at_s": at, "action": "freeze_host", "host": host, "pick": 0.0, "down_s": 0.0}
             for at, host in ((2.5, "host-a"), (6.0, "host-b"))]
    plan.sort(key=lambda e: e["at_s"])
    copy = mutants.apply(mutant, tmp_path / "mutant")
    chaos = ChaosRound(seed=seed, url=url, backend=kind, server=server, workdir=_workdir(tmp_path),
                       scale=SCALE, mutant=mutant, engine_copy=copy, plan=plan)
    result = chaos.run()
    mutants.check_ran_patched(mutant, copy)  # the fleet ran the patched copy, not ductwork/
    reported = {inv: len(v) for inv, v in result.violations.items()}
    print(f"mutant {mutant} seed {seed} on {kind}: reported {reported or 'nothing'}; {result.summary()}")
    assert result.violations, f"mutant {mutant} went unnoticed by the chaos checkers ({result.summary()})"
