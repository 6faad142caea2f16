"""The abstraction from the limits layer's rows to the state its specification reads.

    >>> rows = snapshot(conn)                      # every execution, key header and bucket row
    >>> lane_state(rows, "a", now_us, take=2, limits=config.limits)   # plan.LaneState
    >>> lane_state(rows, 'f["a"]', now_us, 2, config.limits, config.families)   # a partition's
    >>> key_view(rows, "a", entry)                 # (in flight, levels, blocked_until) as the model says them
    >>> family_in_flight(rows, "p")                # in flight over every partition p[...] of family p

Written once, from the rows alone (no engine code reads them here), and used by the
refinement test of the lane routine (``tests/refinement.py``: the state
``ductwork.limits.plan.plan`` decides on, and the rows the routine must leave) and by the
limits conformance machine (``key_view``: what it compares with the model's ``LimitsModel``
after every rule; :mod:`ductwork_proof.conformance.limits`, shipped with ``ductwork verify``,
hence here and not in the test suite). The lane scan's rules are restated here from
docs/semantics.md §5, not imported from ``ductwork.limits.lanes``, so that the refinement
test checks them too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.clock import from_us, to_us
from ductwork.limit_entries import FamilyEntry, LimitEntry, entry_digest
from ductwork.limits.buckets import Bucket
from ductwork.limits.lanes import Position
from ductwork.limits.plan import KeyRow, LaneState


@dataclass(frozen=True)
class Execution:
    """One row of ``ductwork_executions``, times in µs."""

    id: str
    step_id: str
    limit_key: str | None
    eligible_us: int
    claimed_us: int | None
    process_id: str | None
    completed_us: int | None
    outcome: str | None
    claim_seq: int | None
    release_seq: int | None

    @property
    def lane(self) -> str:
        return self.limit_key or ""

    @property
    def pending(self) -> bool:
        return self.claimed_us is None

    @property
    def in_flight(self) -> bool:
        return self.claimed_us is not None and self.completed_us is None

    @property
    def position(self) -> Position:
        return Position(from_us(self.eligible_us), self.id)


@dataclass(frozen=True)
class Header:
    """One row of ``ductwork_limit_keys``."""

    key: str
    seq: int
    digest: str | None
    blocked_until_us: int | None


@dataclass
class Rows:
    """Every row of the three tables the limits layer writes (``snapshot``)."""

    executions: dict[str, Execution]
    keys: dict[str, Header]
    buckets: dict[tuple[str, int], Bucket]

    def copy(self) -> Rows:
        return Rows(dict(self.executions), dict(self.keys), dict(self.buckets))


def _us(moment: datetime | None) -> int | None:
    return None if moment is None else to_us(moment)


def snapshot(conn: sa.Connection) -> Rows:
    """Read every execution, key header and bucket row."""
    e, k, b = schema.executions, schema.limit_keys, schema.limit_buckets
    executions = {row.id: Execution(row.id, row.step_id, row.limit_key, to_us(row.eligible_at), _us(row.claimed_at),
                                    row.process_id, _us(row.completed_at), row.outcome, row.claim_seq,
                                    row.release_seq)
                  for row in conn.execute(sa.select(e.c.id, e.c.step_id, e.c.limit_key, e.c.eligible_at, e.c.claimed_at,
                                                    e.c.process_id, e.c.completed_at, e.c.outcome, e.c.claim_seq,
                                                    e.c.release_seq))}
    keys = {row.key: Header(row.key, int(row.seq), row.config_digest, _us(row.blocked_until))
            for row in conn.execute(sa.select(k.c.key, k.c.seq, k.c.config_digest, k.c.blocked_until))}
    buckets = {(row.key, row.period_s): Bucket(row.period_s, int(row.level_units), int(row.refilled_at_us))
               for row in conn.execute(sa.select(b.c.key, b.c.period_s, b.c.level_units, b.c.refilled_at_us))}
    return Rows(executions, keys, buckets)


def in_flight(rows: Rows, key: str) -> int:
    """Claimed, not completed executions of ``key``: derived, never stored [INV-LIM-3]."""
    return sum(1 for e in rows.executions.values() if e.limit_key == key and e.in_flight)


def family_of(key: str, families: Mapping[str, FamilyEntry] | None) -> FamilyEntry | None:
    """The family ``key`` is a partition of (``family[<value>]``, semantics §5.1), among
    ``families``; None: a static key, or a family's own name."""
    name, bracket, _ = key.partition("[")
    return (families or {}).get(name) if bracket else None


def entry_of(key: str, limits: Mapping[str, LimitEntry], families: Mapping[str, FamilyEntry] | None
             ) -> LimitEntry | None:
    """The entry a decision on ``key`` applies: its own, or its family's ``per_partition``."""
    family = family_of(key, families) if key not in limits else None
    return limits.get(key) if family is None else family.per_partition


