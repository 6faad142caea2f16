"""Steps and pipelines for tests that run real processes (``ductwork start`` fleets,
``timeout=`` children, kills): they sleep, block, spawn or end their process, and write
marker lines a test reads back. A child process resolves ``"tests.workloads.processes:Nap"``
by importing this module.
"""

from __future__ import annotations

import time

from ductwork import Pipeline, Step
from tests.workloads import Gather, Items, Square

FAULT_KEY = "fault_key"
#: the collapse's key, of concurrency 1: its claim fills it
FAULT_TOTAL_KEY = "fault_total_key"


class FaultPipeline(Pipeline):
    """start → expand (keyed) → collapse (keyed by a full key, a leaf: its success ends the
    branch and the run in the transaction that records it): passes every fault checkpoint."""

    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Square, limit_by=FAULT_KEY).collapse(into=Gather, limit_by=FAULT_TOTAL_KEY)


def fault_pipeline_expected(n: int) -> dict:
    return {"Items#0": 1, "Square#1": n, "Gather#2": 1}


class Nap(Step):
    """Sleeps ``seconds`` (a stand-in for a slow call), then returns them."""

    def __init__(self, seconds):
        self.seconds = seconds

    def execute(self):
        time.sleep(self.seconds)
        return self.seconds


def mark(path, what: str, key: str) -> list[str]:
    """Append ``<what> <pid> <key>`` to the marker file at ``path`` (what :func:`marker_lines`
    reads back); returns the file's lines."""
    import os

    with open(path, "a") as marker:
        marker.write(f"{what} {os.getpid()} {key}\n")
    with open(path) as marker:
        return marker.read().splitlines()


def mark_start_and_block(path, key: str) -> None:
    """Mark ``start`` in ``path``, then sleep until the process is killed."""
    mark(path, "start", key)
    while True:
        time.sleep(0.05)


class Forever(Step):
    """Never returns: only a timeout (a killed process) ends it."""

    def __init__(self, marker_path):
        self.marker_path = marker_path

    def execute(self):
        mark_start_and_block(self.marker_path, self.idempotency_key)


class NapPipeline(Pipeline):
    """Two Naps in a chain (each sleeps the seconds it is given)."""

    @classmethod
    def define(cls, p):
        p.start(Nap).chain(to=Nap)


class ForeverPipeline(Pipeline):
    """One Forever step with ``timeout=1``: its child is killed at the timeout."""

    @classmethod
    def define(cls, p):
        p.start(Forever, timeout=1)


class RaisesInChild(Step):
    """A ``timeout=`` step that raises in its child process, naming that process's pid."""

    def __init__(self, _):
        pass

    def execute(self):
        import os

        raise ValueError(f"raised in pid {os.getpid()}")


class RaisesInChildPipeline(Pipeline):
    """One RaisesInChild step in a ``timeout=`` child."""

    @classmethod
    def define(cls, p):
        p.start(RaisesInChild, timeout=30)


class EndsItsChild(Step):
    """A ``timeout=`` step that ends its child process its own way (``how``): ``"exit"``
    leaves with ``os._exit(3)`` (no result), ``"system_exit"`` raises SystemExit,
    ``"init"`` raises in ``__init__``; ``"marker:<path>"`` writes ``start <pid> <key>`` to
    the path and sleeps until killed."""

    def __init__(self, how):
        if how == "init":
            raise KeyError("cannot build")
        self.how = how

    def execute(self):
        import os
        import sys

        if self.how == "exit":
            os._exit(3)
        if self.how == "system_exit":
            sys.exit(4)
        mark_start_and_block(self.how.removeprefix("marker:"), self.idempotency_key)


class EndsItsChildPipeline(Pipeline):
    """One EndsItsChild step in a ``timeout=`` child."""

    @classmethod
    def define(cls, p):
        p.start(EndsItsChild, timeout=30)


class Slow(Step):
    """Records ``start <pid> <idempotency_key>`` in ``job["path"]``, sleeps, records ``end``.

    Sleeps ``job["first"]`` seconds on the first attempt of the step and ``job["after"]``
    on later ones, so a test can kill the first attempt mid-step and let a retry finish.
    """

    def __init__(self, job):
        self.job = job

    def execute(self):
        lines = mark(self.job["path"], "start", self.idempotency_key)
        first = sum(1 for line in lines if line.startswith("start")) == 1
        time.sleep(self.job["first"] if first else self.job["after"])
        mark(self.job["path"], "end", self.idempotency_key)
        return self.job


class Done(Step):
    """Returns ``"done"``."""

    def __init__(self, job):
        self.job = job

    def execute(self):
        return "done"


class SlowPipeline(Pipeline):
    """Slow, then Done: an unkeyed step a test kills mid-way."""

    @classmethod
    def define(cls, p):
        p.start(Slow).chain(to=Done)


class SlowKeyedPipeline(Pipeline):
    """Slow on key ``slow_key``, then Done (the CLI's check names the key)."""

    @classmethod
    def define(cls, p):
        p.start(Slow, limit_by="slow_key").chain(to=Done)


