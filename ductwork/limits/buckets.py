"""Token-bucket arithmetic and the key decision: pure functions on ints.

    >>> entry = LimitEntry("api", None, (RateEntry(limit=5, per_s=10, burst=1),))
    >>> decide(entry, {}, in_flight=0, now_us=0).blocked_until_us
    2000000

No SQL, no floats, no clock: the claim path reads the key's buckets, its in-flight
count and the database time under the key's lock, calls :func:`decide`, and writes
back what the :class:`Decision` says, in the same transaction. The model mirrors
these functions and ``tests/unit/test_buckets.py`` replays ``vectors/buckets.json``
through them.

A bucket's level is an integer number of *units*, one unit being
``1 / (per_s × 10⁶)`` token, and time is integer microseconds, so refilling ``dt`` µs
adds exactly ``dt × limit`` units. Worked example, limit 5 per 10 s, burst 1: a
token is 10,000,000 units, 1 µs adds 5 units, a token takes 2,000,000 µs (2 s) to
arrive, and the bucket never holds more than 10,000,000 units (one token).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from ductwork.limit_entries import LimitEntry, RateEntry


@dataclass(frozen=True)
class Bucket:
    """The stored state of one rate entry's bucket, per ``(key, period)``.

    Survives restarts; ``limit`` and ``burst`` are never stored, they come from the
    config at every refill [INV-LIM-4].
    """

    #: the period this bucket meters; matches ``RateEntry.per_s``
    period_s: int
    #: tokens held, in units of ``1 / (period_s × 10⁶)`` token; in [0, capacity] [INV-LIM-4]
    level_units: int
    #: database time (µs) up to which refill has been credited; never moves backwards
    refilled_at_us: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check(bucket: Bucket, entry: RateEntry) -> None:
    if bucket.period_s != entry.per_s:
        raise AssertionError(
            f"bucket of period {bucket.period_s} s refilled with an entry of period "
            f"{entry.per_s} s"
        )
    if bucket.level_units < 0:  # [INV-LIM-4] never clamped silently: it means a bug
        raise AssertionError(
            f"[INV-LIM-4] bucket of period {bucket.period_s} s has a negative level "
            f"{bucket.level_units}"
        )


def refill(bucket: Bucket, entry: RateEntry, now_us: int) -> Bucket:
    """The bucket credited with the time from its refill time up to ``now_us``.

    Adds ``dt × limit`` units for ``dt = now_us − refilled_at_us > 0`` and caps the
    level at ``entry.capacity_units``, the *current* burst, so a burst lowered by a
    restart clamps banked tokens away on the next refill, even when ``dt <= 0``
    [INV-LIM-4]. Limit 5 per 10 s, burst 1, from empty: after 1,000,000 µs the level is
    5,000,000 units (half a token); after 3,000,000 µs it is capped at 10,000,000.

    Time that goes backwards (``dt <= 0``) adds nothing, and the refill time becomes
    ``max(refilled_at_us, now_us)``, not ``now_us``: rewinding it would credit the same
    microseconds a second time once the clock caught up, letting more than
    ``burst + limit·T/per`` claims through [INV-LIM-2]. The cost of that choice is
    conservative: after a backwards jump the bucket earns nothing until the clock
    passes its old refill time. (For ``dt >= 0`` both readings agree; the vectors have
    no backwards step.)

    ``dt × limit`` is only formed below the time the bucket takes to fill, so no
    intermediate exceeds ``capacity + limit``, which parsing keeps within 64 bits
    however long the bucket sat idle.
    """
    _check(bucket, entry)
    capacity = entry.capacity_units
    level = min(bucket.level_units, capacity)  # [INV-LIM-4] clamp to the current burst
    dt = now_us - bucket.refilled_at_us
    if dt > 0:
        level = (
            capacity
            if dt >= _ceil_div(capacity - level, entry.limit)
            else level + dt * entry.limit
        )
    return Bucket(bucket.period_s, level, max(bucket.refilled_at_us, now_us))


def next_token_us(bucket: Bucket, entry: RateEntry, now_us: int) -> int | None:
    """The first µs at which the bucket holds a whole token, or None if it holds one now.

    For a bucket refilled at ``now_us`` holding ``u`` units this is
    ``now_us + ceil((per_s × 10⁶ − u) / limit)``: limit 5 per 10 s, empty at 0, gives
    ``0 + ceil(10,000,000 / 5) = 2,000,000``. At that µs a refill adds at least the
    missing units, and one µs earlier it adds fewer, so the time is exact [INV-LIM-5].
    The bucket is refilled to ``now_us`` first, so a stale bucket gives the same answer,
    and after a backwards clock the count starts at the bucket's own refill time.
    """
    current = refill(bucket, entry, now_us)
    missing = entry.units_per_token - current.level_units
    if missing <= 0:
        return None
    return current.refilled_at_us + _ceil_div(missing, entry.limit)


def _latest_next_token(
    buckets: tuple[Bucket, ...], rates: tuple[RateEntry, ...], now_us: int
) -> int | None:
    """The first µs at which every bucket holds a token again; None if all hold one now."""
    times = [t for b, r in zip(buckets, rates, strict=True) if (t := next_token_us(b, r, now_us)) is not None]
    return max(times, default=None)


def carry_over(entry: LimitEntry | None, buckets: Mapping[int, Bucket]) -> dict[int, Bucket]:
    """The buckets a key keeps when the fleet restarts with ``entry`` as its config.

    Buckets are matched by period: a period the new entry keeps keeps its level and
    refill time (clamped to the new burst at its next refill [INV-LIM-4]); any other
    bucket is discarded, so a period dropped by one config and listed again by a later
    one starts empty, never with tokens banked under other values. The key's
    ``blocked_until`` is cleared at a restart too (it was computed from the old
    values). Both are what ``vectors/buckets.json``'s ``restart_with`` specifies:
    ``1 per 1s`` and ``30 per 1m`` (bursts 5 and 5) keep only the 1 m bucket, as the
    per-second entry is dominated.
    """
    kept = {rate.per_s for rate in entry.rates} if entry is not None else set()
    return {period: bucket for period, bucket in buckets.items() if period in kept}


def _stored_or_empty(buckets: Mapping[int, Bucket], rate: RateEntry, now_us: int) -> Bucket:
    """The stored bucket of ``rate``'s period, or a new one: empty, refilled at ``now_us``."""
    stored = buckets.get(rate.per_s)
    return stored if stored is not None else Bucket(rate.per_s, 0, now_us)


