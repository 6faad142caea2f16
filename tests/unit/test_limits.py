"""Parsing ``job_worker.limits``: every case of ``vectors/rate_entries.json`` and the
pure rows of the seed's boot-validation table.

Checks: INV-LIM-7 (boot validation: missing entry, empty entry, duplicate periods,
bad period, unreferenced entry warns; dominated entries dropped).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.errors import (
    ConfigError,
    DuplicatePeriodError,
    EmptyLimitError,
    FamilyKeyError,
    InvalidPeriodError,
    MissingFamilyError,
    MissingLimitError,
)
from ductwork.limit_entries import (
    INT64_MAX,
    MAX_PERIOD_S,
    FamilyEntry,
    LimitEntry,
    RateEntry,
    check_int,
    child_path,
    drop_dominated,
    entry_digest,
    parse_limit_config,
    parse_limit_entry,
    parse_limits,
    partition_key,
    validate_references,
)
from tests.conftest import spelled

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


# ---------------------------------------------------------------- key families at boot

#: docs/limits.md's worked example: each account 2 at once and 10/s, the platform 50
FAMILY_CONFIG = {"vendor_api": {"per_partition": {"concurrency": 2, "rate": {"limit": 10, "per": "1s"}},
                                "concurrency": 50},
                 "report_export": {"concurrency": 2}}


def check_families(static, partitioned, config=FAMILY_CONFIG):
    limits, families = parse_limit_config(config)
    return validate_references(limits, static, families=families, family_references=partitioned)


def test_a_family_partitioned_by_a_pipeline_with_its_entry_passes():
    assert check_families({"report_export": {"a:Export"}}, {"vendor_api": {"a:Sync"}}) == []


def test_a_family_without_a_family_entry_names_it_and_its_pipelines():
    with pytest.raises(MissingFamilyError) as info:
        check_families({}, {"zeta": {"b:Two", "a:One"}, "vendor_api": {"a:Sync"}, "alpha": {"c:C"}})
    assert isinstance(info.value, MissingLimitError)
    assert (info.value.key, info.value.path, info.value.pipelines) == ("alpha", "job_worker.limits.alpha", ["c:C"])
    assert str(info.value) == ("job_worker.limits.alpha: the entry of key family 'alpha' is missing, referenced by "
                               "limit_by=('alpha', …) in c:C")
    with pytest.raises(MissingFamilyError) as info:
        check_families({}, {"report_export": {"a:Sync"}})
    assert str(info.value) == ("job_worker.limits.report_export: the entry of key family 'report_export' is a "
                               "static key's; a family's entry has per_partition, referenced by "
                               "limit_by=('report_export', …) in a:Sync")


@pytest.mark.parametrize(("key", "what"), [
    ("vendor_api", "names key family"),
    ('vendor_api["acct-1"]', "is a partition of key family"),
    ("vendor_api[42]", "is a partition of key family"),
])
def test_a_static_key_naming_a_family_or_its_partition_is_refused(key, what):
    with pytest.raises(FamilyKeyError) as info:
        check_families({key: {"b:P", "a:Q"}}, {"vendor_api": {"a:Sync"}})
    assert (info.value.path, info.value.value) == ("job_worker.limits.vendor_api", key)
    assert str(info.value) == (
        f"job_worker.limits.vendor_api={key!r}: limit_by={key!r} in a:Q, b:P {what} 'vendor_api'; partition by "
        "limit_by=('vendor_api', field) or use another key")


def test_a_configured_family_nobody_partitions_by_only_warns_in_key_order():
    assert check_families({"report_export": {"a:Export"}}, {"gone": set()}, {**FAMILY_CONFIG, "a_old": {
        "concurrency": 1}}) == [
        "job_worker.limits.a_old: configured but no loaded pipeline uses limit_by='a_old'; remove the entry "
        "once keyed work has drained",
        "job_worker.limits.vendor_api: a key family configured but no loaded pipeline uses "
        "limit_by=('vendor_api', …); remove the entry once keyed work has drained"]


def test_a_family_entry_parses_to_its_partitions_entry_and_its_ceiling():
    """docs/limits.md's worked example, beside a family with no ceiling of its own and a
    static key: each kept in config order, the partitions' entry parsed as a static key's
    (default burst: one second's worth), a family ceiling of 1 accepted."""
    assert parse_limit_config({
        "vendor_api": {"per_partition": {"concurrency": 2, "rate": {"limit": 10, "per": "1s"}}, "concurrency": 1},
        "report_export": {"concurrency": 2},
        "mail": {"per_partition": {"rate": {"limit": 5, "per": "1m"}}},
    }) == ({"report_export": LimitEntry("report_export", 2, ())},
           {"vendor_api": FamilyEntry("vendor_api", LimitEntry("vendor_api", 2, (RateEntry(10, 1, 10),)), 1),
            "mail": FamilyEntry("mail", LimitEntry("mail", None, (RateEntry(5, 60, 1),)), None)})


ONE = {"concurrency": 1}
FAMILY_V = {"per_partition": ONE}
#: why a key or family with whitespace around it is refused
PAD = "MySQL-family ignores trailing spaces when it compares keys"


@pytest.mark.parametrize(("raw", "path", "value", "reason"), [
    ({"v[": FAMILY_V}, "job_worker.limits.v[", "v[", "a key family must be a non-blank string without '['"),
    ({" ": FAMILY_V}, "job_worker.limits[' ']", " ", "a key family must be a non-blank string without '['"),
    ({7: FAMILY_V}, "job_worker.limits[7]", 7, "a key family must be a non-blank string without '['"),
    ({"v ": FAMILY_V}, "job_worker.limits['v ']", "v ", f"a key family may not have whitespace around it ({PAD})"),
    ({"\tv": FAMILY_V}, "job_worker.limits['\\tv']", "\tv", f"a key family may not have whitespace around it ({PAD})"),
    ({"v": {**FAMILY_V, "burst": 1}}, "job_worker.limits.v.burst", 1,
     "unknown key; valid keys: per_partition, concurrency, rate"),
    ({"v": {**FAMILY_V, "rate": {"limit": 1, "per": "1s"}}}, "job_worker.limits.v.rate", {"limit": 1, "per": "1s"},
     "a rate over a whole family is not supported: put it under per_partition (each partition's own), or use a "
     "static key"),
    ({"v": {**FAMILY_V, "concurrency": 0}}, "job_worker.limits.v.concurrency", 0, "must be at least 1"),
    ({"v": {"per_partition": {}}}, "job_worker.limits.v.per_partition", {},
     "declares neither concurrency nor rate; an empty entry is never unlimited"),
    ({"v": {"per_partition": {"concurrency": "2"}}}, "job_worker.limits.v.per_partition.concurrency", "2",
     "expected an integer >= 1, got str"),
    ({"v": FAMILY_V, 'v["a"]': ONE}, 'job_worker.limits.v["a"]', 'v["a"]',
     "a static key may not be a partition of family 'v' (v[…]); rename it"),
    ({"v[1]": ONE, "v": FAMILY_V}, "job_worker.limits.v[1]", "v[1]",
     "a static key may not be a partition of family 'v' (v[…]); rename it"),
    # the family is the name before the first '[': a value holding one is still v's partition
    ({"v": FAMILY_V, 'v["a[0]"]': ONE}, 'job_worker.limits.v["a[0]"]', 'v["a[0]"]',
     "a static key may not be a partition of family 'v' (v[…]); rename it"),
], ids=["bracket", "blank", "not-str", "spaced", "tabbed", "unknown-key", "family-rate", "ceiling-0", "empty-partition",
        "partition-int", "static-partition", "static-partition-first", "bracket-in-value"])
def test_family_refusals_give_path_value_and_reason(raw, path, value, reason):
    with pytest.raises(ConfigError) as info:
        parse_limit_config(raw)
    assert (info.value.path, info.value.value, info.value.reason) == (path, value, reason)


def test_parse_limits_names_the_path_it_is_given():
    """Its ``path`` argument (default ``job_worker.limits``) roots every error's path, as
    parse_limit_config's does."""
    with pytest.raises(ConfigError) as info:
        parse_limits({"k": {"concurrency": 0}}, "environments.prod.limits")
    assert info.value.path == "environments.prod.limits.k.concurrency"


def test_boot_references_split_static_keys_from_families():
    from ductwork import Pipeline
    from ductwork.fleet.boot import limit_references
    from tests.workloads import Echo

    class Mixed(Pipeline):
        @classmethod
        def define(cls, p):
            p.start(Echo, limit_by="report_export").chain(to=Echo, limit_by=("vendor_api", "value.account"))

    name = Mixed.definition.pipeline
    assert limit_references([Mixed]) == {"report_export": {name}}
    assert limit_references([Mixed], families=True) == {"vendor_api": {name}}


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


def _int_refusal(text: str) -> str:
    try:
        int(text)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"int() accepted {len(text)} digits")


