"""Claims and releases of executions, with limits enforced exactly, fleet-wide: the lane routine.

    >>> claimed = claim(app, process_id)      # a poll: None when nothing may run now
    >>> taken = release_and_claim(app, tx, "vendor_api", owner, [Ending(execution_id)], take=1)

Every change to a lane's executions goes through one routine, :func:`release_and_claim`:
end the owner's executions of one lane (every outcome: a success, a failure, a crash),
then claim up to ``take`` of the lane's next ones for the same owner, either as a
**hand-off** (in the transaction that recorded a success: only what a poll made now would
claim) or as a **poll's claim** (the lane a scan found first). On PostgreSQL and
MySQL-family it is one round trip (a server-side routine, ``limits/sql/``); on SQLite,
which is in-process, the same steps in Python. What it decides is
:func:`ductwork.limits.plan.plan`, a pure function of what it read, and each backend's
routine is checked against it state by state (``tests/properties/test_refinement.py``).

In one transaction, in order:

1. a keyed lane's header row is locked before any other read [INV-LIM-1], and the
   database clock is read only then [INV-CLK-1];
2. the endings, guarded: every one still open and held by the owner (None: an orphan, no
   process), each taking the key's next sequence number in the order given, or none is
   kept and the caller rolls its transaction back [INV-EXE-2, INV-LIM-3];
3. the lane's oldest eligible executions and the key's in-flight count (derived from
   execution rows, never a stored counter [INV-LIM-3]), and the oldest eligible execution
   of every other lane a poll would try (``lanes``) [INV-LIM-6];
4. the plan (the key decision, the poll order), then its writes: refilled buckets and the
   ``blocked_until`` stamp [INV-LIM-4, INV-LIM-5], the claims, each with the key's next
   sequence number, and the spend [INV-LIM-2], all committed together or not at all.

So a limit of five never reaches six: two workers cannot both read "four in flight".
Worked numbers: ``concurrency: 3`` admits a fourth claim only after one of three in-flight
executions completed; ``rate: {limit: 5, per: 1s}`` (burst 5) admits at most 5 + 5·T
claims in any T seconds of database time [INV-LIM-2]. A hand-off keeps the owner's slot:
the release frees it and the claim takes it again under one hold of the key's lock, so no
moment exists at which it stands empty while work waits (docs/semantics.md §5).

A poll (:func:`claim`, :func:`claim_batch`) scans the lanes (``lanes.scan_lanes``) and
calls the routine on each in the scan's order, each keyed claim a transaction of its own
whose first statement is the key's lock, until one claims (a batch goes on past a key its
claims filled). Not done here: running the step, what an outcome means for the pipeline
(``pipelines.outcomes``), or enqueueing (``executions.enqueue``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork import faults
from ductwork.db import dialects, schema
from ductwork.db.clock import from_us, to_us
from ductwork.limit_entries import FamilyEntry, LimitEntry, entry_digest
from ductwork.limits import buckets
from ductwork.limits.executions import CLAIM_COLUMNS, Claimed, Ending, KeyHeader, lock_key, write_header
from ductwork.limits.lanes import LANES_PER_SCAN, UNKEYED, Position, family_in_flight, in_lane, scan_lanes
from ductwork.limits.plan import KeyRow, LaneState, Plan, Request, plan

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

log = logging.getLogger("ductwork.claims")
_e = schema.executions
UNCONFIGURED_WARNING = "Claiming a limit key with no configuration entry unlimited: %r"


@dataclass
class Refusal:
    """Why a keyed lane did not admit a poll's claim (for status and tests)."""

    key: str
    reason: str  # "concurrency" | "rate" | "gone"


@dataclass(frozen=True)
class Taken:
    """What one call of :func:`release_and_claim` did: whether every ending ended (False:
    one was taken, by the reaper or another recovery, and the caller must roll back), the
    executions claimed for the owner (in order), and a poll's refusal, if any."""

    ended: bool
    claimed: list[Claimed]
    refused: str | None = None


