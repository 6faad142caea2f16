"""Limits: the executable specification of docs/semantics.md §5 and docs/limits.md.

Example::

    m = LimitsModel({"vendor_api": {"concurrency": 1, "rate": {"limit": 1, "per": "1s"}}})
    m.enqueue("j1", "vendor_api", eligible_at_us=0); m.claim("w1", now_us=1_000_000)  # -> "j1"

Everything here is exact: times are integer microseconds passed in by the
caller, bucket levels are integers in *units* of ``1 / (per_s * 10**6)`` token,
so a bucket of entry ``(L, P, B)`` gains ``dt * L`` units over ``dt`` µs and
holds at most ``B * P * 10**6`` units. Worked number: ``limit 2, per 1s,
burst 2`` is one token per 500 000 µs; an idle key admits at most 2 claims at
once and then one every 0.5 s, so at most ``2 + 2·T`` claims in any T seconds
[INV-LIM-2].

Three layers, each usable on its own:

* config parsing, re-implemented independently of the engine: ``parse_period``
  / ``render_period`` (durations), ``parse_rate_entries`` (defaults, duplicate
  periods), ``drop_dominated`` and ``parse_key_limits`` [INV-LIM-7];
* pure bucket arithmetic: ``refill``, ``spend``, ``next_token_us``;
* key families (semantics §5.1, model only: issue 34): ``FamilyLimits``,
  ``partition_key`` / ``split_partition_key`` (the rendered key), ``limits_for``;
* ``LimitsModel``, the state machine of jobs, claims, keys and buckets, with an
  append-only event log (``events``) that the checkers in
  ``model/invariants.py`` read.

Nothing here imports ``ductwork`` (``tests/unit/test_model_isolation.py``).

PYTEST_DONT_REWRITE: this module's assertion messages (``[INV-…]`` and what failed)
are its output, compared exactly by its tests and quoted by ``ductwork verify``;
pytest would rewrite the asserts of the distribution its plugins come from,
which ships this module (as ``ductwork_model``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

from .errors import CommitFailed, ConfigError, PreconditionError

__all__ = [
    "MICROS",
    "UNCONFIGURED_WARNING",
    "Bucket",
    "Claimed",
    "Completed",
    "Decided",
    "Decision",
    "Enqueued",
    "FamilyLimits",
    "Forgotten",
    "KeyLimits",
    "LaneVerdict",
    "LimitJob",
    "LimitsModel",
    "Polled",
    "RateEntry",
    "Restarted",
    "cap_units",
    "drop_dominated",
    "family_of",
    "limits_for",
    "next_token_us",
    "parse_key_limits",
    "parse_limits",
    "parse_period",
    "parse_rate_entries",
    "partition_key",
    "refill",
    "render_period",
    "spend",
    "split_partition_key",
    "token_units",
]

MICROS = 1_000_000
#: Logged once per claim of a key that config no longer names (semantics §5 step 1).
UNCONFIGURED_WARNING = "Claiming a limit key with no configuration entry unlimited"

JobId = Hashable
Key = str | None
#: the longest key the schema stores (``ExactKey``: VARCHAR(255), counted in characters)
MAX_KEY_CHARS = 255
#: the refusals that refill nothing (a ceiling refuses before any bucket is read)
CEILING_REFUSALS = ("concurrency", "family_concurrency")

# --------------------------------------------------------------------------- durations

_UNITS = (("w", 604_800), ("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
_COMPOUND = re.compile(r"(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")


def parse_period(value: object, path: str = "per") -> int:
    """Seconds of a rate period: a whole number ``>= 1`` or ``<int><unit>`` groups.

    ``parse_period("1h30m") == 5400``. Units are ``w d h m s``, in that order,
    each at most once, lowercase, no spaces, signs or decimals; the total must be
    at least one second. Anything else (``0``, ``"1mo"``, ``1.5``, ``True``,
    ``None``) raises ``ConfigError`` naming ``path`` and the value; nothing is
    rounded or guessed.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(path, value, "must be whole seconds or a duration string like '1h30m'")
    if isinstance(value, int):
        seconds = value
    elif value.isascii() and value.isdigit():
        seconds = int(value)
    else:
        match = _COMPOUND.fullmatch(value)
        if not value or match is None:
            if re.search(r"[0-9](mo|y|M)", value):
                raise ConfigError(path, value, "months and years are not supported")
            raise ConfigError(path, value, "unparseable duration (use w d h m s, e.g. '1h30m')")
        seconds = sum(int(n) * unit for n, (_, unit) in zip(match.groups(), _UNITS, strict=True) if n)
    if seconds < 1:
        raise ConfigError(path, value, "a period must be at least one second")
    return seconds


