"""What ``ductwork status`` reports: runs by state, on_halt hooks by state (with the most
recent failed ones), processes (host, pid, heartbeat age; marked ``late``, ``stale`` or
``dead``), and each limit key.

    >>> print(render(snapshot(app)))

Per key: executions in flight (claimed, not completed) against its
``concurrency``, each bucket's tokens against its burst (refilled to now for
display only; nothing is written), and ``blocked_until`` (a rate-blocked key is
skipped by every worker until then). Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.clock import to_us
from ductwork.fleet.processes import host_name
from ductwork.fleet.reaper import proven_dead
from ductwork.limits import buckets

if TYPE_CHECKING:
    from ductwork.app import App

#: the most recent failed on_halt hooks ``ductwork status`` lists
FAILED_HOOKS_SHOWN = 5


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
class ProcessStatus:
    id: str
    role: str
    label: str
    #: the host name of its machine identifier (ductwork.fleet.processes.host_name)
    host: str
    pid: int
    heartbeat_age_s: float
    #: the heartbeat is older than ``reaper_timeout``: dead to the fleet, reaped at the
    #: next tick of any running supervisor (an exited script's ``inline`` row, a lost host)
    stale: bool
    #: the heartbeat is overdue (older than two ``heartbeat_interval``s) but not stale
    late: bool = False
    #: of this machine, and its OS process is provably gone (``reaper.proven_dead``):
    #: ``ductwork status`` and any supervisor of this machine reap it at once
    dead: bool = False


@dataclass(frozen=True)
class Status:
    now: datetime
    runs: dict[str, int]
    processes: list[ProcessStatus]
    keys: list[KeyStatus]
    #: on_halt hooks by status (pending, running, succeeded, failed); empty: none owed ever
    hooks: dict[str, int] = field(default_factory=dict)
    #: the failed hooks: (run id, handler, last error class, last error message)
    failed_hooks: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)


def snapshot(app: App) -> Status:
    r, p, k, e, b = schema.runs, schema.processes, schema.limit_keys, schema.executions, schema.limit_buckets
    with app.begin(readonly=True) as tx:
        now = tx.now
        runs = {row.status: row.runs for row in tx.execute(
            sa.select(r.c.status, sa.func.count().label("runs")).group_by(r.c.status))}
        procs = []
        cfg = app.config.supervisor
        for row in tx.execute(sa.select(p.c.id, p.c.role, p.c.label, p.c.machine_identifier, p.c.pid,
                                        p.c.os_start_ticks, p.c.last_heartbeat_at).order_by(p.c.label)):
            age = (now - row.last_heartbeat_at).total_seconds()
            stale = age >= cfg.reaper_timeout  # as reaper.reap_dead
            procs.append(ProcessStatus(row.id, row.role, row.label, host_name(row.machine_identifier), row.pid,
                                       age, stale, late=not stale and age > 2 * cfg.heartbeat_interval,
                                       dead=proven_dead(row.machine_identifier, row.pid, row.os_start_ticks)))
        keys = []
        for header in tx.execute(sa.select(k.c.key, k.c.blocked_until).order_by(k.c.key)).all():
            key, blocked = header.key, header.blocked_until
            in_flight = tx.execute(sa.select(sa.func.count()).where(e.c.inflight_key == key)).scalar_one()
            pending = tx.execute(sa.select(sa.func.count()).where(e.c.pending_lane == key)).scalar_one()
            stored = {row.period_s: buckets.Bucket(row.period_s, row.level_units, row.refilled_at_us)
                      for row in tx.execute(sa.select(b.c.period_s, b.c.level_units, b.c.refilled_at_us)
                                            .where(b.c.key == key))}
            entry = app.config.limits.get(key)
            shown = []
            for rate in (entry.rates if entry else ()):
                bucket = stored.get(rate.per_s)
                level = buckets.refill(bucket, rate, to_us(now)).level_units if bucket else 0
                shown.append((rate.per_s, Fraction(level, rate.units_per_token), rate.burst))
            keys.append(KeyStatus(key, in_flight, pending, entry.concurrency if entry else None, shown,
                                  blocked, entry is not None))
        h = schema.halt_hooks
        hooks = {row.status: row.hooks for row in tx.execute(
            sa.select(h.c.status, sa.func.count().label("hooks")).group_by(h.c.status))}
        failed = [(row.run_id, row.klass, row.error_klass, row.error_message) for row in tx.execute(
            sa.select(h.c.run_id, h.c.klass, h.c.error_klass, h.c.error_message)
            .where(h.c.status == "failed").order_by(h.c.completed_at.desc()).limit(FAILED_HOOKS_SHOWN))]
    return Status(now, runs, procs, keys, hooks, failed)


def _mark(proc: ProcessStatus) -> str:
    if proc.dead:
        return "  dead: its process is gone (this machine)"
    if proc.stale:
        return "  stale: any running supervisor reaps it"
    return "  late: heartbeat overdue" if proc.late else ""


def render(status: Status) -> str:
    lines = [f"database time {status.now.isoformat(sep=' ')} UTC", "", "runs:"]
    for state in ("in_progress", "dampened", "completed", "halted"):
        lines.append(f"  {state:<12} {status.runs.get(state, 0)}")
    if status.hooks:  # only once some run owed an on_halt hook
        lines += ["", "on_halt hooks:"]
        for state in ("pending", "running", "succeeded", "failed"):
            lines.append(f"  {state:<12} {status.hooks.get(state, 0)}")
        for run_id, klass, error, message in status.failed_hooks:
            lines.append(f"  failed: run {run_id} {klass}: {error}: {message}")
    lines += ["", "processes:"]
    if not status.processes:
        lines.append("  (none)")
    width = max((len(proc.host) for proc in status.processes), default=0)
    for proc in status.processes:
        lines.append(f"  {proc.label:<28} {proc.role:<18} {proc.host:<{width}} pid {proc.pid:<7} "
                     f"heartbeat {proc.heartbeat_age_s:6.1f}s ago  {proc.id}" + _mark(proc))
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
