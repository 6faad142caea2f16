"""The model's recovery operations over every run status: the engine's table, mirrored.

``tests/integration/test_recovery_preconditions.py`` tables revive, resume, ``Context.set``
and prune over every status a run can be in (in progress, dampened, halted, completed,
revived, pruned) against the engine. Here the same cells against ``model/pipelines.py``:
each refusal raises ``PreconditionError`` with its message and changes nothing, each
accepted operation has its effect, and the cells the model refuses are exactly those the
engine refuses (so a rule that accepts one state too many on either side fails here). The
explorer (``model/explore.py``) offers the refused cells too, as self-loops, in its worlds
that revive or prune. The same for the hook sweep: the engine's orphan sweep and reaper
crash only a running hook (``HOOK_TABLE``), and the model's ``reap_hook`` over every hook
status refuses exactly the others, changing nothing; the explorer offers those refusals
in its worlds with hooks.

Checks: INV-RUN-1, INV-REV-1, INV-PRN-1, INV-CTX-1, INV-HLT-1, INV-HLT-2 (the model's side
of the tables).
"""

from __future__ import annotations

import pytest

from model.errors import PreconditionError
from model.explore import _OUTPUTS as OUTPUTS
from model.explore import CHAIN_AB, HALTING
from model.pipelines import FAILURE, INVALID, NO_INPUT, PipelineConfig, PipelinesModel, success
from tests.integration.test_recovery_preconditions import HOOK_STATUSES, HOOK_TABLE, OPERATIONS, STATUSES, TABLE

#: A -dampen-> B: the run waits for a resume after A
DAMPEN = {**CHAIN_AB, "edges": {"A": {"type": "dampen", "to": ["B"]}}}

#: (status, operation) -> the model's refusal message (with {run}), or its effect
MODEL_TABLE: dict[tuple[str, str], str] = {
    ("in_progress", "revive"): "run {run} is in_progress, not halted: only a halted run is revived",
    ("dampened", "revive"): "run {run} is dampened, not halted: only a halted run is revived",
    ("halted", "revive"): "a new run",
    ("completed", "revive"): "run {run} is completed, not halted: only a halted run is revived",
    ("revived", "revive"): "its revival",
    ("pruned", "revive"): "no run {run}",
    ("in_progress", "resume"): "run {run} is in_progress with no dampened branch; nothing to resume",
    ("dampened", "resume"): "resumed",
    ("halted", "resume"): "run {run} is halted with no dampened branch; nothing to resume",
    ("completed", "resume"): "run {run} is completed with no dampened branch; nothing to resume",
    ("revived", "resume"): "run {run} is halted with no dampened branch; nothing to resume",
    ("pruned", "resume"): "run {run} was pruned",
    ("in_progress", "context_set"): "set",
    ("dampened", "context_set"): "set",
    ("halted", "context_set"): "set",
    ("completed", "context_set"): "set",
    ("revived", "context_set"): "set",
    ("pruned", "context_set"): "run {run} was pruned",
    ("in_progress", "prune"): "kept",
    ("dampened", "prune"): "kept",
    ("halted", "prune"): "deleted",
    ("completed", "prune"): "deleted",
    ("revived", "prune"): "deleted",
    ("pruned", "prune"): "kept",
}
EFFECTS = {"a new run", "its revival", "resumed", "set", "kept", "deleted"}


def _oracle(node, _input, _attempt):
    return success(OUTPUTS[node])


def _run_in(model: PipelinesModel, status: str) -> str:
    """A run of ``model`` in ``status``."""
    if status == "dampened":
        run_id = model.trigger(DAMPEN, [0])
        model.drive(_oracle)
    elif status in ("halted", "revived"):
        run_id = model.trigger(CHAIN_AB, [0])
        model.drive(lambda *_: FAILURE)  # max_retry 0: the first failure halts it
        if status == "revived":
            model.revive(run_id)
    else:
        run_id = model.trigger(CHAIN_AB, [0])
        if status != "in_progress":
            model.drive(_oracle)
        if status == "pruned":
            assert model.prune(model.now_us + 1, candidates=[run_id]) == [run_id]
    assert ("pruned" if model.runs[run_id].pruned else model.runs[run_id].status) == \
        ("halted" if status == "revived" else status)
    return run_id


