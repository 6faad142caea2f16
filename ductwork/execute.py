"""The job worker: claim one execution, run the step's code, record the outcome.

    >>> worker = Worker(app)
    >>> worker.run_once()          # None when nothing may run now
    Performed(execution_id='…', node='Charge#1', outcome='success')

At-least-once: ``execute`` runs *before* its outcome is committed, so a crash
between the two (or a reaper that took the claim) means the step runs again; its
side effects must be made harmless with ``idempotency_key`` or ``Context``. The
outcome itself is recorded at most once [INV-EXE-2].

Rescue layering, one owner per failure:

- the step's ``execute`` raising (or returning what its edge cannot carry) is a
  **failure**: retried within ``max_retry`` [INV-EXE-4];
- running past ``timeout=`` is **timed_out** (counts like a failure); the step
  ran in a child process, which is killed and reaped *before* the outcome is
  recorded, so a freed slot never has code still running behind it [INV-EXE-5];
- anything else — the class cannot be imported or built, ductwork's own code
  raised, the thread is leaving — is a **crash** of the execution, re-run within
  ``max_crash``.

Steps without ``timeout=`` run in the worker's thread: Python threads cannot be
killed, so only a process kill stops them.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ductwork import faults
from ductwork.advance import advance_on_success
from ductwork.context import Context
from ductwork.claims import claim_next, hand_off as claim_hand_off, seconds_to_next_token
from ductwork.definition import resolve_step
from ductwork.dialects import retry_transient
from ductwork.errors import CommitFailed, StepReturnError
from ductwork.executions import Claimed, ErrorInfo, Output, record_crash, record_failure, record_success

if TYPE_CHECKING:
    from ductwork.app import App
    from ductwork.definition import Definition

log = logging.getLogger("ductwork.execute")

ABANDONED = "ductwork.AbandonedClaim"


@dataclass(frozen=True)
class Performed:
    """What :meth:`Worker.run_once` did."""

    execution_id: str
    node: str
    outcome: str  # success | failure | timed_out | process_crashed | commit_failed


class BuildFailed(Exception):
    """The step could not be constructed (import, arguments, ``__init__``): a crash, not a failure."""

    def __init__(self, info: ErrorInfo):
        self.info = info
        super().__init__(info.message)


class StepTimedOut(Exception):
    """The step ran past its timeout and its process was killed."""


class ChildStepError(Exception):
    """The step raised inside its child process; carries the child's error."""

    def __init__(self, info: ErrorInfo):
        self.info = info
        super().__init__(info.message)


def make_output(klass: str, definition: Definition, node: str, value: Any) -> Output:
    """Validate a return value against the step's edge; raises :class:`StepReturnError`."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise StepReturnError(klass, value, f"return value is not JSON-serialisable ({error})") from None
    edge = definition.edges.get(node)
    if edge is not None and edge.type == "expand":
        if not isinstance(value, list):
            raise StepReturnError(klass, value, "a step followed by expand must return a list")
        return Output(expand_items=[json.dumps(v) for v in value])
    return Output(text)


def build_step(app: App, klass: str, input_json: str, step_id: str, run_id: str) -> Any:
    """Construct the user's step with its identity bound; errors become :class:`BuildFailed`."""
    try:
        cls = resolve_step(klass)
        args = json.loads(input_json)
        # [INV-EXE-3] the key is the step row's id: the same for every execution of the step
        return cls._ductwork_build(args, step_id, run_id, Context(app, run_id))
    except Exception as error:  # noqa: BLE001 - any construction error is a crash, never lost
        raise BuildFailed(ErrorInfo.of(error)) from error


