"""The pipeline layer's transition rules: pure functions of values read under the locks.

    >>> resolve_run_status(["completed", "halted"])
    'halted'
    >>> job_halt_reason("process_crashed")
    'job_crashes_exhausted'

No SQL, no clock, no configuration: the transactions of ``runs``, ``trigger``, ``hooks``,
``advance`` and ``prune`` read the rows (and the database time, and the budgets of the pipeline's
configuration) under their locks, call a rule, and write what it returns in the same
transaction. Each rule is the engine's side of a rule of ``model/pipelines.py``, named
as the model names it where it has a public name (``resolve_run_status``,
``job_halt_reason``); its docstring says which. ``tests/unit/test_rules.py`` pins every
branch and boundary, and the rules are mutated (``python -m tests.mutation
ductwork.pipelines.rules``, docs/verification.md "Generated mutants").

Not here: the statements that read and write (the modules above), and the limits
layer's rules (``limits/buckets.py``, the key's decision; ``limits/outcomes.py``, what
follows an execution's outcome).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ductwork.errors import UnknownStepClassError
from ductwork.pipelines.snapshot import Definition, render_divert_key

#: branch statuses of a branch that has not ended: its run is ``in_progress``
ACTIVE_BRANCH = ("in_progress", "advancing")

# --------------------------------------------------------------------------- runs


def resolve_run_status(branch_statuses: Iterable[str]) -> str:
    """A run's status from its branches' statuses (semantics §3 run resolution; the model's
    ``resolve_run_status``): ``in_progress`` while any branch is ``in_progress`` or
    ``advancing``, else ``dampened`` if one waits in ``dampen``, else ``halted`` if one
    halted, else ``completed`` (no branch at all included). The caller leaves a run that is
    already final as it is [INV-RUN-1]: this decides, it does not check that.

    >>> resolve_run_status(["completed", "halted"]), resolve_run_status(["dampened", "advancing"])
    ('halted', 'in_progress')
    """
    statuses = set(branch_statuses)
    if statuses & set(ACTIVE_BRANCH):
        return "in_progress"
    if "dampened" in statuses:
        return "dampened"
    if "halted" in statuses:
        return "halted"
    return "completed"


# --------------------------------------------------------------------------- trigger keys


@dataclass(frozen=True)
class KeyHolder:
    """The run holding a key, as a windowed trigger reads it."""

    run_id: str
    status: str
    completed_at: datetime | None
    halted_at: datetime | None


def key_expired(holder: KeyHolder, now: datetime, window_us: int) -> bool:
    """Whether a trigger at ``now`` with a window of ``window_us`` may take the key from
    ``holder``: it finished (completed or halted) at least the window before ``now``
    (exactly the window is enough). A run that is running or dampened never lets its key
    go. The model's ``PipelinesModel._key_expired``; the release's UPDATE re-checks the
    same condition in its fence (``trigger.release_key``)."""
    finished = {"completed": holder.completed_at, "halted": holder.halted_at}.get(holder.status)
    return finished is not None and finished + timedelta(microseconds=window_us) <= now  # [INV-TRG-1]


# --------------------------------------------------------------------------- prune

#: the run statuses a prune may delete [INV-PRN-1]
PRUNABLE = ("completed", "halted")


def may_prune(status: str, finished_at: datetime | None, cutoff: datetime, hook_open: bool) -> bool:
    """The live-run guard: only a completed or halted run that finished before the cutoff
    (strictly: a run finished at the cutoff stays), and owes no on_halt hook still to run,
    may be deleted [INV-PRN-1]. ``prune.prune_batch`` calls it on each candidate as re-read
    under its row lock; the model's ``PipelinesModel._may_prune``."""
    return status in PRUNABLE and finished_at is not None and finished_at < cutoff and not hook_open  # [INV-PRN-1]


# --------------------------------------------------------------------------- halts

#: ``error_klass`` of an execution whose class is not of the configured pipelines
UNKNOWN_CLASS = f"{UnknownStepClassError.__module__}.{UnknownStepClassError.__qualname__}"

#: halt reasons of a step whose last execution was ``invalid``, by the error's class: a
#: stored class that is not of the configured pipelines (never imported), or a return
#: value that cannot be stored (fleet.invoke.ReturnRejected); any other ``invalid`` execution
#: (the input does not bind to ``__init__``) halts ``job_invalid``
INVALID_HALTS = {
    UNKNOWN_CLASS: "unknown_step_class",
    "ductwork.errors.PayloadTooLargeError": "payload_too_large",
    "ductwork.errors.NotJSONError": "step_return_invalid",
    "ductwork.errors.StepReturnError": "step_return_invalid",
}


def job_halt_reason(outcome: str | None, error_klass: str | None = None) -> str:
    """Why a branch halts on its failed step, from the step's last execution (semantics §3.1;
    the model's ``job_halt_reason``, whose ``return_rejected`` is the engine's error class):
    a crash budget spent, an ``invalid`` execution by its error's class
    (:data:`INVALID_HALTS`, else ``job_invalid``), anything else (a failure or timeout, no
    execution at all) a retry budget spent.

    >>> [job_halt_reason(o) for o in ("failure", "timed_out", "process_crashed", "invalid")]
    ['job_retries_exhausted', 'job_retries_exhausted', 'job_crashes_exhausted', 'job_invalid']
    >>> job_halt_reason("invalid", "ductwork.errors.PayloadTooLargeError")
    'payload_too_large'
    """
    if outcome == "process_crashed":
        return "job_crashes_exhausted"
    if outcome == "invalid":
        return INVALID_HALTS.get(error_klass or "", "job_invalid")
    return "job_retries_exhausted"


