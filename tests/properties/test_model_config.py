"""Configuration properties of the model's own parser (independent of the engine's).

Checks: INV-LIM-7 — dropping dominated rate entries never changes which claims are
admitted (nor the ``blocked_until`` stamps), and durations parse/render round-trip.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model.errors import ConfigError
from model.limits import (
    KeyLimits,
    LimitsModel,
    RateEntry,
    drop_dominated,
    parse_period,
    parse_rate_entries,
    render_period,
)
from tests.properties.strategies import rate_entry_lists

UNITS = (("w", 604_800), ("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
SCHEDULES = st.lists(st.tuples(st.sampled_from([0, 1, 999, 250_000, 1_000_000, 7_000_000]) | st.integers(0, 3_000_000),
                               st.integers(1, 3)), max_size=40)


def _dominates(a: RateEntry, b: RateEntry) -> bool:
    return a.rate <= b.rate and a.burst <= b.burst


@given(rate_entry_lists(min_size=1, max_size=4), SCHEDULES)
def test_dropping_dominated_entries_changes_no_admission(raw, schedule):
    """Replay one claim schedule against all entries and against the kept ones: same
    admissions, same stamps (a dominated bucket is never the short one that decides)."""
    entries = tuple(parse_rate_entries(raw))
    kept = tuple(drop_dominated(entries))
    every = LimitsModel({"k": KeyLimits(None, entries, entries)})
    fewer = LimitsModel({"k": KeyLimits(None, kept, entries)})
    now = 0
    for dt, attempts in schedule:
        now += dt
        for _ in range(attempts):
            a, b = every.decide("k", now), fewer.decide("k", now)
            assert (a.admitted, a.blocked_until_us) == (b.admitted, b.blocked_until_us), (now, entries, kept)


@given(rate_entry_lists(min_size=1, max_size=4))
def test_kept_entries_are_exactly_the_undominated(raw):
    entries = parse_rate_entries(raw)
    kept = drop_dominated(entries)
    assert kept
    assert drop_dominated(kept) == kept
    assert [e for e in entries if e in kept] == kept  # config order
    for b in entries:
        if b not in kept:
            assert any(_dominates(a, b) for a in kept), (b, kept)
    for a in kept:
        for b in kept:
            assert a is b or not (_dominates(a, b) and (a.rate, a.burst) != (b.rate, b.burst))


@given(st.integers(1, 10**9))
def test_render_then_parse_round_trips(seconds):
    text = render_period(seconds)
    assert parse_period(text) == seconds
    assert parse_period(str(seconds)) == seconds == parse_period(seconds)
    assert render_period(parse_period(text)) == text


@given(st.lists(st.integers(0, 400), min_size=5, max_size=5).filter(any))
def test_compound_durations_parse_to_their_sum(parts):
    text = "".join(f"{n}{unit}" for n, (unit, _) in zip(parts, UNITS, strict=True) if n)
    assert parse_period(text) == sum(n * size for n, (_, size) in zip(parts, UNITS, strict=True))


@given(st.permutations([u for u, _ in UNITS]).filter(lambda p: list(p) != [u for u, _ in UNITS]))
def test_units_out_of_order_are_rejected(order):
    text = "".join(f"1{unit}" for unit in order)
    with pytest.raises(ConfigError, match=re.escape(repr(text))):
        parse_period(text)


@pytest.mark.parametrize("bad", ["1mo", "2y", "1M"])
def test_months_and_years_named(bad):
    with pytest.raises(ConfigError, match="months and years"):
        parse_period(bad)


@pytest.mark.parametrize("bad", [0, "0", "0s", "0h0m", "", " 1s", "1s ", "+1", "1e3", "\u0661", True, None, 1.0])
def test_not_a_period(bad):
    with pytest.raises(ConfigError):
        parse_period(bad)
