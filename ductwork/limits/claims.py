"""Claiming one execution, with limits enforced exactly, fleet-wide.

    >>> claimed = claim(app, process_id)      # None when nothing may run now
    >>> handed = hand_off(app, tx, key, process_id)   # inside a success's transaction

Each model operation of ``model.limits.LimitsModel`` that claims is one function here of
the same name (``claim``, ``claim_batch``, ``restart_with``): the whole transaction, called
by the worker and by the conformance machine alike (CONTRIBUTING.md, "Operations"). The
model's ``complete_all_and_hand_off`` (of one success or a group) is the success
transaction (``pipelines.outcomes.record_successes``), whose limits part is
``executions.release`` then :func:`hand_off`.

A poll looks at *lanes*: each limit key with eligible pending work that is not
rate-blocked and not concurrency-saturated, plus one lane for unkeyed work, and
tries them in the order of their oldest eligible execution (eligible time, then
creation order) [INV-LIM-6]. The unkeyed lane claims with ``FOR UPDATE SKIP
LOCKED``. A keyed lane claims in one transaction that

1. locks the key's header row before any other read [INV-LIM-1],
2. reads the database clock only then [INV-CLK-1],
3. finds the key's oldest eligible execution and
4. counts the key's in-flight executions (derived from execution rows, never a
   stored counter, so a slot cannot leak [INV-LIM-3]), both in one statement,
5. runs the pure decision (:func:`ductwork.limits.buckets.decide`) on the current config,
6. writes refilled buckets and the ``blocked_until`` stamp [INV-LIM-4, INV-LIM-5],
   and, if admitted, claims the execution and spends the tokens.

The claim, the token spend and the stamp commit together or not at all, so a
limit of five never reaches six: two workers cannot both read "four in flight".
Worked numbers: ``concurrency: 3`` admits a fourth claim only after one of three
in-flight executions completed; ``rate: {limit: 5, per: 1s}`` (burst 5) admits at
most 5 + 5·T claims in any T seconds of database time [INV-LIM-2].

Not done here: running the step, or releasing slots (completion does that, under
the same key lock: executions.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork import faults
from ductwork.db import dialects, schema
from ductwork.db.clock import from_us
from ductwork.limit_entries import LimitEntry, entry_digest
from ductwork.limits import buckets
from ductwork.limits.executions import CLAIM_COLUMNS, Claimed, KeyHeader, lock_key, write_header
from ductwork.limits.lanes import UNKEYED, Lane, Position, in_lane, next_lane, precedes, scan_lanes

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

log = logging.getLogger("ductwork.claims")
_e = schema.executions

@dataclass
class Refusal:
    """Why a keyed lane did not admit (for status and tests)."""

    key: str
    reason: str  # "concurrency" | "rate" | "gone"


def _running(*columns: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """What running an execution needs (``Claimed``'s fields but its owner and claim time),
    and ``columns``."""
    j, s, r = schema.jobs, schema.steps, schema.runs
    return (sa.select(_e.c.id.label("execution_id"), _e.c.job_id, s.c.id.label("step_id"),
                      schema.step_idempotency_key(s).label("idempotency_key"), s.c.run_id,
                      s.c.branch_id, s.c.node, j.c.klass, r.c.pipeline_klass, r.c.definition_sha1,
                      j.c.input_args.label("input_json"), _e.c.limit_key, s.c.timeout_us, _e.c.retry_count,
                      _e.c.crash_count, *columns)
            .join(j, j.c.id == _e.c.job_id).join(s, s.c.id == j.c.step_id).join(r, r.c.id == s.c.run_id))


_RUNNING = [name for name in CLAIM_COLUMNS if name not in ("process_id", "claimed_at")]  # (the claim's own)


def _claimed(row: sa.Row[Any], process_id: str, claimed_at: datetime, fills_key: bool = False,
             next_token_in_s: float | None = None) -> Claimed:
    """A row of :func:`_running` as claimed by ``process_id`` at ``claimed_at``."""
    mapping = row._mapping
    return Claimed(**{name: mapping[name] for name in _RUNNING}, process_id=process_id, claimed_at=claimed_at,
                   fills_key=fills_key, next_token_in_s=next_token_in_s)


def _load(tx: Tx, execution_ids: list[str]) -> list[Claimed]:
    """What running each claimed execution needs, in the order of ``execution_ids``."""
    rows = tx.execute(dialects.prepared(tx.conn, _load_statement), {"batch_ids": execution_ids}).all()
    by_id = {row.execution_id: Claimed.from_row(row) for row in rows}
    return [by_id[execution_id] for execution_id in execution_ids]


def _load_statement(_: Any) -> sa.Select[Any]:
    return _running(_e.c.process_id, _e.c.claimed_at).where(_e.c.id.in_(dialects.ids_param()))


def _claim_rows(tx: Tx, execution_ids: list[str], process_id: str, seq: int) -> bool:
    """Claim a key's executions in one statement, the i-th (from 0) with sequence number
    ``seq + 1 + i``; True when every one was still pending."""
    if len(execution_ids) == 1:  # (a poll's claim: the statement built once)
        result = tx.execute(dialects.prepared(tx.conn, _claim_one_row),
                            {"batch_ids": execution_ids, "c_now": tx.now, "c_process": process_id,
                             "c_seq": seq + 1})
        return result.rowcount == 1
    claim_seq = sa.case({execution_id: seq + i for i, execution_id in enumerate(execution_ids, start=1)},
                        value=_e.c.id)
    result = tx.execute(
        _e.update()
        .where(_e.c.id.in_(dialects.inline_ids(execution_ids)),
               _e.c.claimed_at.is_(None))  # still pending: nobody claimed it since we read it
        .values(claimed_at=tx.now, process_id=process_id, claim_seq=claim_seq, updated_at=tx.now)
    )
    return result.rowcount == len(execution_ids)


def _claim_one_row(_: Any) -> sa.Update:
    """:func:`_claim_rows` of one execution, its values bound at execution."""
    now = sa.bindparam("c_now", type_=schema.Timestamp)
    return (_e.update()
            .where(_e.c.id.in_(dialects.ids_param()),
                   _e.c.claimed_at.is_(None))  # still pending: nobody claimed it since we read it
            .values(claimed_at=now, process_id=sa.bindparam("c_process", type_=_e.c.process_id.type),
                    claim_seq=sa.bindparam("c_seq", type_=_e.c.claim_seq.type), updated_at=now))


def _decide_statement(_: Any) -> sa.Select[Any]:
    """A keyed claim's read under the key's lock: the key's ``d_limit`` oldest executions
    eligible at ``d_now``, with what running them needs and the key's in-flight count."""
    key = sa.bindparam("d_key", type_=_e.c.pending_lane.type)
    counted = sa.select(sa.func.count()).where(_e.c.inflight_key == key)  # [INV-LIM-1] run under the key's lock
    return (in_lane(_running(_e.c.eligible_at, counted.scalar_subquery().label("in_flight")), key,
                    sa.bindparam("d_now", type_=schema.Timestamp))
            .limit(sa.bindparam("d_limit", type_=sa.Integer)))


def claim_unkeyed(app: Database, process_id: str, limit: int = 1, before: Lane | None = None) -> list[Claimed]:
    """Claim up to ``limit`` of the oldest eligible unkeyed executions, skipping rows
    other claimers hold, and only those a poll would take before lane ``before``."""
    with app.begin() as tx:
        return _claim_unkeyed_in(tx, process_id, limit, before)


def _claim_unkeyed_in(tx: Tx, process_id: str, limit: int, before: Lane | None) -> list[Claimed]:
    """The unkeyed claim in ``tx``: what ``limit`` successive polls would claim while the
    unkeyed lane stays first, in one statement of each kind.

    ``before`` is the next lane of the scan (the oldest keyed lane that may admit): an
    execution is taken only if it comes before that lane's oldest in poll order, so a
    batch never overtakes a key [INV-LIM-6]. Nothing of a key changes in between: the
    batch is read at one database time, and a key's lane is not touched by unkeyed claims.
    """
    params: dict[str, Any] = {"b_lane": UNKEYED, "b_now": tx.now, "b_limit": limit}
    stmt = dialects.prepared(tx.conn, _unkeyed_batch)
    if before is not None:
        stmt = dialects.prepared(tx.conn, _unkeyed_batch_before)  # [INV-LIM-6] not past the next lane's oldest
        params.update(b_oldest_at=before.oldest.eligible_at, b_oldest_id=before.oldest.id)
    execution_ids = list(tx.execute(stmt, params).scalars())
    if not execution_ids:
        return []
    claimed = tx.execute(dialects.prepared(tx.conn, _claim_unkeyed_rows), {
        "batch_ids": execution_ids, "b_now": tx.now, "b_process": process_id}).rowcount
    if claimed != len(execution_ids):  # pragma: no cover  the ids were read FOR UPDATE in this transaction
        raise AssertionError(f"unkeyed claim: {claimed} of {len(execution_ids)} locked executions were "
                             "still pending")
    return _load(tx, execution_ids)


def _unkeyed_query() -> sa.Select[Any]:
    """The oldest eligible unkeyed executions (``in_lane``), its values bound at execution:
    ``b_lane``, ``b_now``, ``b_limit``."""
    query = in_lane(sa.select(_e.c.id), sa.bindparam("b_lane", type_=_e.c.pending_lane.type),
                    sa.bindparam("b_now", type_=schema.Timestamp))
    return query.limit(sa.bindparam("b_limit", type_=sa.Integer))


def _unkeyed_batch(bind: Any) -> sa.Select[Any]:
    return dialects.for_update(_unkeyed_query(), bind, skip_locked=True)


def _unkeyed_batch_before(bind: Any) -> sa.Select[Any]:
    before = precedes((sa.bindparam("b_oldest_at", type_=schema.Timestamp),
                        sa.bindparam("b_oldest_id", type_=_e.c.id.type)))
    return dialects.for_update(_unkeyed_query().where(before), bind, skip_locked=True)


def _claim_unkeyed_rows(_: Any) -> sa.Update:
    now = sa.bindparam("b_now", type_=schema.Timestamp)
    return (_e.update()
            .where(_e.c.id.in_(dialects.ids_param()),
                   _e.c.claimed_at.is_(None))  # still pending (locked by the read above)
            .values(claimed_at=now, process_id=sa.bindparam("b_process", type_=_e.c.process_id.type),
                    updated_at=now))


def _buckets_of(tx: Tx, key: str) -> dict[int, buckets.Bucket]:
    return {
        row.period_s: buckets.Bucket(row.period_s, row.level_units, row.refilled_at_us)
        for row in tx.execute(dialects.prepared(tx.conn, _buckets_statement), {"b_key": key})
    }


def _buckets_statement(_: Any) -> sa.Select[Any]:
    b = schema.limit_buckets
    return sa.select(b.c.period_s, b.c.level_units, b.c.refilled_at_us).where(
        b.c.key == sa.bindparam("b_key", type_=b.c.key.type))


def _write_buckets(tx: Tx, key: str, new: tuple[buckets.Bucket, ...], old: dict[int, buckets.Bucket]) -> None:
    b = schema.limit_buckets
    for bucket in new:
        values = {"level_units": bucket.level_units, "refilled_at_us": bucket.refilled_at_us,
                  "updated_at": tx.now}
        if bucket.period_s in old:
            tx.execute(dialects.prepared(tx.conn, _bucket_update),
                       {"b_key": key, "b_period": bucket.period_s, **{f"b_{k}": v for k, v in values.items()}})
        else:
            tx.execute(b.insert().values(key=key, period_s=bucket.period_s, **values))


def _bucket_update(_: Any) -> sa.Update:
    b = schema.limit_buckets
    return (b.update().where(b.c.key == sa.bindparam("b_key", type_=b.c.key.type),
                             b.c.period_s == sa.bindparam("b_period", type_=b.c.period_s.type))
            .values(level_units=sa.bindparam("b_level_units", type_=b.c.level_units.type),
                    refilled_at_us=sa.bindparam("b_refilled_at_us", type_=b.c.refilled_at_us.type),
                    updated_at=sa.bindparam("b_updated_at", type_=schema.Timestamp)))


def _rebase(tx: Tx, key: str, entry: LimitEntry | None, header: KeyHeader,
            stored: dict[int, buckets.Bucket], *, restart: bool = False) -> dict[int, buckets.Bucket]:
    """Apply the config to a locked key: keep only the buckets of periods the entry keeps,
    and clear the stamp [INV-LIM-4].

    Returns the buckets the decision may use. Outside a ``restart``, a key whose values
    did not change is left as it is.
    """
    digest = entry_digest(entry)
    if header.config_digest == digest and not restart:
        return stored
    kept = buckets.carry_over(entry, stored)
    dropped = sorted(set(stored) - set(kept))
    b = schema.limit_buckets
    if dropped:
        tx.execute(b.delete().where(b.c.key == key, b.c.period_s.in_(dropped)))
    header.set(config_digest=digest, blocked_until=None)  # written with the claim's (write_header)
    return kept


def restart_with(app: Database) -> list[str]:
    """A restart with this process's limits: re-base every key on its config (at boot);
    ``LimitsModel.restart_with``.

    Every key's stamp is cleared (a stamp is only a hint that lets workers skip a
    key; the next refusal stamps it again, exactly), and a key whose values changed
    keeps only the buckets of the periods its new entry keeps. That is what
    ``vectors/buckets.json``'s ``restart_with`` specifies. Claims re-base lazily too,
    under the same lock, when the stored values differ, so a rolling deploy converges.
    Returns the keys re-based.
    """
    with app.begin(readonly=True) as tx:
        keys = list(tx.execute(sa.select(schema.limit_keys.c.key)).scalars())
    for key in keys:
        with app.begin() as tx:
            header = lock_key(tx, key)
            if header is not None:  # pragma: no branch  a key's row, once written, is never deleted
                _rebase(tx, key, app.config.limits.get(key), header, _buckets_of(tx, key), restart=True)
                write_header(tx, key)
    return keys


def claim_keyed(app: Database, key: str, process_id: str, limit: int = 1) -> list[Claimed] | Refusal:
    """Claim the oldest eligible execution of ``key`` if its limits admit one now, and up
    to ``limit`` in all under the same lock hold, as successive polls would
    (:func:`decide_and_claim`); the first claim first."""
    with app.begin() as tx:
        faults.hit(faults.BEFORE_KEY_LOCK)
        header = lock_key(tx, key)  # [INV-LIM-1] the key lock, before any other read
        faults.hit(faults.AFTER_KEY_LOCK)
        return decide_and_claim(app, tx, key, header, process_id, limit=limit)


def hand_off(app: Database, tx: Tx, key: str | None, process_id: str, limit: int = 1,
             keyed_limit: int = 1) -> list[Claimed]:
    """In the transaction that just completed an execution of lane ``key`` (None: the
    unkeyed lane): claim the lane's next execution for the same worker, if a poll made
    now would claim it; for the unkeyed lane, up to ``limit`` of them, for a key up to
    ``keyed_limit`` (a keyed group commit's hand-off), as :func:`claim_batch` would.

    That is when the lane is the first lane a poll would try [INV-LIM-6] and, for a key,
    its limits admit a claim now. The completion of a keyed execution holds the key's
    lock and has read the clock after it, so the claim is the one :func:`claim_keyed`
    makes, with the same decision, spend and stamp. Otherwise nothing at all is written
    (not even a refill or a stamp) and the worker polls as usual. A freed slot thus
    passes to the next execution in the commit that frees it, with no moment at which it
    stands empty while work waits, and a busy worker saves a poll per step. Not done: a
    key whose stored values differ from this process's config (a deploy in progress) is
    left to an ordinary claim, which re-bases it first.
    """
    lane = key or UNKEYED
    lanes = scan_lanes(app, tx)
    if not lanes or lanes[0].key != lane:  # [INV-LIM-6] only what a poll would claim first
        return []
    if lane == UNKEYED:
        return _claim_unkeyed_in(tx, process_id, limit, next_lane(lanes, 0))
    header = lock_key(tx, lane)  # [INV-LIM-1] held since the completion's release (no statement)
    if header is None or header.config_digest != entry_digest(app.config.limits.get(lane)):
        return []
    outcome = decide_and_claim(app, tx, lane, header, process_id, write_refusal=False, limit=keyed_limit, lanes=lanes)
    return outcome if isinstance(outcome, list) else []


def decide_and_claim(app: Database, tx: Tx, key: str, header: KeyHeader | None, process_id: str,
                      *, write_refusal: bool = True, limit: int = 1,
                      lanes: list[Lane] | None = None) -> list[Claimed] | Refusal:
    """The claim a poll makes on ``key`` (whose lock ``tx`` holds: steps 2-6 of the module
    docstring), then, with ``limit`` > 1, up to ``limit`` in all as the next polls would
    (``LimitsModel.claim_batch``); the Refusal of the first decision if it did not admit.
    The one place of a keyed claim and a keyed hand-off alike; ``lanes``: a scan made
    under this lock hold (the hand-off's), else one is made when a further claim is
    possible. One statement reads the key's ``limit`` oldest eligible executions, with
    what running them needs, and the key's in-flight count.

    Each further claim is exactly the one the worker's next poll would make: while the
    key's lane is the first lane of a scan made now and the key admits. The batch ends
    before an execution that another lane's oldest precedes [INV-LIM-6] or before a
    decision that refuses (which writes nothing: the last spend already stamped the key if
    it ran short). Under the lock nothing of this key changes but what this transaction
    writes and no other lane is touched by it, so one scan bounds every further claim
    (the oldest of the other lanes), and the decisions are made in memory one after the
    other (:func:`ductwork.limits.buckets.decide` on the in-flight count and buckets the
    previous one left, at the same database time), each deciding, spending and stamping
    as a poll does [INV-LIM-2, INV-LIM-5]; their effects are then written at once: one
    UPDATE claims the admitted executions, each with its own sequence number, in order,
    and the buckets and header get the last admitted decision's state."""
    now_us = tx.now_us  # [INV-CLK-1] the clock is read only once the lock is held
    # [INV-LIM-1] the in-flight count is read under the lock, with the candidates
    rows = tx.execute(dialects.prepared(tx.conn, _decide_statement),
                      {"d_key": key, "d_now": tx.now, "d_limit": limit}).all()
    if header is None or not rows:
        return Refusal(key, "gone")
    in_flight = rows[0].in_flight
    entry = app.config.limits.get(key)
    old = _rebase(tx, key, entry, header, _stored_buckets(tx, key, entry, header))
    decision = buckets.decide(entry, old, in_flight, now_us)
    if decision.refused_for == "concurrency":
        write_header(tx, key)  # a re-base, if any (a refusal refills and stamps nothing)
        return Refusal(key, "concurrency")
    if not decision.admitted and not write_refusal:
        return Refusal(key, "rate")  # a hand-off that does not happen leaves no trace
    seq, admitted = header.seq, [rows[0]] if decision.admitted else []
    if decision.admitted and len(rows) > 1:
        decision = _decide_further(app, tx, key, rows, admitted, decision, in_flight, lanes)
    if admitted:
        _claim_admitted(tx, key, admitted, process_id, seq, decision.unconfigured)
    _write_buckets(tx, key, decision.buckets, old)  # [INV-LIM-2] the spend commits with the claim
    if decision.stamp:  # pragma: no branch  only a concurrency refusal leaves the stamp, and it returned above
        # [INV-LIM-5] the exact time of the next token, or cleared
        header.set(blocked_until=None if decision.blocked_until_us is None else from_us(decision.blocked_until_us))
    if admitted:
        header.set(seq=seq + len(admitted))
    write_header(tx, key)  # with the seq of a release in this transaction, if any
    if not admitted:
        return Refusal(key, "rate")
    return _as_claimed(tx, admitted, process_id, entry, in_flight, decision)


def _stored_buckets(tx: Tx, key: str, entry: LimitEntry | None, header: KeyHeader) -> dict[int, buckets.Bucket]:
    """The key's stored buckets, read when the decision needs them: a rated key, or one
    whose stored config differs (a re-base decides what is kept)."""
    if (entry is not None and entry.rates) or header.config_digest != entry_digest(entry):
        return _buckets_of(tx, key)
    return {}


def _as_claimed(tx: Tx, admitted: list[sa.Row[Any]], process_id: str, entry: LimitEntry | None, in_flight: int,
                decision: buckets.Decision) -> list[Claimed]:
    """The admitted rows as claimed by ``process_id`` now, with the claim's hints: whether
    it filled the key (its releases are what waiting work needs first) and when the next
    token is due if it spent the last (the stamp just written, for ``TokenAlarm``)."""
    full = entry is not None and entry.concurrency is not None and in_flight + len(admitted) >= entry.concurrency
    next_token = None if decision.blocked_until_us is None else (decision.blocked_until_us - tx.now_us) / 1e6
    return [_claimed(row, process_id, tx.now, full, next_token) for row in admitted]


def _decide_further(app: Database, tx: Tx, key: str, rows: Sequence[sa.Row[Any]], admitted: list[sa.Row[Any]],
                    decision: buckets.Decision, in_flight: int, lanes: list[Lane] | None) -> buckets.Decision:
    """The further claims of a keyed batch after an admitted first (appended to
    ``admitted``): each the one the next poll would make, decided in memory on the
    in-flight count and buckets the previous decision left, at the same time; returns the
    last admitted decision."""
    lanes = scan_lanes(app, tx) if lanes is None else lanes
    # [INV-LIM-6] the oldest of every other lane: a further claim must come before it
    before = next((lane for lane in lanes if lane.key != key), None)
    entry = app.config.limits.get(key)
    for row in rows[1:]:
        if before is not None and Position(row.eligible_at, row.execution_id) >= before.oldest:
            break  # [INV-LIM-6] another lane would come first: the batch ends
        faults.hit(faults.BETWEEN_KEYED_BATCH_CLAIMS)
        further = buckets.decide(entry, {b.period_s: b for b in decision.buckets}, in_flight + len(admitted),
                                 tx.now_us)
        if not further.admitted:
            break  # the next poll would be refused: the batch ends, no trace of it
        decision = further
        admitted.append(row)
    return decision


def _claim_admitted(tx: Tx, key: str, admitted: list[sa.Row[Any]], process_id: str, seq: int,
                    unconfigured: bool) -> None:
    """Claim the admitted executions, in order, each with the key's next sequence number."""
    if unconfigured:
        log.warning("Claiming a limit key with no configuration entry unlimited: %r", key)
    ids = [row.execution_id for row in admitted]
    if not _claim_rows(tx, ids, process_id, seq):  # pragma: no cover  read under the key lock all their claims take
        raise AssertionError(f"key {key!r}: one of executions {ids} taken under the key lock [INV-LIM-1]")
    faults.hit(faults.BETWEEN_CLAIM_AND_SPEND)


def claim(app: Database, process_id: str) -> Claimed | None:
    """Claim at most one execution: the oldest that its lane's limits admit now."""
    claimed = claim_batch(app, process_id, 1)
    return claimed[0] if claimed else None


def claim_batch(app: Database, process_id: str, limit: int, keyed_limit: int = 1,
                per_key: Mapping[str, int] | None = None,
                refused: Callable[[Refusal], None] | None = None) -> list[Claimed]:
    """What successive polls would claim while the first poll's lane stays first:
    ``LimitsModel.claim_batch``, in one transaction.

    A poll claims the oldest execution that its lane's limits admit now. When the oldest
    lane is the unkeyed one, the claim happens in the lane scan's own transaction, and
    takes up to ``limit`` unkeyed executions, each older than the next lane's oldest
    [INV-LIM-6]: the claims that many polls would make in a row. A keyed claim is a
    transaction of its own, whose first statement is the key lock [INV-LIM-1]; it takes
    up to ``keyed_limit`` executions of the key under that one lock hold, each the claim
    the next poll would make (:func:`decide_and_claim`), or ``per_key[key]`` for a key it
    names. Returns the claimed executions in poll order (empty: nothing may run now);
    ``refused`` is told of each keyed claim refused for concurrency or rate (the fleet
    counts them; nothing is written for it here).
    """
    with app.begin() as tx:
        lanes = scan_lanes(app, tx)
        if lanes and lanes[0].key == UNKEYED:
            claimed = _claim_unkeyed_in(tx, process_id, limit, next_lane(lanes, 0))
            if claimed:
                return claimed
            lanes = lanes[1:]
    for index, lane in enumerate(lanes):
        if lane.key == UNKEYED:
            claimed = claim_unkeyed(app, process_id, limit, next_lane(lanes, index))
            if claimed:
                return claimed
            continue
        most = keyed_limit if per_key is None else per_key.get(lane.key, keyed_limit)
        outcome = claim_keyed(app, lane.key, process_id, most)
        if isinstance(outcome, list):
            return outcome
        if refused is not None and outcome.reason != "gone":  # ("gone": no eligible work left, not a refusal)
            refused(outcome)
    return []