def release_and_claim(app: Database, tx: Tx, key: str | None, owner: str | None, endings: Sequence[Ending],
                      take: int = 0, *, poll: bool = False) -> Taken:
    """End ``endings`` (executions of lane ``key``, None: the unkeyed lane, held by
    ``owner``, None: orphans), then claim up to ``take`` of the lane's next executions for
    ``owner``: a hand-off, or with ``poll`` a poll's claim of the lane (module docstring).
    The one routine of every release and every claim: the guard [INV-EXE-2], the key's
    lock and clock [INV-LIM-1, INV-CLK-1], the decision (:func:`~ductwork.limits.plan.plan`)
    and its writes. Endings of more than one execution share one outcome and no error."""
    assert len(endings) <= 1 or all(e.outcome == endings[0].outcome and e.error is None for e in endings), endings
    if dialects.has_server_routines(tx.conn):  # one round trip (limits/sql/); SQLite: the steps here
        return _on_server(app, tx, key, owner, endings, take, poll)
    return _in_python(app, tx, key, owner, endings, take, poll)


#: the server-side routine's name (``limits/sql/``, installed by migration 0013): a change to
#: it is a new name, installed by a new migration
ROUTINE = "ductwork_release_and_claim_3"


def _on_server(app: Database, tx: Tx, key: str | None, owner: str | None, endings: Sequence[Ending],
               take: int, poll: bool) -> Taken:
    """The routine on a server, in one round trip: the SQL of ``limits/sql/`` (PL/pgSQL, a
    MySQL stored procedure) takes the key's lock, reads the clock, ends, reads, decides and
    writes, as :func:`_in_python` does."""
    rows = dialects.call_routine(tx.conn, ROUTINE, _routine_args(app, key, owner, endings, take, poll))
    head = rows[0]
    tx.read_by_routine(head.r_now)  # [INV-CLK-1] the time the routine read after the key's lock
    if head.r_status == "taken":
        return Taken(False, [])
    claimed = [row for row in rows if row.r_execution_id is not None]
    if claimed and head.r_unconfigured:
        log.warning(UNCONFIGURED_WARNING, key)
    stamped = head.r_stamp and head.r_blocked_us is not None
    next_token = (head.r_blocked_us - to_us(head.r_now)) / 1e6 if stamped else None
    return Taken(True, [_claimed(row, owner, head.r_now, next_token, prefix="r_") for row in claimed], head.r_status)


def _routine_args(app: Database, key: str | None, owner: str | None, endings: Sequence[Ending], take: int,
                  poll: bool) -> list[dialects.RoutineArg]:
    """The server-side routine's arguments, in its order (``limits/sql/``)."""
    fixed, offset = app.clock.in_sql()
    keys, unconfigured = _routine_config(tuple(app.config.limits.items()), tuple(app.config.families.items()))
    entry = None if key is None else app.config.entry_for(key)  # (a partition's: its family's per_partition)
    family, ceiling = (None, None) if key is None else app.config.family_ceiling(key) or (None, None)
    error = endings[0].error if endings else None
    return [key, owner, [e.execution_id for e in endings], endings[0].outcome if endings else None,
            None if error is None else error.klass, None if error is None else error.message,
            None if error is None else error.backtrace, take, poll, fixed,
            offset // timedelta(microseconds=1), None if entry is None else dialects.Json(_entry_json(entry)),
            None if key is None else entry_digest(entry), dialects.Json(keys), unconfigured, family, ceiling]


@functools.lru_cache(maxsize=64)
def _entry_json(entry: LimitEntry) -> dict[str, object]:
    """A key's entry as the routine reads it: concurrency and kept rates in config order."""
    return {"c": entry.concurrency, "r": [[r.limit, r.per_s, r.burst] for r in entry.rates]}