def test_the_64_bit_bound_is_exact():
    """``burst × per × 10⁶ + limit`` may equal INT64_MAX, not exceed it. With ``per`` 1 s,
    INT64_MAX = 9,223,372,036,854 × 10⁶ + 775,807, so limit 775,807 is the largest that fits."""
    burst = INT64_MAX // 10**6
    entry = parse({"rate": {"limit": 775_807, "per": 1, "burst": burst}}).rates[0]
    assert entry.capacity_units + entry.limit == INT64_MAX
    with pytest.raises(ConfigError) as info:
        parse({"rate": {"limit": 775_808, "per": 1, "burst": burst}})
    assert (info.value.path, info.value.value, info.value.reason) == (
        f"{PATH}.rate.limit", 775_808,
        "burst × per × 10⁶ + limit does not fit the 64-bit integer the bucket is stored in")
    with pytest.raises(ConfigError) as info:
        parse({"rate": {"limit": 1, "per": 1, "burst": burst + 1}})
    assert (info.value.path, info.value.value, info.value.reason) == (
        f"{PATH}.rate.burst", burst + 1,
        "burst × per × 10⁶ does not fit the 64-bit integer the bucket is stored in")
    # no burst given: the default burst (limit // per) overflows, and the limit is named
    with pytest.raises(ConfigError) as info:
        parse({"rate": {"limit": 2**62, "per": 1}})
    assert (info.value.path, info.value.value) == (f"{PATH}.rate.limit", 2**62)


