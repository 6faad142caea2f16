"""The model explored exhaustively within bounds (``model/explore.py``): every interleaving of
each bounded configuration, every invariant after every transition, and each model mutant
found with a shortest counterexample.

Checks: every invariant of ``model/invariants.py`` with a model function (INV-LIM-1…6,
INV-ADV-1…4, INV-EXE-1…4, INV-RUN-1, INV-CTX-1, INV-HLT-1, INV-HLT-2, INV-PRN-1, INV-PRN-2,
INV-REV-1…3) in every reachable state of the configurations; that a refused operation
changes nothing; that each mutant of ``model/mutants.py`` is caught, naming an ID it breaks.

``HYPOTHESIS_PROFILE=deep`` explores the nightly bounds (``DEEP_CONFIGS``), as
``python -m model.explore --deep`` does.
"""

from __future__ import annotations

import os

import pytest

from model.errors import CommitFailed
from model.explore import CONFIGS, DEEP_CONFIGS, MUTANT_CONFIGS, explore, replay
from model.limits import LimitsModel
from model.mutants import MUTANTS

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
BOUNDS = DEEP_CONFIGS if DEEP else CONFIGS


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BOUNDS))
def test_no_invariant_fails_in_any_reachable_state(name):
    report = explore(BOUNDS[name])
    print(report.line())
    assert report.violation is None, str(report.violation)
    assert report.complete
    assert report.transitions > report.states > 1


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_is_found_with_a_shortest_counterexample(mutant):
    """Breadth first, the first violation is at the least depth; its trace replays to the
    same failure, and no shorter prefix of it fails."""
    config = CONFIGS[MUTANT_CONFIGS[mutant.name]]
    report = explore(config, mutant.model_class)
    assert report.violation is not None, f"{mutant.name} survives {report.line()}"
    print(f"{mutant.name}: counterexample of {len(report.violation.trace)} operations in {config.name}\n"
          f"{report.violation}")
    assert any(report.violation.message.startswith(f"[{inv_id}]") for inv_id in mutant.caught_by), \
        report.violation.message
    trace = report.violation.trace
    replay(config, trace[:-1], mutant.model_class)  # the prefix holds every invariant
    with pytest.raises(AssertionError) as info:
        replay(config, trace, mutant.model_class)
    assert str(info.value).splitlines()[0] == report.violation.message


def test_every_mutant_has_a_configuration():
    assert set(MUTANT_CONFIGS) == {m.name for m in MUTANTS}
    assert {MUTANT_CONFIGS[m.name] for m in MUTANTS} <= set(CONFIGS)
    assert {CONFIGS[MUTANT_CONFIGS[m.name]].machine for m in MUTANTS if m.machine == "limits"} == {"limits"}


class CompletesThenRefuses(LimitsModel):
    """A broken model: it records a completion, then raises as if it had refused it."""

    def complete(self, job_id, now_us, outcome="success"):
        super().complete(job_id, now_us, outcome)
        raise CommitFailed("refused after all")


def test_a_refused_operation_that_changes_the_state_is_reported():
    """The explorer's own check: an operation that raises a refusal must leave the model as it was."""
    report = explore(CONFIGS["limits"], CompletesThenRefuses)
    assert report.violation is not None
    assert report.violation.message.startswith("a refused operation changed the state: complete(")
    # the shortest way to a completion: a's bucket is created empty by the first decision (at 0),
    # holds a token 0.5 s later, then the claim and the completion
    assert report.violation.trace == ("enqueue(key='a', eligible_at=0)", "claim(w0, now=0)",
                                      "clock +500000 µs -> 500000", "claim(w0, now=500000)",
                                      "complete(job j1, w0, now=500000)")


def test_the_explorer_merges_states_and_reaches_every_operation():
    """State hashing works (fewer states than transitions) and the bounds leave no operation
    of a configuration unexplored: every kind of operation labels some transition."""
    seen: set[str] = set()
    for name in ("limits", "limits-batch", "limits-fifo"):
        seen |= _labels(name)
    for kind in ("enqueue", "claim", "claim_batch", "complete", "complete_and_hand_off", "late complete",
                 "crash_worker", "reap", "restart_with", "clock +", "clock ->"):
        assert any(label.startswith(kind) for label in seen), kind
    seen = set()
    for name in ("chain", "divide", "expand", "hooks", "revive", "two-runs"):
        seen |= _labels(name)
    for kind in ("trigger", "run_execution", "advance_on_success", "advance_on_successes", "advance(",
                 "advance_batch", "advancer_crash", "advancer_error", "resume", "context_set", "prune", "revive",
                 "claim_hook", "run_hook", "reap_hook", "clock ->"):
        assert any(label.startswith(kind) for label in seen), kind


def _labels(name: str, limit: int = 3_000) -> set[str]:
    """Labels of the operations enabled in the first ``limit`` states, breadth first."""
    from collections import deque

    world = CONFIGS[name].make(None)
    seen, labels, queue = {world.fingerprint()}, set(), deque([world])
    while queue and len(seen) < limit:
        world = queue.popleft()
        for label, operation in world.actions():
            labels.add(label)
            successor = world.copy()
            try:
                operation(successor)
            except Exception:  # noqa: BLE001 - refusals: only the labels matter here
                continue
            if successor.fingerprint() not in seen:
                seen.add(successor.fingerprint())
                queue.append(successor)
    return labels


def test_the_parked_expand_world_reaches_arrivals_between_batches():
    """``expand-parked`` reaches what its bounds are for, so that every invariant is checked
    there: children arriving while their expand holds its claim between batches, and while
    it is released after its advancer crashed, also in the gap after the middle batch; the
    merge fired by a first-batch child arriving last, and by the last arrival after a
    crashed expand resumed at its cursor [INV-ADV-3, INV-ADV-4]. (The ``expand`` world, 2
    items and an advancer crash budget of 1, reaches only half of these.)"""
    from collections import deque

    world = CONFIGS["expand-parked"].make(None)
    seen, queue, reached = {world.fingerprint()}, deque([world]), set()
    while queue:
        world = queue.popleft()
        for _, operation in world.actions():
            successor = world.copy()
            try:
                operation(successor)
            except Exception:  # noqa: BLE001 - refusals change nothing
                continue
            if successor.fingerprint() in seen:
                continue
            seen.add(successor.fingerprint())
            queue.append(successor)
            for b in successor.model.branches.values():
                if b.expand_cursor is None:
                    continue
                parked = b.expand_cursor < b.fanout_width
                if parked and b.fanin_arrivals and b.status == "advancing":
                    reached.add("arrived while the claim is held")
                if parked and b.fanin_arrivals and b.status == "in_progress" and b.advancer_crashes:
                    reached.add("arrived while released after a crash")
                if parked and 0 < b.fanin_arrivals < b.expand_cursor:
                    reached.add("some created children arrived")
                if parked and b.expand_cursor == 2 and b.fanin_arrivals:
                    reached.add("arrived while parked after the middle batch")
                if b.fanin_arrivals == b.fanout_width and list(b.arrived)[-1] == 0:
                    reached.add("fired by the first batch's child arriving last")
                if b.fanin_arrivals == b.fanout_width and b.advancer_crashes:
                    reached.add("fired after the expand resumed from a crash")
    assert reached == {"arrived while the claim is held", "arrived while released after a crash",
                       "some created children arrived", "arrived while parked after the middle batch",
                       "fired by the first batch's child arriving last", "fired after the expand resumed from a crash"}
