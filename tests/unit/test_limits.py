"""Parsing ``job_worker.limits``: every case of ``vectors/rate_entries.json`` and the
pure rows of the seed's boot-validation table.

Checks: INV-LIM-7 (boot validation: missing entry, empty entry, duplicate periods,
bad period, unreferenced entry warns; dominated entries dropped).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.errors import (
    ConfigError,
    DuplicatePeriodError,
    EmptyLimitError,
    InvalidPeriodError,
    MissingLimitError,
)
from ductwork.limit_entries import (
    INT64_MAX,
    LimitEntry,
    RateEntry,
    drop_dominated,
    parse_limit_entry,
    parse_limits,
    validate_references,
)

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
RATE_ENTRIES = json.loads((VECTORS / "rate_entries.json").read_text())
PERIODS = json.loads((VECTORS / "periods.json").read_text())
BAD_PERIODS = [case["per"] for case in PERIODS if case.get("error")]
PATH = "job_worker.limits.vendor_api"


def parse(raw):
    return parse_limit_entry("vendor_api", raw, PATH)


@pytest.mark.parametrize("case", RATE_ENTRIES, ids=lambda c: json.dumps(c["rate"]))
def test_rate_entry_vectors(case):
    if case.get("error"):
        with pytest.raises(ConfigError) as info:
            parse({"rate": case["rate"]})
        assert info.value.path.startswith(f"{PATH}.rate[")
    else:
        assert parse({"rate": case["rate"]}).rates == tuple(RateEntry(**k) for k in case["kept"])


def test_single_mapping_rate_and_default_burst():
    entry = parse({"concurrency": 5, "rate": {"limit": 2000, "per": "1h"}})
    assert entry == LimitEntry("vendor_api", 5, (RateEntry(2000, 3600, 1),))
    assert entry.rates[0].units_per_token == 3_600_000_000
    assert entry.rates[0].capacity_units == 3_600_000_000


def test_seed_example_entries():
    limits = parse_limits({
        "vendor_api": {"concurrency": 5, "rate": [{"limit": 1, "per": "1s"},
                                                  {"limit": 2000, "per": "1h", "burst": 50}]},
        "report_export": {"concurrency": 2},
        "bulk_import": {"rate": {"limit": 100, "per": "1m"}},
    })
    assert list(limits) == ["vendor_api", "report_export", "bulk_import"]
    assert limits["vendor_api"].rates == (RateEntry(1, 1, 1), RateEntry(2000, 3600, 50))
    assert limits["report_export"] == LimitEntry("report_export", 2, ())
    assert limits["bulk_import"].rates == (RateEntry(100, 60, 1),)


# ---------------------------------------------------------------- boot-validation table


def test_missing_entry_names_key_and_pipelines():
    limits = parse_limits({"report_export": {"concurrency": 2}})
    refs = {"vendor_api": {"b:Refresh", "a:SyncOrders"}, "report_export": {"a:Export"}}
    with pytest.raises(MissingLimitError) as info:
        validate_references(limits, refs)
    message = str(info.value)
    assert "vendor_api" in message
    assert "a:SyncOrders, b:Refresh" in message
    assert info.value.path == "job_worker.limits.vendor_api"
    assert info.value.pipelines == ["a:SyncOrders", "b:Refresh"]


def test_first_missing_key_in_sorted_order():
    with pytest.raises(MissingLimitError) as info:
        validate_references({}, {"zeta": {"p:Z"}, "alpha": {"p:A"}})
    assert info.value.key == "alpha"


@pytest.mark.parametrize("raw", [{}, None, {"rate": []}])
def test_empty_entry_raises(raw):
    with pytest.raises(EmptyLimitError) as info:
        parse(raw)
    assert info.value.path.startswith(PATH)


def test_duplicate_periods_raise_even_when_written_differently():
    with pytest.raises(DuplicatePeriodError) as info:
        parse({"rate": [{"limit": 1, "per": 60}, {"limit": 100, "per": "1m", "burst": 9}]})
    assert info.value.path == f"{PATH}.rate[1].per"
    assert "rate[0]" in str(info.value)


@pytest.mark.parametrize("per", BAD_PERIODS, ids=repr)
def test_bad_period_raises(per):
    with pytest.raises(InvalidPeriodError) as info:
        parse({"rate": [{"limit": 1, "per": "1s"}, {"limit": 1, "per": per}]})
    assert info.value.path == f"{PATH}.rate[1].per"


def test_months_message_names_the_path():
    with pytest.raises(InvalidPeriodError, match=r"vendor_api\.rate\.per='1mo': months"):
        parse({"rate": {"limit": 1, "per": "1mo"}})


def test_unreferenced_entry_only_warns():
    limits = parse_limits({"old_api": {"concurrency": 1}, "vendor_api": {"concurrency": 5}})
    warnings = validate_references(limits, {"vendor_api": {"a:SyncOrders"}, "gone": set()})
    assert len(warnings) == 1
    assert "job_worker.limits.old_api" in warnings[0]
    assert validate_references(limits, {"old_api": {"p:X"}, "vendor_api": {"p:Y"}}) == []


# ---------------------------------------------------------------- shapes and values


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"concurrency": 5, "rates": []}, f"{PATH}.rates"),
        ({"rate": {"limit": 1, "per": 1, "brust": 3}}, f"{PATH}.rate.brust"),
        ({"rate": {"per": 1}}, f"{PATH}.rate.limit"),
        ({"rate": [{"limit": 1}]}, f"{PATH}.rate[0].per"),
        ({"concurrency": 0}, f"{PATH}.concurrency"),
        ({"concurrency": True}, f"{PATH}.concurrency"),
        ({"concurrency": "5"}, f"{PATH}.concurrency"),
        ({"concurrency": 2.0}, f"{PATH}.concurrency"),
        ({"concurrency": None}, f"{PATH}.concurrency"),
        ({"rate": {"limit": True, "per": 1}}, f"{PATH}.rate.limit"),
        ({"rate": {"limit": 1, "per": 1, "burst": False}}, f"{PATH}.rate.burst"),
        ({"rate": "10/s"}, f"{PATH}.rate"),
        ({"rate": None}, f"{PATH}.rate"),
        ({"rate": [5]}, f"{PATH}.rate[0]"),
        ([1], PATH),
        ({"rate": {"limit": 1, "per": "9" * 5000}}, f"{PATH}.rate.per"),
        ({"rate": {"limit": 1, "per": 200 * 366 * 86400}}, f"{PATH}.rate.per"),
        ({"rate": {"limit": 1, "per": 1, "burst": 2**62}}, f"{PATH}.rate.burst"),
        ({"rate": {"limit": 2**62, "per": 1}}, f"{PATH}.rate.limit"),
        ({"rate": {"limit": INT64_MAX, "per": 1, "burst": 1}}, f"{PATH}.rate.limit"),
    ],
)
def test_bad_values_name_the_path(raw, path):
    with pytest.raises(ConfigError) as info:
        parse(raw)
    assert info.value.path == path


@pytest.mark.parametrize("key", ["", "   ", None, 123, True])
def test_keys_must_be_non_blank_strings(key):
    with pytest.raises(ConfigError) as info:
        parse_limits({key: {"concurrency": 1}})
    assert info.value.path.startswith("job_worker.limits[")


def test_limits_must_be_a_mapping_and_null_means_none():
    assert parse_limits(None) == {}
    with pytest.raises(ConfigError) as info:
        parse_limits(["vendor_api"])
    assert info.value.path == "job_worker.limits"


def test_largest_accepted_values_fit_64_bits():
    per_s = 3600
    burst = (INT64_MAX - 10) // (per_s * 10**6)
    entry = parse({"rate": {"limit": 10, "per": per_s, "burst": burst}}).rates[0]
    assert entry.capacity_units + entry.limit <= INT64_MAX


# ---------------------------------------------------------------- dominance


def test_equal_rate_and_burst_keeps_shorter_period():
    assert drop_dominated([RateEntry(60, 60, 1), RateEntry(1, 1, 1)]) == (RateEntry(1, 1, 1),)


def test_neither_dominates_keeps_both_in_order():
    pair = (RateEntry(2000, 3600, 50), RateEntry(1, 1, 1))
    assert drop_dominated(pair) == pair


rate_entries = st.builds(
    RateEntry, limit=st.integers(1, 50), per_s=st.integers(1, 100), burst=st.integers(1, 10)
)


def _dominates(a: RateEntry, b: RateEntry) -> bool:
    return a.limit * b.per_s <= b.limit * a.per_s and a.burst <= b.burst


@given(st.lists(rate_entries, max_size=8, unique_by=lambda e: e.per_s))
def test_drop_dominated_properties(entries):
    kept = drop_dominated(entries)
    assert list(kept) == [e for e in entries if e in kept]  # a subsequence, order kept
    assert bool(kept) == bool(entries)
    assert drop_dominated(kept) == kept
    for b in entries:
        if b not in kept:  # every dropped entry is dominated by a kept one
            assert any(_dominates(a, b) for a in kept)
    for a in kept:
        for b in kept:
            if a is not b:
                assert not _dominates(a, b)