def test_the_longest_period_is_exactly_100_years():
    assert parse({"rate": {"limit": 1, "per": MAX_PERIOD_S}}).rates[0].per_s == MAX_PERIOD_S
    with pytest.raises(InvalidPeriodError) as info:
        parse({"rate": {"limit": 1, "per": MAX_PERIOD_S + 1}})
    assert (info.value.path, info.value.value, info.value.reason) == (
        f"{PATH}.rate.per", MAX_PERIOD_S + 1, "must be at most 100 years")


@pytest.mark.parametrize(("raw", "path", "reason"), [
    ({"rate": {"per": 1}}, f"{PATH}.rate.limit", "required: every rate entry needs limit and per"),
    ({"rate": {"limit": 1, "per": "1mo"}}, f"{PATH}.rate.per",
     "months and years are not supported (their length varies)"),
    # int() refuses a digit string this long with a plain ValueError: its text is the reason
    ({"rate": {"limit": 1, "per": "9" * 5000}}, f"{PATH}.rate.per", _int_refusal("9" * 5000)),
], ids=["required", "months", "huge"])
def test_rate_refusals_give_the_reason(raw, path, reason):
    with pytest.raises(ConfigError) as info:
        parse(raw)
    assert (info.value.path, info.value.reason) == (path, reason)


@pytest.mark.parametrize("key", ["api ", "api  ", " api", "api\t", "\napi", "api\xa0", "api\u3000"], ids=spelled)
def test_a_key_with_whitespace_around_it_is_refused_naming_it(key):
    """MySQL-family compares keys with trailing spaces ignored: ``api `` would be ``api``'s
    key there and its own elsewhere, so it is refused, at a path that shows it in brackets
    (``job_worker.limits['api ']``), as a static key and as a family's partitions' key; the
    key without it parses."""
    for raw in ({key: ONE}, {"api": ONE, key: ONE}):
        with pytest.raises(ConfigError) as info:
            parse_limits(raw)
        assert (info.value.path, info.value.value, info.value.reason) == (
            f"job_worker.limits[{key!r}]", key, f"a limit key may not have whitespace around it ({PAD})")
        with pytest.raises(ConfigError) as info:
            parse_limit_entry(key, ONE, "limits.x")
        assert (info.value.path, info.value.reason) == (
            "limits.x", f"a limit key may not have whitespace around it ({PAD})")
    assert set(parse_limits({key.strip(): ONE})) == {"api"}


