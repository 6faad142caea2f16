"""Process trees: no step code, and nothing a step started, outlives the process that ran
it [INV-EXE-5] (``ductwork/fleet/tree.py``).

A step's subprocesses are checked in three ways of dying: a ``timeout=`` step killed at its
deadline, a runner SIGKILLed mid-step, and a supervisor SIGKILLed (its runners stop). Each
step starts one subprocess in its process group and one that left it with ``setsid``. An
``on_halt`` handler runs in its worker's thread, as a step without ``timeout=`` does, and
its grandchildren are checked the same way (INV-HLT-1: the handler's old attempt must not
run on beside its re-run).
Linux only, as the mechanism is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from ductwork.db.hosts import os_start_ticks
from ductwork.fleet import child, tree
from ductwork.testing import drain
from ductwork_proof.fleet import Fleet, pid_alive, process_rows, wait_for, write_config
from tests import mutants
from tests.databases import skip_or_fail
from tests.workloads.hooks import HOOK_LOG_ENV, ShellSpawnerHookPipeline
from tests.workloads.processes import (
    AsyncShellSpawnerPipeline,
    ShellSpawnerChildPipeline,
    ShellSpawnerPipeline,
    SpawnerPipeline,
    SpawnerTimeoutPipeline,
    shells,
    spawned,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees are handled on Linux only")


@contextlib.contextmanager
def no_leftovers(marker):
    """SIGKILL whatever the steps spawned at the end, so a failing test leaks nothing."""
    try:
        yield
    finally:
        for _, *subprocesses in spawned(marker) + shells(marker):
            tree.kill(subprocesses)


def test_descendants_finds_grandchildren_and_kill_stops_them():
    shell = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"])
    try:
        found = wait_for(lambda: len(tree.descendants(os.getpid())) >= 3 and tree.descendants(os.getpid()),
                         "the shell and its two sleeps are seen")
        assert shell.pid in found
        grandchildren = tree.descendants(shell.pid)
        assert len(grandchildren) == 2
        assert shell.pid not in grandchildren
        assert tree.children(os.getpid()).count(shell.pid) == 1
        tree.kill([shell.pid, *grandchildren])
        shell.wait(10)
        wait_for(lambda: not any(pid_alive(pid) for pid in grandchildren), "the grandchildren died")
    finally:
        with contextlib.suppress(ProcessLookupError):
            shell.kill()
        shell.wait(10)


#: run in a pid namespace of its own (its /proc shows its own processes only, so a wrong
#: kill_marked cannot reach a process of the machine): starts three shells that each start
#: a sleep, one with this process's mark, one with the mark of another start of this pid,
#: one without a mark; kills the marked ones, then reports as JSON
MARKED = """
import json, os, subprocess, sys, time
from ductwork.db.hosts import os_start_ticks
from ductwork.fleet import tree

start = os_start_ticks(os.getpid())
mark = tree.own_mark()
unmarked_env = {k: v for k, v in os.environ.items() if k != tree.OWNER_ENV}
envs = {"marked": tree.marked_environment(),
        "other": {**unmarked_env, tree.OWNER_ENV: tree.owner_mark(os.getpid(), start + 1)},
        "unmarked": unmarked_env}
shells = {name: subprocess.Popen(["sh", "-c", "sleep 600 & wait"], env=env, start_new_session=True)
          for name, env in envs.items()}
end = time.monotonic() + 60
while not all(tree.descendants(s.pid) for s in shells.values()):
    assert time.monotonic() < end, "the shells did not start their sleeps"
    time.sleep(0.01)
trees = {name: [s.pid, *tree.descendants(s.pid)] for name, s in shells.items()}
killed = tree.kill_marked(mark)
began = time.monotonic()
left = tree.wait_gone(killed, 60)
waited = time.monotonic() - began
alive = tree.wait_gone(trees["other"] + trees["unmarked"], 0.5)
tree.kill([pid for pids in trees.values() for pid in pids])
print(json.dumps({"mark": mark, "expected": tree.owner_mark(os.getpid(), start), "trees": trees,
                  "killed": killed, "left": left, "waited": waited, "alive": alive}), flush=True)
