"""Where a chain step's time goes: statements, transactions and commits per step, by phase,
a cProfile of the hot paths, and fusion experiments that estimate what merging
transactions would gain.

    python -m bench.profile_hot_paths [--database-url URL] [--runs 60] [--profile-out prof.txt]

Default database: a fresh SQLite file; the numbers in bench/RESULTS.md were taken on
PostgreSQL (``--database-url postgresql://postgres@127.0.0.1:5432/ductwork_bench``).

Single-threaded on purpose (one worker and one advancer driven in turn by this process,
as ``ductwork.testing.drain`` does), so every statement is attributed to exactly one
phase and nothing waits on another thread's lock:

- ``claim``: ``claims.claim`` (the lane scan and the claim);
- ``execute+commit``: building and running the step and ``record_success``;
- ``advance: candidates`` / ``advance: claim`` / ``advance: route+fence``: the three
  parts of ``Advancer.run_once`` that advance one branch;
- ``idle polls``: calls that found nothing (not charged to steps).

Counts come from SQLAlchemy events (``before_cursor_execute``, ``commit``); a
transaction is *writing* if it ran an INSERT, UPDATE, DELETE, a locking read or a
NOTIFY (those are the commits that wait for the WAL flush).

Experiments (``--experiments``, default on): the same drain with transactions fused by
a shim that makes a nested ``App.begin()`` join the caller's transaction (so the engine
runs its very statements, only with fewer commits). They measure a *gain*, they are not
a safe engine change: fusing moves crash and lock boundaries, which the model must
allow first (see RESULTS.md).

- ``fuse advancement``: candidates + claim + route + fence in one transaction;
- ``fuse completion+next claim``: a worker's ``record_success`` and its next
  ``claim_next`` in one transaction;
- ``fuse all``: completion, the branch's advancement and the next claim in one;
- ``fuse claim scan``: ``claim_next``'s lane scan and its claim in one transaction;
- ``no pre-ping``: the pool does not ping a connection at each checkout (one round trip
  per transaction);
- ``no fsync`` (PostgreSQL only): ``synchronous_commit = off``, the bound on what fewer
  commits can give on this disk.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from sqlalchemy import event

from bench.harness import Target, insert_pending, log
from bench.workloads import CHAIN_LENGTH, Chain
from ductwork.app import App
from ductwork.fleet import execute as execute_mod
from ductwork.fleet.processes import register
from ductwork.fleet.worker import Worker
from ductwork.limits import claims as claims_mod
from ductwork.pipelines import advance as advance_mod
from ductwork.pipelines.outcomes import record_success

_phase = threading.local()
_outer = threading.local()
_ORIGINAL_BEGIN = App.begin


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    previous = getattr(_phase, "name", None)
    _phase.name = name
    try:
        yield
    finally:
        _phase.name = previous


class Counts:
    """Statements, transactions and writing transactions per phase (SQLAlchemy events)."""

    WRITES = ("INSERT", "UPDATE", "DELETE")

    def __init__(self, app: App):
        self.statements: Counter[str] = Counter()
        self.transactions: Counter[str] = Counter()
        self.writing: Counter[str] = Counter()
        self.pings: Counter[str] = Counter()
        self.trace: list[tuple[str, str]] | None = None
        engine = app.engine
        pool = engine.pool

        def _checkout(*_: Any) -> None:
            if pool._pre_ping:  # the pool pings every checked-out connection: one round trip
                self.pings[getattr(_phase, "name", None) or "other"] += 1

        event.listen(engine, "checkout", _checkout)
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)
        event.listen(engine, "begin", self._begin)

    def _begin(self, conn: Any) -> None:
        conn.info["bench_writes"] = False

    def _statement(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:  # noqa: ARG002 - the hook's
        name = getattr(_phase, "name", None) or "other"
        head = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
        if statement.startswith("BEGIN"):
            return  # SQLite's explicit BEGIN IMMEDIATE: counted as a transaction, not a statement
        self.statements[name] += 1
        conn.info["bench_phase"] = name  # the commit is charged to the phase of its last statement
        if head in self.WRITES or any(mark in statement for mark in ("FOR UPDATE", "FOR NO KEY UPDATE", "pg_notify")):
            conn.info["bench_writes"] = True
        if self.trace is not None:
            self.trace.append((name, " ".join(statement.split())[:150]))

    def _commit(self, conn: Any) -> None:
        name = conn.info.pop("bench_phase", None) or getattr(_phase, "name", None) or "other"
        self.transactions[name] += 1
        if conn.info.get("bench_writes"):
            self.writing[name] += 1
        if self.trace is not None:
            self.trace.append((name, "COMMIT" + (" (writing)" if conn.info.get("bench_writes") else "")))


# --------------------------------------------------------------------------- the transaction-fusing shim


@contextlib.contextmanager
def _joining_begin(self: App, *args: Any, **kwargs: Any) -> Iterator[Any]:
    tx = getattr(_outer, "tx", None)
    if tx is not None:
        yield tx
        return
    with _ORIGINAL_BEGIN(self, *args, **kwargs) as tx:
        yield tx


@contextlib.contextmanager
def fused(app: App) -> Iterator[None]:
    """Every ``app.begin()`` inside this block joins one transaction, committed at its end."""
    if getattr(_outer, "tx", None) is not None:
        yield
        return
    with _ORIGINAL_BEGIN(app) as tx:
        _outer.tx = tx
        try:
            yield
        finally:
            _outer.tx = None


# --------------------------------------------------------------------------- one instrumented drain


def _instrument_advancer() -> None:
    """Wrap the three parts of Advancer.run_once so their statements get their own phase."""
    if getattr(advance_mod, "_bench_wrapped", False):
        return
    candidates, claim_branch, advance = advance_mod.candidates, advance_mod.claim_branches, advance_mod.Advancer.advance

    def wrapped_candidates(*a: Any, **k: Any) -> Any:
        with phase(_stage("advance: candidates")):
            return candidates(*a, **k)

    def wrapped_claim(*a: Any, **k: Any) -> Any:
        with phase(_stage("advance: claim")):
            return claim_branch(*a, **k)

    def wrapped_advance(self: Any, *a: Any, **k: Any) -> Any:
        with phase(_stage("advance: route+fence")):
            return advance(self, *a, **k)

    advance_mod.candidates, advance_mod.claim_branches = wrapped_candidates, wrapped_claim
    advance_mod.Advancer.advance = wrapped_advance
    advance_mod._bench_wrapped = True


def _stage(name: str) -> str:
    current = getattr(_phase, "name", None)
    return current if current == "idle polls" else name


def drain(app: App, mode: str, counts: Counts | None, runs: int) -> tuple[float, int]:
    """Run every pending chain to completion in this thread; returns (seconds, steps).

    Each iteration is one step: claim it, run it and record its success, advance its
    branch (the only advanceable one: exactly one ``run_once``, which creates the next
    step or completes the run). The fused modes move the same calls into shared
    transactions.
    """
    worker = Worker(app, process_id=register(app, role="job_worker", label=f"bench-prof-{time.time()}"))
    advancer = advance_mod.Advancer(app, process_id=register(app, role="pipeline_advancer",
                                                             label=f"bench-prof-adv-{time.time()}"))
    fuse_adv = mode == "fuse advancement"
    fuse_scan = mode == "fuse claim scan"
    fuse_claim = mode in ("fuse completion+next claim", "fuse all")
    fuse_all = mode == "fuse all"
    steps, total = 0, runs * CHAIN_LENGTH

    def claim() -> Any:
        with phase("claim"), (fused(app) if fuse_scan else contextlib.nullcontext()):
            return claims_mod.claim(app, worker.process_id)

    def advance() -> None:
        with phase("advance"), (fused(app) if fuse_adv else contextlib.nullcontext()):
            outcome = advancer.run_once()
        # idle: the success advanced its branch itself (inline, ``pipeline_advancer.inline_linear``)
        assert outcome in ("advanced", "idle"), outcome

    start = time.perf_counter()
    claimed = claim()
    while claimed is not None:
        tracing = counts is not None and steps == total // 2
        if tracing:
            counts.trace = []
        definition = app.definition(claimed.definition_sha1)
        nxt = None
        with phase("execute+commit"):
            output = execute_mod.run_body(app, claimed, definition)
            if fuse_claim:
                with fused(app):
                    record_success(app, claimed, output)
                    if fuse_all:
                        advance()
                    nxt = claim()
            else:
                record_success(app, claimed, output)
        if not fuse_all:
            advance()
        if nxt is None:
            nxt = claim()
        steps += 1
        if tracing:
            counts.final_trace, counts.trace = counts.trace, None
        claimed = nxt
    elapsed = time.perf_counter() - start
    with phase("idle polls"):
        assert advancer.run_once() == "idle"
    assert steps == total, (steps, total)
    return elapsed, steps


def _fresh(target: Target, runs: int) -> App:
    target.reset()
    app = target.app()
    insert_pending(app, Chain, runs, "p")
    return app


def _no_fsync(app: App) -> None:
    @event.listens_for(app.engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
        dbapi_connection.commit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--runs", type=int, default=40, help="chain runs per drain (5 steps each)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-experiments", action="store_true")
    parser.add_argument("--profile-out", default=None, help="write the full cProfile listing here")
    args = parser.parse_args()
    target = Target.from_url(args.database_url)
    target.setup()
    _instrument_advancer()
    App.begin = _joining_begin  # identical outside a fused() block

    # 1. statements and transactions per step, by phase
    app = _fresh(target, args.runs)
    counts = Counts(app)
    seconds, steps = drain(app, "baseline", counts, args.runs)
    print(f"\n## {target.name}: {steps} chain steps in {seconds:.2f} s, single thread "
          f"({steps / seconds:.0f} steps/s)\n")
    print("| phase | statements/step | transactions/step | writing tx (commits that flush)/step | "
          "round trips/step (statements + BEGIN + COMMIT + pool ping) |")
    print("|---|---:|---:|---:|---:|")

    def trips(name: str) -> float:
        begins = counts.transactions[name] if target.kind != "sqlite" else 0  # SQLite's BEGIN is in-process
        return counts.statements[name] + begins + counts.transactions[name] + counts.pings[name]

    phases = ["claim", "execute+commit", "advance: candidates", "advance: claim", "advance: route+fence"]
    for name in [*phases, "idle polls", "other"]:
        if counts.statements[name] or counts.transactions[name]:
            print(f"| {name} | {counts.statements[name] / steps:.2f} | {counts.transactions[name] / steps:.2f} | "
                  f"{counts.writing[name] / steps:.2f} | {trips(name) / steps:.2f} |")
    total = sum(counts.statements[p] for p in phases)
    print(f"| **per step, excluding idle polls** | **{total / steps:.2f}** | "
          f"**{sum(counts.transactions[p] for p in phases) / steps:.2f}** | "
          f"**{sum(counts.writing[p] for p in phases) / steps:.2f}** | "
          f"**{sum(trips(p) for p in phases) / steps:.2f}** |")
    trace = getattr(counts, "final_trace", [])
    if trace:
        print("\nOne mid-run step, statement by statement:\n")
        for name, text in trace:
            print(f"    {name:22s} {text}")
    app.dispose()

    # 2. cProfile of a drain
    app = _fresh(target, args.runs)
    profiler = cProfile.Profile()
    profiler.enable()
    seconds, steps = drain(app, "baseline", None, args.runs)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats("ductwork", 30)
    if args.profile_out:
        with open(args.profile_out, "w") as f:
            f.write(out.getvalue())
    raw = stats.stats  # type: ignore[attr-defined]
    wait = sum(v[2] for k, v in raw.items() if k[2] in ("wait", "wait_conn") and "psycopg" in k[0])
    recv = sum(v[2] for k, v in raw.items() if "pymysql" in k[0] and k[2] in ("_read_bytes", "recv_into"))
    sqlite = sum(v[2] for k, v in raw.items() if k[0] == "~" and "sqlite3" in k[2])
    print(f"\ncProfile: {steps} steps in {seconds:.2f} s (profiled); waiting on the server (psycopg wait / "
          f"pymysql reads / sqlite3 calls): {(wait + recv + sqlite):.2f} s; "
          f"listing in {args.profile_out or '(not saved)'}")
    print(out.getvalue()[:6000] if not args.profile_out else "")
    app.dispose()

    if args.no_experiments:
        return
    # 3. experiments, interleaved repetitions in this run
    modes = ["baseline", "fuse claim scan", "fuse advancement", "fuse completion+next claim", "fuse all",
             "no pre-ping"]
    if target.kind == "postgresql":
        modes.append("no fsync")
    rates: dict[str, list[float]] = defaultdict(list)
    commits: dict[str, float] = {}
    round_trips: dict[str, float] = {}
    for rep in range(args.repeats):
        for mode in modes:
            app = _fresh(target, args.runs)
            if mode == "no fsync":
                _no_fsync(app)
            if mode == "no pre-ping":
                app.engine.pool._pre_ping = False
            c = Counts(app) if rep == 0 else None
            seconds, steps = drain(app, mode, c, args.runs)
            rates[mode].append(steps / seconds)
            if c is not None:
                commits[mode] = sum(c.writing.values()) / steps
                begins = 0 if target.kind == "sqlite" else sum(c.transactions.values())
                round_trips[mode] = (sum(c.statements.values()) + begins + sum(c.transactions.values())
                                     + sum(c.pings.values())) / steps
            log(f"{mode}: {steps / seconds:.1f} steps/s")
            app.dispose()
    print(f"\n| experiment (single thread, {args.repeats} interleaved repetitions) | steps/s (median) | "
          "× baseline (median of per-repetition ratios) | writing commits/step | round trips/step |")
    print("|---|---:|---:|---:|---:|")
    for mode in modes:
        value = statistics.median(rates[mode])
        paired = statistics.median(m / b for m, b in zip(rates[mode], rates["baseline"], strict=False))
        print(f"| {mode} | {value:.1f} | {paired:.2f}× | {commits.get(mode, float('nan')):.2f} | "
              f"{round_trips.get(mode, float('nan')):.1f} |")


if __name__ == "__main__":
    main()
