"""The fleet as users run it: ``ductwork start`` processes, killed, reaped, stopped.

Checks: INV-EXE-1 (a dead host's work is re-run by another supervisor), INV-EXE-5
(a timed-out step's process no longer runs when its slot is freed), INV-LIM-3
(a killed worker's slot comes back through its supervisor, not the stale
reaper), INV-EXE-3 (re-runs carry the step's idempotency key).

The last section drives the supervisor's tick and a runner's own decisions in this
process (its own row heartbeat and registered again once reaped, the wait between ticks,
an exited child reaped alone and replaced in the same tick, a shutdown that leaves a child
it could not confirm dead, a runner's boot, its loops' units and waits, its hand-offs and
its role's shutdown timeout): each test there was written for mutants of
``fleet/supervisor.py`` that the fleets above let through (``python -m tests.guard_mutation``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.wakeup import Wakeup
from ductwork.testing import drain
from ductwork_proof.fleet import Fleet, pid_alive, process_rows, wait_for, write_config
from tests.conftest import make_app, reset_tables
from tests.workloads.processes import ForeverKeyedPipeline, SlowKeyedPipeline, SlowPipeline, marker_lines


def _outcomes(app, run_id):
    e, s = schema.executions, schema.steps
    with app.begin() as tx:
        return tx.execute(
            sa.select(s.c.node, e.c.outcome, e.c.error_klass)
            .join(s, s.c.id == e.c.step_id)
            .where(s.c.run_id == run_id).order_by(e.c.created_at, e.c.id)
        ).all()


def test_a_dead_hosts_step_is_reaped_by_another_supervisor(app, db_url, tmp_path):
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SlowPipeline"])
    marker = tmp_path / "marker"
    run = SlowPipeline.trigger({"path": str(marker), "first": 60, "after": 0.05})
    host_a = Fleet(db_url, config, label="host-a").start()
    wait_for(lambda: marker_lines(marker), "the step started on host A")
    host_a.kill_host()  # supervisor and children SIGKILLed mid-step
    ((a_pid, key),) = marker_lines(marker)
    wait_for(lambda: not pid_alive(a_pid), "host A's worker died of the SIGKILL", 10)
    with Fleet(db_url, config, label="host-b") as host_b:
        wait_for(lambda: run.refresh().status == "completed", "the run completed on host B", 60)
        wait_for(lambda: not process_rows(app.engine, label_prefix="host-a"),
                 f"host A's process rows reaped by host B; log: {host_b.log()[-2000:]}", 20)
    (first, second) = marker_lines(marker)
    assert first[0] == a_pid
    assert second[0] != a_pid
    assert first[1] == second[1] == key  # [INV-EXE-3] the same idempotency key
    outcomes = [(n, o, e) for n, o, e in _outcomes(app, run.id) if n == "Slow#0"]
    assert outcomes == [("Slow#0", "process_crashed", "ductwork.ProcessCrash"), ("Slow#0", "success", None)]


def test_a_killed_worker_is_replaced_and_its_slot_freed_by_its_supervisor(app, db_url, tmp_path):
    # reaper_timeout is far beyond the test's deadlines: only the supervisor's
    # wait on its child can free the slot in time.
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SlowKeyedPipeline"],
                          limits={"slow_key": {"concurrency": 1}},
                          overrides={"supervisor": {"reaper_timeout": 600}})
    marker = tmp_path / "marker"
    run = SlowKeyedPipeline.trigger({"path": str(marker), "first": 120, "after": 0.05})
    with Fleet(db_url, config) as fleet:
        wait_for(lambda: marker_lines(marker), "the step started")
        ((victim, _),) = marker_lines(marker)
        os.kill(victim, signal.SIGKILL)
        e = schema.executions
        wait_for(lambda: _outcomes(app, run.id)[:1] == [("Slow#0", "process_crashed", "ductwork.ProcessCrash")],
                 "the supervisor crashed the dead worker's execution (slot freed)", 20)
        wait_for(lambda: run.refresh().status == "completed", "the re-run completed", 30)
        workers = process_rows(app.engine, role="job_worker")
        assert workers, fleet.log()[-3000:]
        assert victim not in {w.pid for w in workers}, fleet.log()[-3000:]
    with app.begin() as tx:
        assert tx.execute(sa.select(sa.func.count()).where(e.c.inflight_key == "slow_key")).scalar_one() == 0


def _fleet_in_a_slow_step(db_url, tmp_path, first: float, **overrides):
    """A SlowPipeline run whose first attempt sleeps ``first`` seconds, and a fleet started on
    it, returned once the step has started (the fleet killed if it never does): (run, fleet,
    marker)."""
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SlowPipeline"],
                          overrides=overrides)
    marker = tmp_path / "marker"
    run = SlowPipeline.trigger({"path": str(marker), "first": first, "after": 0.05})
    fleet = Fleet(db_url, config).start()
    try:
        wait_for(lambda: marker_lines(marker), "the step started")
    except BaseException:
        fleet.kill_host()
        raise
    return run, fleet, marker


def test_sigterm_finishes_the_step_in_hand_and_loses_nothing(app, db_url, tmp_path):
    run, fleet, marker = _fleet_in_a_slow_step(db_url, tmp_path, 1.0)
    try:
        assert fleet.terminate(30) == 0, fleet.log()[-3000:]
    finally:
        fleet.kill_host()
    assert marker_lines(marker, "end"), "the step in hand finished during shutdown"
    assert not process_rows(app.engine), "every process row removed on shutdown"
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert [o for n, o, _ in _outcomes(app, run.id) if n == "Slow#0"] == ["success"]


def test_sigterm_past_the_shutdown_timeout_crashes_and_requeues_the_step(app, db_url, tmp_path):
    run, fleet, marker = _fleet_in_a_slow_step(db_url, tmp_path, 60, job_worker={"shutdown_timeout": 0.5})
    try:
        ((pid, _),) = marker_lines(marker)
        assert fleet.terminate(30) == 0, fleet.log()[-3000:]
    finally:
        fleet.kill_host()
    wait_for(lambda: not pid_alive(pid), "the worker that ran the step is gone", 10)
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert [o for n, o, _ in _outcomes(app, run.id) if n == "Slow#0"] == ["process_crashed", "success"]


def test_a_timed_out_step_is_killed_recorded_and_retried(db_url, tmp_path):
    from ductwork.app import set_default_app

    app = make_app(db_url, job_worker={"limits": {"forever_key": {"concurrency": 1}}})
    reset_tables(app.engine)
    set_default_app(app)
    marker = tmp_path / "marker"
    run = ForeverKeyedPipeline.trigger(str(marker))
    drain(app, timeout=60)
    assert run.refresh().status == "halted"
    outcomes = _outcomes(app, run.id)
    assert [o for _, o, _ in outcomes] == ["timed_out"] * 3  # max_retry 2: three attempts
    starts = marker_lines(marker)
    assert len(starts) == 3
    assert len({pid for pid, _ in starts}) == 3
    assert not any(pid_alive(pid) for pid, _ in starts)  # [INV-EXE-5] none still runs the step
    with app.begin() as tx:
        halt = tx.execute(sa.select(schema.branches.c.halt_reason)).scalar_one()
        in_flight = tx.execute(sa.select(sa.func.count()).where(
            schema.executions.c.inflight_key == "forever_key")).scalar_one()
    assert (halt, in_flight) == ("job_retries_exhausted", 0)
    set_default_app(None)
    app.dispose()


def test_sigterm_to_the_whole_group_twice_stops_cleanly(app, db_url, tmp_path):
    """Ctrl-C or systemd signal every process of the group, and the supervisor signals its
    children again: a second signal during the first handler must not hang a runner."""
    run, fleet, _ = _fleet_in_a_slow_step(db_url, tmp_path, 1.0)
    try:
        for _ in range(2):
            os.killpg(fleet.proc.pid, signal.SIGTERM)
        assert fleet.proc.wait(30) == 0, fleet.log()[-3000:]
        wait_for(lambda: not process_rows(app.engine), "every process row removed on shutdown", 20)
    finally:
        fleet.kill_host()
    drain(app, timeout=30)
    assert run.refresh().status == "completed"


def test_an_exited_scripts_inline_row_is_reaped_by_a_supervisor_tick(manual_app, db_url):
    """A script that did its work in its own process (``drain``) and exited leaves an
    ``inline`` row; a supervisor's tick reaps it once its heartbeat is older than
    ``reaper_timeout``, as any process's, and leaves a live script's row alone."""
    from datetime import timedelta

    from ductwork.fleet.processes import heartbeat, register
    from ductwork.fleet.supervisor import Supervisor
    from tests.workloads.processes import NapPipeline

    clock = manual_app.clock
    script = make_app(db_url, clock=clock)  # the script's own App, in its own process
    run = NapPipeline.trigger(0, app=script)
    drain(script, timeout=30)
    assert run.refresh().status == "completed"
    exited = script.process_id()  # registered by drain; the script exits without a word
    script.dispose()
    live = register(manual_app, role="inline", label="inline", pid=os.getpid() + 1)

    supervisor = Supervisor(manual_app, [], role="advancer")
    supervisor.children.clear()  # the tick without child processes: heartbeat and reap
    supervisor.run_once()
    timeout = manual_app.config.supervisor.reaper_timeout
    clock.advance(timedelta(seconds=timeout) - timedelta(microseconds=1))
    supervisor.run_once()
    assert {row.id for row in process_rows(manual_app.engine, role="inline")} == {exited, live}

    clock.advance(microseconds=2)  # the exited script's heartbeat is now older than reaper_timeout
    assert heartbeat(manual_app, live)  # the live script heartbeats (drain does)
    supervisor.run_once()
    assert {row.id for row in process_rows(manual_app.engine, role="inline")} == {live}
    assert {row.role for row in process_rows(manual_app.engine)} == {"inline", "supervisor"}


# --------------------------------------------------------------------------- one process, in this one


@contextlib.contextmanager
def _started(command: list[str]):
    """A real child process that says ``ready`` once it is set up; killed at the end."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)
        proc.stdout.close()


