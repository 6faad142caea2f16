"""Which machine this is, and how many other job workers the database has: the read side
of process rows that the layers below the fleet need (``Pipeline.trigger`` asks before
it stores a run whose classes only this process can import).

Not done here: registering, heartbeating or reaping process rows (``ductwork.fleet``).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork.db import schema

if TYPE_CHECKING:
    from ductwork.db.database import Database as App


def machine_identifier() -> str:
    """``HOST/MACHINE-ID``: the host name, then ``/etc/machine-id`` when readable.

    The host name is what people recognise (``ductwork status`` shows it, see
    :func:`~ductwork.fleet.processes.host_name`); the machine id keeps apart two hosts
    that share a name, and the host name keeps apart containers whose image carries one
    machine id.
    """
    try:
        value = Path("/etc/machine-id").read_text().strip()
    except OSError:
        value = ""
    host = socket.gethostname()
    return f"{host}/{value}"[:255] if value else host[:255]


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