@functools.lru_cache(maxsize=16)
def _routine_config(limits: tuple[tuple[str, LimitEntry], ...], families: tuple[tuple[str, FamilyEntry], ...]
                    ) -> tuple[list[dict[str, object]], str]:
    """What the server-side routine is given of a config's limits for its bound's walk: every
    configured key and family with its concurrency and fingerprint (a family's are its
    ``per_partition``'s, marked ``"p"``, with its ceiling ``"f"``), and the fingerprint of no
    entry."""
    named = [*limits, *((family, f.per_partition) for family, f in families)]
    ceilings = {family: f.concurrency for family, f in families}
    keys: list[dict[str, object]] = [
        {"k": key, "c": entry.concurrency, "d": entry_digest(entry), **({"p": True, "f": ceilings[key]}
                                                                          if key in ceilings else {})}
        for key, entry in named]
    return keys, entry_digest(None)


def _in_python(app: Database, tx: Tx, key: str | None, owner: str | None, endings: Sequence[Ending],
               take: int, poll: bool) -> Taken:
    """The routine's steps here, each a statement (SQLite: a statement is a call, not a
    round trip), under the database write lock the transaction took at BEGIN IMMEDIATE: the
    key's lock is that lock (a partition's family's too: taken first, before any read
    [INV-LIM-8]), and every clock read of the transaction is after it [INV-CLK-1]."""
    header = None
    if key is not None:
        header = lock_key(tx, key, create=bool(take))  # [INV-LIM-1] the key's lock, before any other read
        if header is None:
            if endings:  # pragma: no cover  a key with work in flight is never forgotten [INV-LIM-9]
                raise sa.exc.NoResultFound(f"limit key {key!r} has no row")
            return Taken(True, [], "gone" if poll else None)
    if endings:
        if not _end(tx, owner, endings, header):  # [INV-EXE-2] the guard
            return Taken(False, [])
        if header is not None:
            header.set(seq=header.seq + len(endings))  # [INV-LIM-3] the slots are free: in-flight derives
    if take <= 0:
        if key is not None:
            write_header(tx, key)
        return Taken(True, [])
    entry = None if key is None else app.config.entry_for(key)
    ceiling = None if key is None else app.config.family_ceiling(key)
    state, rows = _read(app, tx, key, header, entry, take, poll)
    if ceiling is not None:  # [INV-LIM-8] the family's in flight, after the endings, under the write lock
        state = dataclasses.replace(state, family_in_flight=tx.execute(family_in_flight(ceiling[0])).scalar_one())
    decided = plan(state, Request(key, entry, take, poll, None if ceiling is None else ceiling[1]))
    claimed = _write(tx, key, header, owner, decided, rows, state)
    return Taken(True, claimed, decided.refused)


def _read(app: Database, tx: Tx, key: str | None, header: KeyHeader | None, entry: LimitEntry | None,
          take: int, poll: bool) -> tuple[LaneState, dict[str, sa.Row[Any]]]:
    """What the plan is made from (``plan.LaneState``), and the candidates' rows by id."""
    if key is None:
        rows = list(tx.execute(dialects.prepared(tx.conn, _unkeyed_candidates),
                               {"b_lane": UNKEYED, "b_now": tx.now, "b_limit": take}))
        in_flight = 0
    else:  # [INV-LIM-1] the in-flight count is read under the key's lock, with the candidates
        rows = list(tx.execute(dialects.prepared(tx.conn, _keyed_candidates),
                               {"d_key": key, "d_now": tx.now, "d_limit": take}))
        in_flight = rows[0].in_flight if rows else 0
    candidates = tuple(Position(row.eligible_at, row.execution_id) for row in rows)
    bound = None
    if candidates and (not poll or take > 1):
        # [INV-LIM-6] the oldest of every other lane a poll would try now
        bound = next((lane.oldest for lane in scan_lanes(app, tx, 1, (key or UNKEYED,), candidates[-1])), None)
    row = None if header is None or key is None else KeyRow(header.seq, header.config_digest,
                                                             _stored_buckets(tx, key, entry, header))
    state = LaneState(tx.now_us, row, in_flight, candidates, bound)
    return state, {r.execution_id: r for r in rows}


