"""The reaper: recovering the claims of processes that died.

    >>> reap_dead(app, own_process_id)         # every supervisor tick
    ['0192…']
    >>> sweep_orphans(app)

A process is dead to the fleet when its heartbeat (database time) is older than
``supervisor.reaper_timeout``, or, on its own machine, as soon as its OS process is
provably gone (:func:`proven_dead`: same boot and pid namespace, and no live
process with its pid and start time), so a crash and restart on one host frees the
crashed fleet's claims within a supervisor tick instead of ``reaper_timeout``. What
its steps started is killed first: every process that still carries its mark
(``tree.kill_marked``) [INV-EXE-5]. :func:`reap` recovers what it
held and deletes its row, in one transaction: each open execution is crashed
(re-run or failed by the crash budget) and each open advancement closed as a
crash with its branch released, token-guarded, so a fresh advancer re-runs the
transition from scratch [INV-EXE-1], and each ``on_halt`` hook it was running crashed
(re-run within the crash budget) [INV-HLT-2]. It is idempotent: of several supervisors
racing, one reaps and the rest find nothing.

Locks are taken in the order every other transaction uses (limit keys, then
branches, then the process row), so a reap never deadlocks with a claim.

Deleting the row nullifies ``process_id`` on claims that raced in after the reap
read them; :func:`sweep_orphans` crashes those after three reaper timeouts.
Never reaps the caller's own row. Each crashed execution is logged at WARNING once
the reap has committed. Not done here: killing processes (the supervisor does
that before it force-reaps a child it has proof is dead).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.db.hosts import machine_identifier, os_process_gone, pid_namespace
from ductwork.fleet import tree
from ductwork.limits.executions import lock_key
from ductwork.pipelines.branches import PROCESS_CRASH, release_advancement
from ductwork.pipelines.hooks import HookEnded, crash_hooks_of, log_ended
from ductwork.pipelines.outcomes import crash_in

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

log = logging.getLogger("ductwork.reaper")

ORPHANED = "ductwork.OrphanedClaim"
ABANDONED = "ductwork.AbandonedClaim"
#: how old a claim of a live process that none of its threads holds must be before its
#: reconciliation crashes it (a thread may not have registered a claim it just made)
RECONCILE_GRACE_S = 5.0
#: how long the processes a dead process left get to die after SIGKILL
KILL_CONFIRM_S = 5.0
_p, _e, _a, _b, _h = schema.processes, schema.executions, schema.advancements, schema.branches, schema.halt_hooks


def _stale_before(app: Database, tx: Tx, factor: int = 1) -> datetime:
    return tx.now - timedelta(seconds=app.config.supervisor.reaper_timeout * factor)


def reap_dead(app: Database, own_process_id: str | None, *, stale: bool = True) -> list[str]:
    """Reap every process that is dead (never our own): its heartbeat is older than
    ``reaper_timeout`` (unless ``stale`` is False), or it is of this machine and its OS
    process is provably gone.

    A provably dead process is reaped at once (``force``), after what its steps started
    is killed; if some of that will not die, it waits for the next call."""
    with app.begin(readonly=True) as tx:
        old = _p.c.last_heartbeat_at <= _stale_before(app, tx) if stale else sa.false()
        here = sa.and_(_p.c.machine_identifier == machine_identifier(), _p.c.os_start_ticks.is_not(None))
        stmt = sa.select(_p.c.id, _p.c.pid, _p.c.machine_identifier, _p.c.os_start_ticks, old.label("stale"))
        stmt = stmt.where(sa.or_(old, here))
        if own_process_id is not None:
            stmt = stmt.where(_p.c.id != own_process_id)
        rows = tx.execute(stmt).all()
    reaped = []
    for row in rows:
        proof = proven_dead(row.machine_identifier, row.pid, row.os_start_ticks)
        if proof and not _left_nothing(row):
            continue  # [INV-EXE-5] what its steps started still runs: its claims wait
        # without proof, the reap re-checks the staleness under the row's lock
        if (proof or row.stale) and reap(app, row.id, force=proof):  # [INV-EXE-1] a dead process's claims
            reaped.append(row.id)
    return reaped


def proven_dead(identifier: str, pid: int, start_ticks: int | None) -> bool:
    """Whether the OS process a row names is provably gone: the row is of this machine,
    boot and pid namespace (its ``machine_identifier`` is ours, and names a namespace),
    it recorded its start time, and no process with that pid and start time lives.

    False in every case of doubt (another machine or container, a row without a start
    time, a ``/proc`` that cannot say): such a row waits for ``reaper_timeout`` as any
    other. Two containers with one host name have different pid namespaces, so neither
    ever proves the other's processes dead [INV-EXE-5]."""
    return (start_ticks is not None and bool(pid_namespace())
            and identifier == machine_identifier()  # [INV-EXE-5] this machine, boot and pid namespace only
            and os_process_gone(pid, start_ticks))  # [INV-EXE-5] by start time, not only by pid


