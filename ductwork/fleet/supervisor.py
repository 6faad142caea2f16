"""The fleet: a supervisor process and its advancer and job-worker processes.

    $ ductwork start -c ductwork.yml --env production

**Supervisor** (``ductwork start``): one per host (two for redundancy is fine). It
starts children as fresh interpreters — one advancer process with
``pipeline_advancer.count`` threads and ``job_worker.processes`` worker processes
with ``job_worker.count`` threads each (``role`` picks which) — and every tick
(``supervisor.polling_timeout``):

1. notices a child that exited (it waits on its children; SIGCHLD wakes the
   tick early), force-reaps the child's process row — so its executions,
   advancements and limit slots come back within that tick — and starts a
   replacement; a child whose heartbeat is stale is SIGKILLed first and reaped
   only once its death is confirmed;
2. heartbeats its own row (re-registering if another supervisor reaped it);
3. reaps every process whose heartbeat is older than ``reaper_timeout``, and every
   process of this machine that is provably gone (a crashed ``ductwork start`` this one
   replaced: its claims are free within a tick, not after ``reaper_timeout``), never
   its own row, and sweeps orphaned claims;
4. forgets the idle partitions (no claim or release for ``supervisor.forget_idle_after``)
   of one batch of ``supervisor.forget_batch`` limit key rows, the next batch at the next
   tick (``limits.executions.forget_idle_partitions``, docs/semantics.md §5.1).

Each step is rescued on its own, so one bad tick cannot stop the loop.

**Runner** (a child): registers a process row, runs its threads (each calls
``run_once`` and waits a jittered ``polling_timeout`` only when idle), and
heartbeats every ``heartbeat_interval``. It holds a *lease*: if it has not
completed a heartbeat for ``reaper_timeout`` minus a margin (database paused or
unreachable), or finds its row reaped, it kills itself at once. The reaper only
reaps after ``reaper_timeout``, so a reaped process's step code is already dead
when its claims are handed to someone else [INV-EXE-5, INV-LIM-1].

Shutdown (SIGTERM/SIGINT): the supervisor TERMs its children and waits up to
``supervisor.shutdown_timeout``; a runner stops claiming, lets threads finish the
unit in hand for up to its ``shutdown_timeout``, then exits; stragglers are
SIGKILLed and force-reaped. Nothing held is lost: whatever was in hand is crashed
and re-run, or released.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.database import Database
from ductwork.db.hosts import rows_of_os_process
from ductwork.db.wakeup import PgListener, Wakeup
from ductwork.errors import ConfigError
from ductwork.fleet import tree
from ductwork.fleet.processes import heartbeat, register
from ductwork.fleet.reaper import reap, reap_dead, reconcile, sweep_orphans
from ductwork.limits.executions import forget_idle_partitions

if TYPE_CHECKING:
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer

log = logging.getLogger("ductwork.supervisor")

EXIT_LEASE_LOST = 75
#: the most characters of a process's label (``ductwork_processes.label``): ``ductwork start
#: --label L`` names its children ``L.advancer`` and ``L.worker.<i>``
LABEL_LIMIT = 100
KILL_CONFIRM_S = 5.0
STARTUP_GRACE_S = 60.0


def lease_margin(reaper_timeout: float, heartbeat_interval: float) -> float:
    """How long before ``reaper_timeout`` a runner without a heartbeat kills itself."""
    return max(heartbeat_interval * 2, reaper_timeout * 0.2)


# --------------------------------------------------------------------------- runner (child)


class Loop(threading.Thread):
    """One worker or advancer thread: ``unit()`` returns whether it did something.

    When idle it waits a jittered ``idle_wait``, or less if ``wakeup`` fires (work
    became claimable) or ``stop`` is set, or until ``until_due()`` seconds have passed
    (work that time alone makes claimable: a token, a delayed execution).
    """

    def __init__(self, name: str, unit: Callable[[], bool], idle_wait: float, stop: threading.Event,
                 wakeup: Wakeup | None = None, until_due: Callable[[], float | None] | None = None):
        super().__init__(name=name, daemon=True)
        self.unit, self.idle_wait, self.stop = unit, idle_wait, stop
        self.wakeup = wakeup
        self.until_due = until_due
        self.rng = random.Random()

    def run(self) -> None:
        while not self.stop.is_set():
            seen = self.wakeup.generation if self.wakeup else 0
            try:
                did = self.unit()
            except Exception:  # one failed unit must not end the thread
                log.exception("%s: unit of work failed", self.name)
                did = False
            if not did:
                wait = self.idle_wait * self.rng.uniform(0.75, 1.25)  # ± 25 %, re-drawn: no lockstep wakes
                due = self.until_due() if self.until_due else None
                if due is not None:
                    wait = min(wait, due)  # a token or a delayed execution is due at an exact time: be there
                if self.wakeup is None:
                    self.stop.wait(wait)
                else:
                    self.wakeup.wait(seen, wait)


class Runner:
    """A child process: threads of one role, a heartbeat, and the lease watchdog."""

    def __init__(self, app: Database, role: str, threads: int, label: str, *, parent_pid: int | None = None):
        if role not in ("job_worker", "pipeline_advancer"):
            raise ValueError(f"runner role must be job_worker or pipeline_advancer, got {role!r}")
        self.app, self.role, self.threads, self.label = app, role, threads, label
        #: the supervisor that started this runner; None: started by hand, nobody to outlive
        self.parent_pid = parent_pid
        self.stop = threading.Event()
        self.process_id = ""
        self.units: list[Worker | Advancer] = []  # the Worker or Advancer of each thread
        self._signalled = False
        self._last_heartbeat_sent = time.monotonic()
        self._reaped = False
        cfg = app.config.supervisor
        #: how long the last heartbeat keeps its claims this process's (``reaper_timeout``
        #: less its margin): the lease the watchdog and each worker ask (:meth:`holds_lease`)
        self.lease_s = cfg.reaper_timeout - lease_margin(cfg.reaper_timeout, cfg.heartbeat_interval)

    def _units(self) -> list[Loop]:
        """A loop per thread, each with its unit (:attr:`units`); a worker's tokens loop too."""
        from ductwork.fleet.shared import Refusals, TokenAlarm

        #: wakes an idle thread when a rated key's next token is due (a claim spent the last)
        self.tokens = TokenAlarm(self.app.wakeup.notify)
        #: the keyed claims this process's polls were refused, written by the next heartbeat
        self.refusals = Refusals()
        if self.role == "job_worker":
            self.tokens_loop = Loop("ductwork.job_worker.tokens", self.tokens.run_once,
                                    self.app.config.job_worker.polling_timeout, self.stop, self.tokens.changed,
                                    self.tokens.seconds_left)
        loop = self._worker_loop if self.role == "job_worker" else self._advancer_loop
        return [loop(f"ductwork.{self.role}.{i}") for i in range(self.threads)]

    def _worker_loop(self, name: str) -> Loop:
        from ductwork.fleet.worker import Worker

        cfg = self.app.config.job_worker
        worker = Worker(self.app, process_id=self.process_id,
                        hand_off=(lambda: not self.stop.is_set()) if cfg.hand_off else None,
                        batch_size=cfg.batch_size, batch_window=cfg.batch_window, threads=self.threads,
                        tokens=self.tokens, lease=self.holds_lease, refused=self.refusals.count)
        self.units.append(worker)
        return Loop(name, lambda: worker.run_once() is not None, cfg.polling_timeout, self.stop, self.app.wakeup,
                    lambda: worker.next_due_s)

    def _advancer_loop(self, name: str) -> Loop:
        from ductwork.pipelines.advance import Advancer

        advancer = Advancer(self.app, process_id=self.process_id)
        self.units.append(advancer)
        return Loop(name, lambda: advancer.run_once() != "idle", self.app.config.pipeline_advancer.polling_timeout,
                    self.stop, self.app.advancer_wakeup)

    def _on_signal(self, *_: object) -> None:
        # Only a plain assignment: a second signal arriving while the first handler sits
        # in Event.set() would re-enter its non-reentrant lock and hang the process.
        self._signalled = True

    def _heartbeats(self) -> None:
        while not self.stop.is_set() and self.beat():
            self.stop.wait(self.app.config.supervisor.heartbeat_interval)

    def beat(self) -> bool:
        """One heartbeat, with the refusals counted since the last (put back if it fails),
        then a reconciliation; False once it found this runner's row reaped. A heartbeat
        that failed with counts is sent again without them: an observability counter the
        database refuses must not cost the process its lease (a reason longer than its
        column did, before revision 0015)."""
        sent, refused = time.monotonic(), self.refusals.take()
        try:
            alive = heartbeat(self.app, self.process_id, refused)
        except Exception:  # the watchdog decides when this is fatal
            self.refusals.add(refused)
            log.warning("heartbeat failed", exc_info=True)
            if not refused:
                return True
            try:
                alive = heartbeat(self.app, self.process_id)
            except Exception:  # the database, not the counts
                log.warning("heartbeat failed without its refusal counts too", exc_info=True)
                return True
            log.error("heartbeat sent without its refusal counts, whose write failed (kept for the next): %s",
                      dict(refused))
        if not alive:
            self._reaped = True
            return False
        self._last_heartbeat_sent = sent
        try:
            reconcile(self.app, self.process_id, set().union(*(u.held() for u in self.units)))
        except Exception:  # retried at the next heartbeat
            log.warning("reconciliation failed", exc_info=True)
        return True

    def holds_lease(self) -> bool:
        """Whether this runner may still start step code: its row not found reaped, and its
        last heartbeat younger than its lease. False once a freeze (SIGSTOP, a paused VM)
        outlasted the lease: the reaper may have handed its claims on, and the watchdog
        below is about to end the process [INV-EXE-5]."""
        return not self._reaped and time.monotonic() - self._last_heartbeat_sent <= self.lease_s

    def _say_lease_lost(self) -> None:
        print(f"ductwork: {self.role} {self.process_id} lost its lease; exiting", file=sys.stderr, flush=True)

    def run(self) -> int:
        self.process_id = register(self.app, role=self.role, label=self.label)
        if mark := tree.own_mark():  # still one thread: every process a step starts inherits it [INV-EXE-5]
            os.environ[tree.OWNER_ENV] = mark
        from ductwork.limits.claims import restart_with

        if self.role == "job_worker":
            restart_with(self.app)
        self._arm_signals()
        if self.app.backend == "postgresql":
            PgListener(self.app, self.stop).start()
        loops = self._units()
        # The lease runs from a heartbeat sent now, after the start-up above (the pipelines'
        # code imported): counted from before it, a start-up slower than a short lease on a
        # loaded machine ended each new runner at once, and its replacement the same way.
        # No loop has started: nothing is claimed before this heartbeat.
        sent = time.monotonic()
        if not heartbeat(self.app, self.process_id):  # reaped meanwhile
            self._say_lease_lost()
            return EXIT_LEASE_LOST
        self._last_heartbeat_sent = sent
        for loop in [*loops, self.tokens_loop] if self.role == "job_worker" else loops:  # a worker's tokens too
            loop.start()
        threading.Thread(target=self._heartbeats, name="ductwork.heartbeat", daemon=True).start()
        log.info("%s %s started: %d threads, lease %.1fs", self.role, self.process_id, self.threads, self.lease_s)
        self._watch_until_signalled()
        self._join_loops_or_exit(loops)
        reap(self.app, self.process_id, force=True)  # nothing in hand: just remove the row
        self.app.dispose()
        return 0

    def _arm_signals(self) -> None:
        """SIGTERM and SIGINT stop this runner (acted on by :meth:`_watch_until_signalled`),
        and so does its supervisor's death."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        if self.parent_pid is not None:
            # A supervisor that dies (SIGKILL, OOM) leaves no runner working unsupervised:
            # the kernel sends SIGTERM, and this runner shuts down as if stopped.
            tree.die_with_parent(signal.SIGTERM)
            if os.getppid() != self.parent_pid:  # it died before the signal was armed
                self._signalled = True

    def _watch_until_signalled(self) -> None:
        """Return once a signal asked this runner to stop (the loops told to stop); end the
        process, with what its steps started, as soon as it no longer holds its lease."""
        while True:  # left by the return below (stop is set there only) or by os._exit
            if self._signalled:  # set by the handler; acted on here, outside it
                self.stop.set()
                self.app.wakeup.notify()
                self.app.advancer_wakeup.notify()
                return
            if not self.holds_lease():
                # Our claims are (or are about to be) someone else's: no code of ours may run.
                self._say_lease_lost()
                tree.kill_descendants()  # [INV-EXE-5] nothing a step started outlives its claim
                os._exit(EXIT_LEASE_LOST)
            self.stop.wait(0.05)

    def _join_loops_or_exit(self, loops: list[Loop]) -> None:
        """Wait up to the role's ``shutdown_timeout`` for the loops to finish; a loop still
        busy then ends the process, with the subprocesses its steps started."""
        shutdown = (self.app.config.job_worker.shutdown_timeout if self.role == "job_worker"
                    else self.app.config.pipeline_advancer.shutdown_timeout)
        deadline = time.monotonic() + shutdown
        for loop in loops:
            loop.join(max(0.0, deadline - time.monotonic()))
        if any(loop.is_alive() for loop in loops):
            # Threads cannot be killed: exit, and let the supervisor (or reaper) recover.
            log.warning("%s: threads still busy after %.1fs; exiting", self.role, shutdown)
            if killed := tree.kill_descendants():  # [INV-EXE-5] the busy steps' subprocesses too
                log.warning("%s: killed %d processes the busy steps started: %s", self.role, len(killed), killed)
            os._exit(0)


# --------------------------------------------------------------------------- supervisor

_p = schema.processes


@dataclass
class Child:
    role: str  # job_worker | pipeline_advancer
    label: str
    threads: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    not_before: float = 0.0
    restarts: int = 0


class Supervisor:
    """Starts, watches and replaces runner processes; reaps the dead. See the module doc."""

    def __init__(self, app: Database, child_command: list[str], *, role: str | None = None,
                 label: str = "supervisor"):
        self.app = app
        self.child_command = child_command
        self.role = role or app.config.role
        self.label = label
        self.stop = threading.Event()
        self._stopping = False
        self._child_exited = False
        #: set by run(): orphans of dead runners are re-parented to this process (Linux)
        self._subreaper = False
        self.process_id: str | None = None
        self.children: list[Child] = []
        self._forget_after = ""  # the key the sweep of idle partitions goes on after
        cfg = app.config
        if self.role in ("all", "advancer"):
            self.children.append(Child("pipeline_advancer", f"{label}.advancer", cfg.pipeline_advancer.count))
        if self.role in ("all", "worker"):
            for i in range(cfg.job_worker.processes):
                self.children.append(Child("job_worker", f"{label}.worker.{i}", cfg.job_worker.count))
        longest = max([label, *(child.label for child in self.children)], key=len)
        if len(longest) > LABEL_LIMIT:  # a child that cannot register would be restarted for ever
            raise ConfigError("--label", label, f"its processes' label {longest!r} has {len(longest)} characters, "
                                                f"more than the {LABEL_LIMIT} a process row holds")

    # -- children --------------------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        command = [*self.child_command, "--role", child.role, "--threads", str(child.threads),
                   "--label", child.label, "--parent-pid", str(os.getpid())]
        child.proc = subprocess.Popen(command)
        child.started = time.monotonic()
        log.info("started %s (pid %d)", child.label, child.proc.pid)

    def _force_reap(self, pid: int) -> None:
        """Reap the rows of a child known dead (it was waited for): whatever it registered."""
        with self.app.begin(readonly=True) as tx:
            rows = list(tx.execute(sa.select(_p.c.id).where(*rows_of_os_process(pid))).scalars())
        for process_id in rows:
            reap(self.app, process_id, force=True)

    def _kill_and_confirm(self, child: Child) -> bool:
        assert child.proc is not None
        with contextlib.suppress(ProcessLookupError):
            child.proc.kill()
        try:
            child.proc.wait(KILL_CONFIRM_S)
            return True
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) did not die after SIGKILL; leaving it", child.label, child.proc.pid)
            return False

    def _stale(self, child: Child) -> bool:
        """A running child whose heartbeat is older than its lease allows (it should have
        killed itself), or that never registered within ``STARTUP_GRACE_S``."""
        cfg = self.app.config.supervisor
        threshold = cfg.reaper_timeout - lease_margin(cfg.reaper_timeout, cfg.heartbeat_interval) / 2
        age = time.monotonic() - child.started
        if child.proc is None or age < threshold:
            return False
        with self.app.begin(readonly=True) as tx:
            last: datetime | None = tx.execute(sa.select(sa.func.max(_p.c.last_heartbeat_at))
                                               .where(*rows_of_os_process(child.proc.pid))).scalar()
            now = tx.now
        if last is None:  # still starting (imports, connecting, registering)
            return age > max(STARTUP_GRACE_S, cfg.reaper_timeout)
        return (now - last).total_seconds() > threshold

    def _kill_adopted(self) -> None:
        if not self._subreaper:
            return
        # [INV-EXE-5] what a dead runner's steps started was re-parented here: kill it
        # before that runner's claims are reaped and handed to someone else
        adopted = tree.kill_adopted({c.proc.pid for c in self.children if c.proc is not None})
        if adopted:
            log.warning("killed %d processes left by a dead runner's steps: %s", len(adopted), adopted)

    def check_children(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None and self._stale(child):
                log.warning("%s (pid %d) stopped heartbeating; killing it", child.label, child.proc.pid)
                if not self._kill_and_confirm(child):
                    continue
            if child.proc is not None and child.proc.poll() is not None:
                code = child.proc.returncode
                log.warning("%s (pid %d) exited with %s; reaping and replacing", child.label, child.proc.pid, code)
                self._kill_adopted()  # what its steps started dies before its claims move on
                self._force_reap(child.proc.pid)  # proof of death: it was waited for
                short_lived = now - child.started < 5.0
                child.failures = child.failures + 1 if short_lived else 0
                child.not_before = now + min(10.0, 0.25 * 2 ** child.failures) if short_lived else now
                child.proc = None
                child.restarts += 1
            if child.proc is None and not self.stop.is_set() and now >= child.not_before:
                self._spawn(child)

    # -- the tick -----------------------------------------------------------------------------

    def run_once(self) -> None:
        """One supervisor tick: children, own heartbeat, reap, sweeps. Each step rescued."""
        for step in (self.check_children, self._heartbeat, self._reap, self._forget):
            try:
                step()
            except Exception:  # a failed step must not stop the supervisor
                log.exception("supervisor step %s failed", step.__name__)

    def _heartbeat(self) -> None:
        if self.process_id is None or not heartbeat(self.app, self.process_id):
            self.process_id = register(self.app, role="supervisor", label=self.label)

    def _reap(self) -> None:
        if reaped := reap_dead(self.app, self.process_id):
            log.warning("reaped dead processes: %s", reaped)
        sweep_orphans(self.app)

    def _forget(self) -> None:
        cfg = self.app.config.supervisor
        _, self._forget_after = forget_idle_partitions(self.app, self._forget_after, limit=cfg.forget_batch,
                                                       idle_for=timedelta(seconds=cfg.forget_idle_after))

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop_signal)
        signal.signal(signal.SIGCHLD, self._on_child_signal)
        self._subreaper = tree.become_subreaper()
        from ductwork.limits.claims import restart_with

        restart_with(self.app)
        tick = self.app.config.supervisor.polling_timeout
        while not self._stopping:
            self.run_once()
            self._sleep(tick)
        self.stop.set()
        self.shutdown()
        return 0

    # Signal handlers only assign flags (an Event.set() in a handler can re-enter the
    # Event's own lock when a second signal arrives); the loop acts on them.
    def _on_stop_signal(self, *_: object) -> None:
        self._stopping = True
        self._child_exited = True

    def _on_child_signal(self, *_: object) -> None:
        self._child_exited = True

    def _sleep(self, tick: float) -> None:
        """Until the next tick, or at once when a child exited or a stop was asked for."""
        end = time.monotonic() + tick
        while time.monotonic() < end and not self._child_exited:
            time.sleep(0.01)
        self._child_exited = False

    def shutdown(self) -> None:
        running = [c for c in self.children if c.proc is not None and c.proc.poll() is None]
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                child.proc.terminate()  # type: ignore[union-attr]
        deadline = time.monotonic() + self.app.config.supervisor.shutdown_timeout
        for child in running:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", child.label)
                self._kill_and_confirm(child)
        self._kill_adopted()  # the orphans of children killed above
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                try:
                    self._force_reap(child.proc.pid)
                except Exception:  # the reaper of another supervisor will finish it
                    log.exception("could not reap %s", child.label)
        if self.process_id is not None:
            reap(self.app, self.process_id, force=True)
        self.app.dispose()
