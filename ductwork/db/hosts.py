"""Which machine and which OS process this is, and how many other job workers the
database has: the read side of process rows that the layers below the fleet need
(``Pipeline.trigger`` asks before it stores a run whose classes only this process can
import).

A process row names its OS process by ``machine_identifier`` (the host, and where Linux
tells them the boot and the pid namespace), ``pid`` and ``os_start_ticks`` (when that
process started). Together they name one OS process for ever, so a supervisor on the
same machine can prove that a row's process is gone (``ductwork.fleet.processes.
proven_dead``) without mistaking a reused pid, or a process of another container with
the same host name and pid, for it.

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
    from ductwork.db.database import Database


PROC = Path("/proc")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host: signal 0 asks the kernel (and
    sends nothing), whatever ``/proc`` shows (hidepid hides other users' pids)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # absent (not Linux, no /proc) or unreadable: not known
        return ""


def pid_namespace() -> str:
    """``BOOT-ID:PID-NAMESPACE``: this boot of the kernel and the pid namespace this
    process lives in (Linux), or "" when either cannot be told.

    A pid names one process only within its namespace (each container has its own) and
    only while the kernel runs: with both, two rows with the same pid are the same
    process or pid reuse, never two containers' processes. "" also when ``/proc`` is not
    this namespace's (its ``self`` is not this pid): a row then never proves anything.
    """
    boot = _read(PROC / "sys/kernel/random/boot_id")
    try:
        namespace = os.readlink(PROC / "self/ns/pid")  # "pid:[4026531836]"
        mine = _read(PROC / "self/stat").split(" ", 1)[0] == str(os.getpid())
    except OSError:
        return ""
    inode = namespace[namespace.find("[") + 1:namespace.rfind("]")]
    return f"{boot}:{inode}" if boot and inode.isdigit() and mine else ""


def machine_identifier() -> str:
    """``HOST/MACHINE-ID/BOOT-ID:PID-NAMESPACE``: the host name, then ``/etc/machine-id``
    and :func:`pid_namespace` when they can be read (each part left out when not).

    The host name is what people recognise (``ductwork status`` shows it, see
    :func:`~ductwork.fleet.processes.host_name`); the machine id keeps apart two hosts
    that share a name; the pid namespace keeps apart containers that share a host name
    and an image's machine id, and a boot from the one before it.
    """
    parts = [socket.gethostname()[:120], _read(Path("/etc/machine-id"))[:64], pid_namespace()]
    return "/".join(part for part in parts if part)[:255]


def stat_fields(process: int | str) -> list[str] | None:
    """``/proc/PROCESS/stat`` (``PROCESS``: a pid, or ``PID/task/TID`` for a thread) after the
    command name, from the state on; None when unreadable."""
    stat = _read(PROC / str(process) / "stat")
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    return stat[stat.rindex(")") + 2:].split() if ")" in stat else None


def os_start_ticks(pid: int) -> int | None:
    """When the process ``pid`` of this namespace started, in clock ticks after boot
    (``/proc/PID/stat``, field 22), or None when it cannot be read (no such process,
    not Linux). With the boot in :func:`machine_identifier`, the pair (pid, ticks)
    names one process: a reused pid has a later start."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None


def os_process_gone(pid: int, start_ticks: int) -> bool:
    """Whether the OS process that had ``pid`` and started at ``start_ticks`` (both of
    this machine and pid namespace) is gone: no process has the pid, or the one that has
    it started at another time (the pid was reused), or it is a zombie (exited, not yet
    waited for) with every thread dead. False whenever that cannot be told (``/proc``
    hidden or unreadable): a caller in doubt waits for the heartbeat to go stale."""
    if not pid_alive(pid):
        return True
    fields = stat_fields(pid)
    if fields is None:
        return False  # exists, but /proc does not say which process it is
    if int(fields[19]) != start_ticks:  # [INV-EXE-5] by start time: a reused pid is not the row's process
        return True  # the pid was reused by a later process
    return fields[0] in ("Z", "X") and _all_tasks_dead(pid)


def _all_tasks_dead(pid: int) -> bool:
    """Whether every thread of ``pid`` is a zombie (a leader that exited while other
    threads run is a zombie too, but its process still runs code)."""
    try:
        tasks = [entry.name for entry in os.scandir(PROC / str(pid) / "task")]
    except OSError:
        return True  # reaped meanwhile
    states = (stat_fields(f"{pid}/task/{task}") for task in tasks)
    return all(not fields or fields[0] in ("Z", "X") for fields in states)  # (a task gone meanwhile: dead)


def rows_of_os_process(pid: int) -> tuple[sa.ColumnElement[bool], ...]:
    """The predicate of the process rows of OS process ``pid`` of this machine (with
    ``ductwork_processes``' ``pid`` and ``machine_identifier``)."""
    p = schema.processes
    return p.c.pid == pid, p.c.machine_identifier == machine_identifier()


def other_job_workers(app: Database) -> int:
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
                   sa.not_(sa.and_(*rows_of_os_process(os.getpid()))))  # not this process
        ).scalar_one())
