"""Pipelines shared by tests that run real child processes (importable by module path).

Steps used by process tests must live in an importable module: a child process
resolves ``"tests.workloads:Work"`` by importing it.
"""

from __future__ import annotations

import time

from ductwork import Pipeline, Step

FAULT_KEY = "fault_key"
#: the collapse's key, of concurrency 1: its claim fills it, so its success is a release
#: first, then an advancement (between_release_and_advance)
FAULT_TOTAL_KEY = "fault_total_key"


class Start(Step):
    def __init__(self, n):
        self.n = n

    def execute(self):
        return list(range(self.n))


class Work(Step):
    def __init__(self, i):
        self.i = i

    def execute(self):
        return self.i * self.i


class Total(Step):
    def __init__(self, squares):
        self.squares = squares

    def execute(self):
        return self.squares


class FaultPipeline(Pipeline):
    """start → expand (keyed) → collapse (keyed by a full key, a leaf: its success is
    released, then advanced by its worker): passes every fault checkpoint."""

    @classmethod
    def define(cls, p):
        p.start(Start).expand(to=Work, limit_by=FAULT_KEY).collapse(into=Total, limit_by=FAULT_TOTAL_KEY)


def fault_pipeline_expected(n: int) -> dict:
    return {"Start#0": 1, "Work#1": n, "Total#2": 1}


class Nap(Step):
    """Sleeps ``seconds`` (a stand-in for a slow call), then returns them."""

    def __init__(self, seconds):
        self.seconds = seconds

    def execute(self):
        time.sleep(self.seconds)
        return self.seconds


class Forever(Step):
    """Never returns: only a timeout (a killed process) ends it."""

    def __init__(self, marker_path):
        self.marker_path = marker_path

    def execute(self):
        import os

        with open(self.marker_path, "a") as marker:
            marker.write(f"start {os.getpid()} {self.idempotency_key}\n")
        while True:
            time.sleep(0.05)


class NapPipeline(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Nap).chain(to=Nap)


class ForeverPipeline(Pipeline):
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
        with open(self.how.removeprefix("marker:"), "a") as marker:
            marker.write(f"start {os.getpid()} {self.idempotency_key}\n")
        while True:
            time.sleep(0.05)


class EndsItsChildPipeline(Pipeline):
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

    def _note(self, what: str) -> list[str]:
        import os

        with open(self.job["path"], "a") as marker:
            marker.write(f"{what} {os.getpid()} {self.idempotency_key}\n")
        with open(self.job["path"]) as marker:
            return marker.read().splitlines()

    def execute(self):
        lines = self._note("start")
        first = sum(1 for line in lines if line.startswith("start")) == 1
        time.sleep(self.job["first"] if first else self.job["after"])
        self._note("end")
        return self.job


class Done(Step):
    def __init__(self, job):
        self.job = job

    def execute(self):
        return "done"


class SlowPipeline(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Slow).chain(to=Done)


class SlowKeyedPipeline(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Slow, limit_by="slow_key").chain(to=Done)


class ForeverKeyedPipeline(Pipeline):
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
    @classmethod
    def define(cls, p):
        p.start(Spawner)


class SpawnerTimeoutPipeline(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Spawner, timeout=1)


class ShellSpawner(Step):
    """Starts two shells that each start a ``sleep 600`` and wait for it (``sh -c "sleep 600
    & wait"``), one shell in its process group and one that left it (``setsid``), waits
    until both have their child, writes ``shells <own pid> <shell> <its sleep> <shell that
    left> <its sleep>`` to ``job["path"]``, then sleeps ``job["seconds"]``: grandchildren of
    the step's process, for a test to kill the step's process or its parent meanwhile."""

    def __init__(self, job):
        self.job = job

    def execute(self):
        import os
        import subprocess

        from ductwork.fleet import tree

        shells = [subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=leaves)
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
    @classmethod
    def define(cls, p):
        p.start(AsyncShellSpawner)


