"""Process trees: no step code, and nothing a step started, outlives the process that ran it.

    >>> die_with_parent(signal.SIGTERM)      # a runner stops when its supervisor dies
    >>> become_subreaper()                   # orphans of a dead runner become ours ...
    >>> kill_adopted(known={runner.pid})     # ... and are killed before its claims are reaped

A step may start subprocesses (a converter, a shell pipeline, a browser). When the
process that ran the step is gone, its claim is re-run elsewhere [INV-EXE-5], so what
the step started must be gone too, or the old attempt keeps producing effects beside
the new one. Five cases, five mechanisms:

- **A timed-out ``timeout=`` step** runs in its own session; the parent SIGKILLs the
  whole process group, and first every descendant it can see, so a subprocess that
  called ``setsid`` (left the group) dies too (``fleet/child.py``).
- **A runner that dies** (SIGKILL, OOM, its lease lost): the supervisor is a *child
  subreaper* (``PR_SET_CHILD_SUBREAPER``), so the runner's orphaned descendants are
  re-parented to it instead of to init; it kills and reaps every child of its own that
  is not one of its runners before it reaps the dead runner's claims. A runner that
  exits on a lost lease or with threads still busy kills its own descendants first.
- **A supervisor that dies**: each runner asked the kernel for SIGTERM when its parent
  dies (``PR_SET_PDEATHSIG``) and shuts down as if ``ductwork start`` had been stopped.
- **A whole host's fleet that dies at once** (``kill -9`` of the process group, then a
  restart): every process a runner's steps start carries the runner's *mark* in its
  environment (``DUCTWORK_STEP_OWNER``, inherited by its own children); the supervisor
  that proves the runner gone kills every process still carrying its mark before it
  reaps the runner's claims (``reaper.reap_dead``).
- **A worker with no supervisor that dies** (an adopter's process that runs ``drain()`` or
  ``Worker.run_once`` itself, SIGKILLed): nothing above it adopts orphans, so a
  ``timeout=`` step's child is a *keeper*, a subreaper that runs the step in a process of
  its own and, told of the worker's death (``PR_SET_PDEATHSIG``), kills everything below
  it before it exits (``fleet/child.py``). A step without ``timeout=`` runs in the
  adopter's own process: what it started is out of reach once that process is killed.

Not done: this is Linux only (``prctl`` and ``/proc``); elsewhere each function does
nothing and says so by its return value. A process that leaves the tree entirely
(double-forks while its parent is not a subreaper, or is started through another
service such as systemd or Docker) is out of reach, unless it kept its environment's
mark; one started with a cleared environment, or as another user whose environment
cannot be read, loses the mark. Killing is SIGKILL: a step's
subprocess gets no chance to clean up; a step that needs one should stop its
subprocesses itself (``try/finally``) within its ``timeout=``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

from ductwork.db.hosts import os_process_gone, os_start_ticks, stat_fields

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")
#: the environment variable that marks what a step started with the OS process that
#: ran the step (:func:`owner_mark`): a runner sets it for itself, a ``timeout=`` step's
#: child is given its parent's, and every process started below inherits it
OWNER_ENV = "DUCTWORK_STEP_OWNER"


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when the thread that started it
    exits. False when the platform cannot (not Linux).

    The caller must then check that its parent is still the one that started it: a parent
    that died before this call sent nothing."""
    return _prctl(PR_SET_PDEATHSIG, int(sig))


def become_subreaper() -> bool:
    """Make this process the one orphaned descendants are re-parented to (instead of init),
    so :func:`kill_adopted` can find them. False when the platform cannot."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc (empty when there is no /proc)."""
    out: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(PROC):
            fields = stat_fields(entry.name) if entry.name.isdigit() else None
            if fields:  # (None: exited meanwhile) "state ppid ...", after the command name
                out[int(entry.name)] = int(fields[1])
    return out


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` now."""
    return sorted(child for child, parent in _parents().items() if parent == pid)


def descendants(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every process below ``pid`` in the tree now (children first), ``pid`` excluded;
    ``parents``: a :func:`_parents` read already taken, so one walk of /proc serves many."""
    parents = _parents() if parents is None else parents
    below: dict[int, list[int]] = {}
    for child, parent in parents.items():
        below.setdefault(parent, []).append(child)
    out: list[int] = []
    frontier = [pid]
    while frontier:
        frontier = sorted(c for p in frontier for c in below.get(p, ()) if c not in out and c != pid)
        out.extend(frontier)
    return out


def kill(pids: list[int]) -> None:
    """SIGKILL each pid that still exists (one that exited meanwhile is skipped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_descendants() -> list[int]:
    """SIGKILL every descendant of this process (a runner about to exit with step code
    possibly running). Returns the pids signalled."""
    found = descendants(os.getpid())
    kill(found)
    return found


def kill_adopted(known: set[int]) -> list[int]:
    """SIGKILL and reap every child of this process that is not in ``known`` (its own
    runners), with their descendants: the orphans a dead runner's steps left, re-parented
    here by :func:`become_subreaper`. Returns the children killed.

    Only pids outside ``known`` are waited for, so the runners' exit statuses stay
    their ``Popen`` objects' to collect."""
    parents = _parents()  # one walk of /proc for the children and all their descendants
    me = os.getpid()
    adopted = sorted(pid for pid, parent in parents.items() if parent == me and pid not in known)
    for pid in adopted:
        kill([pid, *descendants(pid, parents)])
    for pid in adopted:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return adopted


def owner_mark(pid: int, start_ticks: int) -> str:
    """The mark of the OS process with this pid and start time (this machine's boot and
    pid namespace, as a process row names it)."""
    return f"{pid}:{start_ticks}"


def own_mark() -> str | None:
    """This process's mark, or None where its start time cannot be read (not Linux)."""
    start = os_start_ticks(os.getpid())
    return None if start is None else owner_mark(os.getpid(), start)


def marked_environment() -> dict[str, str]:
    """``os.environ`` with this process's mark: the environment for a process a step
    runs in (a ``timeout=`` step's child)."""
    return {**os.environ, OWNER_ENV: mark} if (mark := own_mark()) else dict(os.environ)


def kill_marked(mark: str) -> list[int]:
    """SIGKILL every process of this namespace whose environment carries ``mark``
    (what the steps of a dead process started). Returns the pids signalled; a process
    whose environment cannot be read (another user's, exited meanwhile) is passed over."""
    wanted = f"{OWNER_ENV}={mark}".encode()
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(PROC):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):  # (another user's environment, or exited meanwhile)
                if wanted in (PROC / entry.name / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    kill(found)
    return found


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of ``pids`` runs any more (gone, or a zombie), at most
    ``timeout_s``; returns those still running then."""
    deadline = time.monotonic() + timeout_s
    while (pids := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return pids


def _running(pid: int) -> bool:
    start = os_start_ticks(pid)
    return start is not None and not os_process_gone(pid, start)