@dataclass(frozen=True)
class Decision:
    """What one claim attempt on a key decided, and what the claim path must write.

    The caller persists ``buckets`` (upserting by period), writes ``blocked_until_us``
    to the key's header row when ``stamp`` is true (None clears it), and claims a job
    only when ``admitted``; all in the transaction that holds the key's lock.
    """

    #: claim the oldest eligible job of the key
    admitted: bool
    #: why not: ``"concurrency"`` (nothing changed) or ``"rate"``; None when admitted
    refused_for: Literal["concurrency", "rate"] | None
    #: new state of every kept bucket, config order; empty on a concurrency refusal
    buckets: tuple[Bucket, ...]
    #: whether ``blocked_until_us`` must be written; False leaves the stamp as it is
    stamp: bool
    #: first µs every bucket holds a token again; None when none is short
    blocked_until_us: int | None
    #: the key has no configuration entry: admitted without limits (log a warning)
    unconfigured: bool


def decide(
    entry: LimitEntry | None, buckets: Mapping[int, Bucket], in_flight: int, now_us: int,
) -> Decision:
    """The key decision of ``docs/semantics.md`` §5, at database time ``now_us``.

    ``buckets`` maps a period to its stored bucket; periods the entry does not keep
    are ignored and left as they are, missing ones are created empty at ``now_us`` (a
    key with no history gets no free burst). In order:

    1. ``entry`` None → admitted, ``unconfigured``; the stamp is cleared because no
       bucket can be short.
    2. ``in_flight >= concurrency`` → refused for ``"concurrency"``; nothing refilled,
       created or stamped (no one knows when a slot frees). Concurrency 2 with 2 in
       flight refuses; with 1 it goes on [INV-LIM-1].
    3. Every kept bucket is refilled (clamped to the current burst) [INV-LIM-4].
    4. A bucket below one token → refused for ``"rate"``, stamped with the latest
       next-token time of the short buckets [INV-LIM-5]; the refilled buckets are
       persisted.
    5. Otherwise admitted: one token is spent from every bucket [INV-LIM-2] and the
       stamp is set as in 4 over the buckets now short, or cleared.

    Limit 5 per 10 s, burst 1, no history: a claim at 0 creates the bucket empty and is
    refused, stamped 2,000,000; a claim at 2,000,000 finds exactly one token, is
    admitted, and leaves the bucket empty, stamped 4,000,000.
    """
    if in_flight < 0:
        raise AssertionError(f"[INV-LIM-3] negative in-flight count {in_flight}")
    if entry is None:
        return Decision(True, None, (), True, None, unconfigured=True)
    if entry.concurrency is not None and in_flight >= entry.concurrency:
        return Decision(False, "concurrency", (), False, None, False)  # [INV-LIM-1]
    rates = entry.rates
    refilled = tuple(
        refill(_stored_or_empty(buckets, rate, now_us), rate, now_us) for rate in rates  # [INV-LIM-4]
    )
    blocked_until = _latest_next_token(refilled, rates, now_us)
    if blocked_until is not None:  # [INV-LIM-5] stamp the exact time of the next token
        return Decision(False, "rate", refilled, True, blocked_until, False)
    spent = tuple(
        replace(bucket, level_units=bucket.level_units - rate.units_per_token)  # [INV-LIM-2]
        for bucket, rate in zip(refilled, rates, strict=True)
    )
    return Decision(True, None, spent, True, _latest_next_token(spent, rates, now_us), False)