def _write(tx: Tx, key: str | None, header: KeyHeader | None, owner: str | None, decided: Plan,
           rows: Mapping[str, sa.Row[Any]], state: LaneState) -> list[Claimed]:
    """Write the plan: the claims (each the key's next sequence number), then the key's
    buckets and header row; the claims as :class:`Claimed`."""
    ids = list(decided.claims)
    if ids:
        if decided.unconfigured:
            log.warning(UNCONFIGURED_WARNING, key)
        seq = None if header is None else header.seq
        if not _claim_rows(tx, ids, owner, seq):  # pragma: no cover  read under the key lock, or FOR UPDATE
            raise AssertionError(f"lane {key!r}: one of executions {ids} was taken under its lock [INV-LIM-1]")
    if key is None or header is None:
        return _load(tx, ids)
    _write_key(tx, key, header, decided, state.key.buckets if state.key else {}, len(ids))
    next_token = None if decided.blocked_until_us is None else (decided.blocked_until_us - state.now_us) / 1e6
    return [_claimed(rows[i], owner, tx.now, next_token if decided.stamp else None) for i in ids]


def _write_key(tx: Tx, key: str, header: KeyHeader, decided: Plan, stored: Mapping[int, buckets.Bucket],
               claimed: int) -> None:
    """The key's part of the plan: a re-base's dropped buckets and digest, the buckets
    [INV-LIM-2], the stamp [INV-LIM-5] and the sequence number after ``claimed`` claims, in
    its header row (with the endings' seq, if any)."""
    b = schema.limit_buckets
    if decided.dropped:
        tx.execute(b.delete().where(b.c.key == key, b.c.period_s.in_(decided.dropped)))
    if decided.digest is not None:
        header.set(config_digest=decided.digest)
    if decided.buckets is not None:
        _write_buckets(tx, key, decided.buckets, stored)  # [INV-LIM-2] the spend commits with the claims
    if decided.stamp:  # [INV-LIM-5] the exact time of the next token, or cleared
        header.set(blocked_until=None if decided.blocked_until_us is None else from_us(decided.blocked_until_us))
    if claimed:
        header.set(seq=header.seq + claimed)
    write_header(tx, key)


# --------------------------------------------------------------------------- the routine's statements (SQLite)


def _end(tx: Tx, owner: str | None, endings: Sequence[Ending], header: KeyHeader | None) -> bool:
    """The guarded UPDATE that ends the executions: whether it ended every one; with a
    keyed lane's ``header``, each takes the key's next sequence number, in the order given."""
    first = endings[0]
    error = first.error
    params: dict[str, Any] = {"batch_ids": [e.execution_id for e in endings], "b_now": tx.now, "b_owner": owner,
                              "b_outcome": first.outcome, "b_error_klass": error.klass if error else None,
                              "b_error_message": error.message if error else None,
                              "b_error_backtrace": error.backtrace if error else None,
                              "b_seq": None if header is None else header.seq + 1}
    statement = dialects.prepared(tx.conn, _end_orphans if owner is None else _end_executions)
    if header is not None and len(endings) > 1:  # [INV-CLK-1] each release its own seq, in the order given
        statement = statement.values(release_seq=sa.case(
            {e.execution_id: header.seq + i for i, e in enumerate(endings, start=1)}, value=_e.c.id))
    return bool(tx.execute(statement, params).rowcount == len(endings))  # [INV-EXE-2] fewer: one was taken