def test_a_runner_takes_a_role_the_supervisor_starts():
    from ductwork.fleet.supervisor import Runner

    with pytest.raises(ValueError, match="runner role must be job_worker or pipeline_advancer, got 'worker'"):
        Runner(None, "worker", 1, "by-hand")


def test_a_child_not_dead_after_sigkill_is_left_until_its_death_is_confirmed(manual_app, monkeypatch, caplog):
    """A stale child that SIGKILL did not end (uninterruptible sleep, here a kill that does
    not arrive) is neither reaped nor replaced: its claims stay its own until a later tick
    sees it dead [INV-EXE-5]. A ``--role worker`` supervisor watches worker processes only."""
    from datetime import timedelta

    from ductwork.fleet import supervisor as sup
    from ductwork.fleet.processes import register

    monkeypatch.setattr(sup, "KILL_CONFIRM_S", 0.2)
    supervisor = sup.Supervisor(manual_app, [], role="worker")
    assert [c.role for c in supervisor.children] == ["job_worker"]
    (child,) = supervisor.children
    supervisor.stop.set()  # no replacement is started: the test watches the one child
    with _started(["sh", "-c", "echo ready; exec sleep 600"]) as proc:
        row = register(manual_app, role="job_worker", label=child.label, pid=proc.pid)
        child.proc, child.started = proc, time.monotonic() - 3600
        manual_app.clock.advance(timedelta(seconds=manual_app.config.supervisor.reaper_timeout))  # stale
        monkeypatch.setattr(proc, "kill", lambda: None)
        with caplog.at_level(logging.WARNING, logger="ductwork.supervisor"):
            supervisor.check_children()
        assert "did not die after SIGKILL; leaving it" in caplog.text
        assert (child.proc, child.restarts) == (proc, 0)
        assert row in {r.id for r in process_rows(manual_app.engine)}  # not reaped: no proof of death
        monkeypatch.undo()  # the kill arrives at the next tick
        supervisor.check_children()
        assert proc.returncode == -signal.SIGKILL
        assert (child.proc, child.restarts) == (None, 1)
        assert row not in {r.id for r in process_rows(manual_app.engine)}  # reaped once confirmed dead