@pytest.mark.parametrize(("key", "path"), [
    ("api", "a.api"), ("a b", "a.a b"), ("api ", "a['api ']"), (" api", "a[' api']"), ("api\n", "a['api\\n']"),
    ("", "a['']"), (" ", "a[' ']"), (7, "a[7]"), (None, "a[None]"),
], ids=spelled)
def test_a_childs_path_is_dotted_only_for_a_non_blank_key_without_whitespace_around_it(key, path):
    assert child_path("a", key) == path


def test_a_blank_key_is_refused_with_the_key_and_the_hint():
    with pytest.raises(ConfigError) as info:
        parse_limits({" ": {"concurrency": 1}})
    assert (info.value.value, info.value.reason) == (
        " ", "limit keys must be non-blank strings (quote keys YAML reads as numbers, booleans or null)")


@pytest.mark.parametrize("chars", [255, 256])
def test_a_key_fits_the_255_characters_of_the_key_columns_or_is_refused(chars):
    """A configured key longer than a stored key can be would match no step's key."""
    key = "k" * chars
    if chars == 255:
        assert set(parse_limits({key: {"concurrency": 1}})) == {key}
        return
    with pytest.raises(ConfigError) as info:
        parse_limits({key: {"concurrency": 1}})
    assert (info.value.path, info.value.value, info.value.reason) == (
        f"job_worker.limits.{key}", key, "a limit key has at most 255 characters, this one 256")


@pytest.mark.parametrize("chars", [252, 253])
def test_a_family_leaves_room_for_its_shortest_partition_key_or_is_refused(chars):
    family = "f" * chars
    raw = {family: {"per_partition": {"concurrency": 1}, "concurrency": 2}}
    if chars == 252:
        assert set(parse_limit_config(raw)[1]) == {family}
        return
    with pytest.raises(ConfigError) as info:
        parse_limit_config(raw)
    assert (info.value.path, info.value.value, info.value.reason) == (
        f"job_worker.limits.{family}", family,
        "a key family has at most 252 characters (its shortest partition key, family[0], fits 255), this one 253")


# ---------------------------------------------------------------- partition keys (docs/semantics.md §5.1)


@pytest.mark.parametrize(("value", "rendered"), [
    ("acct-42", 'v["acct-42"]'), (42, "v[42]"), (-1, "v[-1]"), ("", 'v[""]'), ('"]', 'v["\\"]"]'),
    ("\x00", 'v["\\u0000"]'), ("é🙂", 'v["é🙂"]'),
    ("x" * 250, 'v["' + "x" * 250 + '"]'),  # 255 characters: the longest a key column holds
], ids=["str", "int", "negative", "empty", "quote-bracket", "nul", "non-ascii", "255-chars"])
def test_a_partition_key_is_its_value_as_compact_json_kept_unicode(value, rendered):
    """The engine's rendering, the same table as model/limits.py's (test_model_limits_ops):
    quotes, backslashes and control characters escaped, other characters kept as they are."""
    assert partition_key("v", value) == rendered


@pytest.mark.parametrize(("value", "reason"), [
    (True, "a partition value must be a str or an int"),
    (None, "a partition value must be a str or an int"),
    (1.5, "a partition value must be a str or an int"),
    ([1], "a partition value must be a str or an int"),
    ("\ud800", "a partition value must be valid Unicode (no lone surrogate)"),
    ("x" * 251, "the rendered key has 256 characters, more than 255"),
    (10**300, "the rendered key has 304 characters, more than 255"),
    # more digits than int() converts to a string: json.dumps raises a plain ValueError
    (10**5000, "the rendered key is longer than 255 characters"),
], ids=["bool", "none", "float", "list", "surrogate", "256-chars", "big-int", "huge-int"])
def test_a_partition_value_that_cannot_be_rendered_or_stored_is_refused_with_the_reason(value, reason):
    with pytest.raises(ValueError, match=re.escape(reason)) as info:
        partition_key("v", value)
    assert str(info.value) == reason


