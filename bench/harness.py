"""The bench harness: databases, bulk rows, fleets, repetitions and the results table.

    target = Target.from_url("postgresql://postgres@127.0.0.1:5432/ductwork_bench")
    target.setup(); target.reset()
    app = target.app()
    insert_pending(app, One, 1000, prefix="a")        # 1000 pending runs, in SQL, in bulk
    with ProcessFleet(target, workers=2) as fleet: ... # real ``ductwork start`` processes

Not run directly: ``python -m bench --help``. Every benchmark takes ``--database-url``
through ``bench/__main__.py`` and defaults to SQLite (a fresh file under the temp dir).

What the harness promises:

- a target database is ductwork's alone: it is created if missing, migrated to head,
  and every ductwork row in it is deleted between benchmarks. The test suite's
  databases (``test``, ``ductwork_test_*``) are refused.
- bulk rows are inserted with ``INSERT … SELECT`` over a numbers CTE, row for row what
  ``trigger`` would write (a run, its start branch, its start step, job and pending
  execution), so 10⁶ pending jobs take seconds rather than 10⁶ Python triggers.
- times used in figures are database times read from rows (``claimed_at``,
  ``completed_at``), so the fleet's own clocks and the bench process never skew them;
  except the bodies' witness lines (``bench.workloads.witness``), which are wall-clock
  times written by the bodies themselves, every process on this one host reading the
  same clock.
- a batch is fed in one of two ways (``FedFirst``, ``Triggered``): inserted whole in
  bulk before it is measured (``insert_pending``), or triggered one run at a time
  through the public ``Pipeline.trigger`` by a thread of the bench process at a steady
  pace while the fleets work (what production does). Either feed names its runs and
  executions for the batch's queries afterwards.
- the fleet shapes users build (issue 32) are one table, ``SHAPES``: worker processes ×
  threads per worker process of one ``ductwork start``, and what the user writes for it.
- a fleet's CPU (``ProcessFleet.cpu_seconds``, from ``/proc``) and SQL statements
  (``ProcessFleet.statements``, counted by bench/probes/sitecustomize.py, which only
  the bench's fleets load) can be read at any moment; ``Meter`` takes the difference
  over a batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from ductwork.app import App
from ductwork.config import Config
from ductwork.db import dialects, engines, migrate, schema
from ductwork.db.database import Tx
from ductwork.fleet import tree
from ductwork.limits.executions import ensure_keys

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN_DATABASES = ("test",)
FORBIDDEN_PREFIXES = ("ductwork_test_",)
DEFAULT_SERVERS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/ductwork_bench",
    "mariadb": "mysql://root@127.0.0.1:3306/ductwork_bench",
}


# --------------------------------------------------------------------------- measurements


@dataclass
class Metric:
    """One figure: the median of ``samples`` (one per repetition), with its unit."""

    value: float | None
    unit: str = ""
    samples: list[float] = field(default_factory=list)
    note: str = ""
    #: an engine-internal figure (claims/s, slots in use, CPU, statements): the table
    #: lists it below every user-visible figure
    diagnostic: bool = False

    @classmethod
    def of(cls, samples: Iterable[float | None], unit: str = "", note: str = "",
           diagnostic: bool = False) -> Metric:
        kept = [s for s in samples if s is not None and s == s]  # drops None and NaN
        return cls(statistics.median(kept) if kept else None, unit, kept, note, diagnostic)

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "samples": self.samples, "note": self.note,
                "diagnostic": self.diagnostic}


def ratio(numerators: list[float], denominators: list[float]) -> list[float]:
    """Per-repetition ratios (a comparison measured within one repetition)."""
    return [n / d for n, d in zip(numerators, denominators, strict=False) if d]


def label(fn: Callable[..., Any]) -> str:
    """A bench function's label: the first line of its docstring."""
    return (fn.__doc__ or fn.__name__).strip().splitlines()[0]


@dataclass
class Sizes:
    """How big and how often; ``quick`` is the smoke run, ``full`` adds the 10⁶ cases."""

    quick: bool = False
    full: bool = False
    #: an interpreter with ``pgqueuer[asyncpg]`` installed: on PostgreSQL, B1 and B2 then
    #: run pgqueuer too, in the same repetitions (bench/pgqueuer_drain.py)
    pgqueuer_python: str | None = None

    @property
    def repeats(self) -> int:
        return 1 if self.quick else 3


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- databases


