"""Process rows: who holds claims, and whether they are alive.

    >>> pid = register(app, role="job_worker", label="worker-1")
    >>> heartbeat(app, pid)
    True

Every claim (execution or branch) records the process row of its holder. A
process proves it is alive by writing ``last_heartbeat_at`` from the database
clock [INV-CLK-1]; the reaper treats a row whose heartbeat is older than
``supervisor.reaper_timeout`` as dead and recovers its claims. Registering a
(host, pid, label) that already has a row means the OS reused the pid: the old
incarnation is dead, so its claims are recovered first, even if its heartbeat
looks fresh.

Not done here: deciding who is stale (reaper.py) or killing anything (supervisor.py).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork import schema
from ductwork.ids import new_id

if TYPE_CHECKING:
    from ductwork.app import App


def machine_identifier() -> str:
    """``/etc/machine-id`` when readable, else the host name."""
    try:
        value = Path("/etc/machine-id").read_text().strip()
    except OSError:
        value = ""
    return value or socket.gethostname()


def register(app: App, *, role: str, label: str | None = None, pid: int | None = None) -> str:
    """Create this process's row and return its id, recovering a previous incarnation's claims."""
    from ductwork.reaper import reap

    pid = os.getpid() if pid is None else pid
    label = label or role
    host = machine_identifier()
    with app.begin() as tx:
        previous = tx.execute(
            sa.select(schema.processes.c.id).where(
                schema.processes.c.machine_identifier == host,
                schema.processes.c.pid == pid,
                schema.processes.c.label == label,
            )
        ).scalar_one_or_none()
    if previous is not None:
        reap(app, previous, force=True)
    process_id = new_id()
    with app.begin() as tx:
        tx.execute(
            schema.processes.insert().values(
                id=process_id, pid=pid, machine_identifier=host, label=label, role=role,
                last_heartbeat_at=tx.now, created_at=tx.now, updated_at=tx.now,
            )
        )
    return process_id


def heartbeat(app: App, process_id: str) -> bool:
    """Stamp the row with database now. False when the row is gone (it was reaped)."""
    with app.begin() as tx:
        result = tx.execute(
            schema.processes.update()
            .where(schema.processes.c.id == process_id)
            .values(last_heartbeat_at=tx.now, updated_at=tx.now)  # [INV-CLK-1] database time
        )
        return result.rowcount == 1


def alive(app: App, process_id: str) -> bool:
    with app.begin() as tx:
        return tx.execute(
            sa.select(schema.processes.c.id).where(schema.processes.c.id == process_id)
        ).first() is not None


def other_job_workers(app: App) -> int:
    """How many job worker processes other than this OS process are alive on the database.

    Alive: a ``job_worker`` row whose heartbeat is younger than ``supervisor.reaper_timeout``
    (the reaper's own test). Rows of this process (same host and pid: threads or an
    embedded runner) do not count. A snapshot: a worker may start right after.
    """
    p = schema.processes
    with app.begin(readonly=True) as tx:
        since = tx.now - timedelta(seconds=app.config.supervisor.reaper_timeout)
        return int(tx.execute(
            sa.select(sa.func.count()).select_from(p)
            .where(p.c.role == "job_worker",
                   p.c.last_heartbeat_at > since,  # alive, as the reaper judges it
                   sa.not_(sa.and_(p.c.machine_identifier == machine_identifier(),
                                   p.c.pid == os.getpid())))  # not this process
        ).scalar_one())
