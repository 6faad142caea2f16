"""One chaos round: a real fleet on a real database, attacked, then checked.

    result = ChaosRound(seed=7, url=url, server=server, workdir=tmp, backend="postgresql").run()
    assert result.violations == {}

A round

1. starts two ``ductwork start`` hosts (supervisor, one advancer process, two
   worker processes of three threads each) with short timeouts;
2. triggers the chaos workload (every transition; keys with concurrency and
   multi-entry rates shared across pipelines; retries; delays);
3. runs a **kill plan** drawn from ``random.Random(seed)`` before the round starts,
   so the same seed attacks at the same moments in the same way: SIGKILL a
   random worker, advancer or supervisor (restarted), kill a whole host
   (restarted, sometimes with a fault checkpoint armed so its children die there),
   freeze a whole host past ``reaper_timeout`` (SIGSTOP, then SIGCONT: zombies),
   terminate the fleet's database connections from the server side, run
   ``ductwork prune --pipeline ChaosRetained`` (sometimes killed inside a batch,
   after triggering two fresh runs so some are live), and, where the database runs
   in a container, restart the server once;
4. a **quiet phase**: faults off, a healthy fleet, until every run is completed,
   halted or dampened and every on_halt hook owed has its outcome (bounded), then
   one last prune (it finishes what a killed one left);
5. stops the fleet, reads the history (execution, step, branch and run rows,
   witness rows the step bodies wrote, the harness's own kill log) and runs the
   independent checkers of ``ductwork_proof/checkers.py`` over it.

With ``engine_copy=DIR``, the fleet runs a scratch copy of ``ductwork`` (an engine mutant's
edits: the repository's ``tests/mutants.py`` makes them), first on its processes'
``PYTHONPATH``; the harness itself and its checkers run the installed package.

The history is written as JSONL (with the seed, the plan and the database
version) so the checkers can be re-run offline; a failure prints the command that
replays the round.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ductwork import faults
from ductwork.app import App
from ductwork.config import Config
from ductwork.db import schema
from ductwork.fleet import tree
from ductwork_proof.checkers import check_all
from ductwork_proof.fleet import Fleet, process_rows, wait_for, write_config
from ductwork_proof.history import History, read_history
from ductwork_proof.workload import LIMITS, PIPELINES, RETAINED, REVIVED, WITNESS, AdopterShapes, trigger_workload

SETTINGS = {
    # batch_window 0.5 s (default 0.05): the witnessed steps take milliseconds each, and
    # kills should land inside batches (claimed, queued, run but not yet recorded) often
    "job_worker": {"count": 3, "processes": 2, "polling_timeout": 0.1, "retry_delay": 0.1, "max_retry": 3,
                   "max_crash": 30, "crash_backoff": 0.1, "shutdown_timeout": 2, "batch_window": 0.5},
    "pipeline_advancer": {"count": 2, "polling_timeout": 0.1, "expand_batch": 25, "max_crash": 30,
                          "shutdown_timeout": 2},
    "supervisor": {"polling_timeout": 0.2, "reaper_timeout": 3, "heartbeat_interval": 0.2, "shutdown_timeout": 6},
}
HOSTS = ("host-a", "host-b")
#: action -> weight in the plan
ACTIONS = {
    "kill_worker": 6, "kill_advancer": 3, "kill_supervisor": 2, "kill_host": 2,
    "kill_host_at_checkpoint": 2, "terminate_connections": 3, "freeze_host": 1, "prune": 2,
}
#: the plan's actions that SIGKILL a process (a worker, an advancer, a supervisor or a whole host)
PROCESS_KILLS = ("kill_worker", "kill_advancer", "kill_supervisor", "kill_host", "kill_host_at_checkpoint")
#: checkpoints a host passes (the harness's own prunes pass inside_prune_batch)
FAULTABLE = [c for c in faults.CHECKPOINTS if c not in (faults.DURING_REAP, faults.INSIDE_PRUNE_BATCH)]
#: a round's prunes: runs of ChaosRetained finished more than this long ago
PRUNE_BACK = "1s"


#: the first seed of the default rounds; each round's seed is printed with its counts
BASE_SEED = 20261129


def chaos_seeds(environ: dict[str, str]) -> list[int]:
    """The rounds' seeds: ``DUCTWORK_CHAOS_SEED`` (comma-separated seeds and ``a-b`` ranges,
    to replay a round or soak over a range), else ``DUCTWORK_CHAOS_ROUNDS`` seeds from
    :data:`BASE_SEED` on (default 2 per database)."""
    given = environ.get("DUCTWORK_CHAOS_SEED", "").strip()
    if not given:
        rounds = int(environ.get("DUCTWORK_CHAOS_ROUNDS", "2"))
        if rounds < 1:
            raise ValueError(f"DUCTWORK_CHAOS_ROUNDS={rounds}: must be at least 1")
        return [BASE_SEED + i for i in range(rounds)]
    seeds: list[int] = []
    for item in (part.strip() for part in given.split(",")):
        if not item:
            continue
        first, dash, last = item.partition("-")
        if dash and int(last) < int(first):
            raise ValueError(f"DUCTWORK_CHAOS_SEED: range {item!r} runs backwards")
        seeds.extend(range(int(first), int(last) + 1) if dash else [int(item)])
    return seeds


def make_plan(seed: int, duration_s: float, *, connections: bool, container: bool) -> list[dict]:
    """The round's fault schedule, entirely from ``seed``."""
    rng = random.Random(seed)
    actions = {a: w for a, w in ACTIONS.items() if connections or a != "terminate_connections"}
    plan, at = [], 0.5
    while at < duration_s:
        action = rng.choices(list(actions), weights=list(actions.values()))[0]
        event: dict[str, Any] = {"at_s": round(at, 3), "action": action, "pick": rng.random(),
                                 "host": rng.choice(HOSTS), "down_s": round(rng.uniform(0.2, 1.5), 3)}
        if action == "kill_host_at_checkpoint":
            event["fault"] = f"{rng.choice(FAULTABLE)}:kill:{rng.randint(2, 12)}"
        if action == "prune" and rng.random() < 0.5:
            event["fault"] = f"{faults.INSIDE_PRUNE_BATCH}:kill:{rng.randint(1, 2)}"
        plan.append(event)
        at += rng.uniform(0.15, 0.55)  # about 22 faults per 8 s round
    if container:
        plan.append({"at_s": round(duration_s / 2, 3), "action": "restart_database", "pick": 0.0,
                     "host": HOSTS[0], "down_s": 0.0})
        plan.sort(key=lambda e: e["at_s"])
    return plan


