"""Exact-boundary bucket arithmetic, model and engine, on rates whose units do not divide.

``vectors/buckets.json`` mostly uses rates whose token and capacity are whole
multiples of the limit (4 per 1 s: a token every 250,000 µs exactly), where a rounding
slip in the next-token time or the fill time cannot show. This file closes that class:

- pinned scenarios (below, with the arithmetic in the comments) where a token takes a
  fractional number of µs (3 per 1 s: 333,333⅓ µs) and the capacity is not a multiple
  of the limit (burst 2 of 3 per 1 s: 2,000,000 units fill in 666,666⅔ µs), with claims
  one µs before the next-token instant (refused, stamped with that instant) and at it
  (admitted), replayed through the engine's ``decide`` and the model's ``LimitsModel``;
- properties over generated limit/per/burst whose units do not divide, with claims
  landing exactly on the stamp, one µs before it and on the fill instant, checking the
  engine and the model decide the same at every step and that the stamp is exact
  [INV-LIM-5] and the level never above capacity [INV-LIM-4].

Checks: INV-LIM-4, INV-LIM-5, model–engine agreement of the key decision.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ductwork.limit_entries import RateEntry, parse_limit_entry
from ductwork.limits.buckets import Bucket, next_token_us, refill
from model import limits as model
from model.invariants import check_all
from tests.unit.test_buckets import Key

US = 1_000_000
FIELDS = ("admitted", "refused_for", "blocked_until_us", "levels", "in_flight")

# One claim per tuple: (at_us, admitted, refused_for, blocked_until_us, levels, in_flight).
PINNED = [
    (
        "3 per 1s burst 2: a token every 333,333⅓ µs, capacity 2,000,000 units",
        {"rate": {"limit": 3, "per": "1s", "burst": 2}},
        [
            # created empty at 0: missing 1,000,000 units, ceil(1,000,000 / 3) = 333,334
            (0, False, "rate", 333_334, [0], 0),
            # one µs before: 333,333 × 3 = 999,999 units, one short
            (333_333, False, "rate", 333_334, [999_999], 0),
            # at it: 1,000,002 units, spend one token leaves 2; ceil(999,998 / 3) = 333,333
            (333_334, True, None, 666_667, [2], 1),
            (666_666, False, "rate", 666_667, [999_998], 1),  # 2 + 333,332 × 3
            (666_667, True, None, 1_000_000, [1], 2),  # 1,000,001 − 1,000,000; ceil(999,999 / 3)
            (999_999, False, "rate", 1_000_000, [999_997], 2),  # 1 + 333,332 × 3
            (1_000_000, True, None, 1_333_334, [0], 3),  # 1 + 333,333 × 3 = one token exactly
            # filling from 0 at 1,000,000: ceil(2,000,000 / 3) = 666,667 µs to the cap; one µs
            # before it the level is 1,999,998, a token is spent, 2 units short: ceil(2 / 3) = 1 µs
            (1_666_666, True, None, 1_666_667, [999_998], 4),
            (1_666_666, False, "rate", 1_666_667, [999_998], 4),
            (2_000_000, True, None, None, [1_000_000], 5),  # 999,998 + 333,334 × 3: the cap exactly
            (2_000_000, True, None, 2_333_334, [0], 6),  # burst of 2 spent at one instant
        ],
    ),
    (
        "7 per 1s burst 3: fill ceil(3,000,000 / 7) = 428,572 µs, one µs earlier 2,999,997",
        {"rate": {"limit": 7, "per": "1s", "burst": 3}},
        [
            (0, False, "rate", 142_858, [0], 0),  # ceil(1,000,000 / 7) = 142,858
            # nothing claimed until the bucket fills: 428,571 × 7 = 2,999,997 < cap
            (428_571, True, None, None, [1_999_997], 1),
            (428_571, True, None, 428_572, [999_997], 2),  # 3 units short: ceil(3 / 7) = 1 µs
            (428_571, False, "rate", 428_572, [999_997], 2),
            (428_572, True, None, 571_429, [4], 3),  # 1,000,004 − 1,000,000; ceil(999,996 / 7)
            (571_428, False, "rate", 571_429, [999_996], 3),  # 4 + 142,856 × 7
            (571_429, True, None, 714_286, [3], 4),  # 4 + 142,857 × 7 − 1,000,000; ceil(999,997 / 7)
        ],
    ),
    (
        "two buckets, 3 per 1s burst 1 and 11 per 13s burst 2: the stamp is the later one",
        {"rate": [{"limit": 3, "per": "1s", "burst": 1}, {"limit": 11, "per": "13s", "burst": 2}]},
        [
            # 1 s bucket: ceil(1,000,000 / 3) = 333,334; 13 s bucket: ceil(13,000,000 / 11) = 1,181,819
            (0, False, "rate", 1_181_819, [0, 0], 0),
            (1_181_818, False, "rate", 1_181_819, [1_000_000, 12_999_998], 0),
            (1_181_819, True, None, 2_363_637, [0, 9], 1),  # 13,000,009 − 13,000,000; ceil(12,999,991 / 11)
            (2_363_636, False, "rate", 2_363_637, [1_000_000, 12_999_996], 1),  # 9 + 1,181,817 × 11
            (2_363_637, True, None, 3_545_455, [0, 7], 2),  # 9 + 1,181,818 × 11 − 13,000,000
        ],
    ),
]


def _replay_engine(raw, claims):
    key = Key(parse_limit_entry("k", raw, "job_worker.limits.k"))
    for at_us, *_ in claims:
        decision = key.claim(at_us)
        yield at_us, dict(zip(FIELDS, (decision.admitted, decision.refused_for, key.blocked_until_us,
                                       key.levels(), key.in_flight), strict=True))


def _replay_model(raw, claims):
    limits = model.LimitsModel({"k": raw})
    for at_us, *_ in claims:
        decision = limits.decide("k", at_us)
        check_all(limits)
        yield at_us, {f: (list(decision.levels) if f == "levels" else getattr(decision, f)) for f in FIELDS}


@pytest.mark.parametrize("replay", [_replay_engine, _replay_model], ids=["engine", "model"])
@pytest.mark.parametrize(("name", "raw", "claims"), PINNED, ids=[p[0].split(":")[0] for p in PINNED])
def test_pinned_boundary_scenarios(replay, name, raw, claims):
    for (at_us, got), expected in zip(replay(raw, claims), claims, strict=True):
        assert got == dict(zip(FIELDS, expected[1:], strict=True)), f"{name}: claim at {at_us}"


# ---------------------------------------------------------------- generated: units that do not divide

LIMITS = st.sampled_from([3, 7, 9, 11, 13, 17, 999, 1_001, 999_983, 3_000_001]) | st.integers(1, 5_000_000)


@st.composite
def odd_rates(draw, per_s=None):
    """A rate whose token (``per × 10⁶`` units) is not a multiple of its limit."""
    limit = draw(LIMITS)
    per = per_s if per_s is not None else draw(st.integers(1, 90))
    burst = draw(st.integers(1, 5))
    assume((per * US) % limit != 0)
    return RateEntry(limit, per, burst)


@given(st.data())
def test_fill_and_next_token_instants_are_exact_engine_and_model(data):
    """From any level, the fill and next-token instants are exact to the µs, in both implementations."""
    rate = data.draw(odd_rates())
    level = data.draw(st.integers(0, rate.capacity_units))
    t0 = data.draw(st.integers(-(10**9), 10**12))
    bucket = Bucket(rate.per_s, level, t0)
    m_rate = model.RateEntry(rate.limit, rate.per_s, rate.burst)
    m_bucket = model.Bucket(level, t0, rate.capacity_units)
    # fill: the cap is reached at t0 + ceil(missing / limit) µs and not one µs earlier
    fill = t0 + -(-(rate.capacity_units - level) // rate.limit)
    for at in (fill - 1, fill, fill + 1):
        got = refill(bucket, rate, at).level_units
        assert got == model.refill(m_bucket, m_rate, at).units
        assert got == min(level + max(0, at - t0) * rate.limit, rate.capacity_units) <= rate.capacity_units
    assert (fill == t0) or refill(bucket, rate, fill - 1).level_units < rate.capacity_units
    assert refill(bucket, rate, fill).level_units == rate.capacity_units
    # next token: admitted at it, refused one µs before, same instant in the model
    at = next_token_us(bucket, rate, t0)
    if level >= rate.units_per_token:
        assert at is None
        assert model.next_token_us(m_bucket, m_rate) == t0
        return
    assert at == model.next_token_us(m_bucket, m_rate) > t0
    assert refill(bucket, rate, at - 1).level_units < rate.units_per_token <= refill(bucket, rate, at).level_units


@st.composite
def odd_entries(draw):
    """A raw ``limits`` entry of 1–3 rates that do not divide, maybe with a concurrency."""
    periods = draw(st.lists(st.integers(1, 90), min_size=1, max_size=3, unique=True))
    rates = [draw(odd_rates(per_s=p)) for p in periods]
    raw = {"rate": [{"limit": r.limit, "per": r.per_s, "burst": r.burst} for r in rates]}
    if draw(st.booleans()):
        raw["concurrency"] = draw(st.integers(1, 3))
    return raw


# Where the next claim lands: relative to the last stamp (one µs before it, at it, just
# after it), a plain step, or the same instant again; and whether one claim completes first.
STEPS = st.lists(
    st.tuples(st.sampled_from(["stamp-1", "stamp", "stamp+1", "step", "same"]),
              st.integers(0, 3 * US), st.booleans()),
    min_size=1, max_size=30,
)


@given(odd_entries(), STEPS)
def test_engine_and_model_decide_alike_on_the_boundaries(raw, steps):
    """Every claim, engine and model: same admission, reason, stamp, levels and in-flight count.

    Claims land one µs before the current stamp (must be refused, stamp unchanged), at
    it and just after (admitted unless concurrency is full), so every refill that lands
    exactly on a next-token instant is exercised, on rates whose arithmetic does not divide.
    """
    key = Key(parse_limit_entry("k", raw, "job_worker.limits.k"))
    limits = model.LimitsModel({"k": raw})
    held, now = [], 0
    for where, dt, complete_first in steps:
        stamp = key.blocked_until_us
        if where.startswith("stamp") and stamp is not None:
            now = max(now, stamp + {"stamp-1": -1, "stamp": 0, "stamp+1": 1}[where])
        elif where != "same":
            now += dt
        if complete_first and held:
            limits.complete(held.pop(0), now)
            key.in_flight -= 1
        slot_free = key.entry.concurrency is None or key.in_flight < key.entry.concurrency
        e = key.claim(now)
        m = limits.decide("k", now)
        check_all(limits)
        if m.admitted:
            held.append(m.job_id)
        assert (e.admitted, e.refused_for, key.blocked_until_us, key.levels(), key.in_flight) == (
            m.admitted, m.refused_for, m.blocked_until_us, list(m.levels), m.in_flight
        ), f"claim at {now} ({where}), entry {raw}"
        for rate in key.entry.rates:
            assert 0 <= key.buckets[rate.per_s].level_units <= rate.capacity_units
        if stamp is not None and slot_free:
            assert e.admitted == (now >= stamp), f"claim at {now}, stamp {stamp}: {e}"
