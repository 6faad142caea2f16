"""The model's recovery operations over every run status: the engine's table, mirrored.

``tests/integration/test_recovery_preconditions.py`` tables revive, resume, ``Context.set``
and prune over every status a run can be in (in progress, dampened, halted, completed,
revived, pruned) against the engine. Here the same cells against ``model/pipelines.py``:
each refusal raises ``PreconditionError`` with its message and changes nothing, each
accepted operation has its effect, and the cells the model refuses are exactly those the
engine refuses (so a rule that accepts one state too many on either side fails here). The
explorer (``model/explore.py``) offers the refused cells too, as self-loops, in its worlds
that revive or prune.

Checks: INV-RUN-1, INV-REV-1, INV-PRN-1, INV-CTX-1 (the model's side of the table).
"""

from __future__ import annotations

import pytest

from model.errors import PreconditionError
from model.explore import _OUTPUTS as OUTPUTS
from model.explore import CHAIN_AB
from model.pipelines import FAILURE, NO_INPUT, PipelineConfig, PipelinesModel, success
from tests.integration.test_recovery_preconditions import OPERATIONS, STATUSES, TABLE

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
