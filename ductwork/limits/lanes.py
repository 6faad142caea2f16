"""Lanes: the order in which polls try the queue's pending work, and when time alone
may make some of it claimable.

    >>> scan_lanes(app, tx)          # the first lanes that may admit now, oldest first
    [Lane(oldest=Position(...), key='vendor_api'), Lane(oldest=Position(...), key='')]

A lane is a limit key with eligible pending work that is neither rate-blocked nor
concurrency-saturated, or the unkeyed lane (:data:`UNKEYED`). A poll tries them in the
order of their oldest eligible execution, and takes each lane's executions in that same
order (:data:`LANE_ORDER`) [INV-LIM-6]. A scan is a read: every claim re-checks under
its locks (``claims.py``). Not done here: claiming.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.limit_entries import FamilyEntry, entry_digest

if TYPE_CHECKING:
    from ductwork.config import Config
    from ductwork.db.database import Database, Tx

_e = schema.executions


UNKEYED = ""
"""The pending lane of unkeyed executions (limit keys are never blank)."""


#: The poll order [INV-LIM-6], within a lane and across lanes: eligible time, then creation
#: order (execution ids are time-ordered). Its one definition: the SQL orders by these
#: columns (:func:`in_lane`), and Python compares :class:`Position`\ s, which hold the same
#: values in the same order.
LANE_ORDER = (_e.c.eligible_at, _e.c.id)


class Position(NamedTuple):
    """A pending execution's place in the poll order (:data:`LANE_ORDER`)."""

    eligible_at: datetime
    id: str


@dataclass(frozen=True, order=True)
class Lane:
    """A lane with eligible work; ordering is the poll's order (its oldest's position)."""

    oldest: Position
    key: str = field(compare=False)  # UNKEYED for the unkeyed lane


def in_lane(query: sa.Select[Any], lane: sa.ColumnElement[Any] | str,
            now: datetime | sa.ColumnElement[Any]) -> sa.Select[Any]:
    """The lane predicate: ``query`` over the executions pending in ``lane`` (a key, or
    UNKEYED) and eligible at ``now``, oldest first (eligible time, then creation order),
    as the index ``ix_execution_pending_lane`` serves it. Not done: locking or limiting."""
    return (query
            .where(_e.c.pending_lane == lane,  # pending in this lane
                   _e.c.eligible_at <= now)  # eligible: delays and back-off have passed
            .order_by(*LANE_ORDER))  # [INV-LIM-6] FIFO within the lane


#: pending executions a lane scan reads per statement (each lane's oldest, and the rows after it
#: up to the page's end); a scan reads further pages only while it has found too few lanes
WALK_PAGE = 64

#: lanes a poll's scan finds before it tries them (more are scanned if all of them refuse)
LANES_PER_SCAN = 8


def scan_lanes(app: Database, tx: Tx, want: int = LANES_PER_SCAN, passed: Collection[str] = (),
               upto: Position | None = None) -> list[Lane]:
    """The first ``want`` lanes that may admit now, oldest first, other than those ``passed``,
    each with its oldest eligible execution no later than ``upto``'s time (None: now; a lane
    whose oldest is later than ``upto`` comes after it, as no lane at all would). A read: the
    claims re-check under locks.

    It walks the pending executions in poll order from the oldest (``ix_execution_pending_order``,
    one statement per :data:`WALK_PAGE` of them, leaving out the lanes met already); a lane's
    first execution met is its oldest, so the lanes come in poll order [INV-LIM-6], and the
    walk ends once it has ``want`` of them: its cost grows with the executions ahead of those
    lanes, never with the number of limit keys. A key may admit unless its stamp says it is
    rate-blocked until later [INV-LIM-5] (a stamp made under other values than this process's
    config does not count), it is saturated, or its family is at its ceiling [INV-LIM-8]; the
    unkeyed lane is one more lane."""
    config = app.config
    full = _full_families(tx, config.families)
    lanes: list[Lane] = []
    met = set(passed)
    while len(lanes) < want:
        rows = tx.execute(_walk_statement(), {"w_upto": tx.now if upto is None else upto.eligible_at,
                                              "w_passed": sorted(met)}).all()
        for row in rows:
            if row.lane not in met:  # (else a lane met already: its oldest was earlier)
                met.add(row.lane)
                if _may_admit(config, row, full, tx.now):  # (the unkeyed lane always may)
                    lanes.append(Lane(Position(row.eligible_at, row.id), row.lane))
        if len(rows) < WALK_PAGE:
            break  # no pending execution left to walk
    return lanes[:want]


def _may_admit(config: Config, row: sa.Row[Any], full: set[str], now: datetime) -> bool:
    """Whether a key's lane may admit now, from its row (none: never stamped) and in-flight count."""
    entry = config.entry_for(row.lane)
    if entry is not None and entry.concurrency is not None and row.in_flight >= entry.concurrency:
        return False  # saturated: retried on the next poll, no one knows when a slot frees [INV-LIM-1]
    if (family := config.family_of(row.lane)) is not None and family.family in full:
        return False  # [INV-LIM-8] its family is at its ceiling: as saturated
    return (row.blocked_until is None  # never rate-blocked
            or row.blocked_until <= now  # or its next token has arrived [INV-LIM-5]
            or (row.config_digest or "") != entry_digest(entry))  # or its stamp came from other values


