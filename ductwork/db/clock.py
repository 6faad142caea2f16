"""The one clock: database time, read once per transaction, injectable for tests.

    >>> clock = ManualClock(datetime(2026, 1, 1))
    >>> clock.advance(microseconds=1)

Every time that gates a decision (eligibility, staleness, token refill, timeouts
recorded) and every time later compared with one comes from :meth:`Clock.now`
[INV-CLK-1]. In production that is :class:`DatabaseClock`, a query to the
database server (so hosts with skewed clocks agree); conformance tests pass a
:class:`ManualClock` and move time only by rule. The engine binds the value it
read as a parameter; statements never call a SQL time function of their own.

Values are naive ``datetime`` objects in UTC with microsecond precision.
:func:`to_us` / :func:`from_us` convert exactly to integer microseconds since the
epoch (the unit of the token-bucket arithmetic).
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy.engine import Connection

EPOCH = datetime(1970, 1, 1)
_ONE_US = timedelta(microseconds=1)


def to_us(moment: datetime) -> int:
    """Exact microseconds since the epoch of a naive UTC datetime."""
    return (moment - EPOCH) // _ONE_US


def from_us(micros: int) -> datetime:
    """The naive UTC datetime ``micros`` microseconds after the epoch (exact)."""
    return EPOCH + timedelta(microseconds=micros)


class Clock(Protocol):
    def now(self, conn: Connection) -> datetime:
        """Current time; ``conn`` is the transaction's connection."""

    def in_sql(self) -> tuple[datetime | None, timedelta]:
        """How a server-side routine reads this clock itself, after its own locks: a fixed
        time (a test's clock), or None and an offset to add to the database's clock."""


class DatabaseClock:
    """The database server's clock (``ductwork.db.dialects.db_now``)."""

    def now(self, conn: Connection) -> datetime:
        from ductwork.db.dialects import db_now

        return db_now(conn)

    def in_sql(self) -> tuple[datetime | None, timedelta]:
        return None, timedelta()

    def __repr__(self) -> str:
        return "DatabaseClock()"


class ManualClock:
    """A clock that moves only when told to: for tests and the conformance machine.

    Thread-safe. ``now`` ignores the connection.
    """

    def __init__(self, start: datetime | None = None):
        self._lock = threading.Lock()
        self._now = start if start is not None else datetime(2026, 1, 1)

    def now(self, conn: Connection | None = None) -> datetime:  # noqa: ARG002 - the Clock signature; no database read
        with self._lock:
            return self._now

    def in_sql(self) -> tuple[datetime | None, timedelta]:
        return self.now(), timedelta()

    def set(self, moment: datetime) -> None:
        with self._lock:
            self._now = moment

    def advance(self, delta: timedelta | None = None, *, microseconds: int = 0,
                seconds: float = 0) -> datetime:
        step = (delta or timedelta()) + timedelta(microseconds=microseconds, seconds=seconds)
        if step < timedelta():
            raise ValueError(f"ManualClock.advance: time only moves forward, got {step}")
        with self._lock:
            self._now += step
            return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now.isoformat()})"


class OffsetClock:
    """Another clock's time plus an offset that only grows: time flows, and a test may
    skip ahead (``ductwork.testing.drain(app, skip_delays=True)`` does, past a retry's
    ``retry_delay``, a crash back-off or a ``delay=``).

        >>> clock = OffsetClock()                 # the database's clock, not moved yet
        >>> clock.skip_to(moment, now)            # from now on it reads ``moment - now`` later

    Thread-safe. Every transaction of an App reads this one clock, so everything that
    App decides stays consistent with itself [INV-CLK-1]; another process on the same
    database, on the database's own clock, sees this App's times ahead by the offset.
    Not for production: a skip makes ``delay=`` and back-offs shorter than configured.
    """

    def __init__(self, base: Clock | None = None):
        self._base: Clock = base if base is not None else DatabaseClock()
        self._lock = threading.Lock()
        self._offset = timedelta()

    @property
    def offset(self) -> timedelta:
        """How far ahead of the base clock this clock reads (zero until a skip)."""
        with self._lock:
            return self._offset

    def now(self, conn: Connection) -> datetime:
        base = self._base.now(conn)
        with self._lock:
            return base + self._offset

    def in_sql(self) -> tuple[datetime | None, timedelta]:
        fixed, offset = self._base.in_sql()
        with self._lock:
            return (None, offset + self._offset) if fixed is None else (fixed + self._offset, timedelta())

    def skip_to(self, moment: datetime, now: datetime) -> None:
        """Move ahead by ``moment - now`` (``now``: a reading of this clock); never back."""
        if moment > now:
            with self._lock:
                self._offset += moment - now

    def __repr__(self) -> str:
        return f"OffsetClock({self._base!r}, offset={self.offset})"
