"""Durations: the grammar shared by rate periods, delays, timeouts and intervals.

    >>> parse_period("1h30m")
    5400
    >>> parse_interval_us(0.25)
    250000

Two parsers, one grammar for strings: a whole number of seconds (``60`` or
``"60"``), or ``<int><unit>`` groups with units ``w d h m s`` in that order, each
at most once, lowercase, ASCII digits ``0-9`` only (an Arabic-Indic or fullwidth digit is
rejected), no spaces, signs or decimals (``"1w2d3h4m5s"``).
Months and years are rejected because their length is approximate.

- :func:`parse_period` is for rate ``per`` values: whole seconds, at least 1.
- :func:`parse_interval_us` is for ``delay=``, ``timeout=`` and config intervals:
  it also takes positive ``float`` seconds and ``timedelta``, and returns whole
  microseconds (sub-microsecond remainders are rounded up so a positive value never
  becomes zero).

Both raise :class:`ductwork.errors.DurationError` naming the value; callers wrap it
with the config path or the transition it came from. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from ductwork.errors import DurationError

_UNITS = (("w", 604_800), ("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
# ASCII digits only: a str pattern's \d also matches Arabic-Indic and fullwidth digits,
# which int() accepts, so '\u0661h' would be an hour here and an error in the model and the documented grammar.
_COMPOUND = re.compile(r"(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_DIGITS = re.compile(r"[0-9]+")
_APPROXIMATE = re.compile(r"^[0-9]+(mo|y|M|mon|month|months|year|years)$")


def _parse_string_seconds(value: str) -> int:
    if _DIGITS.fullmatch(value):
        return int(value)
    if _APPROXIMATE.match(value):
        raise DurationError(value, "months and years are not supported (their length varies)")
    match = _COMPOUND.fullmatch(value)
    if not value or match is None or not any(match.groups()):
        raise DurationError(
            value,
            "expected whole seconds or <int><unit> groups in the order w d h m s "
            "(e.g. '90', '1m', '1h30m')",
        )
    return sum(int(n) * size for n, (_, size) in zip(match.groups(), _UNITS, strict=True) if n)


def parse_period(value: object) -> int:
    """Parse a rate period into whole seconds (>= 1).

    ``60``, ``"60"``, ``"1m"`` and ``"1h30m"`` are accepted; ``0``, ``"500ms"``,
    ``"1mo"``, ``1.5``, ``True`` and ``None`` raise :class:`DurationError`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DurationError(
            value, f"expected whole seconds (int) or a duration string, got {type(value).__name__}"
        )
    seconds = value if isinstance(value, int) else _parse_string_seconds(value)
    if seconds < 1:
        raise DurationError(value, "must be at least one second")
    return seconds


def parse_interval_us(value: object) -> int:
    """Parse a positive interval into whole microseconds.

    Takes ``int``/``float`` seconds, a ``timedelta``, or a duration string
    (:func:`parse_period`'s grammar). Zero, negative, non-finite and ``bool`` values
    raise :class:`DurationError`.
    """
    if isinstance(value, bool):
        raise DurationError(value, "expected seconds, a timedelta or a duration string, got bool")
    if isinstance(value, timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    elif isinstance(value, int):
        micros = value * 1_000_000
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise DurationError(value, "must be a finite number of seconds")
        micros = math.ceil(value * 1_000_000) if value > 0 else math.floor(value * 1_000_000)
    elif isinstance(value, str):
        micros = _parse_string_seconds(value) * 1_000_000
    else:
        raise DurationError(
            value, f"expected seconds, a timedelta or a duration string, got {type(value).__name__}"
        )
    if micros <= 0:
        raise DurationError(value, "must be positive")
    return micros