"""


def test_kill_marked_kills_the_processes_carrying_the_mark_and_wait_gone_sees_them_go():
    """The whole host's fleet died: what its runner's steps started is found by the mark in
    its environment (``DUCTWORK_STEP_OWNER``, this process's pid and start time) and killed,
    a grandchild (``sh -c "sleep 600 & wait"``) included, and only that: a process with the
    same pid's mark of another start time, or with no mark, runs on. ``wait_gone`` returns
    at once when the killed are gone (zombies not yet waited for count as gone) and names
    the live processes when its deadline passes [INV-EXE-5]. In a pid namespace of its own."""
    report = in_own_pid_namespace(MARKED)
    assert report["mark"] == report["expected"]  # this process's pid and start time
    marked, other, unmarked = (report["trees"][name] for name in ("marked", "other", "unmarked"))
    assert len(marked) == len(other) == len(unmarked) == 2  # each shell and its sleep
    assert sorted(report["killed"]) == sorted(marked)
    assert report["left"] == []
    assert report["waited"] < 30  # returned when they were gone, not at its deadline (60 s)
    assert sorted(report["alive"]) == sorted(other + unmarked)


#: run as the init of a pid namespace of its own (a wrong kill_adopted cannot reach a process
#: of the machine): a runner (a shell with a sleep), and what a dead runner's step left: a
#: shell with a sleep whose parent exited, so it was re-parented here; kill_adopted spares
#: the known runner, then reports as JSON
ADOPTED = """
import json, os, subprocess, time
from ductwork.fleet import tree

runner = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
dead = subprocess.Popen(["sh", "-c", "sh -c 'sleep 600 & wait' & exit 0"])
dead.wait()
end = time.monotonic() + 60
while not (tree.descendants(runner.pid) and [c for c in tree.children(os.getpid()) if c != runner.pid]
           and all(tree.descendants(c) for c in tree.children(os.getpid()))):
    assert time.monotonic() < end, "the shells did not start their sleeps"
    time.sleep(0.01)
(orphan,) = [c for c in tree.children(os.getpid()) if c != runner.pid]
trees = {"runner": [runner.pid, *tree.descendants(runner.pid)], "orphan": [orphan, *tree.descendants(orphan)]}
adopted = tree.kill_adopted({runner.pid})
report = {"trees": trees, "adopted": adopted, "left": tree.wait_gone(trees["orphan"], 60),
          "alive": tree.wait_gone(trees["runner"], 0.5)}
tree.kill(trees["runner"])
print(json.dumps(report), flush=True)
"""


def in_own_pid_namespace(script: str) -> dict:
    """Run ``script`` as the init of a pid namespace of its own (its /proc shows its own
    processes only) and return the JSON it prints."""
    if shutil.which("unshare") is None:
        skip_or_fail("no unshare(1) to start a process in its own pid namespace", "DUCTWORK_REQUIRE_PID_NAMESPACES")
    done = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode and "Operation not permitted" in done.stderr:
        skip_or_fail(f"unshare --pid is not permitted here: {done.stderr.strip()}", "DUCTWORK_REQUIRE_PID_NAMESPACES")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_kill_adopted_kills_the_orphan_with_its_grandchild_and_spares_the_runners():
    """A supervisor (here a pid namespace's init, which orphans are re-parented to, as to a
    subreaper) kills what a dead runner's step left (a shell re-parented to it, with the
    sleep it started) and waits for it, and leaves its known runner and the runner's own
    child running [INV-EXE-5]."""
    report = in_own_pid_namespace(ADOPTED)
    runner, orphan = report["trees"]["runner"], report["trees"]["orphan"]
    assert len(runner) == len(orphan) == 2  # each shell and its sleep
    assert report["adopted"] == orphan[:1]
    assert report["left"] == []
    assert sorted(report["alive"]) == sorted(runner)


def test_descendants_of_a_parents_read_that_loops_back_end_at_the_pid():
    """``/proc`` is not read at once: a read can link a process back above ``pid`` (a pid
    reused meanwhile). The walk still ends, each process named once, ``pid`` not among them."""
    found: list[list[int]] = []
    walker = threading.Thread(target=lambda: found.append(tree.descendants(10, {11: 10, 12: 11, 10: 12, 13: 12})),
                              daemon=True)
    walker.start()
    walker.join(10)
    assert found == [[11, 12, 13]]


def test_wait_gone_past_its_deadline_looks_once_and_names_the_live(monkeypatch):
    """A deadline already reached (``timeout_s`` 0, the clock standing still at it):
    ``wait_gone`` looks once and names the process still running, with no further round;
    a process gone is not named."""
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        wait_for(lambda: os_start_ticks(sleeper.pid), "the sleep started")
        monkeypatch.setattr(tree, "time", types.SimpleNamespace(monotonic=lambda: 100.0, sleep=time.sleep))
        returned: list[list[int]] = []
        waiter = threading.Thread(target=lambda: returned.append(tree.wait_gone([sleeper.pid], 0)), daemon=True)
        waiter.start()
        waiter.join(10)
        assert returned == [[sleeper.pid]]
    finally:
        sleeper.kill()
        sleeper.wait(10)
    assert tree.wait_gone([sleeper.pid], 0) == []


def test_a_timed_out_steps_subprocesses_die_with_it(app, tmp_path):
    marker = tmp_path / "marker"
    with no_leftovers(marker):
        run = SpawnerTimeoutPipeline.trigger({"path": str(marker), "seconds": 600})
        drain(app, timeout=60)
        assert run.refresh().status == "halted"
        attempts = spawned(marker)
        assert len(attempts) == 3  # max_retry 2: three attempts, each timed out
        for step, stays, leaves in attempts:
            # the group kill takes the one in the group; the one that left is killed by pid
            assert not any(pid_alive(pid) for pid in (step, stays, leaves)), (step, stays, leaves)


def stop(fleet: Fleet, pids: list[int] = ()) -> None:
    """Stop gracefully what is still running (the supervisor, or runners it left), so each
    process records the modules it loaded (a mutant's run is checked against that)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if fleet.proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            fleet.terminate(30)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not any(pid_alive(pid) for pid in pids), "the runners stopped", 30)


@pytest.mark.usefixtures("app")  # the default app the trigger uses, tables emptied
def test_a_killed_runners_step_subprocesses_are_killed_by_its_supervisor(db_url, tmp_path):
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SpawnerPipeline"],
                          overrides={"supervisor": {"reaper_timeout": 600}})
    marker = tmp_path / "marker"
    SpawnerPipeline.trigger({"path": str(marker), "seconds": 600})
    with Fleet(db_url, config) as fleet, no_leftovers(marker):
        try:
            ((runner, stays, leaves),) = wait_for(lambda: spawned(marker), "the step spawned its subprocesses")
            os.kill(runner, signal.SIGKILL)
            wait_for(lambda: not pid_alive(stays) and not pid_alive(leaves),
                     f"the dead runner's step subprocesses were killed; log: {fleet.log()[-2000:]}", 10)
            # the supervisor logs the kill after making it: wait for the line, not only the deaths
            # (read at once, it was not there yet once, in a CI run on a loaded 2-core VM)
            wait_for(lambda: "processes left by a dead runner's steps" in fleet.log(),
                     "the supervisor logged that it killed them", 10)
        finally:
            stop(fleet)


