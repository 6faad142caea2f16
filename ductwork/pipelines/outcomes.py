"""Recording how an execution ended, at most once, and what follows it in the pipeline.

    >>> record_successes(app, [Success(claimed, Output("3"))], HandOff(limit=8))
    >>> record_crash(app, execution_id, owner=None, error_klass="ProcessCrash", message="reaped")

Every outcome is one transaction read top-down: what the outcome means for the pipeline
(the step's output and expand items, the step advanced past or left ``advancing``, a retry
or a re-run enqueued, the step ``failed``), then the limits layer's routine
(``limits.claims.release_and_claim``, one round trip on a server): the guard and the
release (every execution still open and its owner's, or nothing of the transaction
commits [INV-EXE-2]) and, for a success, the hand-off of the lane's next executions to
the same worker. If the reaper got there first, :func:`record_successes` and
:func:`record_failure` raise :class:`CommitFailed` (the reaper's re-run is the live one),
:func:`record_crash` returns False, so crashing is idempotent when several recoveries race.

Successes: one path for one success and for a group (a worker's batch): a group, of one
lane or of several, is one transaction; a group whose guard finds one execution taken, or
whose transaction fails for a reason the database would not retry, is recorded one
success at a time, so only the taken one (or the one that fails) is lost. A success whose
edge is a simple transition (``branches.advance_on_successes``) advances its branch in the
same transaction, before any key's lock is taken (so a key is held only for the routine
and the commit); any other is left ``advancing`` for an advancer. Lock order [lock order]:
branch rows, run rows, then each key's lock in key order (the routine's, once per lane),
then the hand-off's claim, for a group of one lane only.

What follows a failure or timeout: a retry while ``retry_count < max_retry`` (never for a
return value that cannot be stored: it would recur); a crash: a re-run while ``crash_count
< max_crash`` (at once for the first third of the budget, then backing off by 10 s per
crash); a spent budget marks the step ``failed``, and so does an ``invalid`` execution (one
that can never succeed) at once [INV-EXE-4]; the budgets' rules are the pure functions of
``limits/outcomes.py``. The code that ran is not stopped here: a caller that knows it may
still run must stop it first [INV-EXE-5].

Once an outcome has committed it is logged (``ductwork.logs``): a failure, timeout or crash
as one WARNING with its context, what follows and its traceback; a success at DEBUG.
Nothing is logged for an outcome that was not recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.errors import CommitFailed
from ductwork.limits.claims import no_longer_full, release_and_claim
from ductwork.limits.executions import Claimed, Ending, ErrorInfo, Pending, enqueue
from ductwork.limits.outcomes import rerun_at, retry_at
from ductwork.pipelines.branches import Inline, StepMovedOn, advance_on_successes, set_status_if
from ductwork.pipelines.payloads import Output
from ductwork.pipelines.runs import cached_definition

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

log = logging.getLogger("ductwork.executions")


@dataclass(eq=False)
class Success:
    """One execution's success, to be recorded (:func:`record_successes`)."""

    claimed: Claimed
    output: Output


@dataclass(frozen=True)
class HandOff:
    """What a success's transaction may claim for its worker once it released
    (``limits.claims.hand_off``): up to ``limit`` unkeyed executions, or ``keyed_limit`` of
    the key."""

    limit: int = 1
    keyed_limit: int = 1


def record_success(app: Database, claimed: Claimed, output: Output, hand_off: HandOff | None = None) -> list[Claimed]:
    """:func:`record_successes` of one success."""
    return record_successes(app, [Success(claimed, output)], hand_off)


