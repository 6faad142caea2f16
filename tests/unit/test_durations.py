"""Duration grammar: every case of ``vectors/periods.json`` plus the interval parser.

Checks: INV-LIM-7 (bad periods are rejected at boot).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.durations import parse_interval_us, parse_period
from ductwork.errors import DurationError

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "periods.json"
PERIODS = json.loads(VECTORS.read_text())


@pytest.mark.parametrize("case", PERIODS, ids=lambda c: repr(c["per"]))
def test_period_vectors(case):
    if case.get("error"):
        with pytest.raises(DurationError) as info:
            parse_period(case["per"])
        assert repr(case["per"]) in str(info.value)
    else:
        assert parse_period(case["per"]) == case["seconds"]


def test_months_named_in_message():
    with pytest.raises(DurationError, match="months and years"):
        parse_period("1mo")


@given(
    st.lists(st.integers(0, 500), min_size=5, max_size=5).filter(lambda xs: any(xs)),
)
def test_compound_round_trip(parts):
    """Rendering w/d/h/m/s groups and parsing them back gives the same seconds."""
    text = "".join(f"{n}{u}" for n, u in zip(parts, "wdhms", strict=True) if n)
    expected = sum(n * s for n, s in zip(parts, (604800, 86400, 3600, 60, 1), strict=True))
    assert parse_period(text) == expected
    assert parse_period(str(expected)) == expected


@pytest.mark.parametrize(
    ("value", "micros"),
    [(1, 1_000_000), (0.25, 250_000), ("1m", 60_000_000), (timedelta(milliseconds=5), 5_000),
     (1e-7, 1),
     # every field of a timedelta: days, seconds and microseconds each weigh exactly
     (timedelta(days=2, seconds=3, microseconds=4), 2 * 86_400_000_000 + 3_000_000 + 4)],
)
def test_interval(value, micros):
    assert parse_interval_us(value) == micros


@pytest.mark.parametrize("value", [0, -1, 0.0, float("nan"), float("inf"), True, None, "0s", "", [1],
                                   timedelta(0)])
def test_interval_rejects(value):
    with pytest.raises(DurationError):
        parse_interval_us(value)


_GRAMMAR = "expected whole seconds or <int><unit> groups in the order w d h m s (e.g. '90', '1m', '1h30m')"


@pytest.mark.parametrize(("parse", "value", "reason"), [
    (parse_period, 1.5, "expected whole seconds (int) or a duration string, got float"),
    (parse_period, None, "expected whole seconds (int) or a duration string, got NoneType"),
    (parse_period, True, "expected whole seconds (int) or a duration string, got bool"),
    (parse_period, 0, "must be at least one second"),
    (parse_period, "0", "must be at least one second"),
    (parse_period, "1mo", "months and years are not supported (their length varies)"),
    (parse_period, "1x", _GRAMMAR),
    (parse_period, "", _GRAMMAR),
    (parse_interval_us, True, "expected seconds, a timedelta or a duration string, got bool"),
    (parse_interval_us, [1], "expected seconds, a timedelta or a duration string, got list"),
    (parse_interval_us, float("inf"), "must be a finite number of seconds"),
    (parse_interval_us, 0, "must be positive"),
    (parse_interval_us, -1.5, "must be positive"),
    (parse_interval_us, timedelta(0), "must be positive"),
    (parse_interval_us, "1h1h", _GRAMMAR),
], ids=lambda v: v.__name__ if callable(v) else repr(v))  # a function by its name: stable across xdist workers
def test_each_refusal_names_the_value_and_its_reason(parse, value, reason):
    """The exact text of every refusal: callers show it under the config path it came
    from, so a reason lost or garbled is a user-visible bug (killed mutmut mutants)."""
    with pytest.raises(DurationError) as info:
        parse(value)
    assert info.value.value is value
    assert info.value.reason == reason
    assert str(info.value) == f"{value!r}: {reason}"
