"""One connection per transaction: no public call opens a second pooled connection while
a connection of the same thread holds a write transaction.

On SQLite every writing transaction is ``BEGIN IMMEDIATE`` and holds the database's
write lock, so a second connection that writes (or just begins) inside it waits for the
lock its own thread holds until ``busy_timeout`` and fails ``database is locked``. On
PostgreSQL and MySQL the same pattern waits on the first connection's row locks. The
guard below is SQLAlchemy events installed by this test only (``Engine`` begin, commit
and rollback; ``Pool`` checkout): a checkout in a thread that has a writing transaction
open on another connection is recorded and refused. Every public call runs under it,
from an App that did not trigger the runs (its caches are cold, as in a process that
only resumes or only works).

Also: ``Run.resume`` from a process that did not trigger the run (the approval flow
of docs/pipelines.md, resumed by a web request or another worker); and a writing block
is one transaction on every database, though on PostgreSQL a read-only block and a
poll's one statement run outside a transaction block.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import traceback

import pytest
import yaml
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

from ductwork import Pipeline
from ductwork.app import set_default_app
from ductwork.cli import main
from ductwork.fleet.processes import heartbeat, register
from ductwork.fleet.reaper import reap, reap_dead, reconcile, sweep_orphans
from ductwork.fleet.worker import Worker
from ductwork.limits.claims import claim, restart_with
from ductwork.pipelines.context import Context
from ductwork.testing import drain
from tests.conftest import make_app
from tests.workloads import Approval, Crashes, Echo, FailsLater, Sum, Takes, Unkeyed

LIMITS = {"guard_key": {"concurrency": 2, "rate": [{"limit": 1000, "per": "1s"}]}}


class SecondConnection(AssertionError):
    """A pool checkout while this thread holds a writing transaction on another connection."""


class OneConnectionGuard:
    """Records (and refuses) a pool checkout while the same thread has a writing
    transaction open on another connection."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.violations: list[str] = []

    def _writing(self) -> set:
        if not hasattr(self._local, "writing"):
            self._local.writing = set()
        return self._local.writing

    def begin(self, conn) -> None:  # type: ignore[no-untyped-def]
        if not conn.get_execution_options().get("ductwork_readonly"):
            self._writing().add(conn)

    def end(self, conn) -> None:  # type: ignore[no-untyped-def]
        self._writing().discard(conn)

    def checkout(self, *_: object) -> None:
        if self._writing():
            stack = "".join(traceback.format_stack(limit=30)[:-1])
            self.violations.append(stack)
            raise SecondConnection("a second connection was checked out inside a write transaction:\n" + stack)

    def __enter__(self) -> OneConnectionGuard:
        event.listen(Engine, "begin", self.begin)
        event.listen(Engine, "commit", self.end)
        event.listen(Engine, "rollback", self.end)
        event.listen(Pool, "checkout", self.checkout)
        return self

    def __exit__(self, *_: object) -> None:
        event.remove(Engine, "begin", self.begin)
        event.remove(Engine, "commit", self.end)
        event.remove(Engine, "rollback", self.end)
        event.remove(Pool, "checkout", self.checkout)


# --------------------------------------------------------------------------- pipelines


class Emit(Takes):
    def execute(self):
        self.context.set("seen", self.value)
        assert self.context.get("seen") == self.value
        return list(range(self.value))


class Everything(Pipeline):
    """expand (keyed) → collapse → divide → combine → divert → converge → dampen → chain."""

    @classmethod
    def define(cls, p):
        gathered = p.start(Emit).expand(to=Echo, limit_by="guard_key").collapse(into=Sum)
        left, right = gathered.divide(to=[Echo, Echo])
        (left.combine(right, into=Sum)
         .divert(to={"6": Echo, "otherwise": Sum}).converge(into=Echo)
         .dampen(before=Echo).chain(to=Echo, timeout=30))


PIPELINES = [f"{cls.__module__}:{cls.__qualname__}" for cls in (Everything, FailsLater, Crashes)]


@pytest.fixture
def guard():
    with OneConnectionGuard() as installed:
        yield installed
    assert not installed.violations, "\n\n".join(installed.violations)


