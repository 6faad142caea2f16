"""A crash and restart on one host: the dead fleet's claims are free within a supervisor
tick, not after ``reaper_timeout``, and never on a guess.

Checks: INV-EXE-1 (a dead host's work is re-run: by the supervisor that replaced it on
the same machine, as soon as it proves the old processes gone), INV-EXE-5 (the proof is
by machine, boot, pid namespace, pid and start time: a reused pid, or a live process of
another pid namespace with the same pid and host name, is never taken for a dead one,
nor is a process whose first thread exited while another runs, and a process that cannot
read its own namespace's ``/proc`` names no namespace, so proves nothing; what a dead
runner's steps started is killed before its claims move on), INV-LIM-3 (the
key's slots come back).

Linux only, as the proof is (``/proc``); elsewhere a row waits for ``reaper_timeout``.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from ductwork.cli import main
from ductwork.db import schema
from ductwork.db.hosts import machine_identifier, os_start_ticks
from ductwork.fleet import tree
from ductwork.fleet.processes import register
from ductwork.fleet.reaper import proven_dead, reap_dead
from ductwork_proof.fleet import Fleet, pid_alive, wait_for, write_config
from tests.databases import skip_or_fail
from tests.workloads.processes import SlowKeyedPipeline, SpawnerPipeline, marker_lines, spawned

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the proof of death reads /proc (Linux)")

#: set in CI (.ci/run): without a pid namespace of its own the test below cannot run, and
#: then nothing detects mutant ``reap_by_host_name``, so there it fails instead of skipping
REQUIRE_PID_NAMESPACES = "DUCTWORK_REQUIRE_PID_NAMESPACES"

#: far beyond every deadline below: only a proof of death can free a slot in time
NEVER_STALE = {"supervisor": {"reaper_timeout": 600}}


def _row(app, process_id):
    p = schema.processes
    with app.begin() as tx:
        return tx.execute(sa.select(p).where(p.c.id == process_id)).first()


def _first_attempts_crashed(app, run_ids) -> bool:
    e, s = schema.executions, schema.steps
    with app.begin() as tx:
        firsts = tx.execute(
            sa.select(s.c.run_id, sa.func.min(e.c.id).label("first")).join(s, s.c.id == e.c.step_id)
            .where(s.c.run_id.in_(run_ids)).group_by(s.c.run_id)
        ).all()
        outcomes = tx.execute(sa.select(e.c.outcome).where(e.c.id.in_([row.first for row in firsts]))).scalars().all()
    return len(firsts) == len(run_ids) and all(outcome == "process_crashed" for outcome in outcomes)


def test_a_fleet_killed_and_restarted_on_its_host_frees_the_keys_slots_at_once(app, db_url, tmp_path):
    """``kill -9`` of ``ductwork start`` and its children while two bodies hold a key of
    concurrency 2, then ``ductwork start`` again on the same host: the restarted
    supervisor proves the old processes gone and reaps them in its first ticks (before,
    only ``reaper_timeout`` freed them: 294 s in the report of issue 36)."""
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SlowKeyedPipeline"],
                          limits={"slow_key": {"concurrency": 2}}, overrides=NEVER_STALE)
    markers = [tmp_path / "a", tmp_path / "b"]
    runs = [SlowKeyedPipeline.trigger({"path": str(m), "first": 600, "after": 0.05}) for m in markers]
    first = Fleet(db_url, config, label="host").start()
    try:
        wait_for(lambda: all(marker_lines(m) for m in markers), "both bodies hold the key's two slots", 60)
    finally:
        first.kill_host()  # supervisor and children SIGKILLed mid-step
    bodies = [marker_lines(m)[0][0] for m in markers]
    wait_for(lambda: not any(pid_alive(pid) for pid in bodies), "the killed fleet's workers are gone", 10)
    restarted = time.monotonic()
    with Fleet(db_url, config, label="host") as again:
        wait_for(lambda: _first_attempts_crashed(app, [r.id for r in runs]),
                 f"the restarted supervisor freed both slots; log: {again.log()[-2000:]}", 60)
        freed_s = time.monotonic() - restarted
        wait_for(lambda: all(r.refresh().status == "completed" for r in runs), "both runs completed", 60)
        assert "reaped dead processes" in again.log()
    print(f"slots free {freed_s:.1f} s after the restart ({db_url.split(':')[0]})")  # for the closing note (-s)
    with app.begin() as tx:
        p = schema.processes
        assert not tx.execute(sa.select(p.c.id).where(p.c.pid.in_(bodies))).all()  # the old rows are gone


def _in_its_own_pid_namespace(db_url: str) -> tuple[subprocess.Popen, list[str]]:
    """A process in a pid namespace of its own (``unshare --pid``) that registers a
    process row, prints its pid there, and lives until its stdin closes."""
    if shutil.which("unshare") is None:
        skip_or_fail("no unshare(1) to start a process in its own pid namespace", REQUIRE_PID_NAMESPACES)
    script = textwrap.dedent(f"""
        import os, sys
        from ductwork.app import App
        from ductwork.config import Config
        from ductwork.fleet.processes import register
        app = App({db_url!r}, Config.from_section({{}}, source="<test>"))
        print(register(app, role="job_worker", label="other-namespace"), os.getpid(), flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        error = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        if "Operation not permitted" in error:
            skip_or_fail(f"unshare --pid is not permitted here: {error.strip()}", REQUIRE_PID_NAMESPACES)
        raise AssertionError(f"the process in its own pid namespace did not start: {error}")
    return proc, line.split()


def test_a_live_process_of_another_pid_namespace_with_a_pid_that_exists_here_is_never_reaped(sqlite_app):
    """Two containers on one kernel can share a host name and machine id, and their
    processes the same small pids. A row of the other namespace's live process names a pid
    that exists here too (started at another time): it must not pass for a reused pid."""
    proc, (process_id, its_pid) = _in_its_own_pid_namespace(sqlite_app.url)
    try:
        row = _row(sqlite_app, process_id)
        assert row.pid == int(its_pid)
        assert row.os_start_ticks is not None
        assert os_start_ticks(row.pid) not in (None, row.os_start_ticks)  # here that pid is another process
        assert row.machine_identifier != machine_identifier()  # the namespace is part of the machine's name
        assert row.machine_identifier.split("/")[:2] == machine_identifier().split("/")[:2]  # same host and id
        assert not proven_dead(row.machine_identifier, row.pid, row.os_start_ticks)
        assert reap_dead(sqlite_app, None) == []
        assert _row(sqlite_app, process_id) is not None
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
    # gone now, but this namespace cannot see that: in doubt, its heartbeat decides
    assert reap_dead(sqlite_app, None) == []


def test_a_reused_pid_is_told_apart_by_its_start_time(sqlite_app):
    """A row whose pid now belongs to a later process (this one, here) is dead; the same
    pid with its own start time is alive."""
    mine = register(sqlite_app, role="job_worker", label="alive")
    reused = register(sqlite_app, role="job_worker", label="before")
    p = schema.processes
    with sqlite_app.begin() as tx:  # the same pid, started a second before this process
        tx.execute(p.update().where(p.c.id == reused).values(os_start_ticks=os_start_ticks(os.getpid()) - 100))
    assert reap_dead(sqlite_app, None) == [reused]
    assert _row(sqlite_app, mine) is not None


def test_a_zombie_is_dead_and_a_row_without_a_start_time_is_in_doubt():
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        start = wait_for(lambda: os_start_ticks(zombie.pid), "the child started")
        wait_for(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
                 "the child exited and is not waited for")
        assert proven_dead(machine_identifier(), zombie.pid, start)
        assert not proven_dead(machine_identifier(), zombie.pid, None)
        assert not proven_dead(f"another-host/{machine_identifier()}", zombie.pid, start)
    finally:
        zombie.wait(10)


#: the thread-exit system call (exit, not exit_group: the other threads run on), per machine
SYS_EXIT = {"x86_64": 60, "aarch64": 93}


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_process_whose_first_thread_exited_while_another_runs_is_alive_until_that_one_ends():
    """A leader thread that exits while another thread of its process runs leaves a zombie
    leader (state Z) over a process that still runs code: not dead (``hosts._all_tasks_dead``:
    every thread must be a zombie); once the last thread ends, it is."""
    if platform.machine() not in SYS_EXIT:
        pytest.skip(f"no thread-exit system call number known for {platform.machine()}")
    script = textwrap.dedent(f"""
        import ctypes, sys, threading
        threading.Thread(target=sys.stdin.read).start()  # runs until stdin closes
        print("started", flush=True)
        ctypes.CDLL(None).syscall({SYS_EXIT[platform.machine()]}, 0)  # the first thread alone exits
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "started\n"
        start = os_start_ticks(proc.pid)
        wait_for(lambda: _state(proc.pid) == "Z", "the first thread exited")
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        assert not proven_dead(machine_identifier(), proc.pid, start)
        proc.stdin.close()
        wait_for(lambda: proven_dead(machine_identifier(), proc.pid, start), "the last thread ended: dead")
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()


def test_a_process_whose_proc_is_of_another_pid_namespace_names_none():
    """A process in a pid namespace of its own that sees its parent namespace's ``/proc``
    (``unshare --pid`` without ``--mount-proc``) cannot read its own processes there: its
    pid namespace is "" (``hosts.pid_namespace``), so its machine identifier names none and
    the rows it writes never prove a death."""
    if shutil.which("unshare") is None:
        skip_or_fail("no unshare(1) to start a process in its own pid namespace", REQUIRE_PID_NAMESPACES)
    script = ("import os; from ductwork.db.hosts import machine_identifier, pid_namespace; "
              "print(os.getpid(), repr(pid_namespace()), machine_identifier())")
    done = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=60, check=False)
    if "Operation not permitted" in done.stderr:
        skip_or_fail(f"unshare --pid is not permitted here: {done.stderr.strip()}", REQUIRE_PID_NAMESPACES)
    assert done.returncode == 0, done.stderr
    pid, namespace, identifier = done.stdout.split()
    assert (pid, namespace) == ("1", "''")  # the first process of its namespace, which it cannot tell
    assert identifier == machine_identifier().rsplit("/", 1)[0]  # the host and machine id: no namespace


@pytest.mark.usefixtures("app")  # the default app the trigger uses, tables emptied
def test_what_a_dead_fleets_step_started_dies_before_its_claim_moves_on(db_url, tmp_path):
    """The whole host SIGKILLed: the step's subprocess that stayed in the process group dies
    with it; the one that left it (``setsid``) is found by its runner's mark and killed by
    the restarted supervisor before the step is re-run."""
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SpawnerPipeline"],
                          overrides=NEVER_STALE)
    marker = tmp_path / "marker"
    SpawnerPipeline.trigger({"path": str(marker), "seconds": 600})
    leaves = None
    try:
        first = Fleet(db_url, config, label="host").start()
        try:
            ((_runner, _stays, leaves),) = wait_for(lambda: spawned(marker), "the step spawned its subprocesses", 60)
        finally:
            first.kill_host()
        assert pid_alive(leaves)  # it left the group: the host's kill did not reach it
        with Fleet(db_url, config, label="host") as again:
            wait_for(lambda: len(spawned(marker)) == 2, f"the step re-ran; log: {again.log()[-2000:]}", 60)
            assert not pid_alive(leaves)  # killed before the re-run was claimed
            assert "processes left by dead process" in again.log()
            for _, *subprocesses in spawned(marker):
                tree.kill(subprocesses)
    finally:
        for _, *subprocesses in spawned(marker):
            tree.kill(subprocesses)


def test_status_marks_late_and_dead_processes_and_reaps_the_dead(sqlite_app, capsys):
    """``late`` is a heartbeat more than two intervals (5 s) old and not yet stale: 11 s is
    late; a fresh row and one of 6 s (over one interval, under two) carry no mark."""
    from datetime import timedelta

    fresh = register(sqlite_app, role="job_worker", label="fresh")
    under = register(sqlite_app, role="job_worker", label="under")
    late = register(sqlite_app, role="job_worker", label="late")
    exited = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    start = wait_for(lambda: os_start_ticks(exited.pid), "the child started")
    dead = register(sqlite_app, role="job_worker", label="dead", pid=exited.pid)
    exited.stdin.close()
    exited.wait(10)
    p = schema.processes
    with sqlite_app.begin() as tx:
        tx.execute(p.update().where(p.c.id == late).values(last_heartbeat_at=tx.now - timedelta(seconds=11)))
        tx.execute(p.update().where(p.c.id == under).values(last_heartbeat_at=tx.now - timedelta(seconds=6)))
    assert _row(sqlite_app, dead).os_start_ticks == start
    assert main(["status", "--database-url", str(sqlite_app.url), "-c", "/dev/null"]) == 0
    out = capsys.readouterr().out
    (fresh_line, under_line, late_line, dead_line) = [
        next(line for line in out.splitlines() if row in line) for row in (fresh, under, late, dead)]
    assert fresh_line.endswith(fresh)  # no mark after the id
    assert under_line.endswith(under)  # 6 s: over one interval, under two
    assert late_line.endswith("late: heartbeat overdue")  # 11 s: over two heartbeat intervals (5 s), not stale
    assert dead_line.endswith("dead: its process is gone (this machine)")
    assert "reaped 1 dead process of this machine: its claims are free now (the counts above were read before)" in out
    assert _row(sqlite_app, dead) is None
    assert _row(sqlite_app, late) is not None


@pytest.fixture
def sqlite_app(tmp_path):
    """One database is enough where only the machine's processes matter. Its heartbeats
    never go stale within a test (reaper_timeout 600 s): only a proof of death reaps here,
    however slow a loaded machine makes the test (with the suite's 5 s, a row of the other
    pid namespace went stale during one CI run and was reaped as stale, as it should be)."""
    from tests.conftest import installed, make_app, migrated_sqlite

    yield from installed(make_app(migrated_sqlite(tmp_path, "hosts"),
                                  supervisor={"reaper_timeout": 600, "heartbeat_interval": 5}))