@pytest.fixture
def quick_stop_app(db_url):
    """The conftest app with a short ``supervisor.shutdown_timeout``, made the default."""
    from tests.conftest import installed

    yield from installed(make_app(db_url, supervisor={"shutdown_timeout": 0.2}))


def test_shutdown_kills_a_child_that_ignores_sigterm_and_survives_a_failed_reap(quick_stop_app, caplog):
    """At shutdown a child that ignores SIGTERM past ``shutdown_timeout`` is SIGKILLed; a
    reap of its row that fails is logged and left to another supervisor's reaper, and the
    shutdown goes on."""
    from datetime import timedelta

    from ductwork import faults
    from ductwork.fleet.processes import register
    from ductwork.fleet.reaper import reap_dead
    from ductwork.fleet.supervisor import Supervisor

    app = quick_stop_app
    supervisor = Supervisor(app, [], role="advancer")
    (child,) = supervisor.children
    with _started(["sh", "-c", "trap '' TERM; echo ready; exec sleep 600"]) as proc:
        row = register(app, role="pipeline_advancer", label=child.label, pid=proc.pid)
        child.proc = proc
        faults.arm(faults.DURING_REAP, "raise")
        try:
            with caplog.at_level(logging.WARNING, logger="ductwork.supervisor"):
                supervisor.shutdown()
        finally:
            faults.disarm()
        assert proc.returncode == -signal.SIGKILL
    assert f"{child.label} did not stop in time; killing it" in caplog.text
    assert f"could not reap {child.label}" in caplog.text
    assert row in {r.id for r in process_rows(app.engine)}
    assert supervisor.process_id is None  # never ran: no row of its own to remove
    with app.begin() as tx:  # once stale, any supervisor's reaper removes it
        tx.execute(schema.processes.update().values(
            last_heartbeat_at=tx.now - timedelta(seconds=app.config.supervisor.reaper_timeout + 1)))
    assert reap_dead(app, None) == [row]