@dataclass
class Result:
    seed: int
    violations: dict[str, list[str]]
    counts: dict[str, int]
    history_path: Path
    plan: list[dict]
    log: list[dict] = field(default_factory=list)

    def summary(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        return f"chaos seed {self.seed}: {counts}; history {self.history_path}"


class ChaosRound:
    def __init__(self, *, seed: int, url: str, backend: str, workdir: Path, server: Any = None,
                 scale: int = 1, mutant: str | None = None, engine_copy: Path | None = None,
                 duration_s: float | None = None, plan: list[dict] | None = None,
                 adopter: AdopterShapes | None = None, builtin: bool = True):
        self.seed, self.url, self.backend, self.workdir = seed, url, backend, workdir
        #: the adopter's limits on synthetic keys and their runs (``ductwork verify -c``), run
        #: beside the built-in workload
        self.adopter = adopter or AdopterShapes()
        self.limits = {**LIMITS, **self.adopter.limits}
        #: trigger the built-in workload's runs (False: only the adopter's; the round's prunes
        #: still trigger and prune runs of ChaosRetained)
        self.builtin = builtin
        self.server, self.scale, self.mutant = server, max(1, scale), mutant
        #: a directory put first on the fleet's ``PYTHONPATH``: a patched copy of ``ductwork``
        #: (an engine mutant, named by ``mutant``, which the round's metadata records)
        self.engine_copy = engine_copy
        self.duration_s = duration_s if duration_s is not None else 8.0 * self.scale
        self.container = server is not None and getattr(server, "container", None) is not None
        self.plan = plan if plan is not None else make_plan(
            seed, self.duration_s, connections=backend != "sqlite", container=self.container)
        self.kills: list[dict] = []
        #: every revive pass's calls: ``{"run", "got": [new run ids], "errors": [...]}``
        self.revives: list[dict] = []
        self.forgotten: list[str] = []  # the partitions the harness's sweep forgot (INV-LIM-9)
        self.rng = random.Random(seed + 1)
        self.hosts: dict[str, Fleet | None] = {}
        self.retired: list[Fleet] = []  # supervisors killed alone: their children live on
        self.config_path = write_config(workdir / "ductwork.yml",
                                        pipelines=[f"{p.__module__}:{p.__qualname__}"
                                                   for p in (*PIPELINES, *self.adopter.pipelines,
                                                             *dict.fromkeys(p for p, _ in self.adopter.runs))],
                                        limits=self.limits, overrides=SETTINGS)

    # -- fleet ---------------------------------------------------------------------------------

    def _env(self, fault: str | None = None) -> dict[str, str]:
        env = {"DUCTWORK_CHAOS_WITNESS_URL": self.url, "DUCTWORK_FAULT": fault or "", **self.adopter.environ()}
        if self.engine_copy is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.engine_copy), os.environ.get("PYTHONPATH")) if p)
            env["COVERAGE_PROCESS_START"] = ""  # a patched copy's lines are not the package's coverage
        return env

    def _start(self, host: str, fault: str | None = None) -> None:
        fleet = Fleet(self.url, self.config_path, label=host, env=self._env(fault),
                      log=self.workdir / f"{host}.log")
        self.hosts[host] = fleet.start()

    def _down(self, host: str) -> None:
        fleet = self.hosts.get(host)
        if fleet is not None:
            fleet.kill_host()
        self.hosts[host] = None

    def _engine(self) -> sa.Engine:
        from ductwork.db.engines import create_engine

        return create_engine(self.url, io_timeout=10)

    # -- faults --------------------------------------------------------------------------------

    def _db_now_us(self) -> int | None:
        """The database's clock now, in µs since the epoch (as the witness rows are), or
        None when the database does not answer."""
        try:
            with self.app.begin(readonly=True) as tx:
                return tx.now_us  # the witnesses' scale: exact µs of the database's naive-UTC time
        except sa.exc.DBAPIError:
            return None

    def _kill_process(self, role: str, pick: float) -> dict:
        rows = sorted(process_rows(self.engine, role=role), key=lambda r: r.label)
        if not rows:
            return {"target": None}
        row = rows[int(pick * len(rows))]
        try:
            os.kill(row.pid, signal.SIGKILL)
        except ProcessLookupError:
            return {"target": row.label, "pid": row.pid, "note": "already gone"}
        return {"target": row.label, "pid": row.pid}

    def _terminate_connections(self) -> dict:
        with self.engine.connect() as conn:
            if self.backend == "postgresql":
                killed = conn.execute(sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar_one()
            else:
                ids = conn.execute(sa.text(
                    "SELECT id FROM information_schema.processlist WHERE db = DATABASE() "
                    "AND id <> CONNECTION_ID()")).scalars().all()
                killed = 0
                for connection_id in ids:
                    try:
                        conn.execute(sa.text(f"KILL {int(connection_id)}"))
                        killed += 1
                    except sa.exc.DBAPIError:
                        pass  # it ended meanwhile
        return {"connections": int(killed)}

    def _apply(self, event: dict) -> dict:
        action = event["action"]
        if action == "kill_worker":
            return self._kill_process("job_worker", event["pick"])
        if action == "kill_advancer":
            return self._kill_process("pipeline_advancer", event["pick"])
        if action == "kill_supervisor":
            host = event["host"]
            fleet = self.hosts.get(host)
            if fleet is None or fleet.proc is None or fleet.proc.poll() is not None:
                return {"target": host, "note": "down"}
            os.kill(fleet.proc.pid, signal.SIGKILL)  # its runners get SIGTERM from the kernel and stop
            fleet.proc.wait(10)
            fleet.close_log()
            self.retired.append(fleet)
            self._start(host)
            return {"target": f"{host}.supervisor", "pid": fleet.proc.pid}
        if action in ("kill_host", "kill_host_at_checkpoint"):
            host = event["host"]
            self._down(host)
            time.sleep(event["down_s"])  # the host stays down this long (the plan's choice)
            self._start(host, event.get("fault"))
            return {"target": host, "fault": event.get("fault")}
        if action == "terminate_connections":
            return self._terminate_connections()
        if action == "freeze_host":
            # SIGSTOP the whole host past reaper_timeout (a VM or GC pause): the other host
            # reaps its rows, then it thaws with threads mid-claim. Its lease kills it soon
            # after, but until then those threads are zombies whose commits must be rejected.
            host = event["host"]
            fleet = self.hosts.get(host)
            if fleet is None or fleet.proc is None or fleet.proc.poll() is not None:
                return {"target": host, "note": "down"}
            frozen_s = SETTINGS["supervisor"]["reaper_timeout"] + 1.5
            # the frozen processes and the database time the freeze began: a body frozen
            # then is stopped, not running, and after the thaw a zombie whose commits the
            # fence refuses until its lease watchdog kills it (INV-EXE-5's stated
            # exception); the witness sweep stops counting it there, and does not count a
            # body admitted before the freeze whose witness row is written after the thaw
            pids = [fleet.proc.pid, *tree.descendants(fleet.proc.pid)]
            frozen_at_us = self._db_now_us()
            os.killpg(fleet.proc.pid, signal.SIGSTOP)
            time.sleep(frozen_s)  # frozen this long (the plan's choice)
            os.killpg(fleet.proc.pid, signal.SIGCONT)
            return {"target": host, "frozen_s": frozen_s, "pids": pids, "frozen_at_us": frozen_at_us}
        if action == "prune":
            return self._prune(event.get("fault"), fresh=2)
        if action == "restart_database":
            self.server.restart()
            self.server.wait_ready(60)
            return {"target": "database"}
        if action == "kill_database":  # the server process dies (SIGKILL), then comes back
            self.server.kill()
            time.sleep(event["down_s"])  # down this long (the plan's choice)
            self.server.start()
            self.server.wait_ready(60)
            return {"target": "database"}
        if action == "pause_database":  # frozen with connections open, for pause_s
            self.server.pause()
            time.sleep(event["pause_s"])  # frozen this long (the plan's choice)
            self.server.unpause()
            return {"target": "database", "paused_s": event["pause_s"]}
        raise AssertionError(f"unknown chaos action {action!r}")

    def _retained(self) -> tuple[int, dict[str, list]]:
        """Database now and each ChaosRetained run's ``[status, finished µs]``, in one read."""
        from ductwork_proof.history import to_us

        r = schema.runs
        with self.engine.connect() as conn:
            from ductwork.db.dialects import db_now

            moment: datetime = db_now(conn)  # the dialect's seam: a naive UTC datetime
            now = to_us(moment)
            rows = conn.execute(sa.select(r.c.id, r.c.status, r.c.completed_at, r.c.halted_at)
                                .where(r.c.pipeline_klass == RETAINED)).all()
        return now, {row.id: [row.status, to_us(row.completed_at or row.halted_at)] for row in rows}

    def _retained_aged(self) -> bool:
        now, runs = self._retained()
        return all(status == "dampened" or (finished is not None and now - finished > 1_000_000)
                   for status, finished in runs.values())

    def _prune(self, fault: str | None, fresh: int = 0) -> dict:
        """Trigger ``fresh`` ChaosRetained runs, read every such run's status, run ``ductwork
        prune`` on them (``fault`` armed in it), read them again: the checkers compare."""
        from ductwork_proof.workload import ChaosRetained

        try:
            for i in range(fresh):  # a multiple of 3 halts (a later prune's), the others stay dampened
                ChaosRetained.trigger(3 * (1000 + len(self.kills)) + i, app=self.app)
            before_us, before = self._retained()
        except sa.exc.DBAPIError as error:  # the database is down (a restart in the plan)
            return {"target": "prune", "note": f"database unavailable: {type(error).__name__}"}
        env = {**os.environ, **self._env(fault)}
        done = subprocess.run([sys.executable, "-m", "ductwork.cli", "prune", "--finished-before", PRUNE_BACK,
                               "--pipeline", RETAINED, "--batch-size", "2", "--database-url", self.url,
                               "-c", "/dev/null"], env=env, capture_output=True, text=True, timeout=120,
                              check=False, cwd=self.workdir)
        cutoff = [line for line in done.stdout.splitlines() if line.startswith("pruning runs finished before ")]
        try:
            _, after = self._retained()
        except sa.exc.DBAPIError as error:
            return {"target": "prune", "note": f"database unavailable after: {type(error).__name__}"}
        return {"target": "prune", "fault": fault, "returncode": done.returncode, "before_us": before_us,
                "before": before, "after": sorted(after),
                "cutoff": cutoff[0].removeprefix("pruning runs finished before ").removesuffix(" UTC")
                if cutoff else None, "stderr": done.stderr.strip().splitlines()[-1:] if done.returncode else []}
    # -- revives (issue 16) --------------------------------------------------------------------

    @staticmethod
    def _unrevived(conn: sa.Connection) -> list[str]:
        """Halted runs of the revived pipelines that no run revives yet."""
        r, again = schema.runs, schema.runs.alias("again")
        return list(conn.execute(sa.select(r.c.id).where(
            r.c.status == "halted", r.c.pipeline_klass.in_(REVIVED),
            ~sa.exists().where(again.c.revived_from == r.c.id)).order_by(r.c.id)).scalars())

    def _revive_pass(self, app: App) -> None:
        """Revive each halted run of the revived pipelines from two threads at once; both
        must get the same new run (INV-REV-1, checked from ``meta["revives"]``)."""
        from ductwork.pipelines.revive import revive_run

        with self.engine.connect() as conn:
            halted = self._unrevived(conn)
        for run_id in halted:
            got: list[str] = []
            errors: list[str] = []

            def revive(run_id: str = run_id, got: list[str] = got, errors: list[str] = errors) -> None:
                try:
                    got.append(revive_run(app, run_id))
                except Exception as error:  # noqa: BLE001 - the database is under attack: recorded
                    errors.append(f"{type(error).__name__}: {str(error)[:200]}")

            threads = [threading.Thread(target=revive, daemon=True) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            self.revives.append({"run": run_id, "got": got, "errors": errors})

    def _reviver(self, app: App, stop: threading.Event) -> None:
        while not stop.wait(0.3):  # a polling interval, not a wait for anything to settle
            with contextlib.suppress(Exception):  # a killed connection or server: the next pass retries
                self._revive_pass(app)

    def _forgetter(self, app: App, stop: threading.Event) -> None:
        """Forget idle partitions while the fleet works and faults strike (INV-LIM-9): the
        supervisors' sweep waits for an hour of idleness, which no round lasts, so the harness
        sweeps with none, racing the enqueues, claims and kills; each key forgotten is kept."""
        from ductwork.limits.executions import forget_idle_partitions

        after = ""
        while not stop.wait(0.2):  # a polling interval, not a wait for anything to settle
            with contextlib.suppress(Exception):  # a killed connection or server: the next pass retries
                forgotten, after = forget_idle_partitions(app, after, idle_for=timedelta(0))
                self.forgotten += forgotten

    # -- the round -----------------------------------------------------------------------------

    def _settled(self) -> bool:
        try:
            with self.engine.connect() as conn:
                running = conn.execute(sa.select(sa.func.count()).select_from(schema.runs)
                                       .where(schema.runs.c.status == "in_progress")).scalar_one()
                h = schema.halt_hooks  # and every hook owed by a halted run has its outcome
                open_hooks = conn.execute(sa.select(sa.func.count()).select_from(h)
                                          .where(h.c.status.not_in(("succeeded", "failed")))).scalar_one()
                return running == 0 and open_hooks == 0 and not self._unrevived(conn)
        except sa.exc.DBAPIError:
            return False

    def run(self) -> Result:
        self.engine = self._engine()
        WITNESS.drop(self.engine, checkfirst=True)
        WITNESS.create(self.engine)
        app = App(self.url, Config.from_section({"job_worker": {"limits": self.limits}}, source="<chaos>"),
                  engine=self.engine)
        self.app = app
        runs = (trigger_workload(app, self.scale) if self.builtin else []) + self.adopter.trigger(app)
        stop_reviving = threading.Event()
        reviver = threading.Thread(target=self._reviver, args=(app, stop_reviving), daemon=True)
        forgetter = threading.Thread(target=self._forgetter, args=(app, stop_reviving), daemon=True)
        try:
            # (inside the try: a fleet that never registers is stopped by the finally below too;
            # started before it, one leaked on a loaded machine and kept replacing its workers,
            # which lost their short lease, until the whole CI run starved)
            for host in HOSTS:
                self._start(host)
            wait_for(lambda: len(process_rows(self.engine, role="job_worker")) >= 2 * len(HOSTS),
                     "both hosts' workers registered", deadline_s=60)
            started = time.monotonic()
            reviver.start()
            forgetter.start()
            for event in self.plan:
                delay = started + event["at_s"] - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the plan's schedule, not a wait for a condition
                outcome = self._apply(event)
                self.kills.append({**event, **outcome, "done_s": round(time.monotonic() - started, 3)})
            # Quiet phase: a healthy fleet, no faults, until everything settles.
            for host in HOSTS:
                fleet = self.hosts.get(host)
                healthy = fleet is not None and fleet.proc is not None and fleet.proc.poll() is None
                faulted = fleet is not None and bool(fleet.env.get("DUCTWORK_FAULT"))
                if not healthy or faulted:
                    self._down(host)
                    self._start(host)
            wait_for(self._settled, f"every run settled after the chaos phase (seed {self.seed})",
                     deadline_s=240, interval=0.25)
            wait_for(self._retained_aged, f"every ChaosRetained run finished more than {PRUNE_BACK} ago",
                     deadline_s=30, interval=0.25)
            self.kills.append({"at_s": round(time.monotonic() - started, 3), "action": "prune", "last": True,
                               **self._prune(None)})
        finally:
            stop_reviving.set()
            for thread in (reviver, forgetter):
                if thread.ident is not None:  # (started)
                    thread.join(120)
            for fleet in self.retired:
                fleet.kill_host()  # runners of supervisors killed alone, if still stopping
            for host in HOSTS:
                fleet = self.hosts.get(host)
                if fleet is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                        fleet.terminate(20)
                    fleet.kill_host()
        history = read_history(self.engine, app.config.limits, WITNESS, kills=self.kills, seed=self.seed,
                               meta={**self._meta(len(runs)), "revives": self.revives,
                                     "forgotten": self.forgotten},
                               families=app.config.families)
        path = self.workdir / f"history-{self.backend}-{self.seed}.jsonl"
        history.to_jsonl(path)
        violations = {k: v for k, v in check_all(history).items() if v}
        result = Result(self.seed, violations, self._counts(history), path, self.plan, self.kills)
        self.engine.dispose()
        return result

    def _meta(self, runs: int) -> dict:
        with self.engine.connect() as conn:
            version = {"postgresql": "SELECT version()", "mysql": "SELECT version()",
                       "sqlite": "SELECT sqlite_version()"}[self.backend]
            db_version = conn.execute(sa.text(version)).scalar_one()
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
        return {"backend": self.backend, "database_version": db_version, "commit": commit, "runs": runs,
                "scale": self.scale, "duration_s": self.duration_s, "plan": self.plan, "mutant": self.mutant,
                "python": sys.version.split()[0], "max_retry": SETTINGS["job_worker"]["max_retry"],
                "max_crash": SETTINGS["job_worker"]["max_crash"]}

    @staticmethod
    def _counts(history: History) -> dict[str, int]:
        return {
            # process kills: SIGKILLs that found their target (a host's counts once)
            "kills": sum(1 for k in history.kills if k["action"] in PROCESS_KILLS
                         and k.get("target") and k.get("note") not in ("down", "already gone")),
            "prunes": sum(1 for k in history.kills if k["action"] == "prune" and "before" in k),
            "pruned runs": sum(len(set(k["before"]) - set(k["after"])) for k in history.kills
                               if k["action"] == "prune" and "before" in k),
            "connection kills": sum(k.get("connections", 0) for k in history.kills),
            "runs": len(history.runs),
            "steps": len(history.steps),
            "claims": sum(1 for e in history.executions if e.claimed_at_us is not None),
            "keyed claims": sum(1 for e in history.executions if e.claimed_at_us is not None and e.key),
            # unkeyed claims made in one transaction with another (a worker's batch): same claim time
            "batched claims": sum(n for n in Counter(e.claimed_at_us for e in history.executions
                                                     if e.claimed_at_us is not None and not e.key).values() if n > 1),
            "witnesses": len(history.witnesses),
            "halted runs": sum(1 for r in history.runs if r.status == "halted"),
            "on_halt hooks": len(history.hooks),
            "revived runs": sum(1 for r in history.runs if r.revived_from is not None),
            "concurrent revive calls": sum(len(c["got"]) + len(c["errors"]) for c in history.meta.get("revives", [])),
            "forgotten partitions": len(history.meta.get("forgotten", [])),
        }


def replay_command(backend: str, seed: int) -> str:
    return f"DUCTWORK_CHAOS_SEED={seed} pytest -m chaos -k 'test_chaos_round and {backend}' -s"