class Worker:
    """Claims and runs executions: one claim per :meth:`run_once`, and what its completions hand on."""

    def __init__(self, app: App, *, process_id: str | None = None,
                 hand_off: Callable[[], bool] | None = None):
        self.app = app
        self._process_id = process_id
        #: asked after each success: may this worker take its lane's next execution in
        #: the same transaction (``claims.hand_off``)? None: never (one per run_once)
        self._may_hand_off = hand_off
        #: an execution handed to this worker by its last completion, not yet performed
        self._handed: Claimed | None = None
        #: after an idle poll: seconds until a rate-blocked key's next token, if any
        self.next_token_s: float | None = None
        #: the execution this worker is performing (what a runner's reconciliation skips)
        self.current: str | None = None

    @property
    def process_id(self) -> str:
        return self._process_id or self.app.process_id()

    def run_once(self) -> Performed | None:
        """Claim and run one execution, then every execution its completions hand to
        this worker (only while ``hand_off()`` says yes, so a stopping worker performs at
        most the one already handed to it). Never sleeps (except inside the step)."""
        claimed, self._handed = self._handed, None
        if claimed is None:
            claimed = claim_next(self.app, self.process_id)
        if claimed is None:
            self.next_token_s = seconds_to_next_token(self.app)
            return None
        performed = self.perform(claimed)
        while self._handed is not None:
            claimed, self._handed = self._handed, None
            performed = self.perform(claimed)
        return performed

    def perform(self, claimed: Claimed) -> Performed:
        """Run a claimed execution and record its outcome; on any escape, crash it."""
        recorded = False
        self.current = claimed.execution_id
        try:
            faults.hit(faults.AFTER_JOB_CLAIM)
            outcome = self._perform(claimed)
            recorded = True
            return Performed(claimed.execution_id, claimed.node, outcome)
        finally:
            self.current = None if self._handed is None else self._handed.execution_id
            if not recorded:  # an exception (or thread exit) escaped: never leave the claim held
                # (if the database is unreachable this fails too; the runner's
                # reconciliation crashes the orphaned claim once it answers again)
                record_crash(self.app, claimed.execution_id, claimed.process_id, ABANDONED,
                             "execution abandoned by its worker thread")

    def _invoke(self, claimed: Claimed, definition: Definition) -> Output:
        if claimed.timeout_us:
            from ductwork.child import run_in_child

            value = run_in_child(self.app, claimed)
        else:
            instance = build_step(self.app, claimed.klass, claimed.input_json, claimed.step_id, claimed.run_id)
            value = instance.execute()
        return make_output(claimed.klass, definition, claimed.node, value)

    def _perform(self, claimed: Claimed) -> str:
        definition = self.app.definition(claimed.definition_sha1)
        try:
            try:
                output = self._invoke(claimed, definition)
                faults.hit(faults.DURING_JOB_EXECUTION)
            except BuildFailed as failed:
                info = failed.info
                retry_transient(lambda: record_crash(self.app, claimed.execution_id, claimed.process_id,
                                                     info.klass, info.message, info.backtrace))
                return "process_crashed"
            except StepTimedOut as timed_out:
                retry_transient(lambda: record_failure(self.app, claimed, timed_out, outcome="timed_out"))
                return "timed_out"
            except ChildStepError as error:
                retry_transient(lambda: record_failure(self.app, claimed, error.info))
                return "failure"
            except Exception as error:  # noqa: BLE001 - the step's own failure: retried, never lost
                info = ErrorInfo.of(error)
                retry_transient(lambda: record_failure(self.app, claimed, info))
                return "failure"
            # AT-LEAST-ONCE: execute() has run and its side effects are durable. The
            # commit below can still fail (CommitFailed) if the reaper took the claim;
            # then the reaper's re-run is the live execution and the step runs again.
            # Repeated on a lost connection: a commit whose acknowledgement was lost is seen
            # as CommitFailed the second time (the guarded update matches nothing).
            inline = None
            if self.app.config.pipeline_advancer.inline_linear and output.value_json is not None:
                inline = functools.partial(advance_on_success, self.app, claimed, definition, output.value_json)
            hand_off = None
            if self._may_hand_off is not None and self._may_hand_off():
                hand_off = functools.partial(claim_hand_off, self.app, key=claimed.limit_key,
                                             process_id=claimed.process_id)
            self._handed = retry_transient(lambda: record_success(self.app, claimed, output, inline, hand_off))
            faults.hit(faults.AFTER_JOB_COMMIT)
            return "success"
        except CommitFailed as failed:
            log.warning("%s", failed)
            return "commit_failed"