def test_a_runners_heartbeat_outlives_a_failed_reconciliation_and_ends_when_reaped(manual_app, monkeypatch,
                                                                                   caplog):
    """A reconciliation that raises is logged and retried at the next heartbeat; a heartbeat
    that finds the runner's row reaped ends the heartbeats and marks the lease lost."""
    import threading

    from ductwork.fleet import supervisor as sup
    from ductwork.fleet.processes import register
    from ductwork.fleet.reaper import reap

    runner = sup.Runner(manual_app, "job_worker", 1, "beat")
    runner.process_id = register(manual_app, role="job_worker", label="beat")
    runner._units()  # its worker, not started: what the heartbeat asks for the claims it holds
    calls = []
    real = sup.reconcile

    def fails_once(app, process_id, held):
        calls.append(held)
        if len(calls) == 1:
            raise sa.exc.OperationalError("SELECT", {}, ConnectionError("server closed the connection"))
        return real(app, process_id, held)

    monkeypatch.setattr(sup, "reconcile", fails_once)
    beats = threading.Thread(target=runner._heartbeats, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="ductwork.supervisor"):
            beats.start()
            wait_for(lambda: len(calls) >= 2, "a reconciliation after the failed one")
            assert "reconciliation failed" in caplog.text
            assert not runner._reaped
            assert reap(manual_app, runner.process_id, force=True)  # another supervisor took its row
            beats.join(10)
        assert not beats.is_alive()
        assert runner._reaped  # the runner's loop exits (EXIT_LEASE_LOST) on this
    finally:
        runner.stop.set()


def test_a_runner_started_by_hand_exits_when_its_row_is_reaped(app, db_url, tmp_path):
    """``ductwork _child`` without a supervisor (no ``--parent-pid``): its heartbeat finds its
    row reaped, and it exits at once with EXIT_LEASE_LOST [INV-EXE-5]."""
    import sys

    from ductwork.fleet.reaper import reap
    from ductwork.fleet.supervisor import EXIT_LEASE_LOST

    # a lease far longer than the test: only the reap can end the runner
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads.processes:SlowPipeline"],
                          overrides={"supervisor": {"reaper_timeout": 600}})
    log = tmp_path / "runner.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ductwork.cli", "_child", "--database-url", db_url,
                                 "-c", str(config), "--role", "job_worker", "--threads", "1", "--label", "by-hand"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        (row,) = wait_for(lambda: process_rows(app.engine, label_prefix="by-hand"), "the runner registered")
        assert row.pid == proc.pid
        assert reap(app, row.id, force=True)
        assert proc.wait(30) == EXIT_LEASE_LOST, log.read_text()[-2000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)
    assert f"job_worker {row.id} lost its lease; exiting" in log.read_text()


