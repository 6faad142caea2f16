"""Parsing ``job_worker.limits``: what each ``limit_by`` key permits.

    >>> parse_limits({"api": {"concurrency": 5, "rate": {"limit": 2000, "per": "1h"}}})["api"].rates
    (RateEntry(limit=2000, per_s=3600, burst=1),)

An entry declares ``concurrency`` (an int >= 1), ``rate`` (one entry or a list of
``{limit, per, burst?}``), or both. Parsing applies the rules of docs/limits.md ("Configuring a key") and
``tests/vectors/rate_entries.json`` exactly:

- ``per`` goes through :func:`ductwork.durations.parse_period` (whole seconds >= 1;
  months, years, zero, sub-second and garbage raise :class:`InvalidPeriodError`);
- ``burst`` defaults to one second's worth, ``max(1, limit // per_s)``:
  ``2000 per 1h`` gets burst 1, ``1000 per 7s`` gets burst 142;
- two entries with the same period raise :class:`DuplicatePeriodError`, before any
  entry is dropped;
- dominated entries are dropped silently (:func:`drop_dominated`);
- an entry with neither ``concurrency`` nor ``rate`` raises :class:`EmptyLimitError`:
  an empty entry is never silently unlimited [INV-LIM-7].

Values are bounded so the bucket arithmetic of :mod:`ductwork.limits.buckets` fits the
engine's BIGINT columns: ``burst × per_s × 10⁶ + limit <= 2⁶³ − 1`` (the capacity in
units, plus the most one refill step can overshoot it before the cap) and ``per`` is at
most 100 years (so a next-token time stays a representable timestamp).

Also home of the small value checks that :mod:`ductwork.config` shares
(:func:`check_mapping`, :func:`check_int`, :func:`child_path`), and one that definitions
and contexts share (:func:`has_whitespace_around`); they are an internal seam, not API.
Pure: no I/O, no logging; every error is a :class:`ConfigError` whose ``path`` names the
offending key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ductwork.durations import parse_period
from ductwork.errors import (
    ConfigError,
    DuplicatePeriodError,
    EmptyLimitError,
    FamilyKeyError,
    InvalidPeriodError,
    MissingFamilyError,
    MissingLimitError,
)

#: Largest value of a signed 64-bit integer (BIGINT on every supported database).
INT64_MAX = 2**63 - 1
#: Longest accepted rate period: 100 years of 365.25 days, in seconds.
MAX_PERIOD_S = 3_155_760_000
#: Microseconds per second; one token of a period of P seconds is ``P × US_PER_S`` units.
US_PER_S = 1_000_000

_ENTRY_KEYS = ("concurrency", "rate")
#: why a key with whitespace around it is refused (:func:`has_whitespace_around`)
_PAD_SPACE = "MySQL-family ignores trailing spaces when it compares keys"
_RATE_KEYS = ("limit", "per", "burst")


# --------------------------------------------------------------------------- shared checks


def has_whitespace_around(text: str) -> bool:
    """Whether ``text`` begins or ends with whitespace (``str.strip``'s: spaces, tabs, line
    breaks, U+00A0…). MySQL-family compares strings with trailing spaces ignored (PAD SPACE
    collations, ``utf8mb4_bin`` included), so ``"api "`` would be ``"api"`` there and another
    key on PostgreSQL and SQLite: names and keys the engine stores and compares (limit keys
    and families, class references and node names, trigger keys, context keys) are refused
    with it where they are declared or written, on every database. (``trigger.check_key``
    says the same, ``key != key.strip()``, itself: trigger.py is a guard module, its mutants
    counted in docs/verification.md.)"""
    return text != text.strip()


def child_path(path: str, key: object) -> str:
    """The path of ``key`` under ``path``: ``a.b`` for a non-blank str without whitespace
    around it, ``a[1]`` or ``a['b ']`` otherwise.

    An empty ``path`` is the root of an environment's section: ``child_path("", "role")``
    is ``role``.
    """
    if isinstance(key, str) and key and not has_whitespace_around(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def check_mapping(path: str, value: object, allowed: Iterable[str] | None = None) -> Mapping[str, object]:
    """Return ``value`` if it is a mapping whose keys are all in ``allowed``.

    ``None`` (a YAML key with nothing under it) reads as an empty mapping. An unknown
    key raises ``ConfigError`` at that key's path listing the valid keys, so a typo
    fails the boot: ``job_worker.cuont=5: unknown key; valid keys: count, …``.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, value, f"expected a mapping, got {type(value).__name__}")
    if allowed is not None:
        valid = tuple(allowed)
        for key in value:
            if key not in valid:
                reason = f"unknown key; valid keys: {', '.join(valid)}"
                raise ConfigError(child_path(path, key), value[key], reason)
    return value