def _apply(model: PipelinesModel, operation: str, run_id: str):
    if operation == "revive":
        return model.revive(run_id)
    if operation == "resume":
        return model.resume(run_id, NO_INPUT)
    if operation == "context_set":
        return model.context_set(run_id, "k", 7)
    return model.prune(model.now_us + 1, candidates=[run_id])


def test_the_model_refuses_exactly_the_cells_the_engine_refuses():
    assert set(MODEL_TABLE) == set(TABLE) == {(s, o) for s in STATUSES for o in OPERATIONS}
    model_refuses = {cell for cell, expected in MODEL_TABLE.items() if expected not in EFFECTS}
    engine_refuses = {cell for cell, expected in TABLE.items() if isinstance(expected[0], type)}
    assert model_refuses == engine_refuses


@pytest.mark.parametrize(("status", "operation"), list(MODEL_TABLE))
def test_each_model_operation_over_every_status(status, operation):
    model = PipelinesModel(PipelineConfig(max_retry=0))
    run_id = _run_in(model, status)
    expected = MODEL_TABLE[status, operation]
    if expected not in EFFECTS:
        before = model.snapshot()
        with pytest.raises(PreconditionError) as refused:
            _apply(model, operation, run_id)
        assert str(refused.value) == expected.format(run=run_id)
        assert model.snapshot() == before
        return
    revival = next((r.id for r in model.runs.values() if r.revived_from == run_id), None)
    got = _apply(model, operation, run_id)
    if expected == "a new run":
        assert (model.runs[got].status, model.runs[got].revived_from) == ("in_progress", run_id)
    elif expected == "its revival":
        assert got == revival
    elif expected == "resumed":
        assert (got, model.runs[run_id].status) == (1, "in_progress")
    elif expected == "set":
        assert (got, model.context_get(run_id, "k")) == (7, 7)
    else:
        assert got == ([run_id] if expected == "deleted" else [])


#: hook status -> the model's ``reap_hook`` refusal (with {hook}), or its effect
MODEL_HOOK_TABLE: dict[str, str] = {
    "pending": "hook {hook} is not running",
    "running": "crashed",
    "succeeded": "hook {hook} is not running",
    "failed": "hook {hook} is not running",
}


def _hook_in(model: PipelinesModel, status: str) -> str:
    """The hook of a halted run of ``model``, in ``status``."""
    model.trigger(HALTING, [0])
    model.drive(lambda *_: FAILURE, hooks=False)  # max_retry 0: halted, its hook pending
    (hook_id,) = model.hooks
    if status != "pending":
        token = model.claim_hook(hook_id)
        if status != "running":
            model.run_hook(hook_id, token, success(None) if status == "succeeded" else INVALID)
    assert model.hooks[hook_id].status == status
    return hook_id


def test_the_model_reaps_exactly_the_hooks_the_engine_crashes():
    assert set(MODEL_HOOK_TABLE) == set(HOOK_TABLE) == set(HOOK_STATUSES)
    assert ({s for s, effect in MODEL_HOOK_TABLE.items() if effect == "crashed"}
            == {s for s, effect in HOOK_TABLE.items() if effect == "crashed"})


@pytest.mark.parametrize("status", list(MODEL_HOOK_TABLE))
def test_the_models_hook_reap_over_every_hook_status(status):
    """A running hook's reap is a crash (re-run within the crash budget); any other is
    refused and changes nothing [INV-HLT-1, INV-HLT-2]."""
    model = PipelinesModel(PipelineConfig(max_retry=0))
    hook_id = _hook_in(model, status)
    expected = MODEL_HOOK_TABLE[status]
    if expected != "crashed":
        before = model.snapshot()
        with pytest.raises(PreconditionError) as refused:
            model.reap_hook(hook_id)
        assert str(refused.value) == expected.format(hook=hook_id)
        assert model.snapshot() == before
        return
    assert model.reap_hook(hook_id) == "pending"
    hook = model.hooks[hook_id]
    assert (hook.crash_count, hook.attempts[-1], hook.claim_token) == (1, "process_crashed", None)
