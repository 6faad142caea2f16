"""What ``ductwork status`` reports: runs by state, on_halt hooks by state (with the most
recent failed ones), processes (host, pid, heartbeat age; marked ``late``, ``stale`` or
``dead``), and each limit key.

    >>> print(render(snapshot(app)))

Per key: executions in flight (claimed, not completed) against its
``concurrency``, each bucket's tokens against its burst (refilled to now for
display only; nothing is written), ``blocked_until`` (a rate-blocked key is
skipped by every worker until then) and the claims it ever admitted. Read-only:
one read-only transaction of the same few statements however many keys there are
(each reads every key at once), taking no key lock.

:func:`execution_outcomes` counts executions by outcome (a scan of the executions
table) and :func:`key_refusals` reads the refused claims per key and reason: the
dashboard's ``/metrics`` reads both, ``ductwork status`` does not.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.clock import to_us
from ductwork.fleet.processes import host_name
from ductwork.fleet.reaper import proven_dead
from ductwork.limit_entries import family_of_key
from ductwork.limits import buckets

if TYPE_CHECKING:
    from ductwork.app import App
    from ductwork.db.database import Tx

#: the most recent failed on_halt hooks ``ductwork status`` lists
FAILED_HOOKS_SHOWN = 5
#: up to this many keys, their buckets are read by name (one IN list); above it, all of them
FEW_KEYS = 1000
#: the busiest partitions ``ductwork status`` lists under each key family (in flight, then pending)
TOP_PARTITIONS = 5


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
    #: claims the key ever admitted, fleet-wide: each claim and each release of the key
    #: takes the next value of its ``seq`` under its lock, and every release ends a claim,
    #: so ``seq == claims + releases == 2 * claims - in_flight``. A counter: it never goes
    #: down (a prune deletes executions, not the key's row)
    claims: int = 0


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
    #: the configured key families and their ceilings (None: none): their partitions are
    #: shown by family, the busiest first
    families: dict[str, int | None] = field(default_factory=dict)


def snapshot(app: App, *, keys: Collection[str] | None = None, busy_only: bool = False) -> Status:
    """Runs by status, processes, limit keys and hooks in one read-only transaction.
    ``keys``: only these limit keys (None: every key); ``busy_only``: only keys with an
    execution in flight or pending, or rate-blocked now (the dashboard's overview)."""
    r = schema.runs
    with app.begin(readonly=True) as tx:
        now = tx.now
        runs = {row.status: row.runs for row in tx.execute(
            sa.select(r.c.status, sa.func.count().label("runs")).group_by(r.c.status))}
        procs = _processes(app, tx, now)
        shown = _keys(app, tx, now, keys, busy_only)
        h = schema.halt_hooks
        hooks = {row.status: row.hooks for row in tx.execute(
            sa.select(h.c.status, sa.func.count().label("hooks")).group_by(h.c.status))}
        failed = [(row.run_id, row.klass, row.error_klass, row.error_message) for row in tx.execute(
            sa.select(h.c.run_id, h.c.klass, h.c.error_klass, h.c.error_message)
            .where(h.c.status == "failed").order_by(h.c.completed_at.desc()).limit(FAILED_HOOKS_SHOWN))]
    return Status(now, runs, procs, shown, hooks, failed,
                  {family: entry.concurrency for family, entry in app.config.families.items()})


def process_statuses(app: App) -> tuple[datetime, list[ProcessStatus]]:
    """The database time and every process row, as :func:`snapshot` reports them, in a
    read-only transaction of their own (the dashboard's processes page)."""
    with app.begin(readonly=True) as tx:
        return tx.now, _processes(app, tx, tx.now)


def _processes(app: App, tx: Tx, now: datetime) -> list[ProcessStatus]:
    p, cfg = schema.processes, app.config.supervisor
    procs = []
    for row in tx.execute(sa.select(p.c.id, p.c.role, p.c.label, p.c.machine_identifier, p.c.pid,
                                    p.c.os_start_ticks, p.c.last_heartbeat_at).order_by(p.c.label)):
        age = (now - row.last_heartbeat_at).total_seconds()
        stale = age >= cfg.reaper_timeout  # as reaper.reap_dead
        procs.append(ProcessStatus(row.id, row.role, row.label, host_name(row.machine_identifier), row.pid,
                                   age, stale, late=not stale and age > 2 * cfg.heartbeat_interval,
                                   dead=proven_dead(row.machine_identifier, row.pid, row.os_start_ticks)))
    return procs


def key_statuses(app: App, *, keys: Collection[str] | None = None, busy_only: bool = False, contains: str = "",
                 offset: int = 0, limit: int | None = None) -> tuple[datetime, int, list[KeyStatus]]:
    """Limit keys as :func:`snapshot` reports them, in a read-only transaction of their own:
    the database time, how many keys match, and those from ``offset`` (at most ``limit``)
    in key order. ``keys`` and ``busy_only`` as for :func:`snapshot`; ``contains``: only
    keys whose name contains it. Only the keys returned are built (their buckets refilled),
    so a page of 100 of 10⁴ keys costs the headers' scan, not 10⁴ keys."""
    with app.begin(readonly=True) as tx:
        matched: list[Any] = []
        shown = _keys(app, tx, tx.now, keys, busy_only, contains=contains, window=(offset, limit), matched=matched)
        return tx.now, len(matched), shown


def _keys(app: App, tx: Tx, now: datetime, names: Collection[str] | None, busy_only: bool, *, contains: str = "",
          window: tuple[int, int | None] = (0, None), matched: list[Any] | None = None) -> list[KeyStatus]:
    """The limit keys asked for, in key order: four statements for all of them (in flight
    and pending are counts over the partial indexes ``ix_execution_inflight_key`` and
    ``ix_execution_pending_lane``), never one per key; no key lock. ``matched`` gets every
    matching header, of which ``window`` (offset, limit) is built."""
    k, e = schema.limit_keys, schema.executions
    counts = {what: _counts(tx, column, names)
              for what, column in (("in_flight", e.c.inflight_key), ("pending", e.c.pending_lane))}
    headers = sa.select(k.c.key, k.c.blocked_until, k.c.seq).order_by(k.c.key)
    rows = tx.execute(headers if names is None else headers.where(k.c.key.in_(names))).all()
    if busy_only:  # filtered here: the busy keys may be too many for one IN list
        rows = [row for row in rows if row.key in counts["in_flight"] or row.key in counts["pending"]
                or (row.blocked_until is not None and row.blocked_until > now)]
    rows = [row for row in rows if contains in row.key]
    if matched is not None:
        matched.extend(rows)
    start, size = window
    rows = rows[start:] if size is None else rows[start:start + size]
    stored = _stored_buckets(tx, [row.key for row in rows])
    return [_key(app, row, counts["in_flight"].get(row.key, 0), counts["pending"].get(row.key, 0),
                 stored.get(row.key, {}), now) for row in rows]


def _counts(tx: Tx, column: sa.ColumnElement[Any], names: Collection[str] | None) -> dict[str, int]:
    """Executions per key of a generated lane column (in flight, pending): one statement."""
    query = sa.select(column.label("key"), sa.func.count().label("n")).where(column.is_not(None))
    return {row.key: row.n for row in tx.execute(
        (query if names is None else query.where(column.in_(names))).group_by(column))}


def _stored_buckets(tx: Tx, keys: list[str]) -> dict[str, dict[int, buckets.Bucket]]:
    """The stored buckets of these keys (of all keys, when they are many: one statement)."""
    b = schema.limit_buckets
    stored: dict[str, dict[int, buckets.Bucket]] = {}
    query = sa.select(b.c.key, b.c.period_s, b.c.level_units, b.c.refilled_at_us)
    if len(keys) <= FEW_KEYS:
        query = query.where(b.c.key.in_(keys))
    for row in tx.execute(query):
        stored.setdefault(row.key, {})[row.period_s] = buckets.Bucket(row.period_s, row.level_units,
                                                                      row.refilled_at_us)
    return stored


def _key(app: App, header: Any, running: int, pending: int, stored: dict[int, buckets.Bucket],
         now: datetime) -> KeyStatus:
    entry = app.config.entry_for(header.key)
    shown = []
    for rate in (entry.rates if entry else ()):
        bucket = stored.get(rate.per_s)
        level = buckets.refill(bucket, rate, to_us(now)).level_units if bucket else 0
        shown.append((rate.per_s, Fraction(level, rate.units_per_token), rate.burst))
    return KeyStatus(header.key, running, pending, entry.concurrency if entry else None, shown,
                     header.blocked_until, entry is not None, claims=(int(header.seq) + running) // 2)


def execution_outcomes(app: App) -> dict[str, int]:
    """Executions by outcome (``success``, ``failure``, ``timed_out``, ``process_crashed``),
    and those not ended yet as ``pending`` (not claimed) and ``running`` (claimed): one
    read-only statement over the whole executions table (a pruned run's are gone)."""
    e = schema.executions
    state = sa.case((e.c.outcome.is_not(None), e.c.outcome), (e.c.claimed_at.is_(None), "pending"),
                    else_="running").label("state")
    with app.begin(readonly=True) as tx:
        return {row.state: row.n for row in tx.execute(
            sa.select(state, sa.func.count().label("n")).group_by(state))}


def key_refusals(app: App) -> dict[tuple[str, str], int]:
    """Claims each key's limits refused, per (key, reason: ``concurrency`` or ``rate``),
    fleet-wide: one read-only statement of ``ductwork_key_refusals``, which each worker
    process's heartbeat adds its counts to (``fleet.shared.Refusals``). A refusal a
    process counted after its last heartbeat is not there yet, and is lost if the process
    dies. A poll that passes over a key known full or rate-blocked (the lane scan) makes
    no claim, so no refusal: these are the claims the key's lock refused."""
    t = schema.key_refusals
    with app.begin(readonly=True) as tx:
        return {(row.key, row.reason): row.refusals
                for row in tx.execute(sa.select(t.c.key, t.c.reason, t.c.refusals).order_by(t.c.key, t.c.reason))}


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
    return "\n".join([*lines, "", "limit keys:", *_limit_key_lines(status)])


def _limit_key_lines(status: Status) -> list[str]:
    """The static keys, then each family with its busiest partitions (:data:`TOP_PARTITIONS`)."""
    lines: list[str] = []
    partitions: dict[str, list[KeyStatus]] = {family: [] for family in status.families}
    static: list[KeyStatus] = []
    for key in status.keys:
        if key.key not in status.families:  # (a family's own row is its partitions' lock, not a key)
            family = family_of_key(key.key, status.families)
            (static if family is None else partitions[family]).append(key)
    if not static and not status.families:
        lines.append("  (none)")
    for key in static:
        lines += _key_lines(key, status.now, "  ")
    for family, ceiling in status.families.items():
        members = sorted(partitions[family], key=lambda k: (-k.in_flight, -k.pending, k.key))
        in_flight = sum(k.in_flight for k in members)
        lines.append(f"  family {family}: {len(members)} partitions, "
                     f"{in_flight}{'' if ceiling is None else f'/{ceiling}'} in flight, "
                     f"{sum(k.pending for k in members)} pending")
        for key in members[:TOP_PARTITIONS]:
            lines += _key_lines(key, status.now, "    ")
        if len(members) > TOP_PARTITIONS:
            lines.append(f"    … and {len(members) - TOP_PARTITIONS} more partitions")
    return lines


def _key_lines(key: KeyStatus, now: datetime, indent: str) -> list[str]:
    limit = "unlimited (no config entry)" if not key.configured else (
        f"{key.in_flight}/{key.concurrency} in flight" if key.concurrency else f"{key.in_flight} in flight")
    lines = [f"{indent}{key.key}: {limit}, {key.pending} pending"]
    for period, tokens, burst in key.buckets:
        lines.append(f"{indent}  rate per {period}s: {float(tokens):.3f} of {burst} tokens")
    if key.blocked_until is not None and key.blocked_until > now:
        lines.append(f"{indent}  blocked until {key.blocked_until.isoformat(sep=' ')} "
                     f"({(key.blocked_until - now).total_seconds():.3f}s from now)")
    return lines