def record_successes(app: Database, successes: list[Success], hand_off: HandOff | None = None) -> list[Claimed]:
    """Record successes of one owner: each step's output and expand items, each step advanced
    past inline (a simple transition on a free branch) or left ``advancing``, then the
    guarded release of every execution (each key's lock first, in key order), then the
    hand-off, if asked and the group is of one lane; returns what was handed on, which the
    caller must perform.

    One transaction for a group, whatever its lanes. When its guard ends fewer executions
    than it holds (the reaper took one), nothing is written and each success is recorded in
    a transaction of its own, so the taken one raises :class:`CommitFailed` alone
    [INV-EXE-2]; so is a group whose transaction fails for any reason the database would
    not retry (that error is raised once the other successes are recorded, and only the
    success that caused it is left unrecorded). Raises CommitFailed only for a group of
    one; recorded one by one, hands on only in the last transaction.
    """
    if len(successes) <= 1:
        return _commit(app, successes, hand_off) if successes else []
    try:
        return _commit(app, successes, hand_off)
    except CommitFailed:  # one taken: each is recorded alone, so that only the taken one is lost
        log.warning("a batch of %d successes lost an execution to the reaper; recording each alone",
                    len(successes))
    except Exception as error:  # re-raised by the success that causes it, recorded alone
        if dialects.is_retryable(error) or dialects.is_disconnect(error):
            raise  # the whole batch is repeated (retry_transient)
        log.warning("a batch of %d successes failed (%s); recording each alone", len(successes), error)
    handed: list[Claimed] = []
    failure: Exception | None = None
    for success in successes:
        try:
            handed = _commit(app, [success], hand_off if success is successes[-1] else None)
        except CommitFailed as failed:  # the reaper's re-run is the live execution
            log.warning("%s", failed)
        except Exception as error:  # noqa: BLE001 - raised once the others are recorded
            failure = failure or error
    if failure is not None:
        raise failure
    return handed


def _commit(app: Database, successes: list[Success], hand_off: HandOff | None) -> list[Claimed]:
    """One group's transaction: what follows the steps, then the routine of each lane, in
    key order: the guarded release and, for a group of one lane, the hand-off, one round
    trip each. Raises CommitFailed (naming the group's first execution) when one of its
    executions was taken, and nothing is written."""
    lanes: dict[str | None, list[Ending]] = {}
    for success in sorted(successes, key=lambda s: s.claimed.limit_key or ""):  # (stable: the order given in a lane)
        lanes.setdefault(success.claimed.limit_key, []).append(Ending(success.claimed.execution_id))
    keyed = any(key is not None for key in lanes)
    no_longer_full(app, lanes)
    with app.begin() as tx:
        _follow_up(app, tx, successes)  # [lock order] branch, then run rows
        if keyed:
            faults.hit(faults.BEFORE_RELEASE_KEY_LOCK)
        for key, endings in lanes.items():
            # [INV-EXE-2] the guard: every execution still open and ours, or nothing commits
            # [lock order] then each key's lock (a keyed release), in key order, then the hand-off's claim
            take = 0 if hand_off is None or len(lanes) > 1 else hand_off.limit if key is None else hand_off.keyed_limit
            taken = release_and_claim(app, tx, key, successes[0].claimed.process_id, endings, take)
            if not taken.ended:
                raise _lost(successes)
            handed = taken.claimed
        if keyed:
            faults.hit(faults.IN_KEYED_GROUP_COMMIT)
        if keyed and len(handed) < len(successes):
            tx.wake()  # a slot is free (those a hand-off took over are nothing for anyone else)
    _log_successes(successes)
    return handed


def _lost(successes: list[Success]) -> CommitFailed:
    """A group's guard matched fewer executions than it holds: one was taken (the error
    names the group's first, the one of a group of one)."""
    return CommitFailed(successes[0].claimed.execution_id, successes[0].claimed.process_id)