def test_a_runner_reaped_before_its_first_heartbeat_exits_without_starting_a_thread(app, monkeypatch, capsys):
    """A runner whose row is reaped while it starts up (registering, importing the
    pipelines' code: slower than a short lease on a loaded machine) finds out from its
    first heartbeat, sent before any loop starts, and exits with EXIT_LEASE_LOST having
    claimed nothing: none of its threads ever ran [INV-EXE-5]."""
    import threading

    from ductwork.fleet import supervisor as sup
    from ductwork.fleet.reaper import reap

    runner = sup.Runner(app, "job_worker", 2, "late")
    built: list[threading.Thread] = []
    real_units = sup.Runner._units

    def units_then_reaped(self):  # type: ignore[no-untyped-def]
        loops = real_units(self)
        built.extend([*loops, self.tokens_loop])
        assert reap(self.app, self.process_id, force=True)  # another supervisor reaped it meanwhile
        return loops

    monkeypatch.setattr(sup.Runner, "_units", units_then_reaped)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # run() installs its own
    try:
        assert runner.run() == sup.EXIT_LEASE_LOST
    finally:
        runner.stop.set()  # (a listener thread on PostgreSQL)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert len(built) == 3
    assert all(thread.ident is None for thread in built)  # none was started
    assert f"job_worker {runner.process_id} lost its lease; exiting" in capsys.readouterr().err


def test_a_worker_whose_process_lost_its_lease_starts_no_step_code(app, tmp_path):
    """A worker thread asks its process's lease before a body starts: once it is lost (the
    process froze past it, and the reaper may have handed its claims on), a claimed
    execution's body does not run, and the claim is crashed (its re-run is enqueued)
    rather than run beside that re-run [INV-EXE-5, INV-LIM-1]. A worker thawed between a
    claim and its body started it in a chaos round: four bodies of a key limited to three."""
    from ductwork.fleet.worker import Worker

    marker = tmp_path / "marker"
    run = SlowPipeline.trigger({"path": str(marker), "first": 0, "after": 0})
    held = [True]
    worker = Worker(app, lease=lambda: held[0])
    worker._claim()  # claimed while the lease held
    assert len(worker._queue) == 1
    held[0] = False  # then frozen past it
    assert worker.run_once() is None
    assert not marker.exists()  # the body never started
    assert [(n, o) for n, o, _ in _outcomes(app, run.id)] == [("Slow#0", "process_crashed"), ("Slow#0", None)]
    held[0] = True  # (a process that holds its lease runs the re-run)
    assert worker.run_once() is not None
    assert len(marker_lines(marker)) == 1


def test_a_runner_holds_its_lease_until_its_last_heartbeat_is_older_than_it(manual_app):
    """``Runner.holds_lease``, what each of its workers asks before a body starts: its
    last heartbeat younger than the lease (``reaper_timeout`` less its margin), and its row
    not found reaped."""
    from ductwork.fleet import supervisor as sup

    runner = sup.Runner(manual_app, "job_worker", 1, "leased")
    cfg = manual_app.config.supervisor
    lease = cfg.reaper_timeout - sup.lease_margin(cfg.reaper_timeout, cfg.heartbeat_interval)
    runner._last_heartbeat_sent = time.monotonic()
    assert runner.holds_lease()
    runner._last_heartbeat_sent = time.monotonic() - lease - 0.5  # a freeze longer than the lease
    assert not runner.holds_lease()
    runner._last_heartbeat_sent = time.monotonic()
    runner._reaped = True
    assert not runner.holds_lease()


# --------------------------------------------------------------------------- the supervisor's tick and a runner's
# own decisions, in this process (found missing by the generated mutants of fleet/supervisor.py)

#: a pid no process of these tests has (its rows are only read or reaped, never signalled)
NO_SUCH_PID = 4_000_001


def test_a_supervisors_tick_heartbeats_its_own_row_and_registers_again_once_reaped(manual_app):
    """Each tick stamps the supervisor's own row (the same row, the database's now); a tick
    that finds it reaped (another supervisor took it for dead) registers a new one."""
    from ductwork.fleet.reaper import reap
    from ductwork.fleet.supervisor import Supervisor

    app = manual_app
    supervisor = Supervisor(app, [], role="advancer")
    supervisor.children.clear()  # the tick without child processes: heartbeat, reap, sweeps

    def rows() -> list[tuple]:
        return [(row.id, row.last_heartbeat_at) for row in process_rows(app.engine, role="supervisor")]

    supervisor.run_once()
    first = supervisor.process_id
    assert rows() == [(first, app.clock.now())]
    app.clock.advance(timedelta(seconds=1))
    supervisor.run_once()
    assert (supervisor.process_id, rows()) == (first, [(first, app.clock.now())])
    assert reap(app, first, force=True)
    supervisor.run_once()
    assert supervisor.process_id != first
    assert rows() == [(supervisor.process_id, app.clock.now())]