def test_the_unreferenced_warning_text():
    limits = parse_limits({"old_api": {"concurrency": 1}})
    assert validate_references(limits, {}) == [
        "job_worker.limits.old_api: configured but no loaded pipeline uses limit_by='old_api'; "
        "remove the entry once keyed work has drained"]


@pytest.mark.parametrize(("raw", "path", "value", "reason"), [
    ({"concurrency": "5"}, f"{PATH}.concurrency", "5", "expected an integer >= 1, got str"),
    ({"rate": []}, f"{PATH}.rate", [], "an empty rate list limits nothing; list entries or remove the key"),
    ({"rate": [{"limit": 1, "per": 60}, {"limit": 2, "per": "1m"}]}, f"{PATH}.rate[1].per", "1m",
     "same period (60 s) as rate[0]; keep one entry per period"),
    ({"rate": "10/s"}, f"{PATH}.rate", "10/s",
     "expected a rate entry ({limit: 100, per: 1m}, optionally with burst) or a list of them, got str"),
    ({}, PATH, {}, "declares neither concurrency nor rate; an empty entry is never unlimited"),
], ids=["int", "empty-list", "duplicate", "rate-type", "empty-entry"])
def test_entry_refusals_give_path_value_and_reason(raw, path, value, reason):
    with pytest.raises(ConfigError) as info:
        parse(raw)
    assert (info.value.path, info.value.value, info.value.reason) == (path, value, reason)


def test_check_int_bounds_are_inclusive_and_named():
    assert check_int("p", 1, minimum=1, maximum=3) == 1
    assert check_int("p", 3, minimum=1, maximum=3) == 3
    for value, reason in ((0, "must be at least 1"), (4, "must be at most 3")):
        with pytest.raises(ConfigError) as info:
            check_int("p", value, minimum=1, maximum=3)
        assert (info.value.path, info.value.value, info.value.reason) == ("p", value, reason)


def test_entry_digests_are_stable():
    """Digests are stored on key header rows: a digest that changed between versions
    would make every key look reconfigured after an upgrade. Pinned values."""
    assert entry_digest(None) == "d519b457f1162fe4"
    assert entry_digest(LimitEntry("k", 5, (RateEntry(1, 1, 1), RateEntry(30, 60, 5)))) == "f61157ee4a2b8bcf"
    assert entry_digest(LimitEntry("k", None, (RateEntry(2, 10, 3),))) == "5c70efc9c6fd2f8f"


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


@pytest.mark.parametrize("more", [6, 0], ids=["deeper", "exactly as deep"])
def test_a_deep_error_keeps_its_first_frames_and_says_how_many_more(more):
    """The stored backtrace of a step's error: its first BACKTRACE_FRAMES frames, then one
    line counting the rest, if any (an error exactly BACKTRACE_FRAMES deep is stored whole,
    with no count); the log's text keeps the whole traceback."""
    from ductwork.limits.executions import BACKTRACE_FRAMES, ErrorInfo

    depth = BACKTRACE_FRAMES + more - 1  # distinct functions: a traceback folds repeats of one frame
    calls: dict = {}
    exec("def f0():\n    raise ValueError('at the bottom')\n"  # noqa: S102 - a chain of distinct frames
         + "".join(f"def f{i}():\n    f{i - 1}()\n" for i in range(1, depth)), calls)
    try:
        calls[f"f{depth - 1}"]()
    except ValueError as error:
        info = ErrorInfo.of(error)
    assert (info.klass, info.message) == ("builtins.ValueError", "at the bottom")
    assert info.backtrace is not None
    assert info.backtrace.count('File "') == BACKTRACE_FRAMES
    if more:  # the test's frame and the functions', 10 shown
        assert info.backtrace.endswith(f"... {more} more frames\n")
    else:
        assert "more frames" not in info.backtrace
        assert info.backtrace.endswith('line 2, in f0\n')  # the raising frame, the last
    assert info.text is not None
    assert info.text.count('File "') == depth + 1
