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
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.db.hosts import machine_identifier, os_process_gone, pid_namespace
from ductwork.fleet import tree
from ductwork.limits.executions import crash_in, lock_key, record_crash
from ductwork.pipelines.advance import PROCESS_CRASH, release_advancement
from ductwork.pipelines.hooks import crash_hooks_of, log_ended

if TYPE_CHECKING:
    from ductwork.db.database import Database as App
    from ductwork.db.database import Tx

log = logging.getLogger("ductwork.reaper")

ORPHANED = "ductwork.OrphanedClaim"
#: how long the processes a dead process left get to die after SIGKILL
KILL_CONFIRM_S = 5.0
_p, _e, _a, _b = schema.processes, schema.executions, schema.advancements, schema.branches


def _stale_before(app: App, tx: Tx, factor: int = 1) -> object:
    return tx.now - timedelta(seconds=app.config.supervisor.reaper_timeout * factor)


def reap_dead(app: App, own_process_id: str | None, *, stale: bool = True) -> list[str]:
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


def reap(app: App, process_id: str, *, force: bool) -> bool:
    """Recover a process's claims and delete its row. ``force`` skips the staleness test
    (for callers with proof of death). Returns False when there was nothing to reap."""
    with app.begin() as tx:
        executions = tx.execute(
            sa.select(_e.c.id, _e.c.limit_key).where(_e.c.process_id == process_id, _e.c.completed_at.is_(None))
            .order_by(_e.c.id)  # re-runs are created in the order their executions were
        ).all()
        advancements = tx.execute(
            sa.select(_a.c.id, _a.c.branch_id, _a.c.claim_token)
            .where(_a.c.process_id == process_id, _a.c.completed_at.is_(None))
        ).all()
        # Lock order: keys, branches, then the process row (as claims and fences do).
        for key in sorted({row.limit_key for row in executions if row.limit_key}):
            lock_key(tx, key)  # [INV-LIM-1] key locks first
        for branch_id in sorted({row.branch_id for row in advancements}):
            tx.execute(dialects.for_update(sa.select(_b.c.id).where(_b.c.id == branch_id), tx.conn))
        stmt = sa.select(_p.c.id).where(_p.c.id == process_id)
        if not force:
            stmt = stmt.where(_p.c.last_heartbeat_at <= _stale_before(app, tx))
        if tx.execute(dialects.for_update(stmt, tx.conn)).first() is None:
            return False  # gone (another reaper won) or no longer stale
        crashed = []
        for row in executions:
            # [INV-EXE-1] a dead owner's execution is re-run (or failed by budget), never lost
            crashed.append(crash_in(app, tx, row.id, process_id, PROCESS_CRASH, "Reaped from a dead process"))
        for row in advancements:
            release_advancement(tx, row.id, row.branch_id, row.claim_token, "Reaped from a dead process")
        hooks = crash_hooks_of(app, tx, process_id)  # [INV-HLT-2] a dead worker's hook is re-run
        faults.hit(faults.DURING_REAP)
        # Deleting the row nullifies process_id on claims that raced in after our read;
        # they are the orphan sweep's.
        tx.execute(_p.delete().where(_p.c.id == process_id))
    for event in crashed:  # committed: now they may be told
        if event is not None:  # pragma: no branch  None: its owner recorded it after the read above (a race)
            logs.step_ended(log, event)
    log_ended(hooks)
    # (a process removing its own row at a clean stop recovers nothing: not worth an INFO line)
    log.log(logging.INFO if executions or advancements else logging.DEBUG,
            "reaped process %s: %d executions, %d advancements", process_id, len(executions), len(advancements))
    return True


def sweep_orphans(app: App) -> int:
    """Crash claims whose process row vanished (``process_id`` NULL) three reaper timeouts ago."""
    with app.begin() as tx:
        threshold = _stale_before(app, tx, factor=3)
        executions = list(tx.execute(
            sa.select(_e.c.id).where(_e.c.process_id.is_(None), _e.c.claimed_at.is_not(None),
                                     _e.c.completed_at.is_(None), _e.c.claimed_at <= threshold)
            .order_by(_e.c.id)
        ).scalars())
        advancements = tx.execute(
            sa.select(_a.c.id, _a.c.branch_id, _a.c.claim_token)
            .where(_a.c.process_id.is_(None), _a.c.completed_at.is_(None), _a.c.started_at <= threshold)
        ).all()
        for row in advancements:
            release_advancement(tx, row.id, row.branch_id, row.claim_token, "Orphaned claim swept")
        hooks = crash_hooks_of(app, tx, None, threshold)
    log_ended(hooks)
    swept = sum(record_crash(app, eid, None, ORPHANED, "Orphaned claim swept") for eid in executions)
    return swept + len(advancements) + len(hooks)