class ForeverKeyedPipeline(Pipeline):
    """One Forever step with ``timeout=1`` on key ``forever_key``."""

    @classmethod
    def define(cls, p):
        p.start(Forever, timeout=1, limit_by="forever_key")


class Spawner(Step):
    """Starts two ``sleep 600`` subprocesses, one in its process group and one that left it
    (``setsid``), writes ``spawned <own pid> <in group> <left group>`` to ``job["path"]``,
    then sleeps ``job["seconds"]``: a test kills or times it out meanwhile."""

    def __init__(self, job):
        self.job = job

    def execute(self):
        import os
        import subprocess

        stays = subprocess.Popen(["sleep", "600"])
        leaves = subprocess.Popen(["sleep", "600"], start_new_session=True)
        with open(self.job["path"], "a") as marker:
            marker.write(f"spawned {os.getpid()} {stays.pid} {leaves.pid}\n")
        time.sleep(self.job["seconds"])
        return "slept"


class SpawnerPipeline(Pipeline):
    """One Spawner step in its worker's thread."""

    @classmethod
    def define(cls, p):
        p.start(Spawner)


class SpawnerTimeoutPipeline(Pipeline):
    """One Spawner step in a ``timeout=1`` child."""

    @classmethod
    def define(cls, p):
        p.start(Spawner, timeout=1)


class ShellSpawner(Step):
    """Starts two shells that each start a ``sleep 600`` and wait for it (``sh -c "sleep 600
    & wait"``), one shell in its process group and one that left it (``setsid``), waits
    until both have their child, writes ``shells <own pid> <shell> <its sleep> <shell that
    left> <its sleep>`` to ``job["path"]``, then sleeps ``job["seconds"]``: grandchildren of
    the step's process, for a test to kill the step's process or its parent meanwhile.

    The shells start with a cleared environment (``PATH`` only), as a step that scrubs its
    subprocesses' environment starts them: they do not carry the runner's mark, so when the
    runner dies only the supervisor's adoption (``tree.kill_adopted``) and the keeper find
    them. With the mark, the supervisor's periodic ``reap_dead`` could kill them first
    (``tree.kill_marked``), and a broken adoption would pass whenever it did."""

    def __init__(self, job):
        self.job = job

    def execute(self):
        import os
        import subprocess

        from ductwork.fleet import tree

        scrubbed = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # no mark: see the docstring
        shells = [subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=leaves, env=scrubbed)
                  for leaves in (False, True)]
        deadline = time.monotonic() + 30
        while not all(tree.children(shell.pid) for shell in shells) and time.monotonic() < deadline:
            time.sleep(0.01)
        pids = [pid for shell in shells for pid in (shell.pid, *tree.children(shell.pid))]
        with open(self.job["path"], "a") as marker:
            marker.write(" ".join(["shells", str(os.getpid()), *map(str, pids)]) + "\n")
        time.sleep(self.job["seconds"])
        return "slept"


class AsyncShellSpawner(ShellSpawner):
    """:class:`ShellSpawner` as an async step (awaited on the process's step loop)."""

    async def execute(self):
        return ShellSpawner.execute(self)


class AsyncShellSpawnerPipeline(Pipeline):
    """One AsyncShellSpawner step, awaited on the step loop."""

    @classmethod
    def define(cls, p):
        p.start(AsyncShellSpawner)


class ShellSpawnerPipeline(Pipeline):
    """One ShellSpawner step in its worker's thread."""

    @classmethod
    def define(cls, p):
        p.start(ShellSpawner)


class ShellSpawnerChildPipeline(Pipeline):
    """:class:`ShellSpawner` in a ``timeout=`` child, with a timeout no test reaches."""

    @classmethod
    def define(cls, p):
        p.start(ShellSpawner, timeout=600)


def _fields(path, what: str) -> list[list[str]]:
    """The fields after ``what`` of each line of the marker file at ``path`` that starts
    with it (none when the file does not exist yet)."""
    import os

    if not os.path.exists(path):
        return []
    with open(path) as marker:
        return [parts[1:] for parts in (line.split() for line in marker) if parts and parts[0] == what]


def shells(path) -> list[list[int]]:
    """[step pid, shell, its sleep, shell that left, its sleep] per ShellSpawner attempt."""
    return [[int(pid) for pid in fields] for fields in _fields(path, "shells")]


def spawned(path) -> list[tuple[int, int, int]]:
    """(step pid, subprocess in its group, subprocess that left it) per Spawner attempt."""
    return [(int(a), int(b), int(c)) for a, b, c in _fields(path, "spawned")]


def marker_lines(path, what: str = "start") -> list[tuple[int, str]]:
    """(pid, idempotency_key) of each ``what`` line a Slow/Forever step wrote (:func:`mark`)."""
    return [(int(pid), key) for pid, key in (f for f in _fields(path, what) if len(f) == 2)]
