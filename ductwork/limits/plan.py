"""What one call of the lane routine decides: a pure function of what it reads under its locks.

    >>> plan(LaneState(now_us=0, key=KeyRow(0, digest, {}), in_flight=4,
    ...                candidates=(first,), bound=None), Request(entry, take=1, poll=False))
    Plan(claims=('e1',), ...)

The lane routine (``claims.release_and_claim``: one round trip on PostgreSQL and
MySQL-family, the same steps in Python on SQLite) ends executions of one lane and claims
the lane's next ones for the same owner, or makes a poll's claim of a lane. What it
*decides* is decided here, from the state it read: the key's header row and buckets under
the key's lock, the key's in-flight count after the endings, the lane's oldest eligible
executions and the oldest eligible execution of every other lane a poll would try
(``bound``). This module is the routine's specification: the SQL of each backend is a
refinement of :func:`plan`, checked against it state by state
(``tests/properties/test_refinement.py``), and :func:`plan` itself only composes the two
pure decisions the model calls and the vectors pin, the key decision
(:func:`ductwork.limits.buckets.decide`) and the poll order (``lanes.LANE_ORDER``).

A claim is one the poll made now would make [INV-LIM-6]:

- a **hand-off** (``poll`` False: in the transaction that ended the owner's executions)
  claims only when the lane is the first lane a poll would try (its oldest eligible
  execution precedes ``bound``) and, for a key, its limits admit now and the values its
  buckets follow are this process's (a key re-based by another config is left to a poll,
  which re-bases it first). Otherwise it writes nothing at all: no refill, no stamp;
- a **poll's claim** of a lane (``poll`` True: the lane a scan found first, or the next one
  after a refusal) decides whatever the lane's place: it re-bases a key whose stored values
  differ, and a refusal writes what it refilled and stamped (a rate refusal) or nothing (a
  concurrency refusal) [INV-LIM-4, INV-LIM-5];
- either way, after the first claim, further claims up to ``take``, each the one the next
  poll would make: before ``bound`` (another lane's oldest) and admitted by the key's
  decision on the in-flight count and buckets the previous one left, at the same time
  [INV-LIM-1, INV-LIM-2]. The batch ends, writing nothing more, at the first that is not.

The owner keeps its slot through a hand-off: the endings free slots and the claims take
them again in one transaction under one hold of the key's lock, so no other claim can see
the key between the two, and ``in_flight`` after the call is ``in_flight`` before it, less
the endings, plus the claims (docs/semantics.md §5, "The hand-off") [INV-LIM-3].

Not done here: reading or writing anything, the endings' guard (the routine ends every
execution or reports them taken, and its caller rolls back), or which lane a poll tries
(``lanes.scan_lanes``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from ductwork.limit_entries import LimitEntry, entry_digest
from ductwork.limits.buckets import Bucket, Decision, carry_over, decide
from ductwork.limits.lanes import Position


@dataclass(frozen=True)
class KeyRow:
    """A key's header row and buckets as read under its lock."""

    #: the key's last event sequence number: the routine's endings and claims take the next
    seq: int
    #: the fingerprint of the values its buckets follow (``entry_digest``); None: none yet
    digest: str | None
    #: its stored buckets by period
    buckets: Mapping[int, Bucket]


@dataclass(frozen=True)
class LaneState:
    """What the routine read, after its endings: the database time (read after the key's
    lock), the key's row (None: the unkeyed lane, or a key without a row), the key's
    in-flight count, the lane's oldest eligible pending executions in poll order (at most
    ``take``) and ``bound``, the oldest eligible execution of every other lane a poll would
    try now: a lane that may admit (a key not rate-blocked by a stamp made under this
    process's values and not saturated, or the unkeyed lane) [INV-LIM-6]."""

    now_us: int
    key: KeyRow | None
    in_flight: int
    candidates: tuple[Position, ...]
    bound: Position | None
    #: a partition's family's in-flight count over all its partitions, read under the
    #: family's lock (0 when the request has no ``family_ceiling``) [INV-LIM-8]
    family_in_flight: int = 0


@dataclass(frozen=True)
class Request:
    """What the routine is asked: the lane's key (None: the unkeyed lane) and its entry in
    this process's config (None: unconfigured; a partition's: its family's
    ``per_partition``), how many to claim (0: only the endings), whether this is a poll's
    claim or a hand-off, and a partition's family's ceiling (None: none, or no partition)."""

    key: str | None
    entry: LimitEntry | None
    take: int
    poll: bool
    family_ceiling: int | None = None


#: why a poll's claim of a keyed lane was refused: the key's concurrency, its rate, its
#: family's ceiling (INV-LIM-8), or ``gone`` (nothing eligible, or no key row: not counted
#: as a refusal). The workers count the others by reason in ``ductwork_key_refusals``,
#: whose ``reason`` column holds the longest (``tests/unit/test_plan.py`` checks it)
Refused = Literal["concurrency", "rate", "family_concurrency", "gone"]


