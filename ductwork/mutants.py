"""Deliberately broken variants of the engine, each missing one guard: for tests only.

    DUCTWORK_MUTANT=no_key_lock pytest tests/properties/test_mutants.py

A guard that no test misses is a guard nobody has verified, so each name below
switches off exactly one guard, and ``tests/properties/test_mutants.py`` (and
the chaos suite's mutant runs) expect the property machines or the history
checkers to go red with it on. Nothing is active unless ``DUCTWORK_MUTANT`` is
set (read at import, so child processes inherit it) or a test calls
:func:`activate`; in production :func:`on` is one set lookup that is always
False.
"""

from __future__ import annotations

import os

#: name -> the guard it removes
MUTANTS = {
    "no_key_lock": "claims.claim_keyed reads the key without locking its header row [INV-LIM-1]",
    "clock_before_lock": "claims.claim_keyed reads the clock before taking the key lock [INV-CLK-1]",
    "count_outside_lock": "claims.claim_keyed uses the in-flight count read by the lane scan [INV-LIM-1]",
    "no_clamp": "buckets refill without capping at the burst [INV-LIM-4]",
    "float_refill": "buckets refill through float tokens, rounding [INV-LIM-2, INV-LIM-4]",
    "no_spend_on_retry": "a retried execution's claim spends no token [INV-LIM-2]",
    "no_stamp": "a rate refusal leaves blocked_until unstamped [INV-LIM-5]",
    "unkeyed_first": "the unkeyed lane is tried before older keyed lanes [INV-LIM-6]",
    "hand_off_any_lane": "claims.hand_off claims its key's next job even when an older lane comes first [INV-LIM-6]",
    "batch_past_lane": "a batch of unkeyed claims takes executions younger than the next lane's oldest [INV-LIM-6]",
    "batch_no_guard": "executions.record_successes ends a batch's executions without the open-and-ours guard [INV-EXE-2]",
    "stale_fence_commits": "the advancement fence does not compare the claim token [INV-ADV-2, INV-ADV-1]",
    "fanin_outside_fence": "the fan-in counter is bumped in its own transaction before the fence [INV-ADV-3]",
}

_active: set[str] = set(filter(None, os.environ.get("DUCTWORK_MUTANT", "").split(",")))
_unknown = _active - set(MUTANTS)
if _unknown:
    raise ValueError(f"DUCTWORK_MUTANT: unknown mutants {sorted(_unknown)}; known: {sorted(MUTANTS)}")


def on(name: str) -> bool:
    """True if the mutant ``name`` is active (never in production)."""
    return bool(_active) and name in _active


def activate(*names: str) -> None:
    unknown = set(names) - set(MUTANTS)
    if unknown:
        raise ValueError(f"unknown mutants {sorted(unknown)}")
    _active.update(names)


def deactivate() -> None:
    _active.clear()


def refill_for_mutants():  # type: ignore[no-untyped-def]
    """The refill function an active bucket mutant substitutes (None: the real one)."""
    from ductwork.limits import buckets

    if on("no_clamp"):
        def no_clamp(bucket, entry, now_us):  # type: ignore[no-untyped-def]
            dt = max(0, now_us - bucket.refilled_at_us)
            return buckets.Bucket(bucket.period_s, bucket.level_units + dt * entry.limit,
                                  max(bucket.refilled_at_us, now_us))
        return no_clamp
    if on("float_refill"):
        def float_refill(bucket, entry, now_us):  # type: ignore[no-untyped-def]
            dt = max(0, now_us - bucket.refilled_at_us)
            tokens = bucket.level_units / entry.units_per_token + dt / 1e6 * entry.limit / entry.per_s
            level = min(int(tokens * entry.units_per_token), entry.capacity_units)
            return buckets.Bucket(bucket.period_s, level, max(bucket.refilled_at_us, now_us))
        return float_refill
    return None
