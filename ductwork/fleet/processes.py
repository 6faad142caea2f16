"""Process rows: who holds claims, and whether they are alive.

    >>> pid = register(app, role="job_worker", label="worker-1")
    >>> heartbeat(app, pid)
    True

Every claim (execution or branch) records the process row of its holder. A
process proves it is alive by writing ``last_heartbeat_at`` from the database
clock [INV-CLK-1]; the reaper treats a row whose heartbeat is older than
``supervisor.reaper_timeout`` as dead and recovers its claims. A row also names its OS
process for ever (machine, boot, pid namespace, pid and start time), so a supervisor on
the same machine reaps it as soon as that process is gone (``reaper.proven_dead``), without
waiting for the heartbeat to go stale. Registering a (host, pid, label) that already has
a row means the OS reused the pid: the old incarnation is dead, so its claims are
recovered first, even if its heartbeat looks fresh.

Not done here: deciding who is stale (reaper.py) or killing anything (supervisor.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork.db import dialects, schema
from ductwork.db.hosts import machine_identifier, os_start_ticks, pid_alive, pid_namespace, rows_of_os_process
from ductwork.db.ids import new_id

if TYPE_CHECKING:
    from ductwork.db.database import Database

_p = schema.processes


def host_name(identifier: str) -> str:
    """The host name in a :func:`machine_identifier` (rows written before it carried
    one hold only the machine id, which is returned as it is)."""
    return identifier.split("/", 1)[0]


def supervisors_on_this_host(app: Database) -> list[sa.Row[Any]]:
    """Other live supervisors of this database on this host: rows with role
    ``supervisor``, this host's identifier, a heartbeat younger than ``reaper_timeout``
    and a pid that exists (``id``, ``pid``, ``label``, ``machine_identifier``).

    Two on one host is legal (they share the work, as on two hosts) but is usually a
    ``ductwork start`` left running; ``ductwork start`` warns. Not done: telling a
    reused pid from the supervisor itself (a fresh heartbeat makes that unlikely).
    """
    with app.begin(readonly=True) as tx:
        since = tx.now - timedelta(seconds=app.config.supervisor.reaper_timeout)
        rows = tx.execute(
            sa.select(_p.c.id, _p.c.pid, _p.c.label, _p.c.machine_identifier)
            .where(_p.c.role == "supervisor", _p.c.machine_identifier == machine_identifier(),
                   _p.c.pid != os.getpid(), _p.c.last_heartbeat_at > since)
            .order_by(_p.c.label)
        ).all()
    return [row for row in rows if pid_alive(row.pid)]


def same_host_warning(row: sa.Row[Any]) -> str:
    """What ``ductwork start`` prints for a row of :func:`supervisors_on_this_host`."""
    return (f"another ductwork supervisor of this database is running on this host "
            f"({host_name(row.machine_identifier)}): pid {row.pid}, label {row.label!r}; both will "
            "share the work (right for a fleet of hosts, usually a mistake on one host)")


def register(app: Database, *, role: str, label: str | None = None, pid: int | None = None) -> str:
    """Create this process's row and return its id, recovering a previous incarnation's claims."""
    from ductwork.fleet.reaper import reap

    pid = os.getpid() if pid is None else pid
    label = label or role
    with app.begin() as tx:
        previous = tx.execute(sa.select(_p.c.id).where(*rows_of_os_process(pid), _p.c.label == label)
                              ).scalar_one_or_none()
    if previous is not None:
        reap(app, previous, force=True)
    process_id = new_id()
    with app.begin() as tx:
        tx.execute(
            _p.insert().values(
                id=process_id, pid=pid, machine_identifier=machine_identifier(), label=label, role=role,
                os_start_ticks=os_start_ticks(pid) if pid_namespace() else None,
                last_heartbeat_at=tx.now, created_at=tx.now, updated_at=tx.now,
            )
        )
    return process_id


def heartbeat(app: Database, process_id: str, refusals: Mapping[tuple[str, str], int] | None = None) -> bool:
    """Stamp the row with database now, and add ``refusals`` (key and reason -> claims
    refused since the last heartbeat: ``shared.Refusals``) to the fleet-wide counts in the
    same transaction, one upsert each. False when the row is gone (it was reaped)."""
    with app.begin() as tx:
        result = tx.execute(
            _p.update()
            .where(_p.c.id == process_id)
            .values(last_heartbeat_at=tx.now, updated_at=tx.now)  # [INV-CLK-1] database time
        )
        for (key, reason), n in sorted((refusals or {}).items()):  # one order: two heartbeats never deadlock
            tx.execute(dialects.upsert(tx.conn, schema.key_refusals, ["key", "reason"],
                                       {"key": key, "reason": reason, "refusals": n}, ["refusals"], add=True))
        return result.rowcount == 1