def bench_config(**sections: dict[str, Any]) -> Config:
    """Defaults (ductwork's own) plus the bench pipelines and limits, with overrides."""
    from bench.workloads import LIMITS, PIPELINES

    body: dict[str, Any] = {"pipelines": PIPELINES, "job_worker": {"limits": LIMITS}}
    for name, values in sections.items():
        body.setdefault(name, {}).update(values)
    return Config.from_section(body, source="<bench>")


@dataclass
class Target:
    """One database the benchmarks own: ``kind`` is sqlite, postgresql or mariadb/mysql."""

    url: str
    kind: str
    name: str
    _template: Path | None = None
    _tempdir: Path | None = None

    @classmethod
    def from_url(cls, url: str | None) -> Target:
        directory = None
        if url is None:
            directory = Path(tempfile.mkdtemp(prefix="ductwork_bench_"))
            url = f"sqlite:///{directory}/bench.sqlite3"
        parsed = engines.normalize_url(url)
        kind = dialects.backend(parsed.get_backend_name())
        database = parsed.database or ""
        if kind != "sqlite" and (database in FORBIDDEN_DATABASES or database.startswith(FORBIDDEN_PREFIXES)):
            raise SystemExit(f"bench: refusing database {database!r}: it belongs to the test suite "
                             f"(the bench deletes every ductwork row); use e.g. ductwork_bench")
        name = kind
        if kind == "mysql":
            name = "mariadb" if "mariadb" in _server_version(parsed).lower() else "mysql"
        return cls(url, kind, name, _tempdir=directory)

    def cleanup(self) -> None:
        """Remove the SQLite file this target created (a server database is left, emptied)."""
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)

    # -- lifecycle ------------------------------------------------------------------

    def setup(self) -> None:
        """Create the database if missing and migrate it to head."""
        parsed = engines.normalize_url(self.url)
        if self.kind == "sqlite":
            path = Path(parsed.database)
            path.parent.mkdir(parents=True, exist_ok=True)
        else:
            create_database(parsed, self.kind)
        engine = engines.create_engine(self.url)
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        if self.kind == "sqlite":
            self._template = path.with_suffix(".template")
            shutil.copyfile(path, self._template)

    def reset(self) -> None:
        """Delete every ductwork row (a fresh copy of the migrated file on SQLite)."""
        if self.kind == "sqlite":
            path = Path(engines.normalize_url(self.url).database)
            for suffix in ("-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)
            assert self._template is not None, "setup() first"
            shutil.copyfile(self._template, path)
            return
        engine = engines.create_engine(self.url)
        tables = [t.name for t in reversed(schema.metadata.sorted_tables)]
        try:
            with engine.begin() as conn:
                if self.kind == "postgresql":
                    conn.exec_driver_sql("TRUNCATE " + ", ".join(tables) + " CASCADE")
                else:
                    conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=0")
                    for table in tables:
                        conn.exec_driver_sql(f"TRUNCATE TABLE {table}")
                    conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=1")
        finally:
            engine.dispose()

    def app(self, **sections: dict[str, Any]) -> App:
        return App(self.url, bench_config(**sections), pool_size=10)

    def analyze(self, app: App) -> None:
        """Refresh planner statistics (what autovacuum / InnoDB auto-stats would do)."""
        with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if self.kind == "postgresql":
                conn.exec_driver_sql("ANALYZE")
            elif self.kind == "mysql":
                for t in schema.metadata.sorted_tables:
                    conn.exec_driver_sql(f"ANALYZE TABLE {t.name}").all()
            else:
                conn.exec_driver_sql("ANALYZE")

    def describe(self) -> str:
        engine = engines.create_engine(self.url)
        try:
            with engine.connect() as conn:
                if self.kind == "sqlite":
                    return "SQLite " + conn.exec_driver_sql("select sqlite_version()").scalar_one()
                version = conn.exec_driver_sql("select version()").scalar_one()
                return version.split(" on ")[0] if self.kind == "postgresql" else f"MariaDB/MySQL {version}"
        finally:
            engine.dispose()


def _server_version(parsed: sa.URL) -> str:
    engine = sa.create_engine(parsed._replace(database=None))
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("select version()").scalar_one()
    finally:
        engine.dispose()


def create_database(parsed: sa.URL, kind: str) -> None:
    """Create the database ``parsed`` names on its server if it does not exist."""
    name = parsed.database
    admin = parsed._replace(database="postgres" if kind == "postgresql" else None)
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if kind == "postgresql":
                exists = conn.execute(sa.text("select 1 from pg_database where datname = :n"), {"n": name}).first()
                if not exists:
                    conn.exec_driver_sql(f'CREATE DATABASE "{name}" ENCODING \'UTF8\' TEMPLATE template0')
            else:
                conn.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- bulk rows


def _numbers(n: int) -> tuple[sa.Subquery, sa.ColumnElement]:
    """A subquery yielding ``n`` rows and the column ``0 .. n-1`` (portable: a recursive CTE
    of 1000 rows, cross-joined with itself for more)."""
    k = min(n, 1000)
    seq = sa.select(sa.literal_column("0").label("n")).cte("bench_seq", recursive=True)
    seq = seq.union_all(sa.select((seq.c.n + sa.literal_column("1")).label("n")).where(seq.c.n < k - 1))
    if n <= 1000:
        sub = sa.select(seq.c.n.label("i")).subquery("nums")
    else:
        a, b = seq.alias("a"), seq.alias("b")
        i = (b.c.n * sa.literal_column("1000") + a.c.n)
        sub = sa.select(i.label("i")).select_from(a.join(b, sa.true())).where(i < n).subquery("nums")
    return sub, sub.c.i


def _id(prefix: str, i: sa.ColumnElement) -> sa.ColumnElement:
    """Ids that sort before every UUIDv7 (``00000000-…``), fixed width, unique per prefix."""
    return sa.literal(f"00000000-{prefix}-", sa.String) + sa.cast(i + sa.literal_column("1000000000000"), sa.String)


def definition_row(pipeline: type) -> tuple[str, str, str]:
    """(pipeline name, snapshot text, sha1) exactly as ``trigger`` stores them."""
    definition = pipeline.definition
    snapshot = json.dumps(definition.to_json(), sort_keys=True)
    return definition.pipeline, snapshot, hashlib.sha1(snapshot.encode()).hexdigest()


def insert_pending(app: App, pipeline: type, n: int, prefix: str, *, one_run: bool = False,
                   input_json: str = "[0]", keyed: Callable[[Any], tuple[Any, Any]] | None = None,
                   before: Callable[[Tx, datetime], None] | None = None) -> datetime:
    """Insert ``n`` pending start steps of ``pipeline`` in one transaction; returns its time.

    ``one_run=False``: n runs, each with its start branch, step, job and pending
    execution: what n ``trigger`` calls write. ``one_run=True``: one run and one branch
    holding n steps (node names made unique): only for claim-cost benchmarks whose
    jobs are never executed or advanced (it spares 10⁶ snapshot texts). ``keyed``: the
    i-th step's key and input as SQL expressions of i (a partitioned start step's:
    B8), in place of the start node's static key and ``input_json``; ``before`` runs
    first in the transaction (B8 writes its partitions' key rows there).
    """
    name, snapshot, sha1 = definition_row(pipeline)
    definition = pipeline.definition
    node = definition.nodes[definition.start]
    key = node.limit_by
    with app.begin() as tx:
        now = tx.now
        if before is not None:
            before(tx, now)
        nums, i = _numbers(n)
        t = sa.literal(now, schema.Timestamp)
        run_id = _id(prefix + "r", i)
        branch_id = _id(prefix + "b", i)
        if one_run:
            run_id = sa.literal(f"00000000-{prefix}r-one", sa.String)
            branch_id = sa.literal(f"00000000-{prefix}b-one", sa.String)
            tx.execute(schema.runs.insert().values(
                id=f"00000000-{prefix}r-one", pipeline_klass=name, definition=snapshot, definition_sha1=sha1,
                status="in_progress", triggered_at=now, created_at=now, updated_at=now))
            tx.execute(schema.branches.insert().values(
                id=f"00000000-{prefix}b-one", run_id=f"00000000-{prefix}r-one", status="in_progress",
                last_advanced_at=now, started_at=now, fanin_arrivals=0, created_at=now, updated_at=now))
            node_name = sa.literal(definition.start + ".", sa.String) + sa.cast(i, sa.String)
        else:
            r, b = schema.runs, schema.branches
            tx.execute(r.insert().from_select(
                ["id", "pipeline_klass", "definition", "definition_sha1", "status", "triggered_at",
                 "created_at", "updated_at"],
                sa.select(run_id, sa.literal(name, sa.String), sa.literal(snapshot, sa.Text),
                          sa.literal(sha1, sa.String), sa.literal("in_progress", sa.String), t, t, t)
                .select_from(nums)))
            tx.execute(b.insert().from_select(
                ["id", "run_id", "status", "last_advanced_at", "started_at", "fanin_arrivals",
                 "created_at", "updated_at"],
                sa.select(branch_id, run_id, sa.literal("in_progress", sa.String), t, t,
                          sa.literal_column("0"), t, t).select_from(nums)))
            node_name = sa.literal(definition.start, sa.String)
        step_id, execution_id = _id(prefix + "s", i), _id(prefix + "e", i)
        if key:
            ensure_keys(tx, {key})
        key_sql, input_sql = keyed(i) if keyed else (sa.literal(key, sa.String), sa.literal(input_json, sa.Text))
        s, e = schema.steps, schema.executions
        tx.execute(s.insert().from_select(
            ["id", "run_id", "branch_id", "node", "klass", "to_transition", "status", "limit_key",
             "timeout_us", "input_args", "started_at", "created_at", "updated_at"],
            sa.select(step_id, run_id, branch_id, node_name, sa.literal(node.klass, sa.String),
                      sa.literal("start", sa.String), sa.literal("in_progress", sa.String),
                      key_sql, sa.literal(node.timeout_us, sa.BigInteger), input_sql, t, t, t)
            .select_from(nums)))
        tx.execute(e.insert().from_select(
            ["id", "step_id", "limit_key", "eligible_at", "retry_count", "crash_count", "created_at",
             "updated_at"],
            sa.select(execution_id, step_id, key_sql, t, sa.literal_column("0"),
                      sa.literal_column("0"), t, t).select_from(nums)))
        if hasattr(tx, "wake"):  # as trigger does: wake idle workers once this commits
            tx.wake()
    app._definitions.setdefault(sha1, definition)
    return now


def count(app: App, stmt: sa.Select) -> int:
    with app.begin() as tx:
        return int(tx.execute(stmt).scalar_one())


def wait_until(predicate: Callable[[], Any], what: str, timeout: float, interval: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"bench: within {timeout:.0f} s, never: {what}")
        time.sleep(interval)


def seconds(delta: Any) -> float:
    return delta.total_seconds()


def percentile_time(times: list[datetime], fraction: float) -> datetime:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


# --------------------------------------------------------------------------- feeds


class FedFirst:
    """A batch inserted whole, in bulk, before anything is measured (``insert_pending``).

    Its runs and executions are named by the batch prefix (``00000000-{prefix}r-…``).
    """

    name = "fed first"

    def start(self, app: App, pipeline: type, n: int, prefix: str, args: list[Any]) -> FedFirst:
        insert_pending(app, pipeline, n, prefix, input_json=json.dumps(args))
        self.prefix = prefix
        return self

    def visible(self) -> bool:
        """Every run of the batch is in the database (at once, for a bulk insert)."""
        return True

    def stop(self) -> None:
        pass

    def runs(self) -> sa.ColumnElement[bool]:
        return schema.runs.c.id.like(f"00000000-{self.prefix}r-%")

    def executions(self) -> sa.ColumnElement[bool]:
        return schema.executions.c.id.like(f"00000000-{self.prefix}e-%")

    def figures(self, starts: list[float], window: tuple[float, float]) -> dict[str, float]:  # noqa: ARG002
        return {}


class Triggered:
    """A batch triggered one run at a time while the fleets work, as production does.

    A thread of the bench process calls the public ``Pipeline.trigger(*args, app=app)``
    (one transaction per run, returning its handle) ``n`` times, one after the other. The
    pace is steady: the i-th call is made ``i / per_s`` seconds after the first; the
    thread sleeps until then (a pacing sleep, nothing else waits on it), and a call that
    is late (the loop slower than ``per_s``) is made at once, so the loop then goes as
    fast as it can and catches up rather than drifting. ``figures`` says what pace it
    held and whether the key's backlog ever ran dry in the measured window.
    """

    name = "triggered"

    def __init__(self, per_s: float):
        self.per_s = per_s
        self.run_ids: list[str] = []
        self.called: list[float] = []    # time.time() as each trigger call began
        self.returned: list[float] = []  # … and as it returned (its run committed)
        self.error: BaseException | None = None
        self.cpu_s = 0.0  # the trigger thread's own CPU (time.thread_time), once it has ended
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, app: App, pipeline: type, n: int, prefix: str, args: list[Any]) -> Triggered:
        self.n = n
        self._thread = threading.Thread(target=self._loop, args=(app, pipeline, n, args), daemon=True,
                                        name=f"bench-trigger-{prefix}")
        self._thread.start()
        return self

    def _loop(self, app: App, pipeline: type, n: int, args: list[Any]) -> None:
        cpu0 = time.thread_time()
        try:
            t0 = time.monotonic()
            for i in range(n):
                delay = t0 + i / self.per_s - time.monotonic()
                stopped = self._stop.wait(delay) if delay > 0 else self._stop.is_set()  # the pacing sleep
                if stopped:
                    return
                began = time.time()
                run = pipeline.trigger(*args, app=app)
                self.called.append(began)
                self.returned.append(time.time())
                self.run_ids.append(run.id)
        except BaseException as error:  # noqa: BLE001 - handed to the bench thread by visible()
            self.error = error
        finally:
            self.cpu_s = time.thread_time() - cpu0

    def visible(self) -> bool:
        """Every run of the batch triggered (committed); raises what the trigger thread raised."""
        if self.error is not None:
            raise RuntimeError(f"bench: the trigger thread failed after {len(self.run_ids)} runs") from self.error
        return self._thread is not None and not self._thread.is_alive() and len(self.run_ids) == self.n

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def runs(self) -> sa.ColumnElement[bool]:
        return schema.runs.c.id.in_(list(self.run_ids))

    def executions(self) -> sa.ColumnElement[bool]:
        s = schema.steps
        return schema.executions.c.step_id.in_(sa.select(s.c.id).where(s.c.run_id.in_(list(self.run_ids))))

    def figures(self, starts: list[float], window: tuple[float, float]) -> dict[str, float]:
        """The pace held (calls after the first / the time from the first call to the last),
        the trigger thread's CPU per call (the bench process's: not in the fleets' CPU) and
        the share of the body window during which no triggered run was waiting for its body
        (``unwaited``)."""
        span = self.called[-1] - self.called[0] if self.called else 0.0
        return {"triggers_per_s": (len(self.called) - 1) / span if span > 0 else float("nan"),
                "trigger_cpu_ms": 1000 * self.cpu_s / len(self.called) if self.called else float("nan"),
                "unwaited": unwaited(self.returned, starts, *window)}