def _slept(supervisor, tick: float, deadline_s: float) -> float:
    """How long ``supervisor._sleep(tick)`` took, run in a thread that must end within ``deadline_s``."""
    import threading

    sleeper = threading.Thread(target=supervisor._sleep, args=(tick,), daemon=True)
    started = time.monotonic()
    sleeper.start()
    sleeper.join(deadline_s)
    assert not sleeper.is_alive(), f"the supervisor's sleep of {tick} s did not end within {deadline_s} s"
    return time.monotonic() - started


def test_a_supervisor_sleeps_its_tick_unless_a_child_exited(manual_app):
    """Between ticks the supervisor waits ``tick`` seconds, and returns at once when a child
    exited (SIGCHLD's handler sets the flag), the flag cleared for the next wait."""
    from ductwork.fleet.supervisor import Supervisor

    supervisor = Supervisor(manual_app, [], role="advancer")
    assert _slept(supervisor, 0.2, 10) >= 0.2
    supervisor._on_child_signal(signal.SIGCHLD, None)
    assert _slept(supervisor, 30, 10) < 10
    assert not supervisor._child_exited


def test_a_child_that_exited_is_reaped_alone_and_replaced_in_the_same_tick(manual_app, monkeypatch):
    """A child that exited after a long life: the tick that sees it reaps its rows, and only
    its (another process's row stays), and starts its replacement at once."""
    from ductwork.fleet.processes import register
    from ductwork.fleet.supervisor import Supervisor

    app = manual_app
    supervisor = Supervisor(app, [], role="worker")
    (child,) = supervisor.children
    spawned = []
    monkeypatch.setattr(supervisor, "_spawn", lambda c: spawned.append(c.label))
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    child.proc, child.started = exited, time.monotonic() - 60
    register(app, role="job_worker", label=child.label, pid=exited.pid)
    other = register(app, role="job_worker", label="another-host.worker.0", pid=NO_SUCH_PID)
    supervisor.check_children()
    assert {row.id for row in process_rows(app.engine)} == {other}
    assert (spawned, child.restarts) == ([child.label], 1)


def test_shutdown_reaps_no_child_it_could_not_confirm_dead_and_skips_one_not_running(quick_stop_app, monkeypatch,
                                                                                    caplog):
    """At shutdown a child that neither stopped nor died of SIGKILL keeps its row (its
    claims stay its own until its death is confirmed [INV-EXE-5]); a child not running
    (between a crash and its restart) is passed over; the supervisor's own row is removed."""
    from ductwork.fleet import supervisor as sup
    from ductwork.fleet.processes import register

    app = quick_stop_app
    monkeypatch.setattr(sup, "KILL_CONFIRM_S", 0.2)
    supervisor = sup.Supervisor(app, [], role="all")
    advancer, worker, *_ = supervisor.children
    assert (advancer.role, worker.role, advancer.proc) == ("pipeline_advancer", "job_worker", None)
    supervisor.process_id = register(app, role="supervisor", label="supervisor")
    with _started(["sh", "-c", "trap '' TERM; echo ready; exec sleep 600"]) as proc:
        row = register(app, role="job_worker", label=worker.label, pid=proc.pid)
        worker.proc = proc
        monkeypatch.setattr(proc, "kill", lambda: None)  # a kill that does not arrive
        try:
            with caplog.at_level(logging.WARNING, logger="ductwork.supervisor"):
                supervisor.shutdown()
            assert proc.poll() is None
            assert f"{worker.label} (pid {proc.pid}) did not die after SIGKILL; leaving it" in caplog.text
            assert {r.id for r in process_rows(app.engine)} == {row}
        finally:
            monkeypatch.undo()  # the kill arrives: the process ends with the test