def _left_nothing(row: sa.Row[Any]) -> bool:
    """Kill what the dead process's steps started and say whether all of it is gone
    [INV-EXE-5]: a claim is never handed on while its step's subprocess runs."""
    mark = tree.owner_mark(row.pid, row.os_start_ticks)
    killed = tree.kill_marked(mark)
    if killed:
        log.warning("killed %d processes left by dead process %s: %s", len(killed), row.id, killed)
    survivors = tree.wait_gone(killed, KILL_CONFIRM_S)
    if survivors:
        log.error("processes left by dead process %s did not die after SIGKILL: %s; its claims wait",
                  row.id, survivors)
    return not survivors


@dataclass(frozen=True)
class Claims:
    """Whose claims a recovery takes, and how it records them.

    ``process_id``: the holder (None: orphans, whose process row was deleted).
    ``before``: only claims made at or before this database time (None: all of them).
    ``held``: claims the holder's threads still hold (a live process's): left alone.
    ``klass`` and ``message``: the crash recorded on each execution and advancement."""

    process_id: str | None
    klass: str
    message: str
    before: datetime | None = None
    held: frozenset[str] = frozenset()


@dataclass
class Recovered:
    """What one recovery crashed: to log once its transaction committed."""

    executions: list[logs.StepEnded] = field(default_factory=list)
    advancements: int = 0
    hooks: list[HookEnded] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.executions) + self.advancements + len(self.hooks)

    def log(self) -> None:
        for event in self.executions:
            logs.step_ended(log, event)
        log_ended(self.hooks)


@dataclass(frozen=True)
class Found:
    """The open claims a recovery takes, read and locked (:func:`find`)."""

    claims: Claims
    executions: list[str]
    advancements: list[sa.Row[Any]]
    hooks: list[str]


def find(tx: Tx, claims: Claims) -> Found:
    """Read the open executions, advancements and running ``on_halt`` hooks that ``claims``
    names, and lock what recording them needs, in the one order ([lock order]): the
    executions' limit keys (sorted), then the advancements' branches (sorted). Writes
    nothing: :func:`recover` does, and a caller may lock more in between (its process
    row, after the branches)."""
    def whose(column: sa.Column[Any]) -> sa.ColumnElement[bool]:
        return column.is_(None) if claims.process_id is None else column == claims.process_id

    def old(column: sa.Column[Any]) -> sa.ColumnElement[bool]:
        return sa.true() if claims.before is None else column <= claims.before

    executions = [row for row in tx.execute(
        sa.select(_e.c.id, _e.c.limit_key)
        .where(whose(_e.c.process_id), _e.c.claimed_at.is_not(None), _e.c.completed_at.is_(None),
               old(_e.c.claimed_at))  # (a claim made since may not be registered by its thread yet)
        .order_by(_e.c.id)  # re-runs are created in the order their executions were
    ) if row.id not in claims.held]
    advancements = [row for row in tx.execute(
        sa.select(_a.c.id, _a.c.branch_id, _a.c.claim_token)
        .where(whose(_a.c.process_id), _a.c.completed_at.is_(None), old(_a.c.started_at))
    ) if row.id not in claims.held]
    hooks = [hook for hook in tx.execute(sa.select(_h.c.id).where(
        whose(_h.c.process_id), _h.c.status == "running", old(_h.c.claimed_at)).order_by(_h.c.id)).scalars()
        if hook not in claims.held]
    for key in sorted({row.limit_key for row in executions if row.limit_key}):
        lock_key(tx, key)  # [INV-LIM-1] [lock order] key locks first
    for branch_id in sorted({row.branch_id for row in advancements}):  # [lock order] then branches
        tx.execute(dialects.for_update(sa.select(_b.c.id).where(_b.c.id == branch_id), tx.conn))
    return Found(claims, [row.id for row in executions], advancements, hooks)