def advancer_crashes_exhausted(crash_count: int, max_crash: int) -> bool:
    """Whether a claimed branch halts ``advancer_crashes_exhausted`` before anything else is
    decided: advancers crashed ``max_crash`` times (``pipeline_advancer.max_crash``) or
    more on its step. ``max_crash = 10``: the claim after the 10th crash halts (the
    model's ``advance``, with ``advancer_max_crash``)."""
    return crash_count >= max_crash


def advancer_retries_exhausted(failures: int, max_retry: int) -> bool:
    """Whether a routing error halts its branch ``advancer_retries_exhausted`` rather than
    releasing it for another attempt: ``failures`` earlier routing errors (crashes not
    counted) on the step already reached ``max_retry`` (``pipeline_advancer.max_retry``).
    ``max_retry = 3``: errors 1 to 3 release, the 4th halts (the model's
    ``advancer_error``, with ``advancer_max_retry``)."""
    return failures >= max_retry


# --------------------------------------------------------------------------- moves


def simple_move(definition: Definition, node: str, value_json: str) -> tuple[str, str | None, str | None] | None:
    """Where a succeeded step of ``node`` returning ``value_json`` takes its branch, when
    that is a simple transition: ``(branch status, next node, kind)`` for a leaf
    (``completed``), ``dampen`` (``dampened``), ``chain``, ``converge`` and a ``divert`` with
    a target (``in_progress`` and the next node). None for every other edge (fan-out,
    fan-in, expand, a divert without a target): those are advanced one by one (the model's
    ``advance`` decides all of them alike; ``batchable`` says which are simple).

    >>> from ductwork.pipelines.snapshot import Definition as D
    >>> node = {"delay_us": None, "limit_by": None, "timeout_us": None}
    >>> d = D.from_json({"format": 1, "pipeline": "m:P", "start": "a",
    ...                  "nodes": {n: {**node, "klass": f"m:{n}"} for n in "ab"},
    ...                  "edges": {"a": {"type": "chain", "to": ["b"]}}})
    >>> simple_move(d, "a", "1"), simple_move(d, "b", "1")
    (('in_progress', 'b', 'chain'), ('completed', None, None))
    """
    edge = definition.edges.get(node)
    if edge is None or not edge.to:
        return ("completed", None, None)
    if edge.type in ("chain", "converge"):
        return ("in_progress", edge.first(), edge.type)
    if edge.type == "divert":
        target = edge.divert_target(render_divert_key(json.loads(value_json)))
        return None if target is None else ("in_progress", target, "divert")
    if edge.type == "dampen":
        return ("dampened", None, None)
    return None


# --------------------------------------------------------------------------- on_halt hooks

#: how a hook attempt can end
HOOK_OUTCOMES = ("success", "failure", "invalid", "process_crashed")


def decide_hook(outcome: str, retry_count: int, crash_count: int, now: datetime, *, max_retry: int,
                max_crash: int, retry_delay: float, crash_backoff: float) -> dict[str, Any]:
    """The hook's columns after an attempt ended with ``outcome``, over the counters read
    under the claim and the step budgets of the run's pipeline and the handler's class
    (``job_worker.max_retry``/``max_crash`` and their overrides, ``retry_delay`` and
    ``crash_backoff`` in seconds) [INV-HLT-2]. The model's ``PipelinesModel._end_attempt``.

    ``success``: ``succeeded``. ``failure`` while ``retry_count < max_retry``: ``pending``
    again ``retry_delay`` later, ``retry_count`` + 1. ``process_crashed`` while
    ``crash_count < max_crash``: ``pending`` again, ``crash_count`` + 1 = n, at once while
    n ≤ ``max_crash // 3``, else n × ``crash_backoff`` later (``max_crash = 10``: crashes 1
    to 3 re-run at once, the 4th 40 s later with a 10 s back-off, the 11th fails).
    Anything else (``invalid``, a spent budget): ``failed``. ``succeeded`` and ``failed``
    are final (``completed_at``). An unknown outcome raises ValueError.
    """
    if outcome not in HOOK_OUTCOMES:
        raise ValueError(f"hook outcome must be one of {HOOK_OUTCOMES}, got {outcome!r}")
    if outcome == "success":
        return {"status": "succeeded", "completed_at": now}
    if outcome == "failure" and retry_count < max_retry:  # [INV-HLT-2] budget
        return {"status": "pending", "retry_count": retry_count + 1,
                "eligible_at": now + timedelta(seconds=retry_delay)}
    if outcome == "process_crashed" and crash_count < max_crash:  # [INV-HLT-2] budget
        count = crash_count + 1
        return {"status": "pending", "crash_count": count,
                "eligible_at": now if count <= max_crash // 3 else now + timedelta(seconds=crash_backoff) * count}
    return {"status": "failed", "completed_at": now}