def test_a_supervisor_kills_what_its_dead_runners_left_only_as_their_subreaper(manual_app, monkeypatch):
    """The orphans a dead runner's steps left are re-parented to the supervisor only once it
    is their subreaper: then it kills every child of its own but its runners (the ones it
    started and still holds); before that there is nothing of theirs to find."""
    from types import SimpleNamespace

    from ductwork.fleet import supervisor as sup

    known = []
    monkeypatch.setattr(sup.tree, "kill_adopted", lambda runners: known.append(runners) or [])
    supervisor = sup.Supervisor(manual_app, [], role="all")
    worker = next(child for child in supervisor.children if child.role == "job_worker")
    worker.proc = SimpleNamespace(pid=NO_SUCH_PID)  # the advancer is between a crash and its restart
    supervisor._kill_adopted()
    assert known == []
    supervisor._subreaper = True
    supervisor._kill_adopted()
    assert known == [{NO_SUCH_PID}]


def test_a_runners_boot_rebases_the_keys_as_a_job_worker_and_listens_where_the_database_notifies(app, monkeypatch):
    """A job worker runner starts by re-basing every limit key on its own config (its stamp
    cleared: ``claims.restart_with``), an advancer runner leaves the keys alone; each
    listens for other processes' wakeups (``PgListener``) on PostgreSQL, and only there."""
    from ductwork.fleet import supervisor as sup
    from ductwork.fleet.reaper import reap
    from ductwork.limits.executions import ensure_keys

    real_units = sup.Runner._units
    listening = []

    def units_then_reaped(self):  # type: ignore[no-untyped-def]
        loops = real_units(self)
        assert reap(self.app, self.process_id, force=True)  # ends the run at its first heartbeat
        return loops

    class Listener:
        def __init__(self, app, _stop) -> None:  # type: ignore[no-untyped-def]
            self.app = app

        def start(self) -> None:
            listening.append(self.app)

    monkeypatch.setattr(sup.Runner, "_units", units_then_reaped)
    monkeypatch.setattr(sup, "PgListener", Listener)
    monkeypatch.setenv(sup.tree.OWNER_ENV, "")  # run() marks this process: unmarked after the test
    k = schema.limit_keys
    with app.begin() as tx:
        ensure_keys(tx, {"stamped"})
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stamped = {}
    try:
        for role in ("pipeline_advancer", "job_worker"):
            with app.begin() as tx:
                tx.execute(k.update().values(blocked_until=tx.now + timedelta(hours=1)))
            runner = sup.Runner(app, role, 1, role)
            assert runner.run() == sup.EXIT_LEASE_LOST
            with app.begin() as tx:
                stamped[role] = tx.execute(sa.select(k.c.blocked_until)).scalar_one() is not None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert stamped == {"pipeline_advancer": True, "job_worker": False}
    assert listening == ([app, app] if app.backend == "postgresql" else [])


def test_a_supervised_runner_dies_with_its_supervisor_and_stops_if_it_died_already(app, monkeypatch):
    """A runner its supervisor started asks the kernel for SIGTERM at that supervisor's
    death, and is stopping at once if its parent is no longer that supervisor (it died
    before the request); a runner started by hand asks nothing."""
    from ductwork.fleet import supervisor as sup

    asked = []
    monkeypatch.setattr(sup.tree, "die_with_parent", lambda sig: asked.append(sig) or True)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signalled = {}
    try:
        for name, parent in (("by hand", None), ("supervised", os.getppid()), ("orphaned", NO_SUCH_PID)):
            runner = sup.Runner(app, "job_worker", 1, name, parent_pid=parent)
            runner._arm_signals()
            signalled[name] = runner._signalled
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert asked == [signal.SIGTERM, signal.SIGTERM]
    assert signalled == {"by hand": False, "supervised": False, "orphaned": True}


def test_a_runners_loops_run_its_roles_units_and_say_whether_they_did_something(app):
    """A job worker runner's loops run Workers, an advancer runner's Advancers, and each
    loop's unit says whether it did something: idle on an empty database, busy while a
    step runs or a branch is advanced (an idle unit makes its loop wait)."""
    from ductwork.fleet.supervisor import Runner
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer
    from tests.workloads import Fan

    workers, advancers = Runner(app, "job_worker", 1, "w"), Runner(app, "pipeline_advancer", 1, "a")
    ((work,), (advance,)) = workers._units(), advancers._units()
    assert [type(u) for u in (*workers.units, *advancers.units)] == [Worker, Advancer]
    assert (work.unit(), advance.unit()) == (False, False)
    Fan.trigger(1)
    assert (work.unit(), advance.unit()) == (True, True)  # Items ran; its expand advanced


