"""How a ``timeout=`` step's child process can end besides a value, a raise or a timeout,
on each database (``ductwork/fleet/child.py``): each is recorded once, by the worker
that started it, and no child outlives its attempt [INV-EXE-5].

Checks: a child that exits without a result or whose ``__init__`` raises is a crash
(re-run within ``max_crash``) and a SystemExit in the step is its failure [INV-EXE-4];
a child that does not start in time is killed; a child whose parent is gone exits at
once; a worker thread interrupted while it waits for its child kills the child before
the interrupt leaves it, and the execution is crashed, not left held [INV-EXE-1].
"""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from ductwork.fleet import child
from ductwork.fleet.worker import Worker
from ductwork_proof.fleet import killed, wait_for
from tests.workloads.processes import EndsItsChildPipeline, marker_lines


def _first_execution(run):
    return run.history().steps[0].executions[0]


@pytest.mark.parametrize(("how", "outcome", "error_klass"), [
    ("exit", "process_crashed", "ductwork.ChildDied"),  # no result on the pipe
    ("init", "process_crashed", "builtins.KeyError"),  # BuildFailed, reported by the child
    ("system_exit", "failure", "builtins.SystemExit"),  # the step's own failure, not the child's exit
])
def test_a_child_that_ends_without_a_value_is_recorded_once(app, how, outcome, error_klass):
    run = EndsItsChildPipeline.trigger(how)
    assert Worker(app).run_once().outcome == outcome
    execution = _first_execution(run)
    assert (execution.outcome, execution.error.klass) == (outcome, error_klass)
    if how == "exit":
        assert "exited with status 3 without a result" in execution.error.message
    executions = run.history().steps[0].executions
    assert len(executions) == 2  # re-run (crash) or retried (failure) within its budget
    assert executions[1].outcome is None


def test_a_child_that_does_not_start_in_time_is_killed_and_crashed(app, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setattr(child, "STARTUP_S", 0.0)  # start-up's deadline passed before it began
    run = EndsItsChildPipeline.trigger(f"marker:{marker}")
    assert Worker(app).run_once().outcome == "process_crashed"
    execution = _first_execution(run)
    assert execution.error.klass == "ductwork.ChildStartup"
    assert "did not start within 0 s; killed" in execution.error.message
    assert marker_lines(marker) == []  # killed before its step ran


def test_a_child_at_its_start_up_deadline_exactly_is_killed(app, monkeypatch):
    """The start-up deadline reached exactly (``STARTUP_S`` 0, the worker's clock standing at
    it): the child is killed and crashed as not started, its pipe not read once more (read,
    it would tell that the child exited without a result)."""
    monkeypatch.setattr(child, "STARTUP_S", 0.0)
    monkeypatch.setattr(child, "time", types.SimpleNamespace(monotonic=lambda: 100.0, sleep=time.sleep))
    run = EndsItsChildPipeline.trigger("exit")
    assert Worker(app).run_once().outcome == "process_crashed"
    assert _first_execution(run).error.klass == "ductwork.ChildStartup"


#: a pipeline module the worker imports from a ``sys.path`` entry it added itself, not
#: from its ``PYTHONPATH`` or working directory
ON_ADDED_PATH = """
from ductwork import Pipeline, Step


class OnAddedPath(Step):
    def __init__(self, value):
        self.value = value

    def execute(self):
        return self.value * 2


class OnAddedPathPipeline(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(OnAddedPath, timeout=30)
"""


def test_a_child_imports_the_pipeline_from_a_path_its_worker_added(app, tmp_path, monkeypatch):
    """A pipeline module found through an entry the worker's process put on ``sys.path``
    (as an adopter's script does): the child is given that entry, imports the module there
    and runs the step; its value is recorded."""
    (tmp_path / "added_path_pipeline.py").write_text(ON_ADDED_PATH)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("added_path_pipeline")
    run = module.OnAddedPathPipeline.trigger(21)
    assert Worker(app).run_once().outcome == "success"
    assert _first_execution(run).outcome == "success"


def test_a_child_whose_parent_is_gone_exits_at_once():
    """The parent died before the child armed its death signal: the child leaves without
    reading its request (pid 1 stands for the supervisor that adopted it)."""
    done = subprocess.run([sys.executable, "-m", "ductwork.fleet.child", "1", "1"], input=b"not read",
                          capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, b""), done.stderr[-2000:]


class Interrupted(BaseException):
    """What the test's signal handler raises in the main thread (as Ctrl-C raises
    KeyboardInterrupt in a script that drains)."""


def test_an_interrupted_wait_for_a_child_kills_it_and_crashes_the_execution(app, tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only")
    marker = tmp_path / "marker"
    run = EndsItsChildPipeline.trigger(f"marker:{marker}")

    def interrupt(*_):
        raise Interrupted

    def interrupt_once_running():
        wait_for(lambda: marker_lines(marker), "the step runs in its child")
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    sender = threading.Thread(target=interrupt_once_running)
    try:
        sender.start()
        with pytest.raises(Interrupted):
            Worker(app).run_once()  # waits on the child's pipe; the interrupt leaves it
        sender.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    ((pid, _),) = marker_lines(marker)
    assert killed(pid)  # [INV-EXE-5] SIGKILLed (its keeper reaped) before the interrupt left
    execution = _first_execution(run)
    assert (execution.outcome, execution.error.klass) == ("process_crashed", "ductwork.AbandonedClaim")