def _end_statement(owner: sa.ColumnElement[bool]) -> sa.Update:
    now = sa.bindparam("b_now", type_=schema.Timestamp)
    return (_e.update()
            .where(_e.c.id.in_(dialects.ids_param()),
                   _e.c.completed_at.is_(None),  # [INV-EXE-2] still open: not already ended
                   _e.c.claimed_at.is_not(None),  # claimed: a pending execution has no outcome
                   owner)  # [INV-EXE-2] still the owner's: the reaper did not take it
            .values(completed_at=now, updated_at=now, release_seq=sa.bindparam("b_seq", type_=_e.c.release_seq.type),
                    **{name: sa.bindparam(f"b_{name}", type_=_e.c[name].type)
                       for name in ("outcome", "error_klass", "error_message", "error_backtrace")}))


def _end_executions(bind: Any) -> sa.Update:
    """The guarded end: the executions (``batch_ids``) end if still open and held by ``b_owner``."""
    owner = sa.bindparam("b_owner", type_=_e.c.process_id.type)
    return _end_statement(dialects.by_primary_key(_e.c.process_id, bind) == owner)


def _end_orphans(_: Any) -> sa.Update:
    """The guarded end for orphans: still open and held by no process."""
    return _end_statement(_e.c.process_id.is_(None))


