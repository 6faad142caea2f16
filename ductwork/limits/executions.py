"""Recording how an execution ended, at most once, and what follows it.

    >>> record_success(app, claimed, Output("3"))
    >>> record_crash(app, execution_id, owner=None, error_klass="ProcessCrash", message="reaped")

Every outcome is one transaction with a guarded UPDATE: the execution must still
be open (``completed_at IS NULL``) and owned by the process that claimed it. If
the reaper got there first, nothing of the transaction commits:
:func:`record_success` and :func:`record_failure` raise :class:`CommitFailed`
(the reaper's retry is the live one), :func:`record_crash` returns False, so
crashing is idempotent when several reapers race [INV-EXE-2].

A keyed execution's release locks its key's header row, reads the clock again and
takes the key's next sequence number, so every change to a key's in-flight set is
ordered under one lock, in time as in sequence (what the concurrency checker sweeps)
[INV-LIM-1, INV-LIM-3, INV-CLK-1]. A keyed success whose claim filled its key
(``Claimed.fills_key``: other work may wait for the slot) is a release: the job's
output and the step left ``advancing`` are written first, then the key's lock is taken
for the release and the hand-off only, and the branch is advanced after the commit, in
a transaction of its own (``advance.advance_released``, by the worker that recorded it,
or by an advancer if that worker dies first), so the slot is free as soon as the
success is durable and never waits for what follows the step. On a key with room,
what follows the step is written inline first, in the same transaction, before the
key's lock. The guard comes after those first writes, and a reaped execution rolls
them back with it. An unkeyed success advances its branch inline, in its own
transaction. Failures, timeouts and crashes release first.

What follows in the same transaction: success keeps the output and moves the step
to ``advancing``; a failure or timeout enqueues a retry while ``retry_count <
max_retry`` (never for a return value that cannot be stored: it would recur); a crash enqueues a
re-run while ``crash_count < max_crash`` (at once for the first third of the budget, then
backing off by 10 s per crash); a spent budget marks the step ``failed``, and so does an ``invalid`` execution (one that
can never succeed: its class is not of the configured pipelines, its input does not
bind, its return value cannot be stored) at once [INV-EXE-4]; the budgets' rules are the pure
functions of ``limits/outcomes.py``, called with the counters and time read here. The code that ran is not stopped
here: a caller that knows it may still run must stop it first [INV-EXE-5].

Once an outcome has committed it is logged (``ductwork.logs``): a failure, timeout
or crash as one WARNING with its context, what follows and its traceback; a success
at DEBUG. Nothing is logged for an outcome that was not recorded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.db.ids import new_id
from ductwork.errors import CommitFailed
from ductwork.limits.outcomes import releases_first, rerun_at, retry_at

if TYPE_CHECKING:
    from ductwork.db.database import Database as App
    from ductwork.db.database import Tx

log = logging.getLogger("ductwork.executions")

MESSAGE_LIMIT = 255
BACKTRACE_FRAMES = 10


@dataclass(frozen=True)
class Claimed:
    """An execution this process holds, with what running it needs."""

    execution_id: str
    job_id: str
    step_id: str
    #: what ``Step.idempotency_key`` returns: the step's id, or the key a revive carried
    #: over from the failed step this one re-runs [INV-EXE-3]
    idempotency_key: str
    run_id: str
    branch_id: str
    node: str
    klass: str
    pipeline_klass: str
    definition_sha1: str
    input_json: str
    limit_key: str | None
    timeout_us: int | None
    retry_count: int
    crash_count: int
    process_id: str
    claimed_at: datetime
    #: the claim left its key's concurrency full: other work of the key may wait for this
    #: slot, so its success may be recorded as a release first (``outcomes.releases_first``)
    fills_key: bool = False
    #: the claim spent its key's last token: seconds (database time, from the claim) until
    #: the rate admits the next claim (the key's ``blocked_until`` stamp); None: a token is
    #: left, or the key has no rate. A hint for waking a poller then (``TokenAlarm``)
    next_token_in_s: float | None = None

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> Claimed:
        """From a row whose columns are labelled with the field names (``claims._load``);
        ``fills_key`` and ``next_token_in_s`` are no columns: their defaults (an unkeyed
        claim's)."""
        mapping = row._mapping
        return cls(**{name: mapping[name] for name in CLAIM_COLUMNS})


#: the fields of :class:`Claimed` read from a row, by name: all but ``fills_key`` and
#: ``next_token_in_s``, which are the claim's own decision, never stored
CLAIM_COLUMNS = tuple(f.name for f in dataclasses.fields(Claimed) if f.name not in ("fills_key", "next_token_in_s"))


@dataclass(frozen=True)
class Output:
    """A validated return value: its JSON text, or, when the edge expands, its items' JSON texts."""

    value_json: str | None = None
    expand_items: list[str] | None = None

    @property
    def payload_json(self) -> str:
        """The job's ``output_payload``: the value's envelope, or an expand's item count."""
        if self.expand_items is not None:
            return expand_envelope(len(self.expand_items))
        assert self.value_json is not None, "an Output holds a value or expand items"
        return payload_envelope(self.value_json)


@dataclass(frozen=True)
class ErrorInfo:
    """An error as recorded: class, message (cut to 255) and backtrace (first frames).
    ``text`` is the whole traceback, chained errors included, for the log only (not stored)."""

    klass: str
    message: str
    backtrace: str | None
    text: str | None = None

    @classmethod
    def of(cls, error: BaseException) -> ErrorInfo:
        frames = traceback.format_tb(error.__traceback__)
        if len(frames) > BACKTRACE_FRAMES:
            frames = [*frames[:BACKTRACE_FRAMES], f"... {len(frames) - BACKTRACE_FRAMES} more frames\n"]
        return cls(f"{type(error).__module__}.{type(error).__qualname__}",
                   str(error)[:MESSAGE_LIMIT], "".join(frames) or None,
                   "".join(traceback.format_exception(error)).rstrip("\n"))


@dataclass
class KeyHeader:
    """A limit key's header row as the transaction that holds its lock has left it:
    ``seq``, the key's last sequence number (a claim or release takes the next), and the
    ``config_digest`` of the values its buckets follow. ``unwritten``: ``seq`` moved in
    this transaction and is not written yet (a keyed group commit's releases wait for
    its hand-off, which writes the header once for both: :func:`write_seq` otherwise)."""

    seq: int
    config_digest: str | None
    unwritten: bool = False


def lock_key(tx: Tx, key: str) -> KeyHeader | None:
    """Lock the key's header row (``SELECT … FOR UPDATE``; SQLite: the write lock taken at
    ``BEGIN IMMEDIATE``) and return its ``seq`` and ``config_digest``; None if the key has
    no row. The one key lock: claims, completions and the reaper take it, each as the
    first statement on the key, so a key's in-flight set changes under it [INV-LIM-1].
    A transaction that holds it already gets the header as it has left it, with no
    statement (the lock is held to the end of the transaction). Not done: creating the
    row (``steps.ensure_limit_keys`` does, with the work)."""
    held: KeyHeader | None = tx.held_keys.get(key)
    if held is not None:
        return held  # locked by this transaction already: held until it ends
    row = tx.execute(dialects.prepared(tx.conn, _lock_key_statement), {"k_key": key}).first()  # the key's lock
    if row is None:
        return None
    header = tx.held_keys[key] = KeyHeader(int(row.seq), row.config_digest)
    return header


def _lock_key_statement(bind: Any) -> sa.Select[Any]:
    """The key lock (:func:`lock_key`): its header row ``FOR UPDATE``, the key bound as ``k_key``."""
    k = schema.limit_keys
    stmt = sa.select(k.c.seq, k.c.config_digest).where(k.c.key == sa.bindparam("k_key", type_=k.c.key.type))
    return dialects.for_update(stmt, bind)  # [INV-LIM-1] the key's lock


def write_seq(tx: Tx, key: str) -> None:
    """Write a held key's ``seq`` if this transaction moved it and has not written it."""
    header = tx.held_keys.get(key)
    if header is not None and header.unwritten:
        tx.execute(dialects.prepared(tx.conn, _write_seq_statement),
                   {"k_key": key, "k_seq": header.seq, "k_now": tx.now})
        header.unwritten = False


def _write_seq_statement(_: Any) -> sa.Update:
    k = schema.limit_keys
    return (k.update().where(k.c.key == sa.bindparam("k_key", type_=k.c.key.type))
            .values(seq=sa.bindparam("k_seq", type_=k.c.seq.type),
                    updated_at=sa.bindparam("k_now", type_=schema.Timestamp)))


def lock_for_release(tx: Tx, key: str) -> KeyHeader:
    """Lock ``key`` to release executions of it (:func:`lock_key`) and read the clock again:
    a completion may have written what follows its step before, at the time it read then,
    and its releases must be timed after the lock, in the key's sequence [INV-CLK-1]. Raises
    NoResultFound if the key has no row."""
    header = lock_key(tx, key)  # [INV-LIM-1] the releases change the key's in-flight set: under its lock
    if header is None:  # pragma: no cover  an execution's key row is written with it and never deleted
        raise sa.exc.NoResultFound(f"limit key {key!r} has no row")
    tx.read_clock_again()  # [INV-CLK-1] the releases' time follows the key's sequence
    return header


def _complete(tx: Tx, execution_id: str, limit_key: str | None, owner: str | None, outcome: str,
              error: ErrorInfo | None, *, wake: bool = True) -> bool:
    """The guarded completion; True when this call ended the execution. ``wake=False``:
    the caller decides whether idle threads have anything new to do."""
    seq = None
    if limit_key:
        seq = lock_for_release(tx, limit_key).seq + 1  # [INV-LIM-1] the key's lock before the release
    e = schema.executions
    guard = e.c.process_id.is_(None) if owner is None else e.c.process_id == owner
    result = tx.execute(
        e.update()
        .where(e.c.id == execution_id,
               e.c.completed_at.is_(None),  # [INV-EXE-2] still open: not already ended
               e.c.claimed_at.is_not(None),  # claimed: a pending execution has no outcome
               guard)  # [INV-EXE-2] still ours: the reaper did not take it
        .values(completed_at=tx.now, outcome=outcome, release_seq=seq, updated_at=tx.now,
                error_klass=error.klass if error else None,
                error_message=error.message if error else None,
                error_backtrace=error.backtrace if error else None)
    )
    if result.rowcount != 1:
        return False
    # [INV-LIM-3] completion frees the slot: in-flight is derived from completed_at
    if wake:
        tx.wake()  # a slot is free, a retry may be queued, the step may be advanceable
    if limit_key:
        tx.execute(schema.limit_keys.update().where(schema.limit_keys.c.key == limit_key)
                   .values(seq=seq, updated_at=tx.now))
        tx.held_keys[limit_key].seq = seq
    return True


def _mark_failed(tx: Tx, step_id: str) -> None:
    tx.execute(schema.steps.update()
               .where(schema.steps.c.id == step_id, schema.steps.c.status == "in_progress")
               .values(status="failed", updated_at=tx.now))


def record_success(app: App, claimed: Claimed, output: Output,
                   advance: Callable[[Tx], bool] | None = None,
                   hand_off: Callable[[Tx], list[Claimed]] | None = None) -> list[Claimed]:
    """Record success: the job's output, expand items, the step ``advancing``. Raises CommitFailed.

    ``advance(tx)`` may advance the branch past the step in this same transaction (a
    linear edge: ``advance.advance_on_success``); when it returns False the step is left
    ``advancing`` for an advancer. A keyed step whose claim filled its key
    (:func:`releases_first`) is always left ``advancing``: its caller advances it after
    the commit (``advance.advance_released``; ``Success.released`` says so) or leaves it
    to an advancer. ``hand_off(tx)`` may then claim the next
    execution of the step's lane in this same transaction (``claims.hand_off``); what it
    claims is returned, and the caller must perform it.
    """
    return record_successes(app, [Success(claimed, output, advance)], hand_off)


@dataclass(eq=False)
class Success:
    """One execution's success, to be recorded: what :func:`record_successes` takes."""

    claimed: Claimed
    output: Output
    #: advances the branch past the step in the recording transaction (or returns False)
    advance: Callable[[Tx], bool] | None = None
    #: advances a group commit's successes together, in the recording transaction (all
    #: locks first): returns the ids of the steps it advanced; when every success of a
    #: group carries the same one, it stands for their ``advance`` one by one
    advance_group: Callable[[Tx, list[Success]], set[str]] | None = None
    #: seconds its body ran, as its worker timed it (None: not timed, as a slow body):
    #: :func:`releases_first` releases a full key's slot first only after a slow body
    ran_s: float | None = None
    #: set by the recording transaction: its step was left ``advancing`` by a keyed
    #: release (:func:`releases_first`, or ready late under the key's lock), for its worker
    #: to advance after the commit (``advance.advance_released``) or an advancer
    released: bool = False


class _Taken(Exception):
    """A batch's guard matched fewer executions than it holds: one was reaped."""


def record_successes(app: App, successes: list[Success],
                     hand_off: Callable[[Tx], list[Claimed]] | None = None,
                     gather: Callable[[], list[Success]] | None = None) -> list[Claimed]:
    """Record several successes of one owner in one transaction (a group commit).

    Each success is recorded as :func:`record_success` would record it, and the batch
    commits as a whole. The guard is one UPDATE over the batch: if it ends fewer
    executions than the batch holds (the reaper took one), nothing is written and
    each success is recorded in a transaction of its own, so the reaped one raises
    :class:`CommitFailed` alone [INV-EXE-2]. So is a batch whose transaction fails for
    any reason the database would not retry (an advancement error of one step): that
    error is then raised, once the other successes are recorded, and only the step
    that caused it is left unrecorded, so its siblings' crash budgets are not spent on
    it. A batch of one key's executions (a keyed group commit) first writes the jobs'
    outputs and either leaves the steps ``advancing`` (:func:`releases_first`: for
    ``advance_released`` after the commit) or advances them inline, then takes the key's
    lock, reads the clock again, and releases each execution with its own
    sequence number, in the order given (``seq + 1``, ``seq + 2``, …), under that one
    lock hold, with the hand-off [INV-LIM-1, INV-CLK-1]; a batch that mixes keys, or keyed
    and unkeyed executions, is recorded one by one. ``gather()`` (keyed only) is called
    when the transaction begins and returns more successes of the key and owner, which
    join the group (``successes`` is extended with them): those that became ready since
    the group was formed. Raises CommitFailed only for a batch of one.
    """
    keys = {s.claimed.limit_key for s in successes}
    keyed_gather = gather if None not in keys else None
    if (len(successes) > 1 or keyed_gather is not None) and len(keys) == 1:
        try:
            return _record_batch(app, successes, hand_off, keyed_gather)
        except _Taken:
            log.warning("a batch of %d successes lost an execution to the reaper; recording each alone",
                        len(successes))
        except Exception as error:  # re-raised below by the success that causes it
            if dialects.is_retryable(error) or dialects.is_disconnect(error):
                raise  # the whole batch is repeated (retry_transient)
            log.warning("a batch of %d successes failed (%s); recording each alone", len(successes), error)
    if len(successes) == 1:
        return _record_one(app, successes[0], hand_off)
    handed: list[Claimed] = []
    failure: Exception | None = None
    for success in successes:
        try:
            handed = _record_one(app, success, hand_off if success is successes[-1] else None)
        except CommitFailed as failed:  # the reaper's re-run is the live execution
            log.warning("%s", failed)
        except Exception as error:  # noqa: BLE001 - raised once the others are recorded
            failure = failure or error
    if failure is not None:
        raise failure
    return handed


def _record_batch(app: App, successes: list[Success], hand_off: Callable[[Tx], list[Claimed]] | None,
                  gather: Callable[[], list[Success]] | None = None) -> list[Claimed]:
    key = successes[0].claimed.limit_key
    with app.begin() as tx:
        if key is None:
            _end_batch(tx, successes, None)  # [INV-EXE-2] the guard is the first write
            _follow_up(tx, successes)
            handed = [] if hand_off is None else hand_off(tx)
        else:
            # A release: the jobs' outputs and the steps left `advancing` (written first, at the
            # time read now: no other transaction writes these rows), then the key's lock for
            # the releases and the hand-off only [INV-LIM-1]. The branches are advanced after
            # the commit, by `advance_released` or an advancer, so a slot is free as soon as
            # its success is durable. A reaped execution rolls all of it back: the guard raises.
            if gather is not None:
                successes.extend(gather())  # ready by now
            # else what follows is written here, before the lock
            first = releases_first(successes, app.config.job_worker.release_first_after)
            _follow_up(tx, successes, inline=not first)
            faults.hit(faults.BEFORE_RELEASE_KEY_LOCK)
            header = lock_for_release(tx, key)  # [INV-LIM-1, INV-CLK-1] the key's lock, then the clock
            late = gather() if gather is not None else []
            if late:  # ready since: released in this hold too (advancing them here would lock branch
                # and run rows after the key's: the lock order is branch, run, key)
                successes.extend(late)
                _follow_up(tx, late, inline=False)
            faults.hit(faults.IN_KEYED_GROUP_COMMIT)
            _end_batch(tx, successes, header)
            handed = [] if hand_off is None else hand_off(tx)
            write_seq(tx, key)  # the releases' seq, unless the hand-off's claim wrote it
            if len(handed) < len(successes):
                tx.wake()  # a slot is free (those a hand-off took over are nothing for anyone else)
    _log_successes(successes)
    return handed


def _end_batch(tx: Tx, successes: list[Success], header: KeyHeader | None) -> None:
    """End a group commit's executions in one guarded UPDATE; raise :class:`_Taken` if it
    ends fewer than the group holds. ``header``: the key's, locked by ``tx``: each release
    takes the key's next sequence number, in the order of the successes [INV-CLK-1]."""
    owner = successes[0].claimed.process_id
    params = {"batch_ids": [s.claimed.execution_id for s in successes], "b_now": tx.now, "b_owner": owner}
    if header is None:
        ended = tx.execute(dialects.prepared(tx.conn, _end_successes), params).rowcount
    elif len(successes) == 1:  # [INV-CLK-1] the release takes the key's next seq
        ended = tx.execute(dialects.prepared(tx.conn, _release_one), {**params, "b_seq": header.seq + 1}).rowcount
    else:
        seq = header.seq
        # [INV-CLK-1] each release its own seq, in the order of the successes
        release_seq = sa.case({s.claimed.execution_id: seq + i for i, s in enumerate(successes, start=1)},
                              value=schema.executions.c.id)
        ended = tx.execute(_end_successes(tx.conn).values(release_seq=release_seq), params).rowcount
    if ended != len(successes):  # [INV-EXE-2] one was reaped: nothing of the batch is written
        raise _Taken()
    if header is not None:  # [INV-LIM-3] the slots are free: in-flight is derived from completed_at
        header.seq, header.unwritten = header.seq + len(successes), True  # written with the hand-off's claim


def _follow_up(tx: Tx, successes: list[Success], *, inline: bool = True) -> None:
    """What follows a group's successes: the jobs' outputs and expand items, and each
    step advanced past inline or left ``advancing``. Without ``inline`` (a keyed release)
    every step is left ``advancing``, and advancers are woken only for those whose
    ``advance`` could not move them (:func:`released_later`: their worker advances the
    others after the commit, ``advance_released``)."""
    _write_outputs(tx, successes)
    for success in successes:
        _write_expand_items(tx, success)
        success.released = not inline and success.claimed.limit_key is not None
    group = successes[0].advance_group
    if not inline:
        _mark_advancing(tx, [s.claimed.step_id for s in successes],
                        wake=any(not released_later(s) for s in successes))
        return
    if group is not None and all(s.advance_group is group for s in successes):
        advanced = group(tx, successes)
    else:  # one lock order (branch id) for every group commit: two never wait on each other's branches
        advanced = {s.claimed.step_id for s in sorted(successes, key=lambda s: s.claimed.branch_id)
                    if s.advance is not None and s.advance(tx)}
    _mark_advancing(tx, [s.claimed.step_id for s in successes if s.claimed.step_id not in advanced])


def released_later(success: Success) -> bool:
    """Whether a keyed success released first (:func:`releases_first`) is advanced by its
    worker after the release commits (its ``advance`` says it may advance inline:
    ``advance.InlineAdvance.simple``)."""
    simple = getattr(success.advance, "simple", None)
    return success.claimed.limit_key is not None and simple is not None and bool(simple())


#: a group commit writes its jobs' outputs with one UPDATE per distinct output while there
#: are at most this many distinct outputs (steps that return the same value: ``None``,
#: ``True``, a status), else one UPDATE per job in one ``executemany``
DISTINCT_OUTPUTS = 4


def _end_successes(bind: Any) -> sa.Update:
    """A group commit's guarded UPDATE: its executions (``batch_ids``) end in success if
    still open and held by ``b_owner``."""
    e = schema.executions
    now = sa.bindparam("b_now", type_=schema.Timestamp)
    owner = sa.bindparam("b_owner", type_=e.c.process_id.type)
    guard = [e.c.completed_at.is_(None),  # [INV-EXE-2] still open: not already ended
             e.c.claimed_at.is_not(None),
             # [INV-EXE-2] still ours: the reaper took none of them
             dialects.by_primary_key(e.c.process_id, bind) == owner]
    return (e.update().where(e.c.id.in_(dialects.ids_param()), *guard)
            .values(completed_at=now, outcome="success", updated_at=now))


def _release_one(bind: Any) -> sa.Update:
    """:func:`_end_successes` of one keyed execution, its release's seq bound as ``b_seq``."""
    return _end_successes(bind).values(release_seq=sa.bindparam("b_seq", type_=schema.executions.c.release_seq.type))


def _write_outputs(tx: Tx, successes: list[Success]) -> None:
    """Each success's job: its output and its completion time. Not done: checking that
    the jobs exist (the guarded UPDATE of their executions came first)."""
    j = schema.jobs
    by_output: dict[str, list[str]] = {}
    for success in successes:
        by_output.setdefault(success.output.payload_json, []).append(success.claimed.job_id)
    if len(by_output) <= DISTINCT_OUTPUTS:
        for payload, job_ids in by_output.items():
            tx.execute(dialects.prepared(tx.conn, _write_output),
                       {"batch_ids": job_ids, "b_payload": payload, "b_now": tx.now})
        return
    tx.execute(j.update().where(j.c.id == sa.bindparam("b_id"))
               .values(output_payload=sa.bindparam("b_payload"), completed_at=tx.now, updated_at=tx.now),
               [{"b_id": s.claimed.job_id, "b_payload": s.output.payload_json} for s in successes])


def _write_output(_: Any) -> sa.Update:
    j = schema.jobs
    now = sa.bindparam("b_now", type_=schema.Timestamp)
    return (j.update().where(j.c.id.in_(dialects.ids_param()))
            .values(output_payload=sa.bindparam("b_payload", type_=j.c.output_payload.type), completed_at=now,
                    updated_at=now))


def _write_expand_items(tx: Tx, success: Success) -> None:
    items = success.output.expand_items
    if items is not None:
        rows = [{"job_id": success.claimed.job_id, "item_index": i, "value": v} for i, v in enumerate(items)]
        for start in range(0, len(rows), 1000):
            tx.execute(schema.expand_items.insert(), rows[start:start + 1000])


def _mark_advancing(tx: Tx, step_ids: list[str], *, wake: bool = True) -> None:
    """Leave these succeeded steps ``advancing``, and wake an advancer (``wake``)."""
    if step_ids:
        tx.execute(dialects.prepared(tx.conn, _to_advancing), {"batch_ids": step_ids, "b_now": tx.now})
        if wake:
            tx.wake_advancers()  # an advancer has work (a job worker has nothing new)


def _to_advancing(bind: Any) -> sa.Update:
    steps = schema.steps
    status = dialects.by_primary_key(steps.c.status, bind)
    return (steps.update().where(steps.c.id.in_(dialects.ids_param()), status == "in_progress")
            .values(status="advancing", updated_at=sa.bindparam("b_now", type_=schema.Timestamp)))


def _record_one(app: App, success: Success, hand_off: Callable[[Tx], list[Claimed]] | None) -> list[Claimed]:
    claimed = success.claimed
    with app.begin() as tx:
        if claimed.limit_key:  # a release: the output first, so the key's lock is held only for the release
            if not _still_ours(tx, claimed):  # (a reaped execution's step may have moved on: nothing to follow)
                raise CommitFailed(claimed.execution_id, claimed.process_id)
            _follow_up(tx, [success], inline=not releases_first([success], app.config.job_worker.release_first_after))
        if not _complete(tx, claimed.execution_id, claimed.limit_key, claimed.process_id, "success", None,
                         wake=False):
            raise CommitFailed(claimed.execution_id, claimed.process_id)  # (rolls back what followed)
        if not claimed.limit_key:
            _follow_up(tx, [success])  # (a successor created inline wakes idle threads)
        handed = [] if hand_off is None else hand_off(tx)
        if claimed.limit_key and not handed:
            tx.wake()  # a slot is free (a hand-off took it over: nothing for anyone else)
    _log_successes([success])
    return handed


def _still_ours(tx: Tx, claimed: Claimed) -> bool:
    """Whether ``claimed`` is still open and its owner's, as read now (a plain read: the
    guarded UPDATE decides; this only spares writing what follows a step for an execution
    the reaper already took, whose step a re-run may have moved past)."""
    e = schema.executions
    return tx.execute(sa.select(e.c.id).where(e.c.id == claimed.execution_id, e.c.completed_at.is_(None),
                                              e.c.process_id == claimed.process_id)).first() is not None


def _log_successes(successes: list[Success]) -> None:
    """One DEBUG per committed success (thousands per second: never INFO)."""
    if log.isEnabledFor(logging.DEBUG):
        for success in successes:
            c = success.claimed
            log.debug("step succeeded: %s (run_id=%s step_id=%s execution_id=%s attempt=%d)", c.node, c.run_id,
                      c.step_id, c.execution_id, c.retry_count + c.crash_count + 1,
                      extra={"run_id": c.run_id, "step": c.klass, "node": c.node, "step_id": c.step_id,
                             "execution_id": c.execution_id, "outcome": "success"})


def record_failure(app: App, claimed: Claimed, error: BaseException | ErrorInfo, *,
                   outcome: str = "failure") -> bool:
    """Record a failure or timeout and enqueue a retry or fail the step. Raises CommitFailed.

    Returns True when a retry was enqueued.
    """
    assert outcome in ("failure", "timed_out"), outcome
    max_retry = app.config.job_worker.max_retry_for(claimed.pipeline_klass, claimed.klass)
    retry = None
    with app.begin() as tx:
        info = error if isinstance(error, ErrorInfo) else ErrorInfo.of(error)
        if not _complete(tx, claimed.execution_id, claimed.limit_key, claimed.process_id, outcome, info):
            raise CommitFailed(claimed.execution_id, claimed.process_id)
        retry = retry_at(claimed.retry_count, max_retry, app.config.job_worker.retry_delay, tx.now)
        if retry is not None:  # [INV-EXE-4] budget left: the retry is enqueued with the outcome
            tx.execute(schema.executions.insert().values(**new_execution_row(
                claimed.job_id, claimed.limit_key, retry, claimed.retry_count + 1,
                claimed.crash_count, tx.now)))
        else:
            _mark_failed(tx, claimed.step_id)
    logs.step_ended(log, logs.StepEnded(  # committed: now it may be told
        outcome, claimed.run_id, claimed.pipeline_klass, claimed.klass, claimed.node, claimed.step_id,
        claimed.execution_id, claimed.retry_count, claimed.crash_count, max_retry, info.klass, info.message,
        retry, info.text or _traceback(info)))
    return retry is not None


def _traceback(info: ErrorInfo) -> str | None:
    """The log's traceback text from a recorded error (when the whole text is not known)."""
    if info.backtrace is None:
        return None
    return f"Traceback (most recent call last):\n{info.backtrace}{info.klass}: {info.message}"


def record_invalid(app: App, claimed: Claimed, error: BaseException | ErrorInfo) -> None:
    """Record an execution that can never succeed (outcome ``invalid``) and fail its step.

    For a step that cannot run as stored (its class does not resolve, or its input
    does not bind to ``__init__``) and for a return value that cannot be stored (not
    JSON, too large, not a list before ``expand``). Running it again would end the same
    way, so no retry or re-run is enqueued whatever budget is left; the step becomes
    ``failed`` in this transaction and an advancer halts its branch ``job_invalid``,
    ``step_return_invalid`` or ``payload_too_large`` (``pipelines.rules.job_halt_reason``)
    [INV-EXE-4]. Raises CommitFailed, as :func:`record_failure` does.
    """
    with app.begin() as tx:
        info = error if isinstance(error, ErrorInfo) else ErrorInfo.of(error)
        if not _complete(tx, claimed.execution_id, claimed.limit_key, claimed.process_id, "invalid", info):
            raise CommitFailed(claimed.execution_id, claimed.process_id)
        _mark_failed(tx, claimed.step_id)  # [INV-EXE-4] no budget applies: it cannot succeed
    logs.step_ended(log, logs.StepEnded(  # committed: now it may be told
        "invalid", claimed.run_id, claimed.pipeline_klass, claimed.klass, claimed.node, claimed.step_id,
        claimed.execution_id, claimed.retry_count, claimed.crash_count, 0, info.klass, info.message,
        None, info.text or _traceback(info)))


def record_crash(app: App, execution_id: str, owner: str | None, error_klass: str, message: str,
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


def crash_in(app: App, tx: Tx, execution_id: str, owner: str | None, error_klass: str, message: str,
             backtrace: str | None = None, traceback_text: str | None = None) -> logs.StepEnded | None:
    """:func:`record_crash` inside the caller's transaction (the reaper's). Returns what
    to log once the transaction commits (:func:`ductwork.logs.step_ended`), or None
    when it crashed nothing."""
    e, j, s, r = schema.executions, schema.jobs, schema.steps, schema.runs
    row = tx.execute(
        sa.select(e.c.job_id, e.c.limit_key, e.c.retry_count, e.c.crash_count, s.c.id.label("step_id"),
                  s.c.klass, s.c.node, s.c.run_id, r.c.pipeline_klass)
        .join(j, j.c.id == e.c.job_id).join(s, s.c.id == j.c.step_id).join(r, r.c.id == s.c.run_id)
        .where(e.c.id == execution_id)
    ).first()
    if row is None:
        return None
    info = ErrorInfo(error_klass, message[:MESSAGE_LIMIT], backtrace)
    if not _complete(tx, execution_id, row.limit_key, owner, "process_crashed", info):
        return None
    max_crash = app.config.job_worker.max_crash_for(row.pipeline_klass, row.klass)
    eligible = rerun_at(row.crash_count, max_crash, app.config.job_worker.crash_backoff, tx.now)
    if eligible is not None:  # [INV-EXE-4] budget left: the re-run is enqueued with the crash
        tx.execute(schema.executions.insert().values(**new_execution_row(
            row.job_id, row.limit_key, eligible, row.retry_count, row.crash_count + 1, tx.now)))
    else:
        _mark_failed(tx, row.step_id)
    return logs.StepEnded("process_crashed", row.run_id, row.pipeline_klass, row.klass, row.node, row.step_id,
                          execution_id, row.retry_count, row.crash_count, max_crash, error_klass, info.message,
                          eligible, traceback_text or _traceback(info))


def payload_envelope(value_json: str) -> str:
    """Wrap a value's JSON text as a job's ``output_payload``."""
    return '{"payload": ' + value_json + "}"


def expand_envelope(count: int) -> str:
    return json.dumps({"expand_items": count})


def new_execution_row(job_id: str, limit_key: str | None, eligible_at: Any, retry_count: int,
                      crash_count: int, now: Any) -> dict[str, Any]:
    """A pending execution (the claim queue entry) for ``job_id``."""
    return {
        "id": new_id(), "job_id": job_id, "limit_key": limit_key, "eligible_at": eligible_at,
        "claimed_at": None, "process_id": None, "completed_at": None, "outcome": None,
        "error_klass": None, "error_message": None, "error_backtrace": None,
        "retry_count": retry_count, "crash_count": crash_count, "claim_seq": None,
        "release_seq": None, "created_at": now, "updated_at": now,
    }