def test_a_killed_supervisors_runners_stop(app, db_url, tmp_path):
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SpawnerPipeline"],
                          overrides={"supervisor": {"reaper_timeout": 600}})
    with Fleet(db_url, config) as fleet:
        runners: list[int] = []
        try:
            # each runner has logged "started" (its death signal is armed by then)
            def started() -> list[int]:
                rows = [row for row in process_rows(app.engine) if row.role in ("job_worker", "pipeline_advancer")]
                ready = [row.pid for row in rows if f"{row.role} {row.id} started" in fleet.log()]
                return ready if len(ready) == 2 else []  # the advancer and the worker

            runners = wait_for(started, "the runners started")
            os.kill(fleet.proc.pid, signal.SIGKILL)
            fleet.proc.wait(10)
            wait_for(lambda: not any(pid_alive(pid) for pid in runners),
                     f"every runner stopped when its supervisor died; log: {fleet.log()[-2000:]}", 15)
        finally:
            stop(fleet, runners)


@pytest.mark.usefixtures("app")  # the default app the trigger uses, tables emptied
def test_a_runner_stopped_past_its_shutdown_timeout_kills_its_steps_subprocesses(db_url, tmp_path):
    """SIGTERM while a step is busy past ``shutdown_timeout``: the runner exits without
    waiting for the thread, and first kills what the busy step started (in its group and
    out of it); the step is re-run elsewhere."""
    # (a long lease: a loaded machine's late heartbeat must not end the runner first)
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SpawnerPipeline"],
                          overrides={"job_worker": {"shutdown_timeout": 0.2}, "supervisor": {"reaper_timeout": 600}})
    marker = tmp_path / "marker"
    SpawnerPipeline.trigger({"path": str(marker), "seconds": 600})
    with Fleet(db_url, config) as fleet, no_leftovers(marker):
        ((runner, stays, leaves),) = wait_for(lambda: spawned(marker), "the step spawned its subprocesses")
        assert fleet.terminate(30) == 0, fleet.log()[-2000:]
        wait_for(lambda: not any(pid_alive(pid) for pid in (runner, stays, leaves)),
                 f"the runner and its busy step's subprocesses are gone; log: {fleet.log()[-2000:]}", 10)
        assert f"job_worker: killed 2 processes the busy steps started: {sorted([stays, leaves])}" in fleet.log()
        assert len(spawned(marker)) == 1  # the one attempt, ended by the shutdown


#: an adopter's process that runs ductwork's worker in its own code (no ``ductwork start``):
#: ``drain()`` or one ``Worker.run_once``, on the database named by argv[1]
ADOPTER = """
import sys
import tests.workloads.processes  # the adopter's own pipelines
from ductwork.app import set_default_app
from ductwork.fleet.worker import Worker
from ductwork.testing import drain
from tests import mutants
from tests.conftest import make_app

app = make_app(sys.argv[1])
set_default_app(app)
if sys.argv[2] == "drain":
    drain(app, timeout=600)
else:
    Worker(app).run_once()
"""