def check_int(path: str, value: object, *, minimum: int, maximum: int = INT64_MAX) -> int:
    """Return ``value`` if it is an ``int`` (never a ``bool``) in ``[minimum, maximum]``.

    ``0`` is a value, not "unset": ``check_int("job_worker.max_retry", 0, minimum=0)``
    returns 0. Strings, floats, ``None`` and ``True`` raise ``ConfigError``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            path, value, f"expected an integer >= {minimum}, got {type(value).__name__}"
        )
    if value < minimum:
        raise ConfigError(path, value, f"must be at least {minimum}")
    if value > maximum:
        raise ConfigError(path, value, f"must be at most {maximum}")
    return value


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class RateEntry:
    """One token bucket: ``limit`` tokens per ``per_s`` seconds, holding at most ``burst``.

    ``RateEntry(limit=5, per_s=10, burst=1)``: a token every 2 s, at most 1 banked, so
    any 10 s window sees at most 1 + 5 claims [INV-LIM-2]. Amounts are in *units* of
    ``1 / (per_s × 10⁶)`` token, so refilling ``dt`` µs adds exactly ``dt × limit``
    units: here a token is 10,000,000 units and 1 µs adds 5 of them.
    """

    #: tokens per period, >= 1
    limit: int
    #: the period in whole seconds, >= 1
    per_s: int
    #: the most tokens the bucket holds, >= 1
    burst: int

    @property
    def units_per_token(self) -> int:
        """One token in units: ``per_s × 10⁶`` (10,000,000 for a 10 s period)."""
        return self.per_s * US_PER_S

    @property
    def capacity_units(self) -> int:
        """The cap on the level: ``burst × per_s × 10⁶`` units (burst 3 per 1 s: 3,000,000)."""
        return self.burst * self.per_s * US_PER_S


@dataclass(frozen=True)
class LimitEntry:
    """What one ``limit_by`` key permits, as the claim path needs it.

    ``concurrency`` is None when unlimited in-flight; ``rates`` are the kept rate entries
    (dominated ones dropped), in config order, possibly empty. At least one of the two
    is set: parsing rejects an empty entry.
    """

    key: str
    concurrency: int | None
    rates: tuple[RateEntry, ...]


def drop_dominated(entries: Iterable[RateEntry]) -> tuple[RateEntry, ...]:
    """The entries no other entry makes redundant, in their original order.

    A dominates B when ``A.limit/A.per_s <= B.limit/B.per_s`` (compared exactly, as
    ``A.limit × B.per_s <= B.limit × A.per_s``) and ``A.burst <= B.burst``. From an
    empty start A's bucket then never holds more tokens than B's, so B never refuses
    a claim that A admits and dropping B changes no decision [INV-LIM-7]. ``1 per 1s``
    (3,600/h, burst 1) beside ``5000 per 1h`` (burst 1) keeps only the per-second
    entry. When two are equal on both, the shorter period is kept (``1 per 1s`` over
    ``60 per 1m``), then the earlier one.
    """
    items = tuple(entries)

    def dominates(a: RateEntry, b: RateEntry) -> bool:
        return a.limit * b.per_s <= b.limit * a.per_s and a.burst <= b.burst

    def preferred(i: int, j: int) -> bool:
        """Of two entries equal on both rate and burst, is ``i`` the one kept?"""
        return (items[i].per_s, i) < (items[j].per_s, j)

    def dropped(j: int) -> bool:
        return any(
            dominates(items[i], items[j])
            and (not dominates(items[j], items[i]) or preferred(i, j))
            for i in range(len(items))
            if i != j
        )

    return tuple(entry for j, entry in enumerate(items) if not dropped(j))


def _parse_rate(raw: object, path: str) -> tuple[RateEntry, object]:
    """One rate entry with its default burst and range checks, plus the raw ``per``."""
    raw = check_mapping(path, raw, _RATE_KEYS)
    for required in ("limit", "per"):
        if required not in raw:
            raise ConfigError(
                child_path(path, required), None, "required: every rate entry needs limit and per"
            )
    limit = check_int(f"{path}.limit", raw["limit"], minimum=1)
    try:
        per_s = parse_period(raw["per"])
    except ValueError as exc:  # DurationError, or int() refusing a huge digit string
        reason = getattr(exc, "reason", str(exc))
        raise InvalidPeriodError(f"{path}.per", raw["per"], reason) from exc
    if per_s > MAX_PERIOD_S:
        raise InvalidPeriodError(f"{path}.per", raw["per"], "must be at most 100 years")
    if "burst" in raw:
        burst_path, burst = f"{path}.burst", check_int(f"{path}.burst", raw["burst"], minimum=1)
    else:
        burst_path, burst = f"{path}.limit", max(1, limit // per_s)
    entry = RateEntry(limit=limit, per_s=per_s, burst=burst)
    capacity = entry.capacity_units
    for bad, where, value, what in (
        (capacity > INT64_MAX, burst_path, raw.get("burst", limit), "burst × per × 10⁶"),
        (capacity + limit > INT64_MAX, f"{path}.limit", limit, "burst × per × 10⁶ + limit"),
    ):
        if bad:
            raise ConfigError(
                where, value, f"{what} does not fit the 64-bit integer the bucket is stored in"
            )
    return entry, raw["per"]


def parse_limit_entry(key: object, raw: object, path: str) -> LimitEntry:
    """Parse one key's entry; ``path`` is the entry's own (``job_worker.limits.vendor_api``).

    ``{"concurrency": 5, "rate": [{"limit": 1, "per": "1s"}, {"limit": 5000, "per": "1h"}]}``
    gives ``LimitEntry("vendor_api", 5, (RateEntry(1, 1, 1),))``: 5,000/h is looser
    than 1/s (3,600/h) with the same burst, so it is dropped. Raises ``EmptyLimitError``
    for ``{}``, ``None`` or ``{"rate": []}``, ``DuplicatePeriodError`` for two entries
    with one period, ``InvalidPeriodError`` for a bad ``per``, ``ConfigError`` otherwise.
    """
    if not isinstance(key, str) or not key.strip():
        raise ConfigError(
            path, key, "limit keys must be non-blank strings (quote keys YAML reads as "
            "numbers, booleans or null)"
        )
    if has_whitespace_around(key):
        raise ConfigError(path, key, f"a limit key may not have whitespace around it ({_PAD_SPACE})")
    if len(key) > MAX_KEY_CHARS:  # no step's key could match it: the key columns hold 255
        raise ConfigError(path, key, f"a limit key has at most {MAX_KEY_CHARS} characters, this one {len(key)}")
    body = check_mapping(path, raw, _ENTRY_KEYS)
    concurrency = None
    if "concurrency" in body:
        concurrency = check_int(f"{path}.concurrency", body["concurrency"], minimum=1)
    rates: list[RateEntry] = []
    if "rate" in body:
        rate_raw = body["rate"]
        if isinstance(rate_raw, Mapping):
            rates.append(_parse_rate(rate_raw, f"{path}.rate")[0])
        elif isinstance(rate_raw, list):
            if not rate_raw:
                raise EmptyLimitError(
                    f"{path}.rate", rate_raw, "an empty rate list limits nothing; list entries "
                    "or remove the key"
                )
            first_index: dict[int, int] = {}
            for index, item in enumerate(rate_raw):
                entry, per = _parse_rate(item, f"{path}.rate[{index}]")
                if entry.per_s in first_index:
                    raise DuplicatePeriodError(
                        f"{path}.rate[{index}].per",
                        per,
                        f"same period ({entry.per_s} s) as rate[{first_index[entry.per_s]}]; "
                        "keep one entry per period",
                    )
                first_index[entry.per_s] = index
                rates.append(entry)
        else:
            raise ConfigError(
                f"{path}.rate",
                rate_raw,
                f"expected a rate entry ({{limit: 100, per: 1m}}, optionally with burst) or a list of "
                f"them, got {type(rate_raw).__name__}",
            )
    if concurrency is None and not rates:
        raise EmptyLimitError(
            path, raw, "declares neither concurrency nor rate; an empty entry is never unlimited"
        )
    return LimitEntry(key=key, concurrency=concurrency, rates=drop_dominated(rates))


def parse_limits(raw: object, path: str = "job_worker.limits") -> dict[str, LimitEntry]:
    """Parse ``job_worker.limits`` into ``{key: LimitEntry}``, in config order: its static
    keys (:func:`parse_limit_config` parses the families too).

    ``None`` (the key present with nothing under it) means no limits. The first bad
    entry raises; see :func:`parse_limit_entry`.
    """
    return parse_limit_config(raw, path)[0]


@dataclass(frozen=True)
class FamilyEntry:
    """A key family's entry (docs/semantics.md §5.1): ``per_partition`` applies to every
    partition ``family[<value>]`` as a static key's entry would; ``concurrency`` (None: no
    ceiling) bounds the family's in-flight executions over all its partitions together
    [INV-LIM-8]."""

    family: str
    per_partition: LimitEntry
    concurrency: int | None


_FAMILY_KEYS = ("per_partition", "concurrency", "rate")


def parse_limit_config(raw: object, path: str = "job_worker.limits"
                       ) -> tuple[dict[str, LimitEntry], dict[str, FamilyEntry]]:
    """Parse ``job_worker.limits`` into its static keys' entries and its families', each in
    config order. An entry with ``per_partition`` is a family's:
    ``{"per_partition": {"concurrency": 2}, "concurrency": 50}`` gives
    ``FamilyEntry("vendor_api", LimitEntry("vendor_api", 2, ()), 50)``. A family's name is
    a non-blank string without ``[`` or whitespace around it, as a static key is (see
    :func:`has_whitespace_around`); a rate over a whole family is refused (semantics
    §5.1 says why), and so is a static key that is a partition of a family declared here
    (``family[…]``): every key a pipeline writes is then either static or a partition."""
    body = check_mapping(path, raw)
    limits: dict[str, LimitEntry] = {}
    families: dict[str, FamilyEntry] = {}
    for key, entry in body.items():
        where = child_path(path, key)
        if isinstance(entry, Mapping) and "per_partition" in entry:
            families[key] = _parse_family(key, entry, where)
        else:
            limits[key] = parse_limit_entry(key, entry, where)
    for key in limits:
        if (family := family_of_key(key, families)) is not None:
            raise ConfigError(child_path(path, key), key, f"a static key may not be a partition of family "
                              f"{family!r} ({family}[…]); rename it")
    return limits, families


def _parse_family(family: object, raw: Mapping[str, object], path: str) -> FamilyEntry:
    if not isinstance(family, str) or not family.strip() or "[" in family:
        raise ConfigError(path, family, "a key family must be a non-blank string without '['")
    if has_whitespace_around(family):
        raise ConfigError(path, family, f"a key family may not have whitespace around it ({_PAD_SPACE})")
    if len(family) > MAX_FAMILY_CHARS:
        raise ConfigError(path, family, f"a key family has at most {MAX_FAMILY_CHARS} characters (its "
                                        f"shortest partition key, family[0], fits {MAX_KEY_CHARS}), this one "
                                        f"{len(family)}")
    body = check_mapping(path, raw, _FAMILY_KEYS)
    if "rate" in body:
        raise ConfigError(f"{path}.rate", body["rate"], "a rate over a whole family is not supported: put it "
                          "under per_partition (each partition's own), or use a static key")
    concurrency = None
    if "concurrency" in body:
        concurrency = check_int(f"{path}.concurrency", body["concurrency"], minimum=1)
    return FamilyEntry(family, parse_limit_entry(family, body["per_partition"], f"{path}.per_partition"),
                       concurrency)


def family_of_key(key: str, families: Mapping[str, object]) -> str | None:
    """The family ``key`` is a partition of (it begins with the family's name and ``[``),
    among ``families``; None: a static key (or a family's own name)."""
    family, bracket, _ = key.partition("[")
    return family if bracket and family in families else None


def validate_references(
    limits: Mapping[str, LimitEntry], references: Mapping[str, Iterable[str]], *,
    families: Mapping[str, FamilyEntry] | None = None, family_references: Mapping[str, Iterable[str]] | None = None,
) -> list[str]:
    """Boot validation of keys and key families against the pipelines that use them [INV-LIM-7].

    ``references`` maps each static ``limit_by`` key to the names of the loaded pipelines
    that use it, ``family_references`` each key family they partition by
    (``limit_by=(family, field)``). In sorted order, the first static key that names a
    configured family or is one of its partitions raises ``FamilyKeyError``; the first
    referenced key with no entry ``MissingLimitError`` naming the key and those
    pipelines; the first family with no family entry ``MissingFamilyError``. Configured
    keys and families nobody references only warn: the returned strings, sorted by key,
    are for the caller to log (retiring a key takes two deploys, so this must not fail
    the boot). A key whose pipeline set is empty counts as unreferenced.
    """
    families = families or {}
    used, partitioned = _used(references), _used(family_references or {})
    for key in sorted(used):
        if (family := key if key in families else family_of_key(key, families)) is not None:
            raise FamilyKeyError(key, family, used[key])
        if key not in limits:
            raise MissingLimitError(key, used[key])
    for family in sorted(set(partitioned) - set(families)):
        raise MissingFamilyError(family, partitioned[family], static=family in limits)
    return [text for _, text in sorted(
        [(key, f"job_worker.limits.{key}: configured but no loaded pipeline uses limit_by={key!r}; "
               "remove the entry once keyed work has drained") for key in limits if key not in used]
        + [(family, f"job_worker.limits.{family}: a key family configured but no loaded pipeline uses "
                    f"limit_by=({family!r}, …); remove the entry once keyed work has drained")
           for family in families if family not in partitioned])]


def _used(references: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The references that name at least one pipeline, as sets."""
    return {key: set(pipelines) for key, pipelines in references.items() if pipelines}


def entry_digest(entry: LimitEntry | None) -> str:
    """A short fingerprint of the values a key is enforced with (after dropping dominated
    entries), stored on the key's header row so a changed config is noticed.

    ``None`` (no entry: the key claims unlimited) has its own digest.
    """
    import hashlib

    if entry is None:
        text = "unconfigured"
    else:
        text = repr((entry.concurrency, [(r.limit, r.per_s, r.burst) for r in entry.rates]))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- partitioned keys

#: the longest key the schema stores (``limit_key``: VARCHAR(255), counted in characters)
MAX_KEY_CHARS = 255
#: the longest family name: its shortest partition key, ``family[0]``, fits :data:`MAX_KEY_CHARS`
MAX_FAMILY_CHARS = MAX_KEY_CHARS - len("[0]")


def partition_key(family: str, value: object) -> str:
    """The key of ``value``'s partition of ``family``: ``family[<canonical JSON>]``
    (docs/semantics.md §5.1), as ``model/limits.py``'s ``partition_key`` renders it.

    ``partition_key("vendor_api", "acct-42") == 'vendor_api["acct-42"]'`` and
    ``partition_key("vendor_api", 42) == "vendor_api[42]"``. The JSON is compact and
    escapes quotes, backslashes and control characters, so two values are two keys and a
    value never ends its key early. Raises ``ValueError`` with the reason for a value
    that is not a str or an int (a bool included), a str with a lone surrogate (no UTF-8
    form), or a key longer than :data:`MAX_KEY_CHARS`; ``family`` is taken as valid (the
    definition checked it).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("a partition value must be a str or an int")
    try:
        rendered = f"{family}[{json.dumps(value, ensure_ascii=False, separators=(',', ':'))}]"
        rendered.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a partition value must be valid Unicode (no lone surrogate)") from None
    except ValueError:  # an int of more digits than str() converts: far too long anyway
        raise ValueError(f"the rendered key is longer than {MAX_KEY_CHARS} characters") from None
    if len(rendered) > MAX_KEY_CHARS:
        raise ValueError(f"the rendered key has {len(rendered)} characters, more than {MAX_KEY_CHARS}")
    return rendered
