"""An ``on_halt`` handler that logs each of its attempts to a file, and a run that owes it
(tests of halt hooks in-process and on real fleets: ``"tests.workloads.hooks:HaltingPipeline"``);
one that starts shells with children of their own, for the process-tree tests.
"""

from __future__ import annotations

from ductwork import Pipeline, Step
from tests.workloads import Boom
from tests.workloads.processes import ShellSpawner

#: the file each HaltRecorder attempt appends a line to (set by the test, read back by it)
HOOK_LOG_ENV = "DUCTWORK_TEST_HOOK_LOG"


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
    """start(Boom): halts ``job_retries_exhausted`` once its retries are spent, and owes its
    HaltRecorder hook."""

    @classmethod
    def define(cls, p):
        p.start(Boom).on_halt(HaltRecorder)


def halted_with_owed_hook(app, n=1, pipeline=HaltingPipeline):  # type: ignore[no-untyped-def]
    """A run of ``pipeline`` (one that halts) driven to its halt on ``app``'s ManualClock by a
    worker that runs no hooks: the run owes its hook, which no thread has claimed."""
    from datetime import timedelta

    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer

    run = pipeline.trigger(n)
    worker, advancer = Worker(app), Advancer(app)
    worker._hook = lambda: None  # this worker runs executions only: the hook is left owed
    for _ in range(50):
        advancer.run_once()
        if run.refresh().status == "halted":
            return run
        worker.run_once()
        app.clock.advance(timedelta(seconds=1))
    raise AssertionError(f"run {run.id} did not halt")


class ShellSpawnerHook(ShellSpawner):
    """An on_halt handler that is a :class:`ShellSpawner` (``sh -c "sleep 600 & wait"``, twice,
    then a sleep), its marker file named by ``$DUCTWORK_TEST_HOOK_LOG``."""

    def __init__(self, halt):
        import os

        self.halt = halt
        super().__init__({"path": os.environ[HOOK_LOG_ENV], "seconds": 600})


class ShellSpawnerHookPipeline(Pipeline):
    """start(Boom), whose halt owes a :class:`ShellSpawnerHook`."""

    @classmethod
    def define(cls, p):
        p.start(Boom).on_halt(ShellSpawnerHook)
