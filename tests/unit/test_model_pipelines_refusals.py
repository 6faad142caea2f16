"""The pipelines model's refusals and small accessors (model/pipelines.py): each
operation the model cannot make raises PreconditionError naming why, changing nothing
(the explorer relies on it: a refused operation is a self-loop); and the batched drive
with keyed successes ends as the plain drive does."""

from __future__ import annotations

import copy

import pytest

from model.errors import PreconditionError
from model.explore import _OUTPUTS as OUTPUTS
from model.explore import CHAIN, CHAIN_AB, HALTING
from model.pipelines import (
    FAILURE,
    NO_INPUT,
    Definition,
    Outcome,
    PipelineConfig,
    PipelinesModel,
    run_and_model,
    run_to_quiescence,
    success,
)


def _ok(node, _input, _attempt):
    return success(OUTPUTS[node])


def _refused(model: PipelinesModel, operation, message: str) -> None:
    before = model.snapshot()
    with pytest.raises(PreconditionError) as refused:
        operation()
    assert str(refused.value) == message
    assert model.snapshot() == before


def test_small_accessors():
    assert repr(NO_INPUT) == "NO_INPUT"
    keyed = copy.deepcopy(CHAIN_AB)
    keyed["nodes"]["B"]["limit_by"] = "k"
    assert (Definition.parse(keyed).limit_by("A"), Definition.parse(keyed).limit_by("B")) == (None, "k")
    summary = run_to_quiescence(CHAIN, [0], _ok)
    assert summary.as_json()["status"] == "completed"
    assert summary.as_json()["halt_reasons"] == []
    _, model, run_id = run_and_model(HALTING, [0], lambda node, *_: FAILURE if node == "A" else success(1),
                                     PipelineConfig(max_retry=0))
    hook = model.hook_of(run_id)
    assert hook is not None
    assert hook.idempotency_key == hook.id
    first = next(iter(model.steps))
    assert model.latest_outcome(first) == "failure"


def test_operations_the_model_refuses():
    with pytest.raises(PreconditionError, match=r"^unknown outcome kind 'maybe'$"):
        Outcome("maybe")
    model = PipelinesModel(PipelineConfig(max_retry=1, retry_delay_us=10))
    _refused(model, lambda: model.advance_clock(-1), "the model clock only moves forward")
    _refused(model, lambda: model.trigger(CHAIN_AB, [0], key=""), "a trigger key must be a non-empty string, got ''")
    _refused(model, lambda: model.trigger(CHAIN_AB, [0], key_window_us=5),
             "a key window is positive microseconds with a key, got 5")
    run_id = model.trigger(CHAIN_AB, [0])
    (step_id,) = model.steps
    assert model.latest_outcome(step_id) is None
    (branch_id,) = model.branches
    _refused(model, lambda: model.claim_branch(branch_id), f"branch {branch_id} is not claimable")
    _refused(model, lambda: model.advance("nope"), "no branch nope")
    _refused(model, lambda: model.advance_batch({"nope": 1}), "branch nope is not advanced in a batch")
    _refused(model, lambda: model.advancer_error(branch_id, transition_error=True),
             f"branch {branch_id}: only routing raises TransitionError")
    (first,) = model.pending_executions()
    model.run_execution(first, FAILURE)  # its retry is eligible 10 µs later
    (retry,) = model.pending_executions()
    _refused(model, lambda: model.run_execution(retry, success(1)), f"execution {retry} is not eligible until 10")
    _refused(model, lambda: model.advance_on_successes([(retry, success(1))]),
             f"executions [{retry}]: not all eligible")
    with pytest.raises(PreconditionError, match=r"^no quiescence after 1 actions$"):
        model.drive(_ok, max_actions=1)
    model.drive(_ok)
    assert model.runs[run_id].status == "completed"
    assert model.prune_all(model.now_us + 1, batch=1) == [run_id]
    assert model.prune(model.now_us + 1, candidates=[run_id, "nope"]) == []  # pruned or unknown: passed over
    _refused(model, lambda: model.context_set(run_id, "x", 1), f"run {run_id} was pruned")


def test_hook_operations_the_model_refuses():
    model = PipelinesModel(PipelineConfig(max_retry=1, retry_delay_us=10))
    model.trigger(HALTING, [0])
    model.drive(lambda *_: FAILURE, hooks=False)
    (hook_id,) = model.hooks
    _refused(model, lambda: model.reap_hook(hook_id), f"hook {hook_id} is not running")
    model.run_hook(hook_id, model.claim_hook(hook_id), FAILURE)  # retried 10 µs later
    _refused(model, lambda: model.claim_hook(hook_id), f"hook {hook_id} is not eligible until {model.now_us + 10}")


def test_the_batched_drive_with_keyed_successes_ends_as_the_plain_drive():
    keyed = copy.deepcopy(CHAIN)
    keyed["nodes"]["B"]["limit_by"] = "k"
    plain = run_to_quiescence(keyed, [0], _ok)
    assert run_to_quiescence(keyed, [0], _ok, batch=2) == plain
    assert plain.status == "completed"