class ShellSpawnerPipeline(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(ShellSpawner)


class ShellSpawnerChildPipeline(Pipeline):
    """:class:`ShellSpawner` in a ``timeout=`` child, with a timeout no test reaches."""

    @classmethod
    def define(cls, p):
        p.start(ShellSpawner, timeout=600)


def shells(path) -> list[list[int]]:
    """[step pid, shell, its sleep, shell that left, its sleep] per ShellSpawner attempt."""
    import os

    if not os.path.exists(path):
        return []
    with open(path) as marker:
        return [[int(pid) for pid in line.split()[1:]] for line in marker if line.startswith("shells ")]


def spawned(path) -> list[tuple[int, int, int]]:
    """(step pid, subprocess in its group, subprocess that left it) per Spawner attempt."""
    import os

    if not os.path.exists(path):
        return []
    with open(path) as marker:
        return [(int(a), int(b), int(c)) for what, a, b, c in (line.split() for line in marker
                                                                if line.startswith("spawned "))]


def marker_lines(path, what: str = "start") -> list[tuple[int, str]]:
    """(pid, idempotency_key) of each ``what`` line a Slow/Forever step wrote."""
    import os

    if not os.path.exists(path):
        return []
    with open(path) as marker:
        return [(int(parts[1]), parts[2]) for parts in (line.split() for line in marker)
                if len(parts) == 3 and parts[0] == what]


class Quick(Step):
    """Returns its argument at once."""

    def __init__(self, i):
        self.i = i

    def execute(self):
        return self.i


class Unkeyed(Pipeline):
    """One unkeyed step: the smallest run there is."""

    @classmethod
    def define(cls, p):
        p.start(Quick)


class Approval(Pipeline):
    """Quick, then a dampen: the run waits for ``resume`` (from any process)."""

    @classmethod
    def define(cls, p):
        p.start(Quick).dampen(before=Quick)


# --------------------------------------------------------------------------- on_halt hooks (issue 16)

#: the file each HaltRecorder attempt appends a line to (set by the test, read back by it)
HOOK_LOG_ENV = "DUCTWORK_TEST_HOOK_LOG"


class Refuse(Step):
    """Always raises: with max_retry spent, its branch (and run) halts."""

    def __init__(self, n):
        self.n = n

    def execute(self):
        raise ValueError(f"refused {self.n}")


class HaltRecorder(Step):
    """An on_halt handler: appends ``<idempotency_key> <run_id> <reasons>`` to the file named
    by ``$DUCTWORK_TEST_HOOK_LOG`` (when set), so a test in another process sees every
    attempt that ran, crashed ones included."""

    def __init__(self, halt):
        self.halt = halt

    def execute(self):
        import json
        import os

        path = os.environ.get(HOOK_LOG_ENV)
        if path:
            reasons = ",".join(r["reason"] for r in self.halt["halt_reasons"])
            with open(path, "a") as out:
                out.write(f"{self.idempotency_key} {self.halt['run_id']} {reasons} {json.dumps(self.halt)}\n")
        return None


class HaltingPipeline(Pipeline):
    """start(Refuse): halts ``job_retries_exhausted`` once its retries are spent, and owes
    its HaltRecorder hook."""

    @classmethod
    def define(cls, p):
        p.start(Refuse).on_halt(HaltRecorder)


# --------------------------------------------------------------------------- rolling deploys
#
# tests/integration/test_rolling_deploy.py: two fleets with different limits on one
# database. Every body writes a witness row when it starts and stamps it when it
# returns, each in its own short transaction with database time, naming the fleet that
# ran it (``DUCTWORK_ROLLING_FLEET``); ``DUCTWORK_ROLLING_WITNESS_URL`` names the database.

_rolling_engine = None


def rolling_witness_table(metadata=None):
    """The table ``RollingCall`` bodies write (created next to ductwork's tables)."""
    import sqlalchemy as sa

    from ductwork.db import schema

    return sa.Table(
        "rolling_witnesses", metadata if metadata is not None else sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("step_id", schema.Id, nullable=False),
        sa.Column("fleet", schema.Name, nullable=False),  # DUCTWORK_ROLLING_FLEET of the body's process
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("limit_key", schema.Name, nullable=False),
        sa.Column("started_at", schema.Timestamp, nullable=False),
        sa.Column("ended_at", schema.Timestamp, nullable=True),  # NULL: did not return
    )


class RollingCall(Step):
    """Writes its witness row, pauses ``seconds``, stamps the row's end."""

    limit_key = ""

    def __init__(self, seconds):
        self.seconds = seconds

    def execute(self):
        import os

        from ductwork.db.dialects import db_now
        from ductwork.db.engines import create_engine

        global _rolling_engine
        if _rolling_engine is None:
            _rolling_engine = create_engine(os.environ["DUCTWORK_ROLLING_WITNESS_URL"], pool_size=2,
                                            io_timeout=10)
        table = rolling_witness_table()
        with _rolling_engine.begin() as conn:
            witness_id = conn.execute(table.insert().values(
                step_id=self._ductwork_step_id, fleet=os.environ["DUCTWORK_ROLLING_FLEET"],
                pid=os.getpid(), limit_key=self.limit_key, started_at=db_now(conn))).inserted_primary_key[0]
        time.sleep(self.seconds)
        with _rolling_engine.begin() as conn:
            conn.execute(table.update().where(table.c.id == witness_id).values(ended_at=db_now(conn)))
        return self.seconds


class RaisedCall(RollingCall):
    limit_key = "raised"


class LoweredCall(RollingCall):
    limit_key = "lowered"


class RatedCall(RollingCall):
    limit_key = "rated"


class RollingRaised(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(RaisedCall, limit_by="raised")


class RollingLowered(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(LoweredCall, limit_by="lowered")


class RollingRated(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(RatedCall, limit_by="rated")