@pytest.mark.usefixtures("guard")
def test_no_public_call_opens_a_second_connection_inside_a_write_transaction(app, tmp_path, capsys):
    everything, failing, crashing = Everything.trigger(3), FailsLater.trigger(1), Crashes.trigger(1)
    opened = []

    def cold():  # an App that did not trigger and has cached nothing: a process of its own
        fresh = make_app(app.url, job_worker={"limits": LIMITS, "crash_backoff": 0.01})
        opened.append(fresh)
        set_default_app(fresh)
        return fresh

    try:
        restart_with(cold())
        drain(cold(), timeout=60)
        run = cold().run(everything.id)
        assert run.status == "dampened", run
        assert cold().run(everything.id).resume(input=5).status == "in_progress"
        drain(cold(), timeout=60)
        assert cold().run(everything.id).wait(timeout=5).status == "completed"
        assert [s.output for s in cold().run(everything.id).steps()][-2:] == [5, 5]
        assert cold().run(failing.id).wait(timeout=5).halt_reasons == ["job_retries_exhausted"]
        assert cold().run(crashing.id).halt_reasons == ["job_crashes_exhausted"]
        assert Context(cold(), everything.id).get("seen") == 3
        assert Context(cold(), everything.id).set("seen", 4, overwrite=True) == 4
        assert Context(cold(), everything.id).set("other", 1) == 1

        # the fleet's own transactions: register, heartbeat, claim, reconcile, reap, sweep
        FailsLater.trigger(2, app=cold())
        fleet = cold()
        dead = register(fleet, role="job_worker", label="guard.dead")
        assert heartbeat(fleet, dead)
        assert claim(fleet, dead) is not None
        reconcile(fleet, dead, held=set(), grace_s=0)
        assert claim(cold(), dead) is not None
        assert reap(cold(), dead, force=True)
        reap_dead(cold(), None)
        sweep_orphans(cold())
        drain(cold(), timeout=60)

        # a batch of unkeyed executions claimed together and recorded in one group commit
        batched = [Unkeyed.trigger(i, app=cold()) for i in range(6)]
        batcher = Worker(cold(), batch_size=8, batch_window=60)
        batcher.batch = 8
        while batcher.run_once() is not None:
            pass
        drain(cold(), timeout=60)
        assert all(cold().run(run.id).status == "completed" for run in batched)
    finally:
        set_default_app(app)
        for fresh in opened:
            fresh.dispose()

    config = tmp_path / "ductwork.yml"
    config.write_text(yaml.safe_dump({"default": {"pipelines": PIPELINES, "job_worker": {"limits": LIMITS}}}))
    for command in (["check"], ["status"], ["db", "current"]):
        assert main([*command, "--database-url", app.url, "-c", str(config)]) == 0, capsys.readouterr().err


def test_resume_from_another_process(app):
    """The approval flow: a run dampens in one process, another process resumes it."""
    run = Approval.trigger(1)
    drain(app, timeout=30)
    assert run.refresh().status == "dampened"
    resumer = textwrap.dedent("""
        import sys, ductwork
        app = ductwork.connect(sys.argv[1], config={"default": {}}, busy_timeout=5)
        print(app.run(sys.argv[2]).resume(input=7).status)
    """)
    done = subprocess.run([sys.executable, "-c", resumer, app.url, run.id],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "in_progress"
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert [(s.input, s.output) for s in run.steps()] == [([1], 1), ([7], 7)]


def test_a_writing_block_is_one_transaction_on_every_database(app):
    """``App.begin()`` is one transaction: a block that raises after its first write leaves
    none of it. On PostgreSQL ``begin(readonly=True)`` and ``begin(one_statement=True)`` run
    without BEGIN and COMMIT (``dialects.runs_outside_transactions``); a writing block never
    does, or each of its statements would commit alone."""
    import sqlalchemy as sa

    from ductwork.db import schema

    k = schema.limit_keys

    def write_then_fail() -> None:
        with app.begin() as tx:
            tx.execute(k.insert().values(key="k", seq=0, created_at=tx.now, updated_at=tx.now))
            raise RuntimeError("after the first write")

    with pytest.raises(RuntimeError, match="after the first write"):
        write_then_fail()
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(k.c.key)).all() == []
