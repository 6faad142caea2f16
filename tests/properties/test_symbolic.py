"""CrossHair's symbolic checks of the exact limit arithmetic (``tests/symbolic.py``).

Checks, for every integer input CrossHair explores: a bucket never holds more than its
burst nor less than zero and a refill adds exactly ``dt × limit`` units [INV-LIM-4];
refill is monotone and additive; the next-token instant is exact, a claim one µs
before it refused and at it admitted [INV-LIM-5]; a spend takes exactly one token;
model and engine agree; periods render and parse back, and both parsers agree.

The checks run in a child process (``python -m tests.symbolic --json``): CrossHair
installs its own tracer, which must not meet a coverage tracer or pytest's in this
process, and a child's CPU-time budget per contract bounds the run (about 25 s for the
twelve contracts at 4 CPU s each, on a 2-core machine). The run fails on any
counterexample; the contracts CrossHair proves in a fraction of their budget must stay
proven (a change that makes the arithmetic opaque to the solver shows up here); and a
deliberately broken variant of each function must be caught, or the checks prove nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PER_CONTRACT_CPU_S = 4.0

#: proven (every path explored) in under 0.5 CPU s of their 4 s each when written
MUST_BE_PROVEN = {
    "check_engine_refill_within_capacity",
    "check_engine_refill_is_exact",
    "check_engine_refill_monotone_and_additive",
    "check_engine_next_token_is_exact_on_refill",
    "check_model_refill_within_capacity",
    "check_model_next_token_is_exact",
    "check_model_spend",
    "check_model_and_engine_agree",
}

pytestmark = pytest.mark.slow


def _run(*args: str, timeout_s: float, cpu_s: float = PER_CONTRACT_CPU_S) -> dict[str, dict]:
    # CrossHair stays out of this process (its tracer belongs in the child); missing is a
    # failure, not a skip: the test extra installs it
    assert importlib.util.find_spec("crosshair"), "crosshair-tool is missing: pip install -e '.[test]'"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # nor does coverage measure the child: two tracers in one interpreter would distort both
    env.pop("COVERAGE_PROCESS_START", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.symbolic", "--json", "--timeout", str(cpu_s), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    results = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert results, f"no result from tests.symbolic (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return results


def test_no_counterexample_to_the_limit_arithmetic():
    from tests.symbolic import CHECKS

    results = _run(timeout_s=600)
    assert set(results) == {fn.__name__ for fn in CHECKS}
    found = {name: r["detail"] for name, r in results.items() if r["outcome"] == "counterexample"}
    assert not found, f"CrossHair found counterexamples: {found}"
    not_proven = {name: results[name]["outcome"] for name in MUST_BE_PROVEN if results[name]["outcome"] != "proven"}
    if not_proven and set(not_proven.values()) == {"timed out"}:
        # CPU time still varies with a loaded machine's caches: a proof that ran out of time
        # (never a counterexample) gets one more attempt alone, with four times the budget
        again = _run(*sorted(not_proven), timeout_s=600, cpu_s=4 * PER_CONTRACT_CPU_S)
        not_proven = {name: again[name]["outcome"] for name in not_proven if again[name]["outcome"] != "proven"}
    assert not not_proven, f"no longer proven within {4 * PER_CONTRACT_CPU_S} CPU s: {not_proven}"


@pytest.mark.parametrize(
    ("mutant", "contracts"),
    [
        ("engine_refill_one_unit_too_many", ["check_engine_refill_within_capacity", "check_engine_refill_is_exact"]),
        ("engine_refill_fills_one_us_late", ["check_engine_refill_within_capacity", "check_engine_refill_is_exact"]),
        ("engine_next_token_rounded_down", ["check_engine_next_token_is_exact",
                                            "check_engine_next_token_is_exact_on_refill",
                                            "check_model_and_engine_agree"]),
        ("model_next_token_rounded_down", ["check_model_next_token_is_exact"]),
    ],
)
def test_a_broken_variant_is_caught(mutant, contracts):
    results = _run("--mutant", mutant, *contracts, timeout_s=120)
    missed = {name: r["outcome"] for name, r in results.items() if r["outcome"] != "counterexample"}
    assert not missed, f"mutant {mutant} not caught by {missed}"