def test_an_idle_loop_waits_for_its_wakeup_or_due_time_and_a_busy_one_goes_on():
    """A loop runs its unit again at once while the unit did something; idle, it waits
    for its wakeup, or for the time its unit says work comes due, or its idle wait."""
    import threading

    from ductwork.fleet.supervisor import Loop

    stop, wakeup = threading.Event(), Wakeup()
    calls: list[bool] = []
    notified = threading.Event()

    def unit() -> bool:
        calls.append(notified.is_set())
        return len(calls) <= 3  # three busy calls, then idle

    loop = Loop("woken", unit, 600, stop, wakeup)
    loop.start()
    try:
        wait_for(lambda: len(calls) == 4, "three busy calls run back to back, then one idle", 10)
        notified.set()
        wakeup.notify()
        wait_for(lambda: len(calls) == 5, "the wakeup ended the idle wait", 10)
        assert calls == [False, False, False, False, True]  # no call between the idle one and the wakeup
    finally:
        stop.set()
        wakeup.notify()
        loop.join(10)
    for name, idle_wait, until_due in (("due", 600, lambda: 0.05), ("plain", 0.05, None)):
        calls.clear()
        stop = threading.Event()
        idle = Loop(name, lambda: calls.append(True) and False, idle_wait, stop, until_due=until_due)
        idle.start()
        try:
            wait_for(lambda: len(calls) >= 2, f"{name}: an idle wait ended without a wakeup", 10)
        finally:
            stop.set()
            idle.join(10)


def test_a_runners_workers_hand_off_work_only_until_it_is_stopped(app):
    """A runner's workers take the work their completions hand them while the runner runs,
    and not once it is stopping (``job_worker.hand_off``)."""
    from ductwork.fleet.supervisor import Runner

    runner = Runner(app, "job_worker", 2, "handing")
    runner._units()
    assert [worker._hands_off() for worker in runner.units] == [True, True]
    runner.stop.set()
    assert [worker._hands_off() for worker in runner.units] == [False, False]


class _Exited(BaseException):
    pass


class _Busy:
    """A loop whose unit never ends: it records how long it was waited for."""

    def __init__(self) -> None:
        self.waited: float | None = None

    def join(self, timeout: float) -> None:
        self.waited = timeout

    def is_alive(self) -> bool:
        return True


def test_a_stopping_runner_gives_a_busy_loop_its_roles_shutdown_timeout(db_url, monkeypatch):
    """A stopping runner waits for its busy loops the ``shutdown_timeout`` of its own role,
    then exits (killing what its steps started)."""
    from ductwork.fleet import supervisor as sup

    app = make_app(db_url, job_worker={"shutdown_timeout": 0.5}, pipeline_advancer={"shutdown_timeout": 7})
    exits, killed = [], []

    def exit_(code: int) -> None:
        exits.append(code)
        raise _Exited

    monkeypatch.setattr(sup.os, "_exit", exit_)
    monkeypatch.setattr(sup.tree, "kill_descendants", lambda: killed.append(True) or [])
    waited = {}
    try:
        for role in ("job_worker", "pipeline_advancer"):
            busy = _Busy()
            with pytest.raises(_Exited):
                sup.Runner(app, role, 1, "busy")._join_loops_or_exit([busy])
            waited[role] = busy.waited
    finally:
        app.dispose()
    assert 0.4 < waited["job_worker"] <= 0.5
    assert 6.9 < waited["pipeline_advancer"] <= 7
    assert (exits, killed) == ([0, 0], [True, True])


def test_an_advancer_runner_started_by_hand_runs_until_sigterm_and_removes_its_row(app, db_url, tmp_path):
    """``ductwork _child --role pipeline_advancer`` starts its loops and heartbeats; SIGTERM
    stops it cleanly (exit 0) and its row goes with it."""
    config = write_config(tmp_path / "ductwork.yml", pipelines=[], overrides={"supervisor": {"reaper_timeout": 600}})
    log = tmp_path / "runner.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ductwork.cli", "_child", "--database-url", db_url,
                                 "-c", str(config), "--role", "pipeline_advancer", "--threads", "1",
                                 "--label", "by-hand"], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: " started: " in log.read_text() or proc.poll() is not None, "the runner started", 30)
        assert " started: " in log.read_text(), log.read_text()[-2000:]
        assert process_rows(app.engine, label_prefix="by-hand")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-2000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)
    assert not process_rows(app.engine, label_prefix="by-hand")
