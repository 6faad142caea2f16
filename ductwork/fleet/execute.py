"""Executing one claimed step, and the failure rules: which exception becomes which
recorded outcome.

    >>> output = run_step(app, claimed, definition, NOT_AWAITED, paced)   # or raises
    >>> record_failed(app, claimed, error)                                     # 'failure'

At-least-once: ``execute`` runs *before* its outcome is committed, so a crash
between the two (or a reaper that took the claim) means the step runs again; its
side effects must be made harmless with ``idempotency_key`` or ``Context``. The
outcome itself is recorded at most once [INV-EXE-2].

Rescue layering, one owner per failure (:func:`record_failed`):

- the step's ``execute`` raising is a **failure**: retried within ``max_retry``
  [INV-EXE-4];
- returning what its edge cannot carry (:class:`StepReturnError`: not JSON, longer
  than ``payloads.MAX_PAYLOAD_BYTES``, not a list before an expand) is a failure
  that is not retried, since the same code returns the same value again: the step
  fails at once and its branch halts (``step_return_invalid``,
  ``payload_too_large``);
- running past ``timeout=`` is **timed_out** (counts like a failure); the step
  ran in a child process, which is killed and reaped *before* the outcome is
  recorded, so a freed slot never has code still running behind it [INV-EXE-5];
- a step that can never succeed is **invalid**: recorded once, never retried, its
  step failed at once [INV-EXE-4]. That is a stored class (or its run's pipeline)
  that is not one of the classes of the pipelines this process runs: it is never
  built and nothing is imported for it (``unknown_step_class``,
  :class:`~ductwork.errors.UnknownStepClassError`); stored input that does not bind
  to the class's ``__init__`` (``job_invalid``); and a return value that cannot be
  stored (``step_return_invalid``, ``payload_too_large``);
- anything else — the step's ``__init__`` raised, ductwork's own code raised, the
  thread is leaving, the process died — is a **crash** of the execution, re-run
  within ``max_crash``.

Three ways to run a body:

- a step without ``timeout=`` runs in the worker's thread (:func:`run_body`): Python
  threads cannot be killed, so only a process kill stops it;
- an async step (``async def execute``) without ``timeout=`` runs on the process's
  step loop (``fleet.steploop``): the executions of one claim that are async steps of
  the same lane are awaited together, concurrently (:func:`await_together`), and then
  each outcome is recorded exactly as a plain step's (the same fences, budgets, group
  commits and hand-offs); since each claimed execution already holds its limit slot and
  token, running them together never exceeds a limit;
- with ``timeout=`` a step, async or not, runs in a child process
  (``fleet.child.run_in_child``), which a kill really stops.

Not done here: committing a success (the worker's loop, ``fleet/worker.py``, with
``pipelines.outcomes.record_successes``), nor deciding what a claim takes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ductwork import faults
from ductwork.db.dialects import retry_transient
from ductwork.errors import StepReturnError
from ductwork.fleet import invoke
from ductwork.fleet.child import run_in_child
from ductwork.fleet.steploop import STEP_LOOP
from ductwork.limits.executions import ErrorInfo
from ductwork.pipelines import payloads
from ductwork.pipelines.outcomes import record_crash, record_failure, record_invalid
from ductwork.pipelines.payloads import Output

if TYPE_CHECKING:
    from ductwork.db.database import Database
    from ductwork.limits.executions import Claimed
    from ductwork.pipelines.snapshot import Definition

#: :func:`run_step` without an awaited outcome: the step is run there
NOT_AWAITED: Any = object()


def awaitable(claimed: Claimed) -> bool:
    """Whether ``claimed`` is awaited on the step loop: an async step without ``timeout=``."""
    return not claimed.timeout_us and invoke.is_async_step(claimed)


def await_together(app: Database, batch: list[Claimed]) -> list[Any]:
    """Await the async steps of ``batch`` together on the step loop; returns, in order,
    each one's value or the exception it raised (for :func:`run_step`'s ``awaited``).
    Nothing returns (nor is crashed by the caller) while a step still runs."""
    awaiting = STEP_LOOP.start([_awaited(app, claimed) for claimed in batch])
    try:
        faults.hit(faults.WHILE_ASYNC_STEPS_AWAIT)
    finally:
        results = STEP_LOOP.result(awaiting)  # no execution is crashed while its step still runs
    return results


async def _awaited(app: Database, claimed: Claimed) -> Any:
    """On the step loop: check, build and await one async step; its value, or raises
    what :func:`run_body` would (``StepInvalid``, ``BuildFailed``, the step's error)."""
    invoke.check_configured(claimed)
    instance = invoke.build_step(app, claimed.klass, claimed.input_json, claimed.idempotency_key, claimed.run_id)
    try:
        return await instance.execute()
    except (KeyboardInterrupt, SystemExit) as error:  # would stop the loop of every thread's steps
        raise invoke.AsyncStepInterrupted(f"the step raised {error!r}") from error


def _value_of(awaited: Any) -> Any:
    """An awaited step's value, or raise what it raised; a ``CancelledError`` nobody
    asked for (the step cancelled itself) is the step's failure, not the thread's exit."""
    if isinstance(awaited, asyncio.CancelledError):
        raise invoke.AsyncStepInterrupted(f"the step's coroutine was cancelled: {awaited!r}") from awaited
    if isinstance(awaited, BaseException):
        raise awaited
    return awaited


def make_output(klass: str, definition: Definition, node: str, value: Any) -> Output:
    """Validate a return value against the step's edge; raises :class:`StepReturnError`
    (a :class:`~ductwork.errors.PayloadError` when it breaks the payload rule)."""
    text = payloads.dump(value, invoke.returned(klass, value))
    edge = definition.edges.get(node)
    if edge is not None and edge.type == "expand":
        if not isinstance(value, list):
            raise StepReturnError(klass, value, "a step followed by expand must return a list")
        return Output(expand_items=[json.dumps(v, allow_nan=False) for v in value])
    return Output(text)


def _output(claimed: Claimed, definition: Definition, value: Any) -> Output:
    try:
        return make_output(claimed.klass, definition, claimed.node, value)
    except StepReturnError as error:  # (not one that execute() itself raised)
        raise invoke.ReturnRejected(ErrorInfo.of(error)) from error


def run_body(app: Database, claimed: Claimed, definition: Definition) -> Output:
    """Run the step's body in this thread, or in a child process for ``timeout=``; its
    validated output, or raises what the body (or its child, or its return value) did."""
    if claimed.timeout_us:
        value = run_in_child(app, claimed)
    else:
        instance = invoke.build_step(app, claimed.klass, claimed.input_json, claimed.idempotency_key, claimed.run_id)
        value = instance.execute()
        if asyncio.iscoroutine(value):  # (an async step is awaited by await_together; not one built here)
            value = _value_of(STEP_LOOP.run([value])[0])
    return _output(claimed, definition, value)


def run_step(app: Database, claimed: Claimed, definition: Definition, awaited: Any,
             paced: Callable[[float, float], None]) -> Output:
    """Run the step (or take ``awaited``: what its coroutine returned or raised on the step
    loop); returns its output, after telling ``paced(seconds, cpu_seconds)`` how long its
    body ran and how much of that on this thread's CPU (an awaited one is not timed here).
    Raises what :func:`record_failed` records."""
    if awaited is not NOT_AWAITED:
        return _output(claimed, definition, _value_of(awaited))
    invoke.check_configured(claimed)  # before anything is built here or in a child process
    started, cpu_started = time.monotonic(), time.thread_time()
    output = run_body(app, claimed, definition)
    paced(time.monotonic() - started, time.thread_time() - cpu_started)
    faults.hit(faults.DURING_JOB_EXECUTION)
    return output


def record_failed(app: Database, claimed: Claimed, error: Exception) -> str:
    """The failure rules: record what ``error`` (raised by :func:`run_step`) makes of the
    execution, repeated on a lost connection; returns the outcome's name. Raises
    ``CommitFailed`` when the claim is no longer this execution's [INV-EXE-2]."""
    if isinstance(error, invoke.StepInvalid):  # can never succeed: fail the step at once [INV-EXE-4]
        retry_transient(lambda: record_invalid(app, claimed, error.info))
        return "invalid"
    if isinstance(error, invoke.BuildFailed):
        info = error.info
        retry_transient(lambda: record_crash(app, claimed.execution_id, claimed.process_id, info.klass,
                                             info.message, info.backtrace, info.text))
        return "process_crashed"
    failed = error.info if isinstance(error, invoke.ChildStepError) else ErrorInfo.of(error)
    outcome = "timed_out" if isinstance(error, invoke.StepTimedOut) else "failure"
    retry_transient(lambda: record_failure(app, claimed, failed, outcome=outcome))  # retried, never lost
    return outcome
