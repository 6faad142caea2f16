"""Resolving and building a step, and the exceptions that say how that went: what the
worker's thread (``execute.py``) and a ``timeout=`` step's child process (``child.py``) share.

    >>> check_configured(claimed)        # StepInvalid unless both classes are configured
    >>> step = build_step(app, claimed.klass, claimed.input_json, claimed.idempotency_key, claimed.run_id)

Only configured code runs: a stored class name that is not a class of the pipelines this
process defined is never built and nothing is imported for it (``check_configured``).
Not done here: running the step or recording its outcome (``execute.py``, ``child.py``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ductwork.errors import UnknownStepClassError
from ductwork.limits.executions import MESSAGE_LIMIT, ErrorInfo
from ductwork.pipelines.context import Context
from ductwork.pipelines.pipeline import resolve_pipeline
from ductwork.pipelines.registry import in_main_module, resolve_step
from ductwork.pipelines.step import is_async

if TYPE_CHECKING:
    from ductwork.db.database import Database
    from ductwork.limits.executions import Claimed


class _Recorded(Exception):
    """An error that carries what is recorded of it (``info``), its message its own."""

    def __init__(self, info: ErrorInfo):
        self.info = info
        super().__init__(info.message)


class BuildFailed(_Recorded):
    """The step's ``__init__`` raised, or its child process never ran it: a crash, not a failure."""


class StepInvalid(_Recorded):
    """The step can never run as stored (its class does not resolve, its input does not
    bind): recorded ``invalid`` once, and the step fails at once (no retry, no re-run)."""


#: added to the reason when a class of ``__main__`` does not resolve in a worker
_MAIN_HINT = ("; it is defined in __main__ (a script), which only the process running that "
              "script can resolve: move it into an importable module")


class StepTimedOut(Exception):
    """The step ran past its timeout and its process was killed."""


class ChildStepError(_Recorded):
    """The step raised inside its child process; carries the child's error."""


class AsyncStepInterrupted(Exception):
    """An async step's coroutine was cancelled without being asked to, or raised
    ``SystemExit``/``KeyboardInterrupt`` (which would stop the loop every async step of
    its process runs on): the step's failure, retried like any other."""


def is_async_step(claimed: Claimed) -> bool:
    """Whether the claimed step's class has ``async def execute``; False when the class
    does not resolve (the plain path records that as ``invalid``)."""
    try:
        return is_async(resolve_step(claimed.klass))
    except Exception:  # noqa: BLE001 - UnknownStepClassError, or what a class lookup raised
        return False


class ReturnRejected(StepInvalid):
    """The step's return value cannot be stored (a :class:`StepReturnError`, in this
    process or in the step's child): the same code would return it again, so it is an
    ``invalid`` execution too, and its branch halts with the error's own reason."""


def returned(klass: str, value: Any) -> str:
    """How a return value is named in its errors: ``shop.steps:Fetch returned list``."""
    return f"{klass} returned {type(value).__name__}"


def _invalid(error: Exception, ref: str) -> StepInvalid:
    """The :class:`StepInvalid` for a class reference that does not resolve (with how to
    fix a class of ``__main__``)."""
    info = ErrorInfo.of(error)
    if in_main_module(ref):
        info = ErrorInfo(info.klass, info.message[:MESSAGE_LIMIT - len(_MAIN_HINT)] + _MAIN_HINT, info.backtrace)
    return StepInvalid(info)


def check_configured(claimed: Claimed) -> None:
    """Only configured code runs: the run's pipeline and the step's class must be classes
    of the pipelines this process defined (``definition.resolve_step``), else
    :class:`StepInvalid` (``UnknownStepClassError``). Nothing is imported for a stored
    name, here or in a step's child process, which is started only after this check."""
    for ref, resolve in ((claimed.pipeline_klass, resolve_pipeline), (claimed.klass, resolve_step)):
        try:
            resolve(ref)
        except UnknownStepClassError as error:
            raise _invalid(error, ref) from error


def build_step(app: Database, klass: str, input_json: str, idempotency_key: str, run_id: str) -> Any:
    """Construct the user's step with its identity bound: ``idempotency_key`` is what
    ``Step.idempotency_key`` returns (the step's id, or a revived step's carried-over key).

    Raises :class:`StepInvalid` when the class does not resolve or the stored input
    does not bind to its ``__init__`` (neither can change by running again), and
    :class:`BuildFailed` when ``__init__`` itself raised (a crash, re-run).
    """
    try:
        cls = resolve_step(klass)
    except Exception as error:  # UnknownStepClassError, or what a class lookup raised
        raise _invalid(error, klass) from error
    try:
        args = json.loads(input_json)
        cls._ductwork_bind(args)
    except (TypeError, ValueError) as error:
        raise StepInvalid(ErrorInfo.of(error)) from error
    try:
        # [INV-EXE-3] the key is the step row's id: the same for every execution of the step
        return cls._ductwork_build(args, idempotency_key, run_id, Context(app, run_id))
    except Exception as error:  # an error in __init__ is a crash, never lost
        raise BuildFailed(ErrorInfo.of(error)) from error


# Recorded (an execution's error class, the logs) as ``ductwork.execute.<name>`` before the
# fleet package existed: the names stay, so stored rows and log searches keep matching.
for _cls in (BuildFailed, StepInvalid, StepTimedOut, ChildStepError, ReturnRejected, AsyncStepInterrupted):
    _cls.__module__ = "ductwork.execute"