def _running(*columns: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """What running an execution needs (``Claimed``'s fields but its owner and claim time),
    and ``columns``."""
    s, r = schema.steps, schema.runs
    return (sa.select(_e.c.id.label("execution_id"), _e.c.step_id,
                      schema.step_idempotency_key(s).label("idempotency_key"), s.c.run_id,
                      s.c.branch_id, s.c.node, s.c.klass, r.c.pipeline_klass, r.c.definition_sha1,
                      s.c.input_args.label("input_json"), _e.c.limit_key, s.c.timeout_us, _e.c.retry_count,
                      _e.c.crash_count, *columns)
            .join(s, s.c.id == _e.c.step_id).join(r, r.c.id == s.c.run_id))


_RUNNING = [name for name in CLAIM_COLUMNS if name not in ("process_id", "claimed_at")]  # (the claim's own)


def _claimed(row: sa.Row[Any], process_id: str | None, claimed_at: datetime,
             next_token_in_s: float | None = None, *, prefix: str = "") -> Claimed:
    """A row of :func:`_running` (each column named ``prefix`` and the field: the server
    routine's are ``r_…``) as claimed by ``process_id`` at ``claimed_at``."""
    mapping = row._mapping
    assert process_id is not None, "a claim has an owner"  # (only a release has none: it takes nothing)
    return Claimed(**{name: mapping[prefix + name] for name in _RUNNING}, process_id=process_id, claimed_at=claimed_at,
                   next_token_in_s=next_token_in_s)


def _load(tx: Tx, execution_ids: list[str]) -> list[Claimed]:
    """Claimed executions as their rows say, in the order of ``execution_ids``."""
    if not execution_ids:
        return []
    rows = tx.execute(dialects.prepared(tx.conn, _load_statement), {"batch_ids": execution_ids}).all()
    by_id = {row.execution_id: Claimed.from_row(row) for row in rows}
    return [by_id[execution_id] for execution_id in execution_ids]


def _load_statement(_: Any) -> sa.Select[Any]:
    return _running(_e.c.process_id, _e.c.claimed_at).where(_e.c.id.in_(dialects.ids_param()))


def _keyed_candidates(_: Any) -> sa.Select[Any]:
    """A keyed lane's read under the key's lock: its ``d_limit`` oldest executions eligible
    at ``d_now``, with what running them needs and the key's in-flight count."""
    key = sa.bindparam("d_key", type_=_e.c.pending_lane.type)
    counted = sa.select(sa.func.count()).where(_e.c.inflight_key == key)  # [INV-LIM-1] run under the key's lock
    return (in_lane(_running(_e.c.eligible_at, counted.scalar_subquery().label("in_flight")), key,
                    sa.bindparam("d_now", type_=schema.Timestamp))
            .limit(sa.bindparam("d_limit", type_=sa.Integer)))


def _unkeyed_candidates(bind: Any) -> sa.Select[Any]:
    """The unkeyed lane's oldest eligible executions (``in_lane``), skipping rows other
    claimers hold: ``b_lane``, ``b_now``, ``b_limit``."""
    query = in_lane(sa.select(_e.c.id.label("execution_id"), _e.c.eligible_at),
                    sa.bindparam("b_lane", type_=_e.c.pending_lane.type), sa.bindparam("b_now", type_=schema.Timestamp))
    return dialects.for_update(query.limit(sa.bindparam("b_limit", type_=sa.Integer)), bind, skip_locked=True)


def _claim_rows(tx: Tx, execution_ids: list[str], owner: str | None, seq: int | None) -> bool:
    """Claim executions in one statement, the i-th (from 0) with sequence number ``seq + 1
    + i`` (None: unkeyed, no sequence); True when every one was still pending."""
    claim_seq: Any = None
    if seq is not None:  # [INV-CLK-1] each claim its own seq, in order, after the endings'
        claim_seq = sa.case({execution_id: seq + i for i, execution_id in enumerate(execution_ids, start=1)},
                            value=_e.c.id)
    result = tx.execute(
        _e.update()
        .where(_e.c.id.in_(dialects.inline_ids(execution_ids)),
               _e.c.claimed_at.is_(None))  # still pending: nobody claimed it since we read it
        .values(claimed_at=tx.now, process_id=owner, claim_seq=claim_seq, updated_at=tx.now))
    return bool(result.rowcount == len(execution_ids))


def _buckets_of(tx: Tx, key: str) -> dict[int, buckets.Bucket]:
    b = schema.limit_buckets
    return {row.period_s: buckets.Bucket(row.period_s, row.level_units, row.refilled_at_us)
            for row in tx.execute(sa.select(b.c.period_s, b.c.level_units, b.c.refilled_at_us).where(b.c.key == key))}


def _stored_buckets(tx: Tx, key: str, entry: LimitEntry | None, header: KeyHeader) -> dict[int, buckets.Bucket]:
    """The key's stored buckets, read when the decision needs them: a rated key, or one
    whose stored config differs (a re-base decides what is kept)."""
    if (entry is not None and entry.rates) or header.config_digest != entry_digest(entry):
        return _buckets_of(tx, key)
    return {}


def _write_buckets(tx: Tx, key: str, new: tuple[buckets.Bucket, ...], old: Mapping[int, buckets.Bucket]) -> None:
    b = schema.limit_buckets
    for bucket in new:
        values = {"level_units": bucket.level_units, "refilled_at_us": bucket.refilled_at_us, "updated_at": tx.now}
        if bucket.period_s in old:
            tx.execute(b.update().where(b.c.key == key, b.c.period_s == bucket.period_s).values(**values))
        else:
            tx.execute(b.insert().values(key=key, period_s=bucket.period_s, **values))


# --------------------------------------------------------------------------- polls


def claim(app: Database, process_id: str) -> Claimed | None:
    """Claim at most one execution: the oldest that its lane's limits admit now."""
    claimed = claim_batch(app, process_id, 1)
    return claimed[0] if claimed else None


def claim_keyed(app: Database, key: str, process_id: str, limit: int = 1) -> list[Claimed] | Refusal:
    """A poll's claim of ``key``, in a transaction of its own: up to ``limit`` of its
    executions if its limits admit one now (the routine), else the Refusal."""
    with app.begin(one_statement=True) as tx:
        faults.hit(faults.BEFORE_KEY_LOCK)
        taken = release_and_claim(app, tx, key, process_id, [], limit, poll=True)
    return taken.claimed if taken.refused is None else Refusal(key, taken.refused)


def claim_batch(app: Database, process_id: str, limit: int, keyed_limit: int = 1,
                per_key: Mapping[str, int] | None = None,
                refused: Callable[[Refusal], None] | None = None) -> list[Claimed]:
    """What successive polls would claim, in runs of one lane each: ``LimitsModel.claim_batch``.

    A poll claims the oldest execution that its lane's limits admit now. A run is the polls
    made in a row while the first poll's lane stays first: up to ``limit`` unkeyed
    executions, each older than the next lane's oldest [INV-LIM-6], or up to ``keyed_limit``
    of a key (``per_key[key]`` for a key or family it names), each the claim the next poll
    would make, under one hold of its lock [INV-LIM-1]. The batch goes on to another run
    only after a key whose run filled its ``concurrency`` (saturated, it cannot be the next
    poll's lane), and claims at most ``max(limit, keyed_limit)`` in all; so a thread takes
    one execution each of many ``concurrency: 1`` partitions in one batch, and records them
    in one group commit. The lanes come from one scan (``lanes.scan_lanes``) of as many
    lanes as the batch may still claim executions (a poll's eight at least), tried in its
    order, each claim a transaction of its own whose first statement is the key's lock; a
    lane refused or filled is passed by the next scan's walk, when the first finds too few.
    (A scan of eight made a thread of ten walk the same eight lanes as its siblings, pass
    the seven they were filling and scan again: a scan a claim; bench/RESULTS.md, "B8: a
    scan of the lanes a batch may claim".)
    Returns the claimed executions in poll order (empty: nothing may run now); ``refused``
    is told of each keyed claim refused for concurrency or rate (the fleet counts them).

    Threads of one process pass a lane a sibling is trying to fill (:func:`_try_marked`).
    """
    most = max(limit, keyed_limit)
    claimed: list[Claimed] = []
    tried: list[str] = []  # lanes tried, left out of the next scan
    while True:
        want = max(LANES_PER_SCAN, most - len(claimed))  # (as many lanes as it may still claim executions)
        with app.begin(readonly=True) as tx:
            lanes = scan_lanes(app, tx, want, passed=tried)
        for lane in lanes:
            run, full = _claim_lane(app, lane.key, process_id, most - len(claimed), limit, keyed_limit, per_key,
                                    refused)
            claimed += run
            if len(claimed) >= most or (run and not full):
                return claimed  # (a lane that may admit again is the next poll's, unless another comes first)
        if len(lanes) < want:
            return claimed  # every lane that may admit was tried (a full scan: more may, after them)
        tried += [lane.key for lane in lanes]


def _claim_lane(app: Database, key: str, process_id: str, left: int, limit: int, keyed_limit: int,
                per_key: Mapping[str, int] | None,
                refused: Callable[[Refusal], None] | None) -> tuple[list[Claimed], bool]:
    """A poll's claim in one lane (:func:`claim_batch`), in a transaction of its own, made
    again when the database rolls it back for contention (a deadlock victim wrote nothing).
    Returns what it claimed and whether that filled the key's ``concurrency`` (the lane
    cannot be the next poll's). A try that may fill the key is made under its process's
    mark (:func:`_try_marked`)."""
    if key == UNKEYED:
        def unkeyed() -> list[Claimed]:
            with app.begin(one_statement=True) as tx:
                return release_and_claim(app, tx, None, process_id, [], min(limit, left), poll=True).claimed
        return dialects.retry_transient(unkeyed), False
    family = app.config.family_of(key)  # (a partition's share is its family's)
    most = min(left, keyed_limit if per_key is None else per_key.get(family.family if family else key, keyed_limit))
    entry = app.config.entry_for(key)
    concurrency = (entry.concurrency if entry is not None else None) or 0  # (0: none)
    fills = 0 < concurrency <= most and dialects.has_server_routines(app.backend)  # (SQLite: a try is a call)
    outcome = _try_marked(app, key, process_id, most, concurrency if fills else 0)
    if isinstance(outcome, list):
        return outcome, 0 < concurrency <= len(outcome)
    if refused is not None and outcome.reason != "gone":  # ("gone": no eligible work left, not a refusal)
        refused(outcome)
    return [], False


def _try_marked(app: Database, key: str, process_id: str, most: int, fills: int) -> list[Claimed] | Refusal:
    """:func:`claim_keyed`, made again for contention: a try that may take all of the key's
    ``fills`` (its concurrency; 0: it may leave room), unless a sibling thread of this
    process is trying to fill the key or holds it full: then the try is passed, as
    refused, without a round trip.

    A try that may take the key's whole concurrency marks the key in ``app.filling``: once
    it is made, the lane admits nothing more (full, or refused for rate, or out of eligible
    work), so a sibling's try would wait on the key's lock to be refused. The mark goes
    when the try ends, unless it took the whole concurrency: then the key is full of this
    process's executions, and the mark goes with the first of their releases
    (:func:`no_longer_full`, before it commits). Threads that walk the same oldest lanes of
    many ``concurrency: 1`` partitions so take different ones, and pass those their
    siblings hold (they took 3 tries in 4 in vain: bench/RESULTS.md, "B8: threads pass the
    lanes a sibling fills"). A try that may leave room (a share below the concurrency) is
    not marked: a sibling may be admitted after it. Nor is any on SQLite (``fills`` 0),
    where the routine runs in the process: a try is a call under the write lock any claim
    takes, not a round trip, and threads spread over more lanes only queued more for that
    lock (B8 drained 13-27 % slower with marks there)."""
    with app.filling_lock:
        if key in app.filling:
            return []  # a sibling's try takes all the lane admits: this one's would be refused
        if fills:
            app.filling.add(key)
    outcome: list[Claimed] | Refusal = []
    try:
        outcome = dialects.retry_transient(lambda: claim_keyed(app, key, process_id, most))
    finally:
        if fills and not (isinstance(outcome, list) and len(outcome) >= fills):
            app.filling.discard(key)  # (else it holds the key full until a release: no_longer_full)
    return outcome


def no_longer_full(app: Database, keys: Iterable[str | None]) -> None:
    """This process releases executions of the lanes ``keys``, in a transaction about to
    commit or roll back: a sibling thread's poll tries them again (:func:`_try_marked`).
    Called by every outcome before its release, even one that turns out lost (a success
    whose step moved on is refused before any release), so no lane stays passed."""
    app.filling.difference_update(keys)


# --------------------------------------------------------------------------- restarts


def restart_with(app: Database) -> list[str]:
    """A restart with this process's limits: re-base every key on its config (at boot);
    ``LimitsModel.restart_with``.

    Every key's stamp is cleared (a stamp is only a hint that lets workers skip a key; the
    next refusal stamps it again, exactly), and a key whose values changed keeps only the
    buckets of the periods its new entry keeps. That is what ``vectors/buckets.json``'s
    ``restart_with`` specifies. Polls re-base lazily too, under the same lock, when the
    stored values differ (``plan``), so a rolling deploy converges. Returns the keys re-based.
    """
    with app.begin(readonly=True) as tx:
        keys = list(tx.execute(sa.select(schema.limit_keys.c.key)).scalars())
    b = schema.limit_buckets
    for key in keys:
        with app.begin() as tx:
            header = lock_key(tx, key)  # [INV-LIM-1]
            if header is None:  # forgotten since it was read (executions.forget_partition)
                continue
            entry = app.config.entry_for(key)
            stored = _buckets_of(tx, key)
            dropped = sorted(set(stored) - set(buckets.carry_over(entry, stored)))  # [INV-LIM-4]
            if dropped:
                tx.execute(b.delete().where(b.c.key == key, b.c.period_s.in_(dropped)))
            header.set(config_digest=entry_digest(entry), blocked_until=None)
            write_header(tx, key)
    return keys
