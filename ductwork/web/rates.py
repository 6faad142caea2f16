"""Recent claims per second of each limit key, from the fleet-wide claims counters.

    >>> rates = ClaimRates()
    >>> rates.record(status.now, {key.key: key.claims for key in status.keys})
    >>> rates.series("vendor_api")          # [(seconds before the last sample, claims/s), ...]

Every snapshot the dashboard reads (a page, a ``/metrics`` scrape) is recorded: a key's
``claims`` (``KeyStatus.claims``, the counter behind its ``seq``) is the whole fleet's
truth, so the difference between two samples over the database time between them is
the fleet's claim rate in that interval, whichever process claimed. Samples closer than
``min_gap_s`` are skipped; those older than ``window_s`` are dropped. Memory: a sample
keeps only the keys whose counter moved.

Not done: history from before the dashboard began reading (the chart fills while a
page is open or Prometheus scrapes; for long ranges use
``rate(ductwork_key_claims_total[1m])`` in Prometheus), and sharing samples between
several dashboard processes (each keeps its own). Thread-safe.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from datetime import datetime


class ClaimRates:
    def __init__(self, window_s: float = 300.0, min_gap_s: float = 1.0):
        self.window_s, self.min_gap_s = window_s, min_gap_s
        self._lock = threading.Lock()
        self._last: dict[str, int] = {}
        self._last_at: datetime | None = None
        #: (end of interval, its length in seconds, claims in it per key that moved)
        self._intervals: deque[tuple[datetime, float, dict[str, int]]] = deque()

    def record(self, now: datetime, claims: Mapping[str, int]) -> None:
        with self._lock:
            if self._last_at is not None:
                seconds = (now - self._last_at).total_seconds()
                if seconds < self.min_gap_s:
                    return
                moved = {key: count - self._last[key] for key, count in claims.items()
                         if key in self._last and count > self._last[key]}
                self._intervals.append((now, seconds, moved))
                while self._intervals and (now - self._intervals[0][0]).total_seconds() > self.window_s:
                    self._intervals.popleft()
            self._last, self._last_at = dict(claims), now

    def series(self, key: str) -> list[tuple[float, float]]:
        """(seconds before the latest sample, claims per second over the interval ending
        then), oldest first; empty until two samples were recorded."""
        with self._lock:
            if self._last_at is None:
                return []
            latest = self._last_at
            return [((latest - end).total_seconds(), moved.get(key, 0) / seconds)
                    for end, seconds, moved in self._intervals]

    def sparkline(self, key: str, width: int = 120, height: int = 28) -> tuple[str, float]:
        """An SVG polyline's ``points`` (numbers only) over the window, right edge = the
        latest sample, and the highest rate drawn (the top of the chart); ``""`` with
        fewer than two points."""
        points = self.series(key)
        if len(points) < 2:
            return "", 0.0
        peak = max(rate for _, rate in points)
        scaled = [(width * (1 - ago / self.window_s), height - 2 - (height - 4) * rate / (peak or 1.0))
                  for ago, rate in points]
        return " ".join(f"{x:.1f},{y:.1f}" for x, y in scaled), peak
