"""Token-bucket arithmetic and the key decision: every scenario of
``vectors/buckets.json`` replayed through ``decide()``, plus properties.

Checks: INV-LIM-1 (concurrency refusal), INV-LIM-2 (claims in any window <= B + L·T/P),
INV-LIM-4 (level in [0, burst], lowered burst clamps, restarts keep levels by period),
INV-LIM-5 (the stamp is the exact next-token time: nothing admitted before, a claim
possible at it), INV-LIM-7 (dropping dominated entries changes no admission).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ductwork.limit_entries import LimitEntry, RateEntry, drop_dominated, parse_limit_entry
from ductwork.limits.buckets import Bucket, Decision, carry_over, decide, next_token_us, refill

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
SCENARIOS = json.loads((VECTORS / "buckets.json").read_text())


@dataclass
class Key:
    """One key as the claim path sees it across calls: stored buckets, stamp, in flight."""

    entry: LimitEntry | None
    buckets: dict[int, Bucket] = field(default_factory=dict)
    in_flight: int = 0
    blocked_until_us: int | None = None

    def claim(self, now_us: int):
        decision = decide(self.entry, self.buckets, self.in_flight, now_us)
        if decision.stamp:
            self.blocked_until_us = decision.blocked_until_us
        self.buckets.update((b.period_s, b) for b in decision.buckets)
        self.in_flight += decision.admitted
        return decision

    def restart_with(self, entry: LimitEntry) -> None:
        self.entry = entry
        self.buckets = carry_over(entry, self.buckets)
        self.blocked_until_us = None

    def levels(self) -> list[int]:
        stored = (self.buckets.get(rate.per_s) for rate in self.entry.rates)
        return [bucket.level_units for bucket in stored if bucket is not None]


def _entry(raw) -> LimitEntry:
    return parse_limit_entry("k", raw, "job_worker.limits.k")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s["name"])
def test_bucket_vectors(scenario):
    key = Key(_entry(scenario["entry"]))
    for index, op in enumerate(scenario["ops"]):
        where = f"{scenario['name']} op {index} {op}"
        if op["op"] == "restart_with":
            key.restart_with(_entry(op["entry"]))
            continue
        if op["op"] == "complete":
            key.in_flight -= 1
        else:
            assert op["op"] == "claim", where
            decision = key.claim(op["at_us"])
            assert decision.admitted == op["admitted"], where
            assert decision.refused_for == op["refused_for"], where
            assert key.blocked_until_us == op["blocked_until_us"], where
            assert key.levels() == op["levels"], where
        assert key.in_flight == op["in_flight"], where


# ---------------------------------------------------------------- worked examples


RATE_5_PER_10S = RateEntry(limit=5, per_s=10, burst=1)


def test_worked_example_5_per_10s():
    key = Key(LimitEntry("api", None, (RATE_5_PER_10S,)))
    first = key.claim(0)
    # every field of each Decision, stamp and flags included: the claim path writes them
    assert first == Decision(False, "rate", (Bucket(10, 0, 0),), True, 2_000_000, unconfigured=False)
    assert not key.claim(1_999_999).admitted
    second = key.claim(2_000_000)
    assert second == Decision(True, None, (Bucket(10, 0, 2_000_000),), True, 4_000_000, unconfigured=False)


def test_unconfigured_key_is_admitted_and_flagged():
    decision = decide(None, {}, in_flight=99, now_us=5)
    # admitted, flagged, and the stamp cleared (stamp True, None): no bucket can be short
    assert decision == Decision(True, None, (), True, None, unconfigured=True)


def test_concurrency_refusal_changes_nothing():
    entry = LimitEntry("k", 2, (RATE_5_PER_10S,))
    decision = decide(entry, {}, in_flight=2, now_us=5)
    # no bucket, no stamp written, not flagged unconfigured
    assert decision == Decision(False, "concurrency", (), False, None, unconfigured=False)
    assert decide(entry, {}, in_flight=1, now_us=5).refused_for == "rate"


def test_concurrency_only_admit_clears_stamp():
    decision = decide(LimitEntry("k", 1, ()), {}, in_flight=0, now_us=5)
    assert decision.admitted
    assert decision.stamp
    assert decision.blocked_until_us is None


def test_negative_in_flight_is_an_assertion_naming_the_invariant():
    with pytest.raises(AssertionError, match=r"^\[INV-LIM-3\] negative in-flight count -1$"):
        decide(LimitEntry("k", 1, ()), {}, in_flight=-1, now_us=5)


def test_a_bucket_refilled_with_another_periods_entry_is_an_assertion_naming_both():
    with pytest.raises(AssertionError, match=r"^bucket of period 1 s refilled with an entry of period 10 s$"):
        refill(Bucket(1, 0, 0), RATE_5_PER_10S, 10)


def test_time_going_backwards_refills_nothing_and_keeps_refill_time():
    bucket = Bucket(10, 1_000, refilled_at_us=5_000)
    back = refill(bucket, RATE_5_PER_10S, 1_000)
    assert back == bucket
    # the µs between 1,000 and 5,000 were never credited, so none is credited twice
    assert refill(back, RATE_5_PER_10S, 6_000).level_units == 1_000 + 1_000 * 5
    assert next_token_us(bucket, RATE_5_PER_10S, 1_000) == 5_000 + (10_000_000 - 1_000) // 5


def test_lowered_burst_clamps_even_without_elapsed_time():
    bucket = Bucket(1, 5_000_000, refilled_at_us=100)
    assert refill(bucket, RateEntry(4, 1, 2), 100).level_units == 2_000_000
    assert refill(bucket, RateEntry(4, 1, 2), 50).level_units == 2_000_000


def test_negative_level_is_an_assertion_naming_the_invariant():
    with pytest.raises(AssertionError, match=r"\[INV-LIM-4\]"):
        refill(Bucket(10, -1, 0), RATE_5_PER_10S, 10)


def test_carry_over_keeps_kept_periods_only():
    stored = {1: Bucket(1, 7, 0), 60: Bucket(60, 9, 0)}
    assert carry_over(LimitEntry("k", None, (RateEntry(30, 60, 5),)), stored) == {60: stored[60]}
    assert carry_over(None, stored) == {}


# ---------------------------------------------------------------- properties

rates = st.builds(RateEntry, limit=st.integers(1, 1000), per_s=st.integers(1, 120),
                  burst=st.integers(1, 8))
buckets_for = lambda rate: st.builds(  # noqa: E731
    Bucket, st.just(rate.per_s), st.integers(0, rate.capacity_units), st.integers(0, 10**9)
)


@st.composite
def limit_entries(draw):
    chosen = draw(st.lists(rates, max_size=3, unique_by=lambda r: r.per_s))
    concurrency = draw(st.none() | st.integers(1, 3))
    assume(chosen or concurrency)
    return LimitEntry("k", concurrency, drop_dominated(chosen))


def _run(entry: LimitEntry, ops: list[tuple[int, bool]]):
    """Drive a key through (time step, complete one first?) ops.

    Yields ``(now, stamp before the claim, decision, key after it)`` per claim.
    """
    key, now = Key(entry), 0
    for dt, complete in ops:
        now += dt
        if complete and key.in_flight:
            key.in_flight -= 1
        stamp_before = key.blocked_until_us
        yield now, stamp_before, key.claim(now), key


op_lists = st.lists(st.tuples(st.integers(0, 3_000_000), st.booleans()), min_size=1, max_size=40)


@given(limit_entries(), op_lists)
def test_level_stays_within_capacity(entry, ops):
    for _, _, _, key in _run(entry, ops):
        for rate in entry.rates:
            if rate.per_s in key.buckets:
                assert 0 <= key.buckets[rate.per_s].level_units <= rate.capacity_units


@given(limit_entries(), op_lists)
def test_no_admission_before_the_stamp(entry, ops):
    for now, stamp_before, decision, _ in _run(entry, ops):
        if stamp_before is not None and now < stamp_before:
            assert not decision.admitted


@given(limit_entries(), op_lists)
def test_a_claim_is_possible_at_the_stamp(entry, ops):
    for _, _, decision, key in _run(entry, ops):
        if decision.blocked_until_us is not None:
            # in_flight 0: the stamp is about tokens, whatever the concurrency
            assert decide(entry, key.buckets, 0, decision.blocked_until_us).admitted
            assert not decide(entry, key.buckets, 0, decision.blocked_until_us - 1).admitted


@given(st.data())
def test_refill_is_additive_over_split_intervals(data):
    rate = data.draw(rates)
    bucket = data.draw(buckets_for(rate))
    t1 = bucket.refilled_at_us + data.draw(st.integers(0, 10**7))
    t2 = t1 + data.draw(st.integers(0, 10**7))
    split = refill(refill(bucket, rate, t1), rate, t2)
    assert split == refill(bucket, rate, t2)
    if bucket.level_units + (t2 - bucket.refilled_at_us) * rate.limit <= rate.capacity_units:
        assert split.level_units == bucket.level_units + (t2 - bucket.refilled_at_us) * rate.limit


@given(st.data())
def test_next_token_time_is_exact(data):
    rate = data.draw(rates)
    bucket = data.draw(buckets_for(rate))
    now = bucket.refilled_at_us + data.draw(st.integers(0, 10**7))
    at = next_token_us(bucket, rate, now)
    if at is None:
        assert refill(bucket, rate, now).level_units >= rate.units_per_token
    else:
        assert at > now
        assert refill(bucket, rate, at).level_units >= rate.units_per_token
        assert refill(bucket, rate, at - 1).level_units < rate.units_per_token


@given(rates, st.lists(st.integers(0, 2_000_000), min_size=1, max_size=40))
def test_claims_in_any_window_within_burst_plus_rate(rate, gaps):
    entry = LimitEntry("k", None, (rate,))
    times = [now for now, _, decision, _ in _run(entry, [(g, False) for g in gaps])
             if decision.admitted]
    unit = rate.per_s * 10**6
    for i, start in enumerate(times):
        for j in range(i, len(times)):  # claims i..j lie in [start, times[j]]
            assert (j - i + 1 - rate.burst) * unit <= rate.limit * (times[j] - start)


@given(st.lists(rates, min_size=1, max_size=4, unique_by=lambda r: r.per_s), op_lists)
def test_dropping_dominated_entries_changes_no_admission(all_rates, ops):
    full = LimitEntry("k", 2, tuple(all_rates))
    kept = LimitEntry("k", 2, drop_dominated(all_rates))
    admitted_full = [d.admitted for _, _, d, _ in _run(full, ops)]
    admitted_kept = [d.admitted for _, _, d, _ in _run(kept, ops)]
    assert admitted_full == admitted_kept
