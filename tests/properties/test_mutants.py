"""Every engine mutant is killed by the test that is meant to catch it.

``ductwork/mutants.py`` lists variants of the engine each missing one guard. For
each, this runs its detector — a property machine, a race test, an
exactly-once test or a fault-checkpoint test — in a fresh pytest process with
``DUCTWORK_MUTANT`` set (and hypothesis shrinking off), and expects it to fail.
A mutant that survives is a guard nobody has verified. Times to the first
counterexample are printed (``-s``) and recorded in INVARIANTS.md.

Checks the detectors of: INV-LIM-1, INV-LIM-2, INV-LIM-4, INV-LIM-5, INV-LIM-6,
INV-CLK-1, INV-ADV-2, INV-ADV-3, INV-EXE-2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ductwork.mutants import MUTANTS

CONFORMANCE = "tests/properties/test_conformance_limits.py::test_limits_engine_agrees_with_model[sqlite]"
DETECTORS = {
    "no_stamp": CONFORMANCE,
    "no_clamp": CONFORMANCE,
    "float_refill": CONFORMANCE,
    "no_spend_on_retry": CONFORMANCE,
    "unkeyed_first": CONFORMANCE,
    "hand_off_any_lane": "tests/integration/test_limits.py::test_a_hand_off_yields_to_an_older_lane[sqlite]",
    "count_outside_lock":
        "tests/integration/test_lock_races.py::test_racing_claims_on_a_key_serialise_on_its_lock[postgresql]",
    "no_key_lock":
        "tests/integration/test_lock_races.py::test_racing_claims_on_a_key_serialise_on_its_lock[postgresql]",
    "clock_before_lock":
        "tests/integration/test_lock_races.py::test_a_claims_time_is_read_after_the_key_lock[postgresql]",
    "batch_past_lane": "tests/integration/test_batches.py::test_a_batch_stops_before_an_older_keyed_lane[sqlite]",
    "batch_no_guard":
        "tests/integration/test_batches.py::test_a_group_commit_leaves_a_reaped_execution_to_the_reaper[sqlite]",
    "stale_fence_commits": "tests/integration/test_exactly_once.py::test_stale_token_commits_nothing[sqlite]",
    "fanin_outside_fence":
        "tests/integration/test_fault_checkpoints.py::test_checkpoint[sqlite-before_fanin_bump-raise]",
}


def test_every_mutant_has_a_detector():
    assert set(DETECTORS) == set(MUTANTS)


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_killed(mutant):
    detector = DETECTORS[mutant]
    if "[postgresql]" in detector and not os.environ.get("DUCTWORK_TEST_POSTGRES_URL"):
        pytest.skip("this detector needs PostgreSQL row locks: set DUCTWORK_TEST_POSTGRES_URL")
    env = {**os.environ, "DUCTWORK_MUTANT": mutant, "DUCTWORK_NO_SHRINK": "1", "HYPOTHESIS_PROFILE": "ci"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", detector, "-x", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly"], env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    print(f"mutant {mutant}: {'killed' if done.returncode == 1 else 'SURVIVED'} by {detector} in {took:.1f} s")
    assert done.returncode == 1, f"mutant {mutant} survived {detector}:\n{done.stdout[-3000:]}"