def family_in_flight(rows: Rows, family: str) -> int:
    """Claimed, not completed executions of every partition of ``family`` (each key
    ``family[…]``): derived, never stored [INV-LIM-3]."""
    prefix = family + "["
    return sum(1 for e in rows.executions.values()
               if e.in_flight and e.limit_key is not None and e.limit_key.startswith(prefix))


def eligible(rows: Rows, lane: str, now_us: int) -> list[Execution]:
    """The pending executions of ``lane`` ("" : unkeyed) eligible at ``now_us``, in poll order."""
    found = [e for e in rows.executions.values() if e.pending and e.lane == lane and e.eligible_us <= now_us]
    return sorted(found, key=lambda e: (e.eligible_us, e.id))


def may_admit(rows: Rows, key: str, now_us: int, limits: Mapping[str, LimitEntry],
              families: Mapping[str, FamilyEntry] | None = None) -> bool:
    """Whether a poll tries ``key``'s lane (semantics §5, §5.1): not rate-blocked by a stamp
    made under this config's values, not saturated, and, for a partition, its family not at
    its ceiling."""
    header, entry, family = rows.keys[key], entry_of(key, limits, families), family_of(key, families)
    blocked = (header.blocked_until_us is not None and header.blocked_until_us > now_us
               and (header.digest or "") == entry_digest(entry))
    saturated = entry is not None and entry.concurrency is not None and in_flight(rows, key) >= entry.concurrency
    full = (family is not None and family.concurrency is not None  # [INV-LIM-8]
            and family_in_flight(rows, family.family) >= family.concurrency)
    return not blocked and not saturated and not full


def bound(rows: Rows, lane: str, now_us: int, limits: Mapping[str, LimitEntry],
          families: Mapping[str, FamilyEntry] | None = None) -> Position | None:
    """The oldest eligible execution of every other lane a poll would try now [INV-LIM-6]."""
    heads = []
    others = [key for key in rows.keys if key != lane and may_admit(rows, key, now_us, limits, families)]
    for other in [*others, *([""] if lane else [])]:
        waiting = eligible(rows, other, now_us)
        if waiting:
            heads.append(waiting[0].position)
    return min(heads, default=None)


def lane_state(rows: Rows, key: str | None, now_us: int, take: int, limits: Mapping[str, LimitEntry],
               families: Mapping[str, FamilyEntry] | None = None) -> LaneState:
    """The state the lane routine decides on (``plan.LaneState``), from the rows as it reads
    them after its endings: a partition of a family with a ceiling with its family's
    in-flight count (else 0)."""
    lane = key or ""
    candidates = tuple(e.position for e in eligible(rows, lane, now_us)[:take])
    header = rows.keys.get(key) if key is not None else None
    row = None if header is None else KeyRow(header.seq, header.digest,
                                             {p: b for (k, p), b in rows.buckets.items() if k == key})
    family = None if key is None else family_of(key, families)
    counted = family is not None and family.concurrency is not None
    return LaneState(now_us, row, 0 if key is None else in_flight(rows, key), candidates,
                     bound(rows, lane, now_us, limits, families) if candidates else None,
                     family_in_flight(rows, family.family) if counted else 0)  # type: ignore[union-attr]


def key_view(rows: Rows, key: str, entry: LimitEntry | None) -> tuple[int, list[int | None], int | None]:
    """A key as the limits model states it: in flight, each kept rate entry's bucket level
    in config order (None: no bucket yet), and its ``blocked_until`` stamp."""
    header = rows.keys.get(key)
    levels = [b.level_units if (b := rows.buckets.get((key, rate.per_s))) is not None else None
              for rate in (entry.rates if entry else ())]
    return in_flight(rows, key), levels, None if header is None else header.blocked_until_us


def ended(rows: Rows, ids: list[str], owner: str | None) -> bool:
    """Whether the routine's guard ends every one of ``ids``: each still open, claimed and
    held by ``owner`` (None: by no process) [INV-EXE-2]."""
    return all((e := rows.executions.get(i)) is not None and e.in_flight and e.process_id == owner for i in ids)


def after_endings(rows: Rows, key: str | None, ids: list[str], outcome: str, now_us: int) -> Rows:
    """The rows once the endings of ``ids`` are written: each completed with ``outcome`` and,
    keyed, the key's next sequence number in the order given."""
    out = rows.copy()
    header = out.keys.get(key) if key is not None else None
    for i, execution_id in enumerate(ids, start=1):
        out.executions[execution_id] = replace(out.executions[execution_id], completed_us=now_us, outcome=outcome,
                                               release_seq=None if header is None else header.seq + i)
    if header is not None:
        out.keys[key] = replace(header, seq=header.seq + len(ids))  # type: ignore[index]
    return out
