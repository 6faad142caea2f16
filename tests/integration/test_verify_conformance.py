"""``run_conformance``: the conformance machines as ``ductwork verify`` runs them, outside pytest's
hypothesis profiles, on each database.

A small budget passes on the three databases with both checks counted; one seed makes the
same examples (the digest of what they did is the same; another seed's differs); a broken
engine (a claim decision that admits one more than a key's concurrency) is caught with
the falsifying example in the findings, where the same seed and budget pass the real
engine; hypothesis's example database stays off and the caller's hypothesis profile is
restored.

Checks: INV-LIM-1 (the broken decision is caught), INV-LIM-6.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import settings

from ductwork_proof.conformance import run_conformance
from ductwork_proof.conformance.pipelines import HUNTS

#: small budgets: the checks' machinery, not a search (the property tier searches)
EXAMPLES, STEPS = 2, 15


def digest(check) -> str:
    found = re.search(r"examples digest ([0-9a-f]{16})", check.detail)
    assert found, f"{check.id}: no digest in its detail {check.detail!r}"
    return found.group(1)


def test_both_machines_pass_and_count_what_they_ran(db_url):
    before = settings.get_current_profile_name()
    checks = run_conformance(db_url, seed=11, examples=EXAMPLES, steps=STEPS)
    assert settings.get_current_profile_name() == before, "the caller's hypothesis profile was not restored"
    assert [c.id for c in checks] == ["CONF-LIMITS", "CONF-PIPELINES"]
    limits, pipelines = checks
    for check in checks:
        assert check.passed is True, f"{check.id} failed on {db_url.split(':')[0]}: {check.findings}"
        assert check.findings == []
        assert check.statement
        assert "seed 11" in check.detail
    assert limits.checker == "LimitsAgainstModel"
    assert limits.counts["examples"] >= EXAMPLES
    assert limits.counts["steps"] >= limits.counts["examples"]  # each example's setup is a step
    assert pipelines.counts["hunts"] == len(HUNTS)
    assert all(pipelines.counts[name] >= EXAMPLES for name in HUNTS), pipelines.counts
    assert pipelines.counts["examples"] == sum(pipelines.counts[name] for name in HUNTS)


def test_one_seed_makes_the_same_examples_and_another_seed_others(tmp_path):
    from tests.conftest import migrated_sqlite

    url = migrated_sqlite(tmp_path, "seeded")
    first, again, other = (run_conformance(url, seed=seed, examples=EXAMPLES, steps=STEPS) for seed in (5, 5, 6))
    assert [digest(c) for c in first] == [digest(c) for c in again]
    assert [c.counts for c in first] == [c.counts for c in again]
    for mine, theirs in zip(first, other, strict=True):
        assert digest(mine) != digest(theirs), f"{mine.id}: seeds 5 and 6 made the same examples"


def test_a_claim_decision_that_admits_one_more_than_the_concurrency_is_caught(tmp_path, monkeypatch):
    """The engine's key decision on SQLite (``plan`` calls ``buckets.decide``) told one
    fewer execution is in flight than there is: the machine's claims go past a key's
    concurrency, and the model's do not. The same seed and budget pass the real engine.
    Nothing is written in hypothesis's storage directory (the failure would be saved in an
    example database that was on), and it is the caller's again after."""
    from hypothesis import configuration

    from ductwork.limits import plan
    from tests.conftest import migrated_sqlite

    url = migrated_sqlite(tmp_path, "broken")
    home = tmp_path / "hypothesis-home"  # where hypothesis would write: its example database, its caches
    monkeypatch.setattr(configuration, "__hypothesis_home_directory", home)
    # (every example starts with a batch across a key's limit, ``fill_a_key``: measured over
    # seeds 1-20, each finds this decision within its first example; before that rule, 9
    # of 20 did within 5 examples, so the seed here had to be picked)
    budget = {"seed": 9, "examples": 3, "which": ("limits",), "shrink": False}
    (real,) = run_conformance(url, **budget)
    assert real.passed is True, real.findings
    decide = plan.decide
    monkeypatch.setattr(plan, "decide", lambda entry, buckets, in_flight, now_us:
                        decide(entry, buckets, max(0, in_flight - 1), now_us))
    (broken,) = run_conformance(url, **budget)
    assert broken.passed is False, f"the broken decision passed: {broken.counts}"
    (finding,) = broken.findings
    assert finding.startswith("AssertionError: INV-LIM-"), finding[:500]
    assert "Falsifying example:" in finding, finding[:2000]
    assert "state.setup(limits=" in finding, finding[:2000]
    assert "seed 9" in broken.detail
    assert not home.exists(), f"hypothesis wrote under its storage directory: {sorted(home.rglob('*'))[:5]}"
    assert configuration.storage_directory(intent_to_write=False).home_directory == home


def test_an_unknown_machine_is_refused():
    with pytest.raises(ValueError, match=r"unknown conformance machine\(s\) \['chaos'\]"):
        run_conformance("sqlite://", seed=1, examples=1, which=("limits", "chaos"))


def test_the_machines_import_neither_the_test_suite_nor_model(tmp_path):
    """An adopter has no ``tests`` package and the model as ``ductwork_model`` only: the
    shipped machines import every module of theirs from outside the repository (the
    checkout on the path, so an import of ``tests`` or ``model`` would succeed and show)."""
    import subprocess
    import sys
    from pathlib import Path

    import ductwork_proof.conformance

    package = Path(ductwork_proof.conformance.__file__).resolve().parent
    root = package.parents[1]
    modules = sorted(f"ductwork_proof.conformance.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__")
    probe = (f"import sys\nimport {', '.join(modules)}\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tests', 'model')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported from the test suite or as model: {done.stdout}"
    assert len(modules) >= 6, modules
