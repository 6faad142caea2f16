"""Recent claims per second of each limit key, from the fleet-wide claims counters.

    >>> rates = ClaimRates()
    >>> rates.record(status.now, {key.key: key.claims for key in status.keys})
    >>> rates.series("vendor_api")    # [(seconds before the latest sample, claims/s), ...]

Every snapshot the dashboard reads (a page, a ``/metrics`` scrape) is recorded: a key's
``claims`` (``KeyStatus.claims``, the counter behind its ``seq``) is the whole fleet's
truth, so the difference between two samples of a key over the database time between
them is the fleet's claim rate in that interval, whichever process claimed. A snapshot
may hold some keys only (a key's own page): each key keeps its own samples. A sample
closer than ``min_gap_s`` to the key's previous one is skipped; intervals older than
``window_s`` are dropped. Memory: a key keeps its first sample, then two points per
change of its counter (the last sample before it and the new one), so an idle key
costs one point.

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
from itertools import pairwise

Point = tuple[datetime, int]


class ClaimRates:
    def __init__(self, window_s: float = 300.0, min_gap_s: float = 1.0):
        self.window_s, self.min_gap_s = window_s, min_gap_s
        self._lock = threading.Lock()
        self._latest: datetime | None = None
        #: per key: its last sample
        self._seen: dict[str, Point] = {}
        #: per key: its first sample, then the samples on each side of every change
        self._points: dict[str, deque[Point]] = {}

    def record(self, now: datetime, claims: Mapping[str, int]) -> None:
        with self._lock:
            self._latest = now if self._latest is None else max(self._latest, now)
            for key, count in claims.items():
                seen = self._seen.get(key)
                if seen is not None and (now - seen[0]).total_seconds() < self.min_gap_s:
                    continue
                points = self._points.setdefault(key, deque())
                if seen is None:
                    points.append((now, count))
                elif count != seen[1]:
                    if points[-1] != seen:
                        points.append(seen)
                    points.append((now, count))
                while len(points) > 1 and (now - points[1][0]).total_seconds() > self.window_s:
                    points.popleft()
                self._seen[key] = (now, count)

    def series(self, key: str) -> list[tuple[float, float, float]]:
        """(seconds before the latest sample at the interval's start, at its end, claims per
        second in it), oldest first; empty until the key has two samples."""
        with self._lock:
            if self._latest is None or key not in self._seen:
                return []
            points = list(self._points[key])
            if points[-1] != self._seen[key]:
                points.append(self._seen[key])
            latest = self._latest
        return [((latest - t1).total_seconds(), (latest - t2).total_seconds(), (c2 - c1) / (t2 - t1).total_seconds())
                for (t1, c1), (t2, c2) in pairwise(points) if t2 > t1]

    def sparkline(self, key: str, width: int = 120, height: int = 28) -> tuple[str, float]:
        """An SVG polyline's ``points`` (numbers only): a step line over the time sampled,
        at most the window (so a chart opened a minute ago spans that minute), its right
        edge the latest sample; and the highest rate drawn (the top); ``""`` before the
        key's second sample."""
        intervals = self.series(key)
        if not intervals:
            return "", 0.0
        peak = max(rate for _, _, rate in intervals)
        span = min(intervals[0][0], self.window_s)

        def x(ago: float) -> float:
            return width * (1 - min(ago, span) / span)

        def y(rate: float) -> float:
            return height - 2 - (height - 4) * rate / (peak or 1.0)

        points = [(x(ago), y(rate)) for start, end, rate in intervals for ago in (start, end)]
        return " ".join(f"{px:.1f},{py:.1f}" for px, py in points), peak
