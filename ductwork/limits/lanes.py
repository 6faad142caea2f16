"""Lanes: the order in which polls try the queue's pending work, and when time alone
may make some of it claimable.

    >>> scan_lanes(app, tx)          # every lane that may admit now, oldest first
    [Lane(oldest=Position(...), key='vendor_api'), Lane(oldest=Position(...), key='')]

A lane is a limit key with eligible pending work that is neither rate-blocked nor
concurrency-saturated, or the unkeyed lane (:data:`UNKEYED`). A poll tries them in the
order of their oldest eligible execution, and takes each lane's executions in that same
order (:data:`LANE_ORDER`) [INV-LIM-6]. A scan is a read: every claim re-checks under
its locks (``claims.py``). Not done here: claiming.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.limit_entries import FamilyEntry, LimitEntry, entry_digest

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

_e = schema.executions


UNKEYED = ""
"""The pending lane of unkeyed executions (limit keys are never blank)."""

_e = schema.executions


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


def _oldest(column: sa.ColumnElement[Any], lane: sa.ColumnElement[Any] | str,
            now: datetime | sa.ColumnElement[Any]) -> sa.ScalarSelect[Any]:
    return in_lane(sa.select(column), lane, now).limit(1).scalar_subquery()


def scan_lanes(app: Database, tx: Tx) -> list[Lane]:
    """Every lane that may admit now, oldest first. A read: the claims re-check under locks.

    A key may admit unless its stamp says it is rate-blocked until later [INV-LIM-5] (a
    stamp made under other values than this process's config does not count: each
    configured key's digest is written into the statement) or it is saturated; the
    unkeyed lane is one more lane. One statement: a UNION of the keys' lanes and the
    unkeyed one, built once per config (:func:`_scan_statement`)."""
    config = app.config
    full = _full_families(tx, config.families)
    lanes = []
    statement = _scan_statement(tuple(config.limits.items()), tuple(config.families.items()))
    for row in tx.execute(statement, {"scan_now": tx.now}).all():
        if row.oldest_id is None:
            continue
        if row.key != UNKEYED:
            entry = config.entry_for(row.key)
            if entry is not None and entry.concurrency is not None and row.in_flight >= entry.concurrency:
                continue  # saturated: retried on the next poll, no one knows when a slot frees
            if (family := config.family_of(row.key)) is not None and family.family in full:
                continue  # [INV-LIM-8] its family is at its ceiling: as saturated
        lanes.append(Lane(Position(row.oldest_at, row.oldest_id), row.key))
    lanes.sort()  # [INV-LIM-6] oldest lane first, unkeyed among them
    return lanes


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


@functools.lru_cache(maxsize=16)
def _scan_statement(limits: tuple[tuple[str, LimitEntry], ...],
                    families: tuple[tuple[str, FamilyEntry], ...]) -> sa.CompoundSelect[Any]:
    """The lane scan's statement for a config's limits, the database time bound as
    ``scan_now``."""
    k = schema.limit_keys
    now = sa.bindparam("scan_now", type_=schema.Timestamp)
    unconfigured = entry_digest(None)
    whens = [*((k.c.key == key, entry_digest(entry)) for key, entry in limits),
             *((of_family(k.c.key, family), entry_digest(entry.per_partition)) for family, entry in families)]
    configured = sa.case(*whens, else_=unconfigured) if whens else sa.literal(unconfigured)
    may_admit = sa.or_(
        k.c.blocked_until.is_(None),  # never rate-blocked
        k.c.blocked_until <= now,  # or its next token has arrived [INV-LIM-5]
        sa.func.coalesce(k.c.config_digest, "") != configured)  # or its stamp came from other values
    inflight = sa.select(sa.func.count()).where(_e.c.inflight_key == k.c.key).scalar_subquery()
    keyed = (sa.select(k.c.key, _oldest(_e.c.eligible_at, k.c.key, now).label("oldest_at"),
                       _oldest(_e.c.id, k.c.key, now).label("oldest_id"), inflight.label("in_flight"))
             .where(may_admit))
    unkeyed = sa.select(sa.literal(UNKEYED, k.c.key.type).label("key"),
                        _oldest(_e.c.eligible_at, UNKEYED, now).label("oldest_at"),
                        _oldest(_e.c.id, UNKEYED, now).label("oldest_id"), sa.literal(0).label("in_flight"))
    return sa.union_all(keyed, unkeyed)


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
