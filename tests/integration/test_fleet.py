"""The fleet as users run it: ``ductwork start`` processes, killed, reaped, stopped.

Checks: INV-EXE-1 (a dead host's work is re-run by another supervisor), INV-EXE-5
(a timed-out step's process no longer runs when its slot is freed), INV-LIM-3
(a killed worker's slot comes back through its supervisor, not the stale
reaper), INV-EXE-3 (re-runs carry the step's idempotency key).
"""

from __future__ import annotations

import os
import signal

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.testing import drain
from tests.conftest import make_app, reset_tables
from tests.fleet import Fleet, pid_alive, process_rows, wait_for, write_config
from tests.workloads import ForeverKeyedPipeline, SlowKeyedPipeline, SlowPipeline, marker_lines


def _outcomes(app, run_id):
    e, j, s = schema.executions, schema.jobs, schema.steps
    with app.begin() as tx:
        return tx.execute(
            sa.select(s.c.node, e.c.outcome, e.c.error_klass)
            .join(j, j.c.id == e.c.job_id).join(s, s.c.id == j.c.step_id)
            .where(s.c.run_id == run_id).order_by(e.c.created_at, e.c.id)
        ).all()


def test_a_dead_hosts_step_is_reaped_by_another_supervisor(app, db_url, tmp_path):
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads:SlowPipeline"])
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
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads:SlowKeyedPipeline"],
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


def test_sigterm_finishes_the_step_in_hand_and_loses_nothing(app, db_url, tmp_path):
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads:SlowPipeline"])
    marker = tmp_path / "marker"
    run = SlowPipeline.trigger({"path": str(marker), "first": 1.0, "after": 0.05})
    fleet = Fleet(db_url, config).start()
    try:
        wait_for(lambda: marker_lines(marker), "the step started")
        assert fleet.terminate(30) == 0, fleet.log()[-3000:]
    finally:
        fleet.kill_host()
    assert marker_lines(marker, "end"), "the step in hand finished during shutdown"
    assert not process_rows(app.engine), "every process row removed on shutdown"
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert [o for n, o, _ in _outcomes(app, run.id) if n == "Slow#0"] == ["success"]


def test_sigterm_past_the_shutdown_timeout_crashes_and_requeues_the_step(app, db_url, tmp_path):
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads:SlowPipeline"],
                          overrides={"job_worker": {"shutdown_timeout": 0.5}})
    marker = tmp_path / "marker"
    run = SlowPipeline.trigger({"path": str(marker), "first": 60, "after": 0.05})
    fleet = Fleet(db_url, config).start()
    try:
        wait_for(lambda: marker_lines(marker), "the step started")
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
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads:SlowPipeline"])
    marker = tmp_path / "marker"
    run = SlowPipeline.trigger({"path": str(marker), "first": 1.0, "after": 0.05})
    fleet = Fleet(db_url, config).start()
    try:
        wait_for(lambda: marker_lines(marker), "the step started")
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
    from tests.workloads import NapPipeline

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