def unwaited(triggered: list[float], starts: list[float], a: float, b: float) -> float:
    """Share of [a, b] during which no run was waiting: triggered (its call returned) minus
    bodies started ≤ 0.

    A run counts as waiting from its trigger's return, so one whose body started before
    its trigger call returned counts as none waiting for that moment: the share errs
    towards "the backlog ran dry", never the other way.
    """
    if b <= a:
        return float("nan")
    events = sorted([(t, 1) for t in triggered] + [(t, -1) for t in starts])
    waiting, last, empty = 0, a, 0.0
    for t, delta in events:
        if t >= b:
            break
        if t > last:
            if waiting <= 0:
                empty += t - last
            last = t
        waiting += delta
    if waiting <= 0:
        empty += b - last
    return empty / (b - a)


# --------------------------------------------------------------------------- fleets


class ProcessFleet:
    """A real ``ductwork start`` (supervisor, one advancer process, N worker processes).

    Config: ductwork's defaults (polling 1 s, 3 advancer threads, 5 worker threads per
    process) except for what the caller passes; the bench pipelines and limits are listed.
    """

    def __init__(self, target: Target, *, workers: int = 1, worker_threads: int = 5,
                 advancer_threads: int = 3, role: str = "all", label: str = "bench",
                 overrides: dict[str, dict[str, Any]] | None = None, patches: tuple[str, ...] = ()):
        from bench.workloads import LIMITS, PIPELINES

        self.patches = patches  # bench/experiments/sitecustomize.py patches, for experiments only

        self.target, self.role, self.label = target, role, label
        self.workers = workers if role in ("all", "worker") else 0
        self.advancers = 1 if role in ("all", "advancer") else 0
        section: dict[str, Any] = {
            "pipelines": PIPELINES,
            "job_worker": {"count": worker_threads, "processes": workers, "limits": LIMITS},
            "pipeline_advancer": {"count": advancer_threads},
        }
        for name, values in (overrides or {}).items():
            section.setdefault(name, {}).update(values)
        self.dir = Path(tempfile.mkdtemp(prefix="ductwork_bench_fleet_"))
        self.config = self.dir / "ductwork.yml"
        self.config.write_text(yaml.safe_dump({"default": section}))
        self.proc: subprocess.Popen | None = None

    def describe(self) -> str:
        parts = []
        if self.advancers:
            parts.append("1 advancer process")
        if self.workers:
            parts.append(f"{self.workers} worker process{'es' if self.workers > 1 else ''}")
        return " + ".join(parts)

    def start(self, app: App, timeout: float = 60.0) -> ProcessFleet:
        from bench.workloads import WITNESS_ENV

        for sub in ("stats", "witness"):
            (self.dir / sub).mkdir(exist_ok=True)
        # bench/probes/sitecustomize.py counts each process's statements (and applies the
        # experiments' patches when asked); the bodies write witness lines (bench.workloads)
        paths = [str(REPO / "bench" / "probes")]
        python_path = os.pathsep.join(filter(None, [*paths, str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": python_path,
               "BENCH_PATCHES": ",".join(self.patches), "BENCH_STATS_DIR": str(self.dir / "stats"),
               WITNESS_ENV: str(self.dir / "witness")}
        command = [sys.executable, "-m", "ductwork.cli", "start", "--database-url", self.target.url,
                   "-c", str(self.config), "--label", self.label]
        if self.role != "all":
            command += ["--role", self.role]
        self._log = open(self.dir / "fleet.log", "ab")  # noqa: SIM115 - open while the fleet runs; stop() closes it
        # the fleet is stopped with this process even when it is killed (a `timeout`, a
        # SIGKILL) before stop() runs: a fleet left behind polls the bench database and
        # skews every later measurement (it did, once, this bench's own profiling runs)
        self.proc = subprocess.Popen(command, env=env, cwd=str(REPO), stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=lambda: tree.die_with_parent(signal.SIGTERM))
        p = schema.processes

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bench fleet exited with {self.proc.returncode}: "
                                   f"{(self.dir / 'fleet.log').read_text()[-2000:]}")
            with app.begin() as tx:
                roles = [r for (r,) in tx.execute(sa.select(p.c.role).where(p.c.label.like(f"{self.label}%")))]
            return roles.count("job_worker") == self.workers and roles.count("pipeline_advancer") == self.advancers

        wait_until(ready, "the fleet registered its processes", timeout)
        return self

    # -- what the fleet used: CPU, statements, and the bodies' witness lines ----------

    def pids(self) -> list[int]:
        """The supervisor and every live descendant (from ``/proc``)."""
        if self.proc is None:
            return []
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                stat = _proc_stat(int(entry))
                if stat is not None:
                    children.setdefault(int(stat[1]), []).append(int(entry))
        tree, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, []))
        return tree

    def cpu_seconds(self) -> float:
        """User + system CPU of the whole process tree so far (``/proc/<pid>/stat``)."""
        ticks = 0
        for pid in self.pids():
            stat = _proc_stat(pid)
            if stat is not None:
                ticks += int(stat[11]) + int(stat[12])  # utime, stime (fields 14, 15)
        return ticks / os.sysconf("SC_CLK_TCK")

    def statements(self) -> int:
        """SQL statements sent by the fleet's processes so far (bench/probes/sitecustomize.py)."""
        total = 0
        for path in (self.dir / "stats").glob("*.count"):
            with contextlib.suppress(OSError, ValueError):
                total += int(path.read_text() or 0)
        return total

    def witnesses(self, tag: str) -> list[tuple[float, float]]:
        """(start, end) wall-clock seconds of every body that wrote ``tag`` (bench.workloads.witness)."""
        out = []
        for path in (self.dir / "witness").glob("witness-*.txt"):
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == tag:
                    out.append((float(parts[1]), float(parts[2])))
        return out

    def stop(self, timeout: float = 40.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGTERM to the supervisor only: it TERMs its children. (A TERM to the whole
            # process group makes each child receive two; the second can re-enter the
            # first's Event.set in the handler and deadlock the runner until SIGKILL.)
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3… of ``/proc/<pid>/stat`` (state, ppid, …), or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


@dataclass(frozen=True)
class FleetShape:
    """How a user sizes one ``ductwork start``: worker processes × threads per worker process.

    Every shape has the default advancer besides (1 process × 3 threads).
    """

    processes: int
    threads: int
    #: what the user writes to get it
    config: str

    @property
    def name(self) -> str:
        return f"{self.processes}×{self.threads} threads"

    def fleet(self, target: Target, label: str) -> ProcessFleet:
        return ProcessFleet(target, workers=self.processes, worker_threads=self.threads, label=label)


#: The fleet shapes users build (issue 32), one ``ductwork start`` each. B2 measures its
#: limits on each (bench/b2_limits.py says which scenario on which shape), B6 the idle CPU
#: of a saturated key on 1×5 and 1×10.
SHAPES = {
    "1×5": FleetShape(1, 5, "`ductwork start` as installed (job_worker.count 5, processes 1)"),
    "1×10": FleetShape(1, 10, "`job_worker: {count: 10}`"),
    "2×5": FleetShape(2, 5, "`job_worker: {processes: 2}`"),
}


class Meter:
    """CPU and statements of some fleets over an interval: ``start()``, then ``stop()``.

    CPU is user + system time of every process of the fleets (supervisor, advancer and
    worker processes), read from ``/proc`` at both ends; statements come from the
    per-process counts of bench/probes/sitecustomize.py, read after a 0.15 s pause so
    the counts (rewritten every 50 ms) include the interval's last statements.
    """

    def __init__(self, *fleets: ProcessFleet):
        self.fleets = fleets

    def _read(self) -> tuple[float, float, int]:
        return (time.monotonic(), sum(f.cpu_seconds() for f in self.fleets),
                sum(f.statements() for f in self.fleets))

    def start(self) -> Meter:
        time.sleep(0.15)
        self.t0, self.cpu0, self.statements0 = self._read()
        return self

    def stop(self) -> dict[str, float]:
        t1, cpu1 = time.monotonic(), sum(f.cpu_seconds() for f in self.fleets)
        time.sleep(0.15)
        statements1 = sum(f.statements() for f in self.fleets)
        return {"seconds": t1 - self.t0, "cpu_s": cpu1 - self.cpu0, "statements": statements1 - self.statements0}


def per_step(used: dict[str, float], steps: int) -> dict[str, float]:
    """CPU ms and statements per completed step over a metered interval."""
    return {"cpu_ms_per_step": 1000 * used["cpu_s"] / steps, "statements_per_step": used["statements"] / steps}


def body_window(starts: list[float], skip: int = 0) -> tuple[float, float]:
    """The measured window of a batch: from its 10 % body start (or the ``skip``-th, if
    later) to its 90 % one; ``starts`` sorted."""
    return starts[max(len(starts) // 10, skip)], starts[(len(starts) * 9) // 10]


def bodies(intervals: list[tuple[float, float]], skip: int = 0) -> dict[str, float]:
    """Bodies per second and mean bodies running, from the bodies' own (start, end) times.

    The window runs from the 10 % body start (or the ``skip``-th, if later: a rate batch
    leaves out its banked burst) to the 90 % one (leaving out the first wake-up and the
    tail): throughput = starts in the window / its length; mean running = the
    time-integral of running bodies over the window / its length.
    """
    starts = sorted(s for s, _ in intervals)
    a, b = body_window(starts, skip)
    if b <= a:
        return {"per_s": float("nan"), "running": float("nan"), "window_s": 0.0}
    in_window = sum(1 for s in starts if a <= s < b)
    busy = sum(max(0.0, min(e, b) - max(s, a)) for s, e in intervals)
    return {"per_s": in_window / (b - a), "running": busy / (b - a), "window_s": b - a}


# --------------------------------------------------------------------------- child processes


def run_child(module: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` (a bench child) and parse the JSON line it prints last."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", module, *args], env=env, cwd=str(REPO), capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"bench child {module} failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_rss_kib() -> int:
    """This process's peak resident set size so far, KiB (Linux ``ru_maxrss``)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# --------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    with contextlib.suppress(OSError):
        info["load_average"] = os.getloadavg()
    import sqlalchemy

    info["sqlalchemy"] = sqlalchemy.__version__
    return info


def git_commit() -> str | None:
    """HEAD, suffixed ``+dirty (files)`` when tracked files differ from it (read-only git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(REPO), capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=str(REPO),
                                 capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return None
    files = sorted(line[3:] for line in changed if line.strip())
    return head + (f" +dirty ({', '.join(files)})" if files else "")
