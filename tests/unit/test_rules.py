"""The pipeline layer's transition rules (``ductwork/pipelines/rules.py``), one by one, no database.

Checks: each rule on every branch and at every exact boundary, whole return values
compared: a run's status from its branches' statuses (and the model's
``resolve_run_status`` on every set of statuses) [INV-RUN-1]; when a trigger key's window
has elapsed (exactly the window is enough, a microsecond less is not; only a completed or
halted run, by its own finish time) [INV-TRG-1]; a failed step's halt reason; the
advancer's crash and routing-error budgets (reached exactly); which runs a prune may
delete (final, finished strictly before the cutoff, no open hook) [INV-PRN-1]; where a success's simple
transition takes its branch; and an on_halt hook's columns after each outcome, with its
retry and crash budgets reached exactly and the crash back-off's first delayed re-run
[INV-HLT-2]. The transactions that call them are tested on every database in
``tests/integration/test_halt_hooks.py``, ``test_triggers.py``, ``test_pipelines.py``.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest

from ductwork.pipelines.rules import (
    INVALID_HALTS,
    PRUNABLE,
    UNKNOWN_CLASS,
    KeyHolder,
    advancer_crashes_exhausted,
    advancer_retries_exhausted,
    decide_hook,
    job_halt_reason,
    key_expired,
    may_prune,
    resolve_run_status,
    simple_move,
)
from ductwork.pipelines.snapshot import Definition, EdgeSpec, NodeSpec
from model.pipelines import resolve_run_status as model_resolve_run_status

NOW = datetime(2026, 3, 1, 12, 0, 0)
BRANCH_STATUSES = ("in_progress", "advancing", "completed", "halted", "dampened")

# --------------------------------------------------------------------------- resolve_run_status


@pytest.mark.parametrize(("statuses", "expected"), [
    ([], "completed"),
    (["completed"], "completed"),
    (["completed", "completed"], "completed"),
    (["in_progress"], "in_progress"),
    (["advancing"], "in_progress"),
    (["advancing", "dampened", "halted", "completed"], "in_progress"),
    (["in_progress", "dampened"], "in_progress"),
    (["dampened"], "dampened"),
    (["halted", "dampened", "completed"], "dampened"),
    (["halted"], "halted"),
    (["completed", "halted"], "halted"),
])
def test_a_run_resolves_from_its_branches(statuses, expected):
    assert resolve_run_status(statuses) == expected
    assert resolve_run_status(iter(statuses)) == expected  # any iterable, read once


@pytest.mark.parametrize("size", range(len(BRANCH_STATUSES) + 1))
def test_the_run_resolution_is_the_models_for_every_set_of_statuses(size):
    for statuses in itertools.combinations(BRANCH_STATUSES, size):
        assert resolve_run_status(statuses) == model_resolve_run_status(statuses), statuses


# --------------------------------------------------------------------------- key_expired

WINDOW_US = 90_000_000  # 90 s
WINDOW = timedelta(microseconds=WINDOW_US)
TICK = timedelta(microseconds=1)


def _holder(status: str, completed_at: datetime | None = None, halted_at: datetime | None = None) -> KeyHolder:
    return KeyHolder("run-1", status, completed_at, halted_at)


@pytest.mark.parametrize(("holder", "expired"), [
    (_holder("completed", completed_at=NOW - WINDOW), True),  # exactly the window: enough
    (_holder("completed", completed_at=NOW - WINDOW - TICK), True),
    (_holder("completed", completed_at=NOW - WINDOW + TICK), False),  # a microsecond short
    (_holder("completed", completed_at=NOW), False),
    (_holder("halted", halted_at=NOW - WINDOW), True),
    (_holder("halted", halted_at=NOW - WINDOW + TICK), False),
    # each status is read by its own finish time, never the other's
    (_holder("completed", completed_at=NOW, halted_at=NOW - 2 * WINDOW), False),
    (_holder("halted", completed_at=NOW - 2 * WINDOW, halted_at=NOW), False),
    (_holder("completed", completed_at=None, halted_at=NOW - 2 * WINDOW), False),
    (_holder("halted", completed_at=NOW - 2 * WINDOW, halted_at=None), False),
    # a running or dampened run never lets its key go, whatever its stamps
    (_holder("in_progress", NOW - 2 * WINDOW, NOW - 2 * WINDOW), False),
    (_holder("dampened", NOW - 2 * WINDOW, NOW - 2 * WINDOW), False),
    (_holder("in_progress"), False),
])
def test_a_key_expires_a_whole_window_after_its_run_finished(holder, expired):
    assert key_expired(holder, NOW, WINDOW_US) is expired


def test_the_window_is_counted_in_microseconds():
    finished = _holder("completed", completed_at=NOW - timedelta(microseconds=5))
    assert key_expired(finished, NOW, 5) is True
    assert key_expired(finished, NOW, 6) is False


# --------------------------------------------------------------------------- may_prune

CUTOFF = NOW - timedelta(days=30)


@pytest.mark.parametrize(("status", "finished_at", "hook_open", "prunable"), [
    ("completed", CUTOFF - TICK, False, True),
    ("halted", CUTOFF - TICK, False, True),
    ("completed", CUTOFF, False, False),  # finished at the cutoff exactly: kept
    ("completed", CUTOFF + TICK, False, False),
    ("halted", CUTOFF - TICK, True, False),  # its on_halt hook is still owed: live work
    ("completed", None, False, False),
    ("in_progress", CUTOFF - TICK, False, False),
    ("dampened", CUTOFF - TICK, False, False),
])
def test_only_a_final_run_finished_before_the_cutoff_with_no_open_hook_is_pruned(
        status, finished_at, hook_open, prunable):
    assert may_prune(status, finished_at, CUTOFF, hook_open) is prunable


def test_the_prunable_statuses_are_the_final_ones():
    assert PRUNABLE == ("completed", "halted")


# --------------------------------------------------------------------------- job_halt_reason


@pytest.mark.parametrize(("outcome", "error_klass", "reason"), [
    ("failure", None, "job_retries_exhausted"),
    ("timed_out", None, "job_retries_exhausted"),
    ("failure", "ductwork.errors.PayloadTooLargeError", "job_retries_exhausted"),  # the class only for invalid
    (None, None, "job_retries_exhausted"),  # no execution ended: the retry budget's reason
    ("process_crashed", None, "job_crashes_exhausted"),
    ("process_crashed", UNKNOWN_CLASS, "job_crashes_exhausted"),
    ("invalid", None, "job_invalid"),
    ("invalid", "builtins.TypeError", "job_invalid"),
    ("invalid", "ductwork.errors.UnknownStepClassError", "unknown_step_class"),
    ("invalid", "ductwork.errors.PayloadTooLargeError", "payload_too_large"),
    ("invalid", "ductwork.errors.NotJSONError", "step_return_invalid"),
    ("invalid", "ductwork.errors.StepReturnError", "step_return_invalid"),
])
def test_a_failed_step_halts_its_branch_for_its_last_outcome(outcome, error_klass, reason):
    assert job_halt_reason(outcome, error_klass) == reason


def test_the_invalid_halts_are_the_documented_four():
    assert UNKNOWN_CLASS == "ductwork.errors.UnknownStepClassError"
    assert INVALID_HALTS == {
        "ductwork.errors.UnknownStepClassError": "unknown_step_class",
        "ductwork.errors.PayloadTooLargeError": "payload_too_large",
        "ductwork.errors.NotJSONError": "step_return_invalid",
        "ductwork.errors.StepReturnError": "step_return_invalid",
    }
    assert job_halt_reason("invalid") == "job_invalid"  # the error class defaults to none


# --------------------------------------------------------------------------- advancer budgets


@pytest.mark.parametrize(("count", "budget", "exhausted"), [
    (0, 10, False), (9, 10, False), (10, 10, True), (11, 10, True), (0, 0, True), (0, 1, False), (1, 1, True),
])
def test_the_advancer_budgets_are_spent_once_the_count_reaches_them(count, budget, exhausted):
    assert advancer_crashes_exhausted(count, budget) is exhausted
    assert advancer_retries_exhausted(count, budget) is exhausted


# --------------------------------------------------------------------------- simple_move


def _definition(edges: dict[str, EdgeSpec]) -> Definition:
    nodes = {name: NodeSpec(f"m:{name}") for name in ("a", "b", "c", "d")}
    return Definition("m:P", "a", nodes, edges)


@pytest.mark.parametrize(("edge", "value_json", "move"), [
    (None, "1", ("completed", None, None)),  # a leaf
    (EdgeSpec("chain", []), "1", ("completed", None, None)),  # an edge to nowhere ends the branch too
    (EdgeSpec("chain", ["b"]), "1", ("in_progress", "b", "chain")),
    (EdgeSpec("converge", ["c"]), "1", ("in_progress", "c", "converge")),
    (EdgeSpec("divert", {"x": "b", "1": "c", "otherwise": "d"}), '"x"', ("in_progress", "b", "divert")),
    (EdgeSpec("divert", {"x": "b", "1": "c", "otherwise": "d"}), "1", ("in_progress", "c", "divert")),
    (EdgeSpec("divert", {"x": "b", "1": "c", "otherwise": "d"}), '"y"', ("in_progress", "d", "divert")),
    (EdgeSpec("divert", {"x": "b"}), '"y"', None),  # no target, no otherwise: advanced alone
    (EdgeSpec("dampen", ["b"]), "1", ("dampened", None, None)),
    (EdgeSpec("divide", ["b", "c"]), "1", None),
    (EdgeSpec("expand", ["b"]), "[1]", None),
    (EdgeSpec("combine", ["d"], ["a"]), "1", None),
    (EdgeSpec("collapse", ["d"], ["a"]), "1", None),
])
def test_a_simple_move_takes_the_branch_where_its_edge_says(edge, value_json, move):
    definition = _definition({} if edge is None else {"a": edge})
    assert simple_move(definition, "a", value_json) == move


def test_a_simple_move_reads_the_edge_of_its_own_node():
    definition = _definition({"a": EdgeSpec("chain", ["b"]), "b": EdgeSpec("dampen", ["c"])})
    assert simple_move(definition, "b", "1") == ("dampened", None, None)
    assert simple_move(definition, "c", "1") == ("completed", None, None)


# --------------------------------------------------------------------------- decide_hook

BUDGET = {"max_retry": 3, "max_crash": 10, "retry_delay": 2.5, "crash_backoff": 10.0}


def _hook(outcome: str, retry_count: int = 0, crash_count: int = 0, **budget: float) -> dict[str, object]:
    return decide_hook(outcome, retry_count, crash_count, NOW, **{**BUDGET, **budget})


def test_a_hook_that_succeeds_is_final():
    assert _hook("success", 3, 10) == {"status": "succeeded", "completed_at": NOW}


@pytest.mark.parametrize(("retry_count", "columns"), [
    (0, {"status": "pending", "retry_count": 1, "eligible_at": NOW + timedelta(seconds=2.5)}),
    (2, {"status": "pending", "retry_count": 3, "eligible_at": NOW + timedelta(seconds=2.5)}),
    (3, {"status": "failed", "completed_at": NOW}),  # the budget reached exactly: no retry
    (4, {"status": "failed", "completed_at": NOW}),
])
def test_a_failed_hook_is_retried_after_the_delay_within_its_budget(retry_count, columns):
    assert _hook("failure", retry_count, crash_count=10) == columns  # the crash budget plays no part


@pytest.mark.parametrize(("crash_count", "columns"), [
    (0, {"status": "pending", "crash_count": 1, "eligible_at": NOW}),
    (2, {"status": "pending", "crash_count": 3, "eligible_at": NOW}),  # the 3rd of 10: still at once
    (3, {"status": "pending", "crash_count": 4, "eligible_at": NOW + timedelta(seconds=40)}),  # 4 × 10 s
    (9, {"status": "pending", "crash_count": 10, "eligible_at": NOW + timedelta(seconds=100)}),
    (10, {"status": "failed", "completed_at": NOW}),  # the budget reached exactly: no re-run
    (11, {"status": "failed", "completed_at": NOW}),
])
def test_a_crashed_hook_is_re_run_at_once_then_backing_off_within_its_budget(crash_count, columns):
    assert _hook("process_crashed", retry_count=3, crash_count=crash_count) == columns


@pytest.mark.parametrize(("max_crash", "crash_count", "eligible_at"), [
    (2, 0, NOW + timedelta(seconds=10)),  # 2 // 3 = 0: no crash is re-run at once
    (5, 0, NOW), (5, 1, NOW + timedelta(seconds=20)),  # 5 // 3 = 1
    (9, 2, NOW), (9, 3, NOW + timedelta(seconds=40)),  # 9 // 3 = 3
])
def test_the_immediate_re_runs_are_a_third_of_the_crash_budget(max_crash, crash_count, eligible_at):
    assert _hook("process_crashed", crash_count=crash_count, max_crash=max_crash) == {
        "status": "pending", "crash_count": crash_count + 1, "eligible_at": eligible_at}


def test_an_invalid_hook_fails_whatever_budget_is_left():
    assert _hook("invalid") == {"status": "failed", "completed_at": NOW}


def test_a_zero_budget_fails_the_first_attempt():
    assert _hook("failure", max_retry=0) == {"status": "failed", "completed_at": NOW}
    assert _hook("process_crashed", max_crash=0) == {"status": "failed", "completed_at": NOW}


def test_an_unknown_hook_outcome_is_refused():
    with pytest.raises(ValueError, match=r"^hook outcome must be one of \('success', 'failure', 'invalid', "
                                         r"'process_crashed'\), got 'timed_out'$"):
        _hook("timed_out")