def _follow_up(app: Database, tx: Tx, successes: list[Success]) -> None:
    """What follows a group's successes: the steps' outputs and expand items, and each step
    advanced past inline (``pipeline_advancer.inline_linear``, a simple transition on a free
    branch) or left ``advancing`` for an advancer (woken). Raises CommitFailed when a step
    is no longer in progress: its execution was taken and another attempt moved it on."""
    for success in successes:
        _write_expand_items(tx, success)
    try:
        advanced = advance_on_successes(tx, _inline_moves(app, successes))
    except StepMovedOn:
        raise _lost(successes) from None
    rest = {s.claimed.step_id: s.output.payload_json for s in successes if s.claimed.step_id not in advanced}
    if rest:
        if set_status_if(tx, rest, "in_progress", "advancing") != len(rest):
            raise _lost(successes)  # a step no longer in progress: its execution was taken [INV-EXE-2]
        tx.wake_advancers()  # an advancer has work (a job worker has nothing new)


def _inline_moves(app: Database, successes: list[Success]) -> list[Inline]:
    """The inline advancements of ``successes`` whose value is a value (not an expand's
    items), when ``pipeline_advancer.inline_linear`` is on; none when it is off."""
    if not app.config.pipeline_advancer.inline_linear:
        return []
    return [Inline(s.claimed, cached_definition(app, s.claimed.definition_sha1), s.output.value_json,
                   s.output.payload_json) for s in successes if s.output.value_json is not None]


def _write_expand_items(tx: Tx, success: Success) -> None:
    items = success.output.expand_items
    if items is not None:
        rows = [{"step_id": success.claimed.step_id, "item_index": i, "value": v} for i, v in enumerate(items)]
        for start in range(0, len(rows), 1000):
            tx.execute(schema.expand_items.insert(), rows[start:start + 1000])


def _log_successes(successes: list[Success]) -> None:
    """One DEBUG per committed success (thousands per second: never INFO)."""
    if log.isEnabledFor(logging.DEBUG):
        for success in successes:
            c = success.claimed
            log.debug("step succeeded: %s (run_id=%s step_id=%s execution_id=%s attempt=%d)", c.node, c.run_id,
                      c.step_id, c.execution_id, c.retry_count + c.crash_count + 1,
                      extra={"run_id": c.run_id, "step": c.klass, "node": c.node, "step_id": c.step_id,
                             "execution_id": c.execution_id, "outcome": "success"})


def record_failure(app: Database, claimed: Claimed, error: BaseException | ErrorInfo, *,
                   outcome: str = "failure") -> bool:
    """Record a failure or timeout and enqueue a retry or fail the step. Raises CommitFailed.

    Returns True when a retry was enqueued.
    """
    assert outcome in ("failure", "timed_out"), outcome
    return _record_end(app, claimed, outcome, error).next_at is not None


def record_invalid(app: Database, claimed: Claimed, error: BaseException | ErrorInfo) -> None:
    """Record an execution that can never succeed (outcome ``invalid``) and fail its step.

    For a step that cannot run as stored (its class does not resolve, or its input
    does not bind to ``__init__``) and for a return value that cannot be stored (not
    JSON, too large, not a list before ``expand``). Running it again would end the same
    way, so no retry or re-run is enqueued whatever budget is left; the step becomes
    ``failed`` in this transaction and an advancer halts its branch ``job_invalid``,
    ``step_return_invalid`` or ``payload_too_large`` (``pipelines.rules.job_halt_reason``)
    [INV-EXE-4]. Raises CommitFailed, as :func:`record_failure` does.
    """
    _record_end(app, claimed, "invalid", error)


def _record_end(app: Database, claimed: Claimed, outcome: str, error: BaseException | ErrorInfo) -> logs.StepEnded:
    """:func:`_end_in` of a claimed execution in a transaction of its own, logged once
    committed; CommitFailed when its guard found it ended or taken."""
    info = error if isinstance(error, ErrorInfo) else ErrorInfo.of(error)
    with app.begin() as tx:
        ended = _end_in(app, tx, claimed, claimed.execution_id, claimed.process_id, outcome, info)
        if ended is None:
            raise CommitFailed(claimed.execution_id, claimed.process_id)  # [INV-EXE-2]
    logs.step_ended(log, ended)  # committed: now it may be told
    return ended