def render_period(seconds: int) -> str:
    """The canonical duration string of ``seconds >= 1``: ``render_period(5400) == "1h30m"``.

    ``parse_period(render_period(n)) == n`` for every ``n >= 1``.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise ConfigError("seconds", seconds, "a period must be a whole number of seconds >= 1")
    parts = []
    for name, unit in _UNITS:
        count, seconds = divmod(seconds, unit)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts)


# --------------------------------------------------------------------------- rate entries


@dataclass(frozen=True, order=True)
class RateEntry:
    """One token bucket's parameters: ``limit`` tokens per ``per_s`` seconds, capacity ``burst``.

    ``RateEntry(2000, 3600, 50)``: 2000 per hour sustained, at most 50 at once.
    """

    limit: int
    per_s: int
    burst: int

    @property
    def rate(self) -> Fraction:
        """Tokens per second, exactly."""
        return Fraction(self.limit, self.per_s)

    def as_dict(self) -> dict[str, int]:
        """The vector form: ``{"limit", "per_s", "burst"}``."""
        return {"limit": self.limit, "per_s": self.per_s, "burst": self.burst}


def _positive_int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(path, value, "must be an integer >= 1")
    return value


def parse_rate_entries(rate: object, path: str = "rate") -> list[RateEntry]:
    """Every entry of a key's ``rate`` (one mapping or a list), defaults applied, none dropped.

    Default burst is one second's worth, ``max(1, limit // per_s)``. Raises
    ``ConfigError`` for a limit or burst below 1, a bad period, an unknown field,
    an empty list, or two entries with the same period [INV-LIM-7].
    """
    items = [rate] if isinstance(rate, Mapping) else rate
    if not isinstance(items, list) or not items:
        raise ConfigError(path, rate, "must be one {limit, per, burst} mapping or a non-empty list")
    entries: list[RateEntry] = []
    seen: dict[int, int] = {}
    for index, item in enumerate(items):
        here = f"{path}[{index}]"
        if not isinstance(item, Mapping):
            raise ConfigError(here, item, "must be a mapping with limit and per")
        unknown = set(item) - {"limit", "per", "burst"}
        if unknown:
            raise ConfigError(here, item, f"unknown fields {sorted(unknown)}")
        if "limit" not in item or "per" not in item:
            raise ConfigError(here, item, "limit and per are required")
        limit = _positive_int(item["limit"], f"{here}.limit")
        per_s = parse_period(item["per"], f"{here}.per")
        burst = max(1, limit // per_s)
        if "burst" in item:
            burst = _positive_int(item["burst"], f"{here}.burst")
        if per_s in seen:
            raise ConfigError(here, item, f"same period as {path}[{seen[per_s]}]")
        seen[per_s] = index
        entries.append(RateEntry(limit, per_s, burst))
    return entries


def _beats(a: RateEntry, b: RateEntry) -> bool:
    """``a`` makes ``b`` dead config: at least as strict on rate and burst (ties: shorter period)."""
    if a.rate > b.rate or a.burst > b.burst:
        return False
    if a.rate == b.rate and a.burst == b.burst:
        return a.per_s < b.per_s
    return True


def drop_dominated(entries: Iterable[RateEntry]) -> list[RateEntry]:
    """The entries no other entry dominates, in config order.

    A dominates B when ``A.limit/A.per <= B.limit/B.per`` and ``A.burst <=
    B.burst``; of two equal on both the shorter period is kept. Dropping them
    never changes which claims are admitted (``tests/properties/test_model_config.py``).
    """
    entries = list(entries)
    return [b for b in entries if not any(a is not b and _beats(a, b) for a in entries)]


@dataclass(frozen=True)
class KeyLimits:
    """A key's parsed configuration: ``concurrency`` (``None`` = no ceiling) and kept ``rates``.

    ``all_rates`` keeps every configured entry, dominated ones included, for the
    INV-LIM-7 property that dropping them changes nothing.
    """

    concurrency: int | None = None
    rates: tuple[RateEntry, ...] = ()
    all_rates: tuple[RateEntry, ...] = ()


def parse_key_limits(entry: object, path: str = "limits") -> KeyLimits:
    """Parse one ``job_worker.limits.<key>`` mapping. An entry with neither field raises.

    ``parse_key_limits({"concurrency": 5, "rate": {"limit": 1, "per": "1s"}})``
    → ``KeyLimits(5, (RateEntry(1, 1, 1),), ...)``. A ``KeyLimits`` passes through.
    """
    if isinstance(entry, KeyLimits):
        return entry
    if not isinstance(entry, Mapping):
        raise ConfigError(path, entry, "must be a mapping with concurrency and/or rate")
    unknown = set(entry) - {"concurrency", "rate"}
    if unknown:
        raise ConfigError(path, entry, f"unknown fields {sorted(unknown)}")
    if "concurrency" not in entry and "rate" not in entry:
        raise ConfigError(path, entry, "declares neither concurrency nor rate")
    concurrency = None
    if "concurrency" in entry:
        concurrency = _positive_int(entry["concurrency"], f"{path}.concurrency")
    all_rates: tuple[RateEntry, ...] = ()
    if "rate" in entry:
        all_rates = tuple(parse_rate_entries(entry["rate"], f"{path}.rate"))
    return KeyLimits(concurrency, tuple(drop_dominated(all_rates)), all_rates)


@dataclass(frozen=True)
class FamilyLimits:
    """A key family's parsed configuration (semantics §5, "Partitioned keys"; issue 34,
    model only): ``per_partition`` applies to each partition as a static key's entry
    would, and ``concurrency`` (``None`` = no ceiling) bounds the family's in-flight
    executions over all its partitions [INV-LIM-8]. A family-wide rate is not modelled
    (``parse_family_limits`` refuses it)."""

    per_partition: KeyLimits
    concurrency: int | None = None


def parse_family_limits(entry: Mapping[str, object], path: str) -> FamilyLimits:
    """Parse a family entry: ``{"per_partition": {concurrency?, rate?}, "concurrency"?: n}``.

    ``parse_family_limits({"per_partition": {"concurrency": 2}, "concurrency": 50}, "limits.v")``
    → ``FamilyLimits(KeyLimits(2), 50)``. A family-level ``rate`` raises: not supported.
    """
    if "rate" in entry:
        raise ConfigError(f"{path}.rate", entry["rate"], "a rate over a whole family is not supported: "
                          "give each partition its rate under per_partition")
    unknown = set(entry) - {"per_partition", "concurrency"}
    if unknown:
        raise ConfigError(path, entry, f"unknown fields {sorted(unknown)}")
    concurrency = None
    if "concurrency" in entry:
        concurrency = _positive_int(entry["concurrency"], f"{path}.concurrency")
    return FamilyLimits(parse_key_limits(entry["per_partition"], f"{path}.per_partition"), concurrency)


def parse_limits(limits: Mapping[str, object] | None) -> dict[str, KeyLimits | FamilyLimits]:
    """Parse a whole ``job_worker.limits`` mapping (key or family → entry).

    An entry with ``per_partition`` is a family (``FamilyLimits``); any other is a
    static key's (``KeyLimits``). A key is a non-blank string without whitespace around
    it (MySQL-family would compare ``"api "`` equal to ``"api"``); a family name is a
    valid family (``partition_key``: the same, and no ``[``);
    a static key may not be a rendered partition of a family the mapping declares.
    """
    parsed: dict[str, KeyLimits | FamilyLimits] = {}
    for key, entry in (limits or {}).items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError("limits", key, "a limit key must be a non-blank string")
        if key != key.strip():  # MySQL-family compares keys with trailing spaces ignored
            raise ConfigError("limits", key, "a limit key may not have whitespace around it")
        if isinstance(entry, FamilyLimits) or (isinstance(entry, Mapping) and "per_partition" in entry):
            _check_family(key, f"limits.{key}")
            parsed[key] = entry if isinstance(entry, FamilyLimits) else parse_family_limits(entry, f"limits.{key}")
        else:
            parsed[key] = parse_key_limits(entry, f"limits.{key}")
    for key in parsed:
        split = split_partition_key(key)
        if split is not None and isinstance(parsed.get(split[0]), FamilyLimits):
            raise ConfigError("limits", key, f"a static key may not be a partition of family {split[0]!r}")
    return parsed


# --------------------------------------------------------------------------- partitioned keys


def _check_family(family: object, path: str = "limit_by") -> None:
    if not isinstance(family, str) or not family.strip() or "[" in family:
        raise ConfigError(path, family, "a key family must be a non-blank string without '['")
    if family != family.strip():
        raise ConfigError(path, family, "a key family may not have whitespace around it")


def partition_key(family: str, value: object) -> str:
    """The rendered key of ``value``'s partition of ``family``: ``family[<canonical JSON>]``.

    ``partition_key("vendor_api", "acct-42") == 'vendor_api["acct-42"]'``,
    ``partition_key("vendor_api", 42) == "vendor_api[42]"``. A value is a string or an
    integer (not a bool, float, ``None`` or container); the JSON escapes quotes,
    backslashes and control characters and keeps other characters as they are, so the
    rendering is one-to-one and a value is never SQL, config or a second key. Raises
    ``ConfigError`` for a value that cannot be rendered or stored: another type, a
    string with a lone surrogate (no UTF-8 form), a rendered key over ``MAX_KEY_CHARS``.
    """
    _check_family(family)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError("limit_by", value, "a partition value must be a string or an integer")
    rendered = f"{family}[{json.dumps(value, ensure_ascii=False, separators=(',', ':'))}]"
    try:
        rendered.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("limit_by", value, "a partition value must be valid Unicode (no lone surrogate)") from None
    if len(rendered) > MAX_KEY_CHARS:
        raise ConfigError("limit_by", value, f"the rendered key has {len(rendered)} characters, more than "
                          f"{MAX_KEY_CHARS}")
    return rendered


@lru_cache(maxsize=4096)  # pure; the invariants ask it of every claim in a history
def split_partition_key(key: Key) -> tuple[str, str | int] | None:
    """``(family, value)`` of a rendered partition key, or ``None`` for any other key:
    the inverse of ``partition_key`` on its image (a string it would not render is no
    partition)."""
    if key is None or "[" not in key or not key.endswith("]"):
        return None
    family, _, rest = key.partition("[")
    try:
        value = json.loads(rest[:-1])
    except ValueError:
        return None
    try:
        return (family, value) if partition_key(family, value) == key else None
    except ConfigError:
        return None


def family_of(config: Mapping[str, object], key: Key) -> tuple[str, FamilyLimits] | None:
    """The family ``key`` is a partition of, with its entry, under ``config``; ``None`` when
    ``key`` is a static key, no rendered partition, or of a family ``config`` does not declare."""
    if key is None or key in config:
        return None
    split = split_partition_key(key)
    entry = config.get(split[0]) if split is not None else None
    return (split[0], entry) if split is not None and isinstance(entry, FamilyLimits) else None


def limits_for(config: Mapping[str, object], key: Key) -> KeyLimits | None:
    """The limits a decision on ``key`` applies: a static key's entry, or its family's
    ``per_partition``; ``None``: unconfigured (a family's own name used as a key included)."""
    if key is None:
        return None
    entry = config.get(key)
    if isinstance(entry, KeyLimits):
        return entry
    family = family_of(config, key)
    return family[1].per_partition if family is not None else None


# --------------------------------------------------------------------------- bucket arithmetic


@dataclass(frozen=True)
class Bucket:
    """One ``(key, period)`` bucket: ``units`` at ``refilled_at_us``.

    ``cap_units`` is the cap applied when it was created or last refilled; it is
    bookkeeping for INV-LIM-4 (a restart may lower the burst, and the level is
    clamped only at the next refill), never an input to a decision.
    """

    units: int
    refilled_at_us: int
    cap_units: int


def token_units(entry: RateEntry) -> int:
    """Units in one token: ``per_s * 10**6``."""
    return entry.per_s * MICROS


def cap_units(entry: RateEntry) -> int:
    """Units in a full bucket: ``burst * per_s * 10**6``."""
    return entry.burst * token_units(entry)


def refill(bucket: Bucket, entry: RateEntry, now_us: int) -> Bucket:
    """Add ``dt * limit`` units for ``dt = now - refilled_at`` (nothing if ``dt <= 0``), clamp to burst.

    The clamp applies on every refill, to the *current* burst [INV-LIM-4]; the
    refill time becomes ``max(refilled_at, now)`` (semantics §5 step 3): when time went
    back, no microsecond is credited twice once it catches up [INV-LIM-2].
    """
    gained = max(0, now_us - bucket.refilled_at_us) * entry.limit
    cap = cap_units(entry)
    return Bucket(min(bucket.units + gained, cap), max(bucket.refilled_at_us, now_us), cap)


def spend(bucket: Bucket, entry: RateEntry) -> Bucket:
    """Take one token; the caller has checked the bucket holds one."""
    assert bucket.units >= token_units(entry), "[INV-LIM-4] spend from a bucket short of a token"
    return Bucket(bucket.units - token_units(entry), bucket.refilled_at_us, bucket.cap_units)


def next_token_us(bucket: Bucket, entry: RateEntry) -> int:
    """First µs at which the bucket holds a whole token: ``t + ceil((P·10⁶ − u) / L)`` [INV-LIM-5]."""
    missing = token_units(entry) - bucket.units
    return bucket.refilled_at_us + max(0, -(-missing // entry.limit))


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Enqueued:
    """A job became pending (``created`` is its creation order)."""

    seq: int
    job_id: JobId
    key: Key
    eligible_at_us: int
    created: int


@dataclass(frozen=True)
class LaneVerdict:
    """What one poll did with one lane: its oldest eligible job and why it was (not) taken.

    ``verdict`` is ``claimed``, ``blocked`` (stamp in the future, skipped),
    ``saturated`` (in flight at concurrency, skipped), ``refused_rate`` /
    ``refused_concurrency`` (the key decision refused) or ``untried`` (a lane
    after the one claimed).
    """

    key: Key
    job_id: JobId
    eligible_at_us: int
    created: int
    verdict: str


@dataclass(frozen=True)
class Polled:
    """One ``claim`` call: every lane considered, in trial order, and the job claimed (or None).

    ``first_seq`` is the seq of the poll's first event (its first ``Decided``,
    or this event), so a checker can see the state as the poll found it.
    """

    seq: int
    first_seq: int
    worker: str
    at_us: int
    lanes: tuple[LaneVerdict, ...]
    job_id: JobId | None


@dataclass(frozen=True)
class Claimed:
    """An execution claimed: ``(job, key, worker, time)`` — the history the checkers read."""

    seq: int
    job_id: JobId
    key: Key
    worker: str
    at_us: int


@dataclass(frozen=True)
class Completed:
    """An in-flight execution completed (``outcome``: success, failure, timed_out, process_crashed)."""

    seq: int
    job_id: JobId
    key: Key
    worker: str
    at_us: int
    outcome: str


@dataclass(frozen=True)
class Restarted:
    """The fleet restarted with ``limits`` (parsed). ``rebased``: the keys whose enforced
    values changed, whose stamps were cleared and unkept buckets dropped."""

    seq: int
    at_us: int
    limits: Mapping[str, KeyLimits | FamilyLimits]
    rebased: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Forgotten:
    """An idle partition's rows removed (``LimitsModel.forget_partition``): its buckets and
    stamp are gone, and its next decision creates its buckets empty [INV-LIM-9]."""

    seq: int
    key: str
    at_us: int


@dataclass(frozen=True)
class Decision:
    """Result of a raw key decision, in the shape of a ``buckets.json`` claim op.

    ``levels`` has one entry per kept rate entry in config order (``None``: the
    bucket does not exist yet); ``job_id`` is the synthetic job that holds the
    slot when ``LimitsModel.decide`` admitted outside a poll.
    """

    key: str
    at_us: int
    admitted: bool
    refused_for: str | None
    blocked_until_us: int | None
    levels: tuple[int | None, ...]
    in_flight: int
    unconfigured: bool = False
    job_id: JobId | None = None


@dataclass(frozen=True, kw_only=True)
class Decided(Decision):
    """The event of one key decision (semantics §5), with the state it left."""

    seq: int


Event = Enqueued | Decided | Polled | Claimed | Completed | Restarted | Forgotten


@dataclass
class LimitJob:
    """A pending, in-flight or completed execution in the limits model."""

    job_id: JobId
    key: Key
    eligible_at_us: int
    created: int
    state: str = "pending"  # pending | in_flight | completed
    worker: str | None = None
    claimed_at_us: int | None = None
    outcome: str | None = None

    @property
    def order(self) -> tuple[int, int]:
        """FIFO order: ``(eligible_at, creation order)`` [INV-LIM-6]."""
        return (self.eligible_at_us, self.created)


# --------------------------------------------------------------------------- the model


@dataclass
class LimitsModel:
    """Jobs, claims, keys and buckets under fleet-wide limits (semantics §5).

    Example::

        m = LimitsModel({"k": {"concurrency": 2}})
        m.enqueue(1, "k", 0); m.enqueue(2, None, 0)
        m.claim("w", 0)        # -> 1 (oldest lane first; ties by creation order)

    Guarantees (checked by ``model/invariants.py`` after every hypothesis step):
    never claims for a key whose in-flight count equals its concurrency
    [INV-LIM-1]; claims of a key fit every kept bucket [INV-LIM-2]; in-flight
    counts are derived from job states, never stored [INV-LIM-3]; levels stay in
    ``[0, cap]`` [INV-LIM-4]; stamps are exact [INV-LIM-5]; lanes are tried in
    FIFO order of their oldest eligible job [INV-LIM-6].

    Not modelled: locks and transactions (every operation is atomic), worker
    heartbeats (``reap`` is called by the caller when it chooses).

    Partitioned keys (semantics §5.1; model only, issue 34): a key rendered by
    ``partition_key(family, value)`` is a partition of a family entry (``FamilyLimits``):
    it is decided as a static key with the family's ``per_partition`` limits, after the
    family's ceiling over all its partitions [INV-LIM-8]; ``forget_partition`` removes an
    idle partition's buckets and stamp, adding no token [INV-LIM-9]. A key that is no
    partition of a configured family behaves exactly as before.

    Buckets are created empty by the first decision that needs them; until then
    ``levels`` reports ``None`` in that position. A restart keeps the buckets
    of the periods the new config keeps for the key (level and refill time
    unchanged), drops the others, and clears every ``blocked_until`` stamp
    (``vectors/buckets.json`` requires both).
    """

    limits: Mapping[str, object] | None = None
    config: dict[str, KeyLimits | FamilyLimits] = field(init=False)
    jobs: dict[JobId, LimitJob] = field(init=False, default_factory=dict)
    buckets: dict[tuple[str, int], Bucket] = field(init=False, default_factory=dict)
    stamps: dict[str, int] = field(init=False, default_factory=dict)
    dead_workers: set[str] = field(init=False, default_factory=set)
    events: list[Event] = field(init=False, default_factory=list)
    log: list[str] = field(init=False, default_factory=list)
    _created: int = field(init=False, default=0)
    _synthetic: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.config = parse_limits(self.limits)
        self.events.append(Restarted(0, 0, dict(self.config), frozenset(self.config)))

    # ----------------------------------------------------------------- hooks (mutants override)

    def _refill(self, bucket: Bucket, entry: RateEntry, now_us: int) -> Bucket:
        return refill(bucket, entry, now_us)

    def _spend(self, bucket: Bucket, entry: RateEntry) -> Bucket:
        return spend(bucket, entry)

    def _next_token_us(self, bucket: Bucket, entry: RateEntry) -> int:
        return next_token_us(bucket, entry)

    def _saturated(self, key: str) -> bool:
        limits = limits_for(self.config, key)
        # [INV-LIM-1] the in-flight count (derived) against the ceiling in config now
        return limits is not None and limits.concurrency is not None and self.in_flight(key) >= limits.concurrency

    def _family_saturated(self, key: str) -> bool:
        family = family_of(self.config, key)
        # [INV-LIM-8] the family's in-flight count (derived, over its partitions) against its ceiling
        return (family is not None and family[1].concurrency is not None
                and self.family_in_flight(family[0]) >= family[1].concurrency)

    def _forget_bucket(self, bucket: Bucket, entry: RateEntry | None, now_us: int) -> Bucket | None:  # noqa: ARG002
        return None  # [INV-LIM-9] the row is deleted: the next decision creates it empty

    def _lane_order(self, job: LimitJob) -> tuple[int, int]:
        return job.order

    # ----------------------------------------------------------------- read accessors

    def in_flight(self, key: Key) -> int:
        """Executions of ``key`` claimed and not completed; derived, never stored [INV-LIM-3]."""
        return sum(1 for job in self.jobs.values() if job.key == key and job.state == "in_flight")

    def family_in_flight(self, family: str) -> int:
        """Executions of every partition of ``family`` claimed and not completed; derived [INV-LIM-8]."""
        return sum(1 for job in self.jobs.values()
                   if job.state == "in_flight" and (split := split_partition_key(job.key)) is not None
                   and split[0] == family and job.key not in self.config)

    def levels(self, key: str) -> list[int | None]:
        """Bucket levels in units, one per kept rate entry in config order; ``None``: not created yet."""
        limits = limits_for(self.config, key)
        if limits is None:
            return []
        return [
            bucket.units if (bucket := self.buckets.get((key, entry.per_s))) is not None else None
            for entry in limits.rates
        ]

    def blocked_until(self, key: str) -> int | None:
        """The key's stamp: first µs at which every bucket holds a token again, or None."""
        return self.stamps.get(key)

    def pending(self) -> list[JobId]:
        """Pending job ids (eligible or not) in FIFO order ``(eligible_at, creation order)``."""
        jobs = [job for job in self.jobs.values() if job.state == "pending"]
        return [job.job_id for job in sorted(jobs, key=lambda job: job.order)]

    def in_flight_jobs(self, worker: str | None = None) -> list[JobId]:
        """In-flight job ids in creation order, optionally only ``worker``'s."""
        jobs = [j for j in self.jobs.values() if j.state == "in_flight" and worker in (None, j.worker)]
        return [job.job_id for job in sorted(jobs, key=lambda job: job.created)]

    @property
    def claims(self) -> list[Claimed]:
        """Every claim so far, in order: ``(job_id, key, worker, at_us)``."""
        return [event for event in self.events if isinstance(event, Claimed)]

    @property
    def polls(self) -> list[Polled]:
        """Every poll so far, with each lane's verdict (why it was skipped, refused or taken)."""
        return [event for event in self.events if isinstance(event, Polled)]

    # ----------------------------------------------------------------- operations

    def enqueue(self, job_id: JobId, key: Key, eligible_at_us: int) -> None:
        """Add a pending job; creation order is call order. ``key=None`` is the unkeyed lane."""
        if job_id in self.jobs:
            raise PreconditionError(f"job {job_id!r} already exists")
        self._created += 1
        self.jobs[job_id] = LimitJob(job_id, key, eligible_at_us, self._created)
        self._emit(Enqueued, job_id=job_id, key=key, eligible_at_us=eligible_at_us, created=self._created)

    def claim(self, worker: str, now_us: int) -> JobId | None:
        """One poll by ``worker`` at ``now_us``: claim at most one eligible job, or return None.

        Lanes are every keyed lane with an eligible job that is neither
        rate-blocked (stamp in the future) nor saturated, plus the unkeyed lane;
        they are tried in the order of their oldest eligible job by
        ``(eligible_at, creation order)`` [INV-LIM-6]. The unkeyed lane always
        admits; a keyed lane runs the key decision and on refusal the poll tries
        the next lane. Every lane's fate is recorded in a ``Polled`` event.
        """
        if worker in self.dead_workers:
            raise PreconditionError(f"worker {worker!r} is dead and cannot poll")
        first_seq = len(self.events)
        verdicts, candidates = self._lanes(now_us)
        claimed: LimitJob | None = None
        for job in candidates:
            if claimed is not None:
                verdicts.append(self._verdict(job, "untried"))
                continue
            decision = None if job.key is None else self._decide(job.key, now_us)
            if decision is None or decision.admitted:  # the unkeyed lane always admits
                claimed = job
                verdicts.append(self._verdict(job, "claimed"))
            else:
                verdicts.append(self._verdict(job, f"refused_{decision.refused_for}"))
        self._emit(Polled, first_seq=first_seq, worker=worker, at_us=now_us, lanes=tuple(verdicts),
                   job_id=None if claimed is None else claimed.job_id)
        if claimed is None:
            return None
        self._start(claimed, worker, now_us)
        return claimed.job_id

    def claim_batch(self, worker: str, now_us: int, limit: int, keyed_limit: int = 1) -> list[JobId]:
        """Polls by ``worker`` at ``now_us``, made in a row: a batch claim, in runs of one
        lane each (:meth:`_claim_run`). Each claim is exactly the claim a poll would make at
        that moment [INV-LIM-6], with its decision, spend and stamp [INV-LIM-2, INV-LIM-5].
        A run takes up to ``limit`` claims of the unkeyed lane, ``keyed_limit`` of a key;
        the batch goes on to another run only after a key whose run filled its concurrency
        (it is saturated: the next poll is another lane's), and takes at most
        ``max(limit, keyed_limit)`` in all. Returns the jobs claimed, in order."""
        most = max(limit, keyed_limit)
        claimed: list[JobId] = []
        while len(claimed) < most:
            run = self._claim_run(worker, now_us, min(limit, most - len(claimed)),
                                  min(keyed_limit, most - len(claimed)))
            claimed += run
            limits = None if not run else limits_for(self.config, self.jobs[run[0]].key)
            if limits is None or limits.concurrency is None or len(run) < limits.concurrency:
                break  # nothing claimed, the unkeyed lane, or a key that may be the next poll's
        return claimed

    def _claim_run(self, worker: str, now_us: int, limit: int, keyed_limit: int) -> list[JobId]:
        """Polls by ``worker`` at ``now_us``, made in a row while the first poll's lane
        stays the first lane and admits: one lane's run of a batch. The first poll is an
        ordinary one (of any lane); then, up to ``limit`` claims in all when that lane is
        the unkeyed one, up to ``keyed_limit`` when it is a key. The run stops, writing
        nothing more, before a poll that would try another lane first or that the key would
        refuse (so a refusal's stamp is never written by a run: the last spend already
        stamped the key if it ran short). Returns the jobs claimed, in order."""
        first = self.claim(worker, now_us)
        if first is None:
            return []
        claimed = [first]
        key = self.jobs[first].key
        most = limit if key is None else keyed_limit
        while len(claimed) < most:
            _, candidates = self._lanes(now_us)
            if not candidates or candidates[0].key != key:
                break  # [INV-LIM-6] another lane would come first
            if key is not None and not self._would_admit(key, now_us):
                break  # pragma: no cover  defensive: a spend leaving k short stamped it, so _lanes skipped it
            job_id = self.claim(worker, now_us)
            assert job_id is not None, "the first lane admits"
            assert self.jobs[job_id].key == key, "the first lane's job is claimed"
            claimed.append(job_id)
        return claimed

    def complete_all_and_hand_off(self, job_ids: list[JobId], now_us: int, limit: int = 1,
                                  keyed_limit: int = 1) -> list[JobId]:
        """Successes of one owner recorded at once (one success is a group of one), then,
        in the same step, the hand-off: when every job is of one lane, the owner takes the
        lane's next jobs if a poll at ``now_us`` would claim them, that is when the lane (its
        key, or the unkeyed lane) is the first candidate lane [INV-LIM-6] and, for a key, its
        limits admit now. Then the hand-off *is* those polls (same choices, spends and
        stamps): up to ``limit`` jobs when the lane is the unkeyed one, up to
        ``keyed_limit`` when it is a key (a keyed group commit: the successes of one key,
        then what ``keyed_limit`` polls in a row would claim of it, one run of
        :meth:`claim_batch`); otherwise nothing changes beyond the completions (no refill,
        no stamp). A group of several lanes hands nothing on: its releases take each key's
        lock in key order, and a claim after them could need a family's lock that comes
        before. The successes release their slots in the order given, at the same time; a
        job not in flight raises as :meth:`complete` does, the successes before it
        standing. Returns the jobs handed on.

        The engine's one success transaction (``pipelines.outcomes.record_successes`` with
        a ``HandOff``), for one success and for a group alike.
        """
        for job_id in job_ids:
            self.complete(job_id, now_us)  # raises unless the job was in flight with a live owner
        job = self.jobs[job_ids[-1]]
        if any(self.jobs[job_id].key != job.key for job_id in job_ids):
            return []  # several lanes: nothing handed on
        _, candidates = self._lanes(now_us)
        if not candidates or candidates[0].key != job.key:
            return []
        if job.key is not None and not self._would_admit(job.key, now_us):
            return []
        assert job.worker is not None
        return self._claim_run(job.worker, now_us, limit, keyed_limit)

    def _lanes(self, now_us: int) -> tuple[list[LaneVerdict], list[LimitJob]]:
        """The verdicts of lanes a poll skips (blocked, saturated), and the head job of
        every other lane with eligible work, in the order a poll tries them."""
        oldest: dict[Key, LimitJob] = {}
        for job in sorted(self._eligible(now_us), key=self._lane_order):
            oldest.setdefault(job.key, job)
        skipped: list[LaneVerdict] = []
        candidates = []
        for key, job in oldest.items():
            if key is not None and (stamp := self.stamps.get(key)) is not None and stamp > now_us:
                skipped.append(self._verdict(job, "blocked"))  # [INV-LIM-5] skip until the stamp
            elif key is not None and (self._family_saturated(key) or self._saturated(key)):
                skipped.append(self._verdict(job, "saturated"))  # [INV-LIM-8, INV-LIM-1] family, then partition
            else:
                candidates.append(job)
        return skipped, sorted(candidates, key=self._lane_order)

    def _would_admit(self, key: str, now_us: int) -> bool:
        """Whether the key decision would admit a claim now; changes nothing."""
        limits = limits_for(self.config, key)
        if limits is None:
            return True
        if self._family_saturated(key) or self._saturated(key):  # pragma: no cover  defensive: both callers
            return False  # take key from _lanes, which skips it
        for entry in limits.rates:
            bucket = self.buckets.get((key, entry.per_s)) or Bucket(0, now_us, cap_units(entry))
            if self._refill(bucket, entry, now_us).units < token_units(entry):
                return False
        return True

    def decide(self, key: str, now_us: int) -> Decision:
        """The raw key decision of semantics §5 (what ``buckets.json`` specifies), outside a poll.

        On admission a synthetic in-flight job holds the slot (``Decision.job_id``);
        ``complete(decision.job_id, now)`` releases it.
        """
        decision = self._decide(key, now_us)
        if not decision.admitted:
            return decision
        self._synthetic += 1
        job_id = ("decide", self._synthetic)
        self.enqueue(job_id, key, now_us)
        self._start(self.jobs[job_id], "decide", now_us)
        return Decision(**{**decision.__dict__, "job_id": job_id})

    def complete(self, job_id: JobId, now_us: int, outcome: str = "success") -> None:
        """The owner records the job's outcome; its slot frees at once [INV-LIM-3].

        Raises ``CommitFailed`` if the job is no longer in flight (reaped: its
        late commit is rejected [INV-EXE-2]) and ``PreconditionError`` if its
        owner is dead (a dead process commits nothing; ``reap`` it).
        """
        job = self.jobs.get(job_id)
        if job is None or job.state != "in_flight":
            raise CommitFailed(f"job {job_id!r} is not in flight")
        if job.worker in self.dead_workers:
            raise PreconditionError(f"job {job_id!r} belongs to dead worker {job.worker!r}")
        self._finish(job, now_us, outcome)

    def crash_worker(self, worker: str, now_us: int) -> list[JobId]:  # noqa: ARG002 - every operation takes the time
        """``worker`` dies: it polls and commits no more; its jobs keep their slots until reaped."""
        self.dead_workers.add(worker)
        return self.in_flight_jobs(worker)

    def reap(self, worker: str, now_us: int,
             requeue: Mapping[JobId, tuple[JobId, int]] | None = None) -> list[JobId]:
        """Complete ``worker``'s in-flight jobs as ``process_crashed`` and re-enqueue as told.

        ``requeue`` maps a reaped job to ``(new_job_id, eligible_at_us)``; a job
        not in it is not re-enqueued (its crash budget is spent). The worker may
        be alive (missed heartbeats): its later ``complete`` raises
        ``CommitFailed`` [INV-EXE-2]. Returns the reaped jobs in creation order.
        """
        reaped = self.in_flight_jobs(worker)
        for job_id in reaped:
            self._finish(self.jobs[job_id], now_us, "process_crashed")
        for job_id in reaped:
            if requeue and job_id in requeue:
                new_id, eligible_at_us = requeue[job_id]
                self.enqueue(new_id, self.jobs[job_id].key, eligible_at_us)
        return reaped

    def restart_with(self, limits: Mapping[str, object], now_us: int = 0) -> None:
        """The fleet restarts with new ``limits`` (raw entries or ``KeyLimits``).

        Buckets persist per ``(key, period)``: a kept period keeps its level and
        refill time (clamped to the new burst at its next refill); buckets of
        periods the new config does not keep are dropped, so a period that comes
        back later starts empty. Every ``blocked_until`` stamp is cleared (a stamp is only
        a hint to skip the key; the next refusal stamps it again, exactly). In-flight
        jobs keep their slots [INV-LIM-4].
        """
        old = self.config
        self.config = parse_limits(limits)
        # Every key is re-based (semantics §5; vectors/buckets.json s7.0 clears a stamp even
        # across a restart with unchanged values): buckets of periods the new entry does
        # not keep are dropped, kept ones keep level and refill time, stamps are cleared.
        rebased = set(old) | set(self.config) | set(self.stamps) | {k for k, _ in self.buckets}
        # a partition is named by no entry: every partition with an execution is re-based too
        rebased |= {job.key for job in self.jobs.values() if job.key is not None and split_partition_key(job.key)}
        self.buckets = {(key, per_s): bucket for (key, per_s), bucket in self.buckets.items()
                        if (lim := limits_for(self.config, key)) and any(e.per_s == per_s for e in lim.rates)}
        self.stamps.clear()
        self._emit(Restarted, at_us=now_us, limits=dict(self.config), rebased=frozenset(rebased))

    def forget_partition(self, key: str, now_us: int) -> None:
        """Remove an idle partition's rows: its buckets and its stamp (semantics §5,
        "Partitioned keys"; the engine's ``limits.executions.forget_partition``). Idle: no
        execution of the key is pending or in flight; anything else raises ``PreconditionError`` and changes nothing, as
        does a key that is no rendered partition or that the config names (a static key's
        rows are bounded by config).

        Never adds a token: the partition's next decision creates its buckets empty, with
        refill time then, so the tokens available after it are at most those before
        [INV-LIM-9]; the rows of partitions kept are bounded by the partitions with work.
        """
        if split_partition_key(key) is None or key in self.config:
            raise PreconditionError(f"{key!r} is not a partition key")
        busy = [job.job_id for job in self.jobs.values() if job.key == key and job.state != "completed"]
        if busy:
            raise PreconditionError(f"partition {key!r} is not idle: {busy!r}")
        limits = limits_for(self.config, key)
        for where in [where for where in self.buckets if where[0] == key]:
            entry = next((e for e in limits.rates if e.per_s == where[1]), None) if limits else None
            left = self._forget_bucket(self.buckets.pop(where), entry, now_us)
            if left is not None:
                self.buckets[where] = left
        self.stamps.pop(key, None)
        self._emit(Forgotten, key=key, at_us=now_us)

    # ----------------------------------------------------------------- internals

    def _emit(self, kind: type, **fields: Any) -> None:
        self.events.append(kind(seq=len(self.events), **fields))

    def _eligible(self, now_us: int) -> list[LimitJob]:
        return [job for job in self.jobs.values() if job.state == "pending" and job.eligible_at_us <= now_us]

    @staticmethod
    def _verdict(job: LimitJob, verdict: str) -> LaneVerdict:
        return LaneVerdict(job.key, job.job_id, job.eligible_at_us, job.created, verdict)

    def _start(self, job: LimitJob, worker: str, now_us: int) -> None:
        job.state, job.worker, job.claimed_at_us = "in_flight", worker, now_us
        self._emit(Claimed, job_id=job.job_id, key=job.key, worker=worker, at_us=now_us)

    def _finish(self, job: LimitJob, now_us: int, outcome: str) -> None:
        job.state, job.outcome = "completed", outcome
        self._emit(Completed, job_id=job.job_id, key=job.key, worker=job.worker, at_us=now_us, outcome=outcome)

    def _decide(self, key: str, now_us: int) -> Decision:
        """Semantics §5 key decision; admission is materialised by the caller (job → in flight)."""
        limits = limits_for(self.config, key)
        in_flight = self.in_flight(key)
        if limits is None:
            self.log.append(UNCONFIGURED_WARNING)
            return self._decided(key, now_us, True, None, in_flight + 1, unconfigured=True)
        if self._family_saturated(key):  # [INV-LIM-8] the family first (its lock comes first), nothing refilled
            return self._decided(key, now_us, False, "family_concurrency", in_flight)
        if self._saturated(key):  # [INV-LIM-1] nothing refilled, nothing stamped
            return self._decided(key, now_us, False, "concurrency", in_flight)
        for entry in limits.rates:
            where = (key, entry.per_s)
            bucket = self.buckets.get(where) or Bucket(0, now_us, cap_units(entry))
            self.buckets[where] = self._refill(bucket, entry, now_us)
        short = [e for e in limits.rates if self.buckets[(key, e.per_s)].units < token_units(e)]
        if short:
            self.stamps[key] = self._stamp(key, short)  # [INV-LIM-5]
            return self._decided(key, now_us, False, "rate", in_flight)
        for entry in limits.rates:
            self.buckets[(key, entry.per_s)] = self._spend(self.buckets[(key, entry.per_s)], entry)
        short = [e for e in limits.rates if self.buckets[(key, e.per_s)].units < token_units(e)]
        if short:
            self.stamps[key] = self._stamp(key, short)  # [INV-LIM-5]
        else:
            self.stamps.pop(key, None)
        return self._decided(key, now_us, True, None, in_flight + 1)

    def _stamp(self, key: str, short: list[RateEntry]) -> int:
        return max(self._next_token_us(self.buckets[(key, entry.per_s)], entry) for entry in short)

    def _decided(self, key: str, now_us: int, admitted: bool, refused_for: str | None,
                 in_flight: int, unconfigured: bool = False) -> Decision:
        fields: dict[str, Any] = {"key": key, "at_us": now_us, "admitted": admitted, "refused_for": refused_for,
                                  "blocked_until_us": self.stamps.get(key), "levels": tuple(self.levels(key)),
                                  "in_flight": in_flight, "unconfigured": unconfigured}
        self._emit(Decided, **fields)
        return Decision(**fields)
