"""What ``ductwork status`` reports: runs by state, processes, and each limit key.

    >>> print(render(snapshot(app)))

Per key: executions in flight (claimed, not completed) against its
``concurrency``, each bucket's tokens against its burst (refilled to now for
display only; nothing is written), and ``blocked_until`` (a rate-blocked key is
skipped by every worker until then). Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork import buckets, schema
from ductwork.clock import to_us

if TYPE_CHECKING:
    from ductwork.app import App


@dataclass(frozen=True)
class KeyStatus:
    key: str
    in_flight: int
    pending: int
    concurrency: int | None
    #: (period seconds, tokens now, burst) per configured rate entry
    buckets: list[tuple[int, Fraction, int]]
    blocked_until: datetime | None
    configured: bool


@dataclass(frozen=True)
class Status:
    now: datetime
    runs: dict[str, int]
    processes: list[tuple[str, str, str, int, float]]  # id, role, label, pid, heartbeat age s
    keys: list[KeyStatus]


def snapshot(app: App) -> Status:
    r, p, k, e, b = schema.runs, schema.processes, schema.limit_keys, schema.executions, schema.limit_buckets
    with app.begin(readonly=True) as tx:
        now = tx.now
        runs = dict(tx.execute(sa.select(r.c.status, sa.func.count()).group_by(r.c.status)).all())
        procs = [(pid, role, label, ospid, (now - beat).total_seconds())
                 for pid, role, label, ospid, beat in tx.execute(
                     sa.select(p.c.id, p.c.role, p.c.label, p.c.pid, p.c.last_heartbeat_at).order_by(p.c.label))]
        keys = []
        for key, blocked in tx.execute(sa.select(k.c.key, k.c.blocked_until).order_by(k.c.key)).all():
            in_flight = tx.execute(sa.select(sa.func.count()).where(e.c.inflight_key == key)).scalar_one()
            pending = tx.execute(sa.select(sa.func.count()).where(e.c.pending_lane == key)).scalar_one()
            stored = {period: buckets.Bucket(period, level, at) for period, level, at in tx.execute(
                sa.select(b.c.period_s, b.c.level_units, b.c.refilled_at_us).where(b.c.key == key))}
            entry = app.config.limits.get(key)
            shown = []
            for rate in (entry.rates if entry else ()):
                bucket = stored.get(rate.per_s)
                level = buckets.refill(bucket, rate, to_us(now)).level_units if bucket else 0
                shown.append((rate.per_s, Fraction(level, rate.units_per_token), rate.burst))
            keys.append(KeyStatus(key, in_flight, pending, entry.concurrency if entry else None, shown,
                                  blocked, entry is not None))
    return Status(now, runs, procs, keys)


def render(status: Status) -> str:
    lines = [f"database time {status.now.isoformat(sep=' ')} UTC", "", "runs:"]
    for state in ("in_progress", "dampened", "completed", "halted"):
        lines.append(f"  {state:<12} {status.runs.get(state, 0)}")
    lines += ["", "processes:"]
    if not status.processes:
        lines.append("  (none)")
    for pid, role, label, ospid, age in status.processes:
        lines.append(f"  {label:<28} {role:<18} pid {ospid:<7} heartbeat {age:6.1f}s ago  {pid}")
    lines += ["", "limit keys:"]
    if not status.keys:
        lines.append("  (none)")
    for key in status.keys:
        limit = "unlimited (no config entry)" if not key.configured else (
            f"{key.in_flight}/{key.concurrency} in flight" if key.concurrency else f"{key.in_flight} in flight")
        lines.append(f"  {key.key}: {limit}, {key.pending} pending")
        for period, tokens, burst in key.buckets:
            lines.append(f"    rate per {period}s: {float(tokens):.3f} of {burst} tokens")
        if key.blocked_until is not None and key.blocked_until > status.now:
            lines.append(f"    blocked until {key.blocked_until.isoformat(sep=' ')} "
                         f"({(key.blocked_until - status.now).total_seconds():.3f}s from now)")
    return "\n".join(lines)