@dataclass(frozen=True)
class Plan:
    """What the routine writes, and what it tells its caller.

    ``claims``: the executions claimed, in order, the i-th (from 0) with the key's sequence
    number after the endings plus 1 + i. ``buckets``: the key's buckets to write (by
    period; None: none written), ``dropped``: periods whose buckets a re-base deletes,
    ``stamp``: whether the key's ``blocked_until`` is written (with ``blocked_until_us``,
    None clearing it), ``digest``: the config fingerprint to write (None: unchanged).
    ``refused``: a poll's refusal (:data:`Refused`), else None. ``unconfigured``: the key
    has no entry (claimed unlimited: logged)."""

    claims: tuple[str, ...] = ()
    buckets: tuple[Bucket, ...] | None = None
    dropped: tuple[int, ...] = ()
    stamp: bool = False
    blocked_until_us: int | None = None
    digest: str | None = None
    refused: Refused | None = None
    unconfigured: bool = False


NOTHING = Plan()


def plan(state: LaneState, request: Request) -> Plan:
    """The routine's decisions (module docstring), in order: nothing to take or nothing
    eligible; a hand-off whose lane is not first [INV-LIM-6]; the unkeyed lane (no decision);
    a key without a row; then the key's (:func:`_keyed`)."""
    if request.take <= 0:
        return NOTHING  # only the endings
    if not state.candidates:
        return Plan(refused="gone") if request.poll else NOTHING
    if not request.poll and state.bound is not None and state.bound < state.candidates[0]:
        return NOTHING  # [INV-LIM-6] a poll now would try another lane first
    if request.key is None:  # the unkeyed lane admits what the poll order lets it take
        return Plan(claims=tuple(p.id for p in _batch(state, request.take, lambda _: True)))
    if state.key is None:  # defensive: a key's row comes with its work
        return Plan(refused="gone") if request.poll else NOTHING
    return _keyed(state, request, state.key)


def _keyed(state: LaneState, request: Request, key: KeyRow) -> Plan:
    """A key's claims: a hand-off on a key whose stored values differ is left to a poll, which
    re-bases it [INV-LIM-4]; then the key decision, and the further claims, each decided on
    what the previous one left."""
    digest = entry_digest(request.entry)
    rebase = key.digest != digest
    if rebase and not request.poll:
        return NOTHING  # a deploy in progress: a poll re-bases the key first
    if not _family_admits(state, request, 0):  # [INV-LIM-8] the family first: nothing read, refilled or written
        return Plan(refused="family_concurrency") if request.poll else NOTHING
    kept = carry_over(request.entry, key.buckets) if rebase else dict(key.buckets)
    # a re-base drops the buckets of periods the entry no longer keeps and clears the stamp
    dropped, new_digest = (tuple(sorted(set(key.buckets) - set(kept))), digest) if rebase else ((), None)
    decided = [decide(request.entry, kept, state.in_flight, state.now_us)]
    if decided[0].refused_for == "concurrency":  # [INV-LIM-1] nothing refilled or stamped
        if not request.poll:
            return NOTHING
        return Plan(refused="concurrency", stamp=rebase, dropped=dropped, digest=new_digest)
    if not decided[0].admitted:  # [INV-LIM-5] a poll's refusal writes its refill and stamp
        return _written(decided[0], (), dropped, new_digest, refused="rate") if request.poll else NOTHING

    def admits(claimed: int) -> bool:  # the next poll's decision, on what the last one left
        if not _family_admits(state, request, claimed):
            return False  # [INV-LIM-8] the family is at its ceiling: the batch ends
        further = decide(request.entry, {b.period_s: b for b in decided[-1].buckets}, state.in_flight + claimed,
                         state.now_us)
        decided.append(further)
        return further.admitted

    claims = _batch(state, request.take, admits)
    last = next(d for d in reversed(decided) if d.admitted)
    return _written(last, tuple(p.id for p in claims), dropped, new_digest)


def _family_admits(state: LaneState, request: Request, claimed: int) -> bool:
    """Whether a partition's family admits one more claim after ``claimed`` of this call:
    its in-flight count over all its partitions below its ceiling [INV-LIM-8]."""
    return request.family_ceiling is None or state.family_in_flight + claimed < request.family_ceiling


def _batch(state: LaneState, take: int, admits: Callable[[int], bool]) -> list[Position]:
    """The first candidate, then each next one, up to ``take``, while it precedes ``bound``
    [INV-LIM-6] and ``admits(claimed so far)``: the claims the next polls would make. The
    batch ends, leaving no trace, at the first that another lane's oldest precedes or that
    the next poll would be refused."""
    claims = list(state.candidates[:1])
    for position in state.candidates[1:take]:
        if state.bound is not None and position >= state.bound:
            break  # [INV-LIM-6] another lane would come first: the batch ends
        if not admits(len(claims)):
            break  # the next poll would be refused: the batch ends, leaving no trace
        claims.append(position)
    return claims


def _written(decision: Decision, claims: tuple[str, ...], dropped: tuple[int, ...], digest: str | None, *,
             refused: Refused | None = None) -> Plan:
    """A plan that writes ``decision``'s buckets and stamp (and a re-base's), with ``claims``."""
    return Plan(claims=claims, buckets=decision.buckets, dropped=dropped, stamp=decision.stamp,
                blocked_until_us=decision.blocked_until_us, digest=digest, refused=refused,
                unconfigured=decision.unconfigured)