@pytest.mark.usefixtures("app")  # the default app the trigger uses, tables emptied
@pytest.mark.parametrize("runs", ["drain", "run_once"])
def test_an_embedded_worker_killed_mid_step_leaves_no_grandchild_of_its_timeout_child(db_url, tmp_path, runs):
    """An adopter's process runs the worker itself (``drain()``, ``Worker.run_once``) and is
    SIGKILLed while a ``timeout=`` step's child runs, the step having started shells that
    each started a process of their own (one shell in the step's group, one that left it):
    no supervisor is there to adopt them, yet the child's keeper, told of the death, kills
    the step's process and every descendant of it, then exits [INV-EXE-5]."""
    marker = tmp_path / "marker"
    ShellSpawnerChildPipeline.trigger({"path": str(marker), "seconds": 600})
    adopter = subprocess.Popen([sys.executable, "-c", ADOPTER, db_url, runs], cwd=str(mutants.REPO))
    keeper = None
    with no_leftovers(marker):
        try:
            (pids,) = wait_for(lambda: shells(marker), "the step started its shells and their children")
            step, *below = pids
            keeper = int(_status(step)["PPid"])  # the timeout child the adopter started, above the step
            assert _status(keeper)["PPid"] == str(adopter.pid)
            assert is_keeper(keeper)
            os.kill(adopter.pid, signal.SIGKILL)
            adopter.wait(10)
            wait_for(lambda: not any(pid_alive(pid) for pid in [keeper, *pids]),
                     f"the keeper {keeper}, the step's process {step} and every process below it {below} died", 10)
        finally:
            with contextlib.suppress(ProcessLookupError):
                adopter.kill()
            adopter.wait(10)
            kill_keeper(keeper)


def is_keeper(pid: int) -> bool:
    """Whether ``pid`` runs a ``timeout=`` child (``ductwork.fleet.child``), a keeper or its step."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return child.__name__.encode() in cmdline.read().split(b"\0")
    except OSError:
        return False


def kill_keeper(pid: int | None) -> None:
    """SIGKILL a keeper a failing test left (only if ``pid`` still runs one: no reused pid)."""
    if pid is not None and is_keeper(pid):
        tree.kill([pid])


def _status(pid: int) -> dict[str, str]:
    """The fields of ``/proc/<pid>/status``."""
    with open(f"/proc/{pid}/status") as status:
        return dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)


@pytest.mark.parametrize("pipeline", [ShellSpawnerPipeline, AsyncShellSpawnerPipeline, ShellSpawnerChildPipeline,
                                      ShellSpawnerHookPipeline], ids=["thread", "step_loop", "child", "on_halt"])
def test_a_killed_runners_grandchildren_are_killed_by_its_supervisor(app, db_url, tmp_path, pipeline):
    """A runner's step (in a worker thread, awaited on the step loop, or in a ``timeout=``
    child) or a halted run's ``on_halt`` handler (in a worker thread) ran shells that each
    started a process (``sh -c "sleep 600 & wait"``, one shell out of the step's group):
    the runner is SIGKILLed, the supervisor adopts the orphans and kills each with
    everything below it, a ``timeout=`` child's keeper too [INV-EXE-5, INV-HLT-1]."""
    config = write_config(tmp_path / "ductwork.yml", pipelines=[f"{pipeline.__module__}:{pipeline.__qualname__}"],
                          overrides={"supervisor": {"reaper_timeout": 600}})
    marker = tmp_path / "marker"
    pipeline.trigger({"path": str(marker), "seconds": 600})  # (the hook's pipeline: Boom's input, it halts)
    keeper = None
    with Fleet(db_url, config, env={HOOK_LOG_ENV: str(marker)}) as fleet, no_leftovers(marker):
        try:
            (pids,) = wait_for(lambda: shells(marker), "the step started its shells and their children")
            (runner,) = {row.pid for row in process_rows(app.engine, role="job_worker")}
            below = [pid for pid in pids if pid != runner]
            if pipeline is ShellSpawnerChildPipeline:  # the keeper, between the runner and the step
                keeper = int(_status(pids[0])["PPid"])
                assert _status(keeper)["PPid"] == str(runner)
                assert is_keeper(keeper)
                below.append(keeper)
            os.kill(runner, signal.SIGKILL)
            wait_for(lambda: not any(pid_alive(pid) for pid in below),
                     f"every process below the dead runner died: {below}; log: {fleet.log()[-2000:]}", 10)
        finally:
            stop(fleet)
            kill_keeper(keeper)
