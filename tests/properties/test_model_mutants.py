"""Tests that must fail: each model mutant (one guard removed) makes its machine go red.

Checks: that the invariants below can fail at all — INV-LIM-1, INV-LIM-2, INV-LIM-4,
INV-LIM-5, INV-LIM-6, INV-LIM-8, INV-LIM-9 (model only: issue 34),
INV-ADV-2, INV-ADV-3, INV-ADV-4, INV-EXE-4, INV-CTX-1, INV-HLT-1,
INV-HLT-2, INV-PRN-1 — and that
their failure message names the ID.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

# ductwork_model, the name the machines below use (the pipeline ones for the shipped strategies): a
# mutant subclasses the model class its machine builds
from ductwork_model.mutants import MUTANTS
from tests.properties.test_model_hooks import HaltHooksModelMachine
from tests.properties.test_model_limits import LimitsModelMachine, PartitionedLimitsModelMachine
from tests.properties.test_model_pipelines import PipelinesModelMachine

MACHINES = {"limits": LimitsModelMachine, "partitioned": PartitionedLimitsModelMachine,
            "pipelines": PipelinesModelMachine, "hooks": HaltHooksModelMachine}
#: generate only (no shrinking: any failure will do), fixed seed, no example database
HUNT = settings(
    max_examples=1000,
    stateful_step_count=40,
    phases=[Phase.generate],
    derandomize=True,
    database=None,
    deadline=None,
    report_multiple_bugs=False,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def no_local_constants(monkeypatch):
    """Hypothesis mixes constants from every loaded local module (this repository's code) into
    what it draws, so a derandomized hunt's examples changed with unrelated edits and with
    which modules an xdist worker happened to have loaded (fan_in_fires_on_created went
    uncaught after a docstring elsewhere changed). Without them, a hunt's examples depend on
    its seed alone."""
    from hypothesis.internal.conjecture import providers

    monkeypatch.setattr(providers, "_get_local_constants", lambda: providers.Constants())
    # and the draws' cache of them, which a test run before in this process (a model machine,
    # whose examples draw local constants) fills: fan_in_fires_on_created went uncaught in a
    # whole-file run, caught alone, after an edit of test_model_limits.py changed its constants
    monkeypatch.setattr(providers, "CONSTANTS_CACHE", providers.LRUCache(1024))


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
@pytest.mark.usefixtures("no_local_constants")
def test_mutant_is_caught(mutant):
    base = MACHINES[mutant.machine]
    machine = type(f"{base.__name__}_{mutant.name}", (base,), {"model_class": mutant.model_class})
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=HUNT)
    message = str(info.value).splitlines()[0]
    assert any(f"[{inv_id}]" in message for inv_id in mutant.caught_by), message


def test_every_mutant_overrides_one_hook():
    """A mutant is its model with exactly one guard replaced."""
    for mutant in MUTANTS:
        own = {name for name in vars(mutant.model_class) if not name.startswith("__")}
        assert len(own) == 1, (mutant.name, own)


def test_rate_window_checker_on_hand_made_histories():
    """The pure INV-LIM-2 checker (reusable on chaos histories) fails with the exact window."""
    from ductwork_model.invariants import inv_lim_2_rate_window
    from ductwork_model.limits import RateEntry

    one_per_second = RateEntry(limit=1, per_s=1, burst=1)
    inv_lim_2_rate_window([0, 1_000_000, 2_000_000, 2_000_000 + 1_000_000], [one_per_second])
    with pytest.raises(AssertionError) as info:
        inv_lim_2_rate_window([1_000_000, 5], [one_per_second])  # unsorted on purpose
    assert str(info.value) == (
        "[INV-LIM-2] 2 claims in [5, 1000000] µs exceed burst 1 + 1/1s × 999995 µs "
        "for entry RateEntry(limit=1, per_s=1, burst=1)")
