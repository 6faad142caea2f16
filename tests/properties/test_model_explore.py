"""The model explored exhaustively within bounds (``model/explore.py``): every interleaving of
each bounded configuration, every invariant after every transition, and each model mutant
found with a shortest counterexample.

Checks: every invariant of ``model/invariants.py`` with a model function (INV-LIM-1…6, INV-LIM-8 and
INV-LIM-9 (partitioned keys, model only: issue 34),
INV-ADV-1…4, INV-EXE-1…4, INV-RUN-1, INV-CTX-1, INV-HLT-1, INV-HLT-2, INV-PRN-1, INV-PRN-2,
INV-REV-1…3) in every reachable state of the configurations; that a refused operation
changes nothing; that each mutant of ``model/mutants.py`` is caught, naming an ID it breaks.

``HYPOTHESIS_PROFILE=deep`` explores the nightly bounds (``DEEP_CONFIGS``), as
``python -m model.explore --deep`` does.
"""

from __future__ import annotations

import os
import re

import pytest

from model.errors import CommitFailed
from model.explore import CONFIGS, DEEP_CONFIGS, MUTANT_CONFIGS, explore, main, replay
from model.limits import LimitsModel
from model.mutants import MUTANTS
from model.pipelines import PipelinesModel

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
BOUNDS = DEEP_CONFIGS if DEEP else CONFIGS


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BOUNDS))
def test_no_invariant_fails_in_any_reachable_state(name):
    progress: list[int] = []
    report = explore(BOUNDS[name], progress=lambda so_far: progress.append(so_far.states))
    print(report.line())
    assert report.violation is None, str(report.violation)
    assert report.complete
    assert report.transitions > report.states > 1
    # the progress callback (--progress) saw each 10 000 states once
    assert progress == [10_000 * (i + 1) for i in range(report.states // 10_000)]


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
    for name in ("limits", "limits-batch", "limits-fifo", "limits-partitioned"):
        seen |= _labels(name)
    for kind in ("enqueue", "claim", "claim_batch", "complete", "complete_all_and_hand_off", "late complete",
                 "crash_worker", "reap", "restart_with", "forget_partition", "clock +", "clock ->"):
        assert any(label.startswith(kind) for label in seen), kind
    seen = set()
    for name in ("chain", "divide", "expand", "hooks", "revive", "two-runs"):
        seen |= _labels(name)
    for kind in ("trigger", "run_execution", "advance_on_successes([e", "advance_on_successes(['", "advance(",
                 "advance_batch", "advancer_crash", "advancer_error", "resume", "context_set", "prune", "revive",
                 "claim_hook", "run_hook", "reap_hook", "clock ->"):
        assert any(label.startswith(kind) for label in seen), kind


def _states(config, limit: int = 3_000):
    """The first ``limit`` states of ``config``'s world, breadth first, each with its labels."""
    from collections import deque

    world = config.make(None)
    seen, queue = {world.fingerprint()}, deque([world])
    while queue and len(seen) < limit:
        world = queue.popleft()
        actions = list(world.actions())
        yield world, [label for label, _ in actions]
        for _, operation in actions:
            successor = world.copy()
            try:
                operation(successor)
            except Exception:  # noqa: BLE001 - refusals: only the states matter here
                continue
            if successor.fingerprint() not in seen:
                seen.add(successor.fingerprint())
                queue.append(successor)


def _after(world, operation):
    """The world after ``operation``, or None when it was refused or changed nothing."""
    successor = world.copy()
    try:
        operation(successor)
    except Exception:  # noqa: BLE001 - a refusal: another operation is taken
        return None
    return successor if successor.fingerprint() != world.fingerprint() else None


def test_resume_is_offered_for_the_dampened_runs_only():
    """With two runs, one dampened and the other not, ``resume`` names the dampened one alone:
    the first run is walked to its dampen (first operation offered each time, the second
    trigger held back), then the second is triggered."""
    from model.explore import EXPAND, _pipelines

    world = _pipelines("two-expands", "", definition=EXPAND, runs=2, faults=0, advancer_faults=False,
                       batches=False).make(None)
    (first,) = world.model.live_runs()
    for _ in range(100):
        if world.model.runs[first].status == "dampened":
            break
        world = next(w for label, op in world.actions() if not label.startswith("trigger")
                     for w in [_after(world, op)] if w is not None)
    assert world.model.runs[first].status == "dampened"
    assert {label for label, _ in world.actions() if label.startswith("resume(")} == {f"resume({first})"}
    _, trigger = next((label, op) for label, op in world.actions() if label.startswith("trigger"))
    trigger(world)
    second = next(r for r in world.model.live_runs() if r != first)
    assert world.model.runs[second].status == "in_progress"
    assert {label for label, _ in world.actions() if label.startswith("resume(")} == {f"resume({first})"}


def test_a_world_of_keyed_triggers_without_a_window_offers_no_windowed_trigger():
    from model.explore import CHAIN_AB, _pipelines

    config = _pipelines("keyed", "", definition=CHAIN_AB, faults=0, advancer_faults=False, batches=False,
                        keyed_triggers=1)
    labels = set().union(*(labels for _, labels in _states(config, 500)))
    assert {"trigger(key 'k')", "trigger_in(key 'k', rolled back)"} <= labels
    assert not any("window" in label for label in labels)


def _labels(name: str, limit: int = 3_000) -> set[str]:
    """Labels of the operations enabled in the first ``limit`` states, breadth first."""
    return set().union(*(labels for _, labels in _states(CONFIGS[name], limit)))


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


# --------------------------------------------------------------------------- python -m model.explore


def _without_seconds(line: str) -> str:
    return re.sub(r", \d+\.\d s", ", … s", line)


def test_main_explores_a_configuration_and_prints_its_report(capsys):
    """``python -m model.explore --only hooks``: the smallest configuration, exhaustively;
    the line printed is its report's, and the exit status 0 says no invariant failed."""
    assert main(["--only", "hooks"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    report = explore(CONFIGS["hooks"])
    assert report.violation is None
    assert _without_seconds(line) == _without_seconds(report.line())
    assert re.fullmatch(rf"hooks: {report.states} states, {report.transitions} transitions, depth {report.depth}, "
                        r"\d+\.\d s: no invariant fails", line), line


def test_main_stopped_at_max_states_fails_as_not_exhaustive(capsys):
    assert main(["--only", "limits", "--max-states", "50", "--progress"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"limits: 50 states, \d+ transitions, depth \d+, \d+\.\d s "
                        r"\(stopped at max_states: not exhaustive\): no invariant fails", line), line


def test_main_hunts_a_mutant_and_prints_its_counterexample(capsys):
    assert main(["--mutants", "--only", "stamp_off_by_one"]) == 0
    line, *trace = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"mutant stamp_off_by_one in limits: \d+ states, \d+\.\d s: counterexample of 2 "
                        r"operations: \[INV-LIM-5\] key 'a' stamped 500001, next token at 500000 .*", line), line
    assert trace == ["  after 2 operations:", "   1. enqueue(key='a', eligible_at=0)", "   2. claim(w0, now=0)"]


class StampedAtStart(LimitsModel):
    """Starts with key a stamped though no decision refilled it: wrong before any operation."""

    def __post_init__(self):
        super().__post_init__()
        self.stamps["a"] = 1


def test_an_initial_state_that_fails_its_check_is_the_counterexample():
    report = explore(CONFIGS["limits"], StampedAtStart)
    assert report.violation is not None
    assert report.violation.trace == ()
    assert report.violation.message == "[INV-LIM-5] key 'a' stamped 1 without a refill since the last restart"
    assert report.states == 1


class Annotated(LimitsModel):
    """A model with a field of its own (as a mutant may have): the explorer copies it whole."""

    def __post_init__(self):
        super().__post_init__()
        self.note = "kept"


def test_a_model_with_fields_of_its_own_is_copied_whole():
    plain, annotated = (explore(CONFIGS["limits"], cls, max_states=200) for cls in (None, Annotated))
    assert (annotated.states, annotated.transitions) == (plain.states, plain.transitions)
    assert annotated.violation is None


class Tallied(PipelinesModel):
    """A pipelines model with a field of its own that its operations change in place."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ran = []

    def run_execution(self, exec_id, outcome):
        super().run_execution(exec_id, outcome)
        self.ran.append(exec_id)


def test_a_pipelines_model_with_fields_of_its_own_is_copied_whole():
    """The explorer's record-by-record copy knows the model's own fields only: a model
    with more is copied whole, so what an operation does to one copy stays in it."""
    world = CONFIGS["hooks"].make(Tallied)
    successor = world.copy()
    dict(successor.actions())["run_execution(e1 A, success)"](successor)
    assert (successor.model.ran, world.model.ran) == ([1], [])
    plain, tallied = (explore(CONFIGS["hooks"], cls) for cls in (None, Tallied))
    assert (tallied.states, tallied.transitions, tallied.violation) == (plain.states, plain.transitions, None)


def test_replay_passes_over_a_refused_operation():
    """A trace may hold an operation the model refuses (a self-loop): replay checks it
    changed nothing and goes on."""
    trace = ("run_execution(e1 A, success)", "run_execution(e1) again (refused)")
    world = replay(CONFIGS["hooks"], trace)
    assert world.present() == replay(CONFIGS["hooks"], trace[:1]).present()