@functools.cache
def _walk_statement() -> sa.Select[Any]:
    """A page of the lane walk (:func:`scan_lanes`): the next :data:`WALK_PAGE` pending
    executions eligible by ``w_upto`` in poll order, but those of the lanes ``w_passed``,
    each with its key's row (outer-joined: none before a first claim) and in-flight count."""
    k = schema.limit_keys
    page = (sa.select(_e.c.pending_lane.label("lane"), _e.c.eligible_at, _e.c.id)
            .where(_e.c.claimed_at.is_(None),  # pending
                   _e.c.eligible_at <= sa.bindparam("w_upto", type_=schema.Timestamp),  # eligible
                   _e.c.pending_lane.not_in(sa.bindparam("w_passed", expanding=True)))  # lanes not met yet
            .order_by(*LANE_ORDER)  # [INV-LIM-6] the poll order
            .limit(WALK_PAGE).subquery("page"))
    in_flight = sa.select(sa.func.count()).where(_e.c.inflight_key == page.c.lane).scalar_subquery()
    return (sa.select(page.c.lane, page.c.eligible_at, page.c.id, k.c.blocked_until, k.c.config_digest,
                      in_flight.label("in_flight"))
            .select_from(page.outerjoin(k, k.c.key == page.c.lane))
            .order_by(page.c.eligible_at, page.c.id))  # [INV-LIM-6] oldest lane first, unkeyed among them


def of_family(key: sa.ColumnElement[Any], family: str) -> sa.ColumnElement[bool]:
    """Whether ``key`` is a partition of ``family``: it begins with the family's name and
    ``[`` (a family's name has none; a static key is never a configured family's partition)."""
    return sa.func.substr(key, 1, len(family) + 1) == family + "["


def family_in_flight(family: str) -> sa.Select[Any]:
    """The count of executions in flight in every partition of ``family`` [INV-LIM-8]:
    derived from execution rows, as a key's is, never stored."""
    return sa.select(sa.func.count()).where(of_family(_e.c.inflight_key, family))


def _full_families(tx: Tx, families: Mapping[str, FamilyEntry]) -> set[str]:
    """The families at their ceiling now, in one statement (none without a ceiling)."""
    ceilings = {family: entry.concurrency for family, entry in families.items() if entry.concurrency is not None}
    if not ceilings:
        return set()
    counts = tx.execute(sa.select(*(family_in_flight(f).scalar_subquery() for f in ceilings))).one()
    return {family for (family, ceiling), count in zip(ceilings.items(), counts, strict=True) if count >= ceiling}


def seconds_to_next_due(app: Database) -> float | None:
    """Seconds (database time) until time alone may let a poll claim something, or None:
    how long an idle worker may wait before it polls again. The earliest of

    - a rate-blocked key's next token (its ``blocked_until``), if the key has pending work;
    - a pending execution's eligible time still to come, in the unkeyed lane or a
      configured key's: a retry after ``retry_delay``, a re-run after a crash's back-off,
      a trigger's ``delay=``.

    Each lane's earliest eligible time to come is one probe of its index
    (``ix_execution_pending_lane``: lane, eligible time), however long the lane's backlog
    of executions already eligible. Not done: a key this process has no config for (its
    delayed executions are found by the polling interval), or telling whether the lane
    will admit a claim then (a saturated key may not: the poll finds out, as any does)."""
    statement = _next_due_statement(tuple(sorted(app.config.limits)))
    with app.begin(readonly=True) as tx:
        times = [t for t in tx.execute(statement, {"n_now": tx.now}).scalars() if t is not None]
        return None if not times else max(0.0, (min(times) - tx.now).total_seconds())


@functools.lru_cache(maxsize=16)
def _next_due_statement(keys: tuple[str, ...]) -> sa.CompoundSelect[Any]:
    """:func:`seconds_to_next_due`'s candidates for a config's ``keys``, the database time
    bound as ``n_now``: the earliest stamp of a rate-blocked key with pending work, then
    each lane's earliest eligible time after now. Each lane is a value of its own in the
    statement, not a column of a join: MariaDB probes ``(lane, eligible_at > now)`` as a
    range only for a constant lane (correlated with the keys' rows, it read a lane's whole
    backlog of eligible executions: 26 ms for 10⁵ of them, against 1.2 ms as constants)."""
    k = schema.limit_keys
    now = sa.bindparam("n_now", type_=schema.Timestamp)
    pending = sa.exists().where(_e.c.pending_lane == k.c.key)
    token = sa.select(sa.func.min(k.c.blocked_until).label("due")).where(k.c.blocked_until > now, pending)

    def upcoming(lane: str) -> sa.Select[Any]:
        first = (sa.select(_e.c.eligible_at).where(_e.c.pending_lane == sa.literal(lane, _e.c.pending_lane.type),
                                                   _e.c.eligible_at > now)
                 .order_by(_e.c.eligible_at).limit(1).scalar_subquery())
        return sa.select(first.label("due"))

    return sa.union_all(token, *(upcoming(lane) for lane in (*keys, UNKEYED)))