def recover(app: Database, tx: Tx, found: Found) -> Recovered:
    """Inside ``tx``, which :func:`find` locked for them: crash every execution, release
    every advancement and crash every hook found; the one recovery routine of the reap,
    the orphan sweep and a live process's reconciliation. Each is guarded (still open,
    still the holder's), so of several recoveries racing one records each claim
    [INV-EXE-2]; returns what it recorded, to log once ``tx`` committed."""
    claims, recovered = found.claims, Recovered()
    for execution_id in found.executions:
        # [INV-EXE-1] a dead owner's execution is re-run (or failed by budget), never lost
        event = crash_in(app, tx, execution_id, claims.process_id, claims.klass, claims.message)
        if event is not None:  # None: its owner recorded it after the read (a race)
            recovered.executions.append(event)
    for row in found.advancements:
        release_advancement(tx, row.id, row.branch_id, row.claim_token, claims.message)
    recovered.advancements = len(found.advancements)
    if found.hooks:  # [INV-HLT-2] a dead worker's hook is re-run
        recovered.hooks = crash_hooks_of(app, tx, found.hooks)  # [INV-HLT-2] re-run within its budget
    return recovered


def reap(app: Database, process_id: str, *, force: bool) -> bool:
    """Recover a process's claims (:func:`recover`) and delete its row, in one
    transaction. ``force`` skips the staleness test (for callers with proof of death).
    Returns False when there was nothing to reap."""
    with app.begin() as tx:
        found = find(tx, Claims(process_id, PROCESS_CRASH, "Reaped from a dead process"))
        stmt = sa.select(_p.c.id).where(_p.c.id == process_id)
        if not force:
            stmt = stmt.where(_p.c.last_heartbeat_at <= _stale_before(app, tx))
        if tx.execute(dialects.for_update(stmt, tx.conn)).first() is None:  # [lock order] the row after the branches
            return False  # gone (another reaper won) or no longer stale: nothing written
        recovered = recover(app, tx, found)
        faults.hit(faults.DURING_REAP)
        # Deleting the row nullifies process_id on claims that raced in after our read;
        # they are the orphan sweep's.
        tx.execute(_p.delete().where(_p.c.id == process_id))
    recovered.log()  # committed: now they may be told
    # (a process removing its own row at a clean stop recovers nothing: not worth an INFO line)
    log.log(logging.INFO if recovered.count else logging.DEBUG, "reaped process %s: %d executions, %d advancements",
            process_id, len(found.executions), recovered.advancements)
    return True


def sweep_orphans(app: Database) -> int:
    """Recover claims whose process row vanished (``process_id`` NULL) three reaper
    timeouts after they were made (:func:`recover`): a claim that raced in as its process
    was reaped, while that process may still run its body until its lease runs out."""
    with app.begin() as tx:
        claims = Claims(None, ORPHANED, "Orphaned claim swept", before=_stale_before(app, tx, factor=3))
        recovered = recover(app, tx, find(tx, claims))
    recovered.log()
    return recovered.count


def reconcile(app: Database, process_id: str, held: set[str], grace_s: float = RECONCILE_GRACE_S) -> int:
    """Recover claims recorded under this live process that none of its threads holds
    (:func:`recover`).

    They arise when a transaction's commit reached the database but its
    acknowledgement did not (a killed connection), or when a thread's cleanup could
    not reach the database: the process lives, so no reaper would ever take them.
    Claims younger than ``grace_s`` are left alone (their thread may not have
    registered them yet). Executions and on_halt hooks are crashed (re-run within the
    crash budget), advancements closed and their branches released, token-guarded.
    """
    with app.begin() as tx:
        claims = Claims(process_id, ABANDONED, "Claim held by no thread of its process",
                        before=tx.now - timedelta(seconds=grace_s), held=frozenset(held))
        recovered = recover(app, tx, find(tx, claims))
    recovered.log()
    if recovered.count:
        log.warning("reconciled %d executions, %d advancements and %d on_halt hooks held by no thread",
                    len(recovered.executions), recovered.advancements, len(recovered.hooks))
    return recovered.count
