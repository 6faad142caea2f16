"""The reaper: recovering the claims of processes that died.

    >>> reap_stale(app, own_process_id)        # every supervisor tick
    ['0192…']
    >>> sweep_orphans(app)

A process whose heartbeat (database time) is older than
``supervisor.reaper_timeout`` is dead to the fleet. :func:`reap` recovers what it
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
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.limits.executions import crash_in, lock_key, record_crash
from ductwork.pipelines.advance import PROCESS_CRASH, release_advancement
from ductwork.pipelines.hooks import crash_hooks_of, log_ended

if TYPE_CHECKING:
    from ductwork.db.database import Database as App
    from ductwork.db.database import Tx

log = logging.getLogger("ductwork.reaper")

ORPHANED = "ductwork.OrphanedClaim"
_p, _e, _a, _b = schema.processes, schema.executions, schema.advancements, schema.branches


def _stale_before(app: App, tx: Tx, factor: int = 1) -> object:
    return tx.now - timedelta(seconds=app.config.supervisor.reaper_timeout * factor)


def reap_stale(app: App, own_process_id: str | None) -> list[str]:
    """Reap every process whose heartbeat is older than ``reaper_timeout`` (never our own)."""
    with app.begin(readonly=True) as tx:
        stmt = sa.select(_p.c.id).where(_p.c.last_heartbeat_at <= _stale_before(app, tx))
        if own_process_id is not None:
            stmt = stmt.where(_p.c.id != own_process_id)
        ids = list(tx.execute(stmt).scalars())
    return [pid for pid in ids if reap(app, pid, force=False)]


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