def record_crash(app: Database, execution_id: str, owner: str | None, error_klass: str, message: str,
                 backtrace: str | None = None, traceback_text: str | None = None) -> bool:
    """Crash an execution held by ``owner`` (None: an orphan) and enqueue its re-run;
    logged (WARNING, ``traceback_text`` or ``backtrace`` under it) once committed.

    Idempotent: False, and nothing written or logged, if it already ended or another
    owner holds it.
    """
    with app.begin() as tx:
        crashed = crash_in(app, tx, execution_id, owner, error_klass, message, backtrace, traceback_text)
    if crashed is not None:
        logs.step_ended(log, crashed)  # committed: now it may be told
    return crashed is not None


def crash_in(app: Database, tx: Tx, execution_id: str, owner: str | None, error_klass: str, message: str,
             backtrace: str | None = None, traceback_text: str | None = None) -> logs.StepEnded | None:
    """:func:`record_crash` inside the caller's transaction (a recovery's). Returns what
    to log once the transaction commits (:func:`ductwork.logs.step_ended`), or None
    when it crashed nothing."""
    e, s, r = schema.executions, schema.steps, schema.runs
    row = tx.execute(
        sa.select(e.c.step_id, e.c.limit_key, e.c.retry_count, e.c.crash_count,
                  s.c.klass, s.c.node, s.c.run_id, r.c.pipeline_klass)
        .join(s, s.c.id == e.c.step_id).join(r, r.c.id == s.c.run_id)
        .where(e.c.id == execution_id)
    ).first()
    if row is None:
        return None
    info = ErrorInfo(error_klass, message, backtrace, traceback_text)
    return _end_in(app, tx, row, execution_id, owner, "process_crashed", info)


def _end_in(app: Database, tx: Tx, x: Claimed | sa.Row[Any], execution_id: str, owner: str | None, outcome: str,
            info: ErrorInfo) -> logs.StepEnded | None:
    """An execution's end without success, in ``tx``: the guarded release (None, and
    nothing written, when it ended already or is another owner's), then a retry (a failure
    or timeout) or a re-run (a crash) enqueued with it while its budget lasts, else its step
    ``failed``, at once for an ``invalid`` execution (no budget applies: it cannot succeed)
    [INV-EXE-4]. ``x``: the execution's step, run and counters (its claim, or the row a
    recovery read). Returns what to log once the transaction commits."""
    no_longer_full(app, [x.limit_key])
    if not release_and_claim(app, tx, x.limit_key, owner, [Ending(execution_id, outcome, info)]).ended:
        return None  # [INV-EXE-2] ended already, or another owner's: nothing to end
    config, retries, crashes = app.config.job_worker, x.retry_count, x.crash_count
    if outcome == "process_crashed":
        budget = config.max_crash_for(x.pipeline_klass, x.klass)
        eligible, crashes = rerun_at(x.crash_count, budget, config.crash_backoff, tx.now), crashes + 1
    elif outcome == "invalid":
        budget, eligible = 0, None  # [INV-EXE-4] no budget applies: it cannot succeed
    else:
        budget = config.max_retry_for(x.pipeline_klass, x.klass)
        eligible, retries = retry_at(x.retry_count, budget, config.retry_delay, tx.now), retries + 1
    if eligible is not None:  # [INV-EXE-4] budget left: the retry or re-run is enqueued with the outcome
        enqueue(tx, [Pending(x.step_id, x.limit_key, eligible, retries, crashes)])
    else:
        set_status_if(tx, {x.step_id: None}, "in_progress", "failed")
    tx.wake(advancers=eligible is None)  # a slot is free; a failed step is an advancer's to halt its branch
    return logs.StepEnded(outcome, x.run_id, x.pipeline_klass, x.klass, x.node, x.step_id, execution_id,
                          x.retry_count, x.crash_count, budget, info.klass, info.message, eligible,
                          info.log_traceback())
