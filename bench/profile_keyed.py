"""Where a keyed step's CPU and wall time go, and what idle threads of a saturated key cost.

    python -m bench.profile_keyed [--database-url URL] [--n 600] [--py-spy] [--lock-stats] [--statement-kinds]

Two phases on one real fleet (2 worker processes × 5 threads, as B2 runs it):

- ``drain``: ``n`` executions of the ``concurrency: 5`` key with 20 ms bodies
  (``bench.workloads.ConcurrencyNap``): steps per second over the whole drain, worker
  CPU seconds per step (user + system of the worker processes, from /proc), how busy
  the whole machine was (every process, the database server's included: /proc/stat)
  and, with ``--py-spy`` (0.4.1 or later: 0.4.0 cannot read this Python's version), the
  functions the first worker process spends its on-CPU samples in (a thread blocked in
  psycopg's ``wait`` for the server's reply counts as on-CPU to py-spy); with
  ``--lock-stats`` (PostgreSQL, MariaDB), the key-lock holds of every worker process
  (bench/probes/sitecustomize.py): holds per step, and per hold the wait for the lock,
  the time it is held (to the end of the commit) and the statements sent under it;
- ``saturated``: another process (this one) holds all five slots of the key and keeps
  completing one and handing its slot on to the next execution (the key stays
  saturated, 50 completions a second); the fleet's worker threads can claim nothing.
  Reported: worker CPU seconds per second of wall time (what idle threads cost).

A diagnostic, not a benchmark of record (``python -m bench --only B2`` is).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa

from bench.harness import ProcessFleet, Target, insert_pending, log, wait_until
from bench.workloads import ConcurrencyNap
from ductwork.db import schema
from ductwork.fleet.processes import register
from ductwork.limits import claims
from ductwork.pipelines.outcomes import HandOff, record_success
from ductwork.pipelines.payloads import Output

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / TICK


def _machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy (not idle or waiting for I/O) since
    boot, from /proc/stat: the fleet, the database server and everything else."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def _worker_pids(fleet: ProcessFleet) -> list[int]:
    assert fleet.proc is not None
    out = subprocess.run(["pgrep", "-P", str(fleet.proc.pid)], capture_output=True, text=True).stdout
    pids = [int(p) for p in out.split()]
    return [p for p in pids if "job_worker" in Path(f"/proc/{p}/cmdline").read_text()]


def _spy(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(seconds), "-r", "200",
                             "--format", "raw", "-o", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _top(raw: Path, n: int = 25) -> list[tuple[str, float]]:
    """Inclusive share of samples per ductwork/sqlalchemy function (excluding idle waits)."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, num = line.rpartition(" ")
        frames = stack.split(";")
        if any("wait (threading.py" in f or ("select" in f and "selectors" in f) for f in frames[-3:]):
            continue  # an idle wait, not CPU
        k = int(num)
        total += k
        seen = set()
        for frame in frames:
            name = frame.split(" (")[0] + " (" + frame.split(" (")[-1].split(":")[0].split("/")[-1] + ")"
            if ("ductwork" in frame or "sqlalchemy/engine" in frame) and name not in seen:
                seen.add(name)
                counts[name] += k
    return [(name, k / max(total, 1)) for name, k in counts.most_common(n)]


def _lock_totals(fleet: ProcessFleet) -> tuple[list[float], collections.Counter[str]]:
    """Key-lock totals of the fleet's processes: [holds, wait s, hold s, statements], and
    the statements sent under holds by kind."""
    totals = [0.0, 0.0, 0.0, 0.0]
    kinds: collections.Counter[str] = collections.Counter()
    for path in (fleet.dir / "stats").glob("*.locks"):
        first, *lines = path.read_text().splitlines()
        for i, value in enumerate(first.split()):
            totals[i] += float(value)
        for line in lines:
            count, _, kind = line.partition("\t")
            kinds[kind] += int(count)
    return totals, kinds


def _statement_kinds(fleet: ProcessFleet) -> collections.Counter[str]:
    """Every statement the fleet's processes sent, by kind (``--statement-kinds``)."""
    kinds: collections.Counter[str] = collections.Counter()
    for path in (fleet.dir / "stats").glob("*.kinds"):
        for line in path.read_text().splitlines():
            count, _, kind = line.partition("\t")
            kinds[kind] += int(count)
    return kinds


def drain(app, fleet: ProcessFleet, n: int, spy: bool) -> None:
    pids = _worker_pids(fleet)
    e = schema.executions
    time.sleep(0.3)  # the probes rewrite their totals every 0.2 s
    locks0, kinds0 = _lock_totals(fleet)
    every0 = _statement_kinds(fleet)
    cpu0, busy0, t0 = _cpu_s(pids), _machine_busy_s(), time.monotonic()
    insert_pending(app, ConcurrencyNap, n, "pk")
    raw = Path("/tmp/profile_keyed.raw")
    proc = _spy(pids[0], max(2, int(n / 40)), raw) if spy else None

    def done() -> bool:
        with app.begin() as tx:
            return tx.execute(sa.select(sa.func.count()).where(e.c.completed_at.is_(None))).scalar_one() == 0

    wait_until(done, "drained", timeout=600, interval=0.05)
    wall, cpu, busy = time.monotonic() - t0, _cpu_s(pids) - cpu0, _machine_busy_s() - busy0
    log(f"drain: {n} steps in {wall:.2f} s = {n / wall:.0f}/s ({n / wall / 250:.2f} of 250/s); "
        f"worker CPU {cpu:.2f} s = {1000 * cpu / n:.1f} ms per step; the machine busy "
        f"{busy / wall:.2f} of {os.cpu_count()} cores ({1000 * busy / n:.1f} ms of CPU per step, server included)")
    time.sleep(0.3)
    locks1, kinds1 = _lock_totals(fleet)
    holds, wait_s, hold_s, statements = (b - a for a, b in zip(locks0, locks1, strict=True))
    if holds:
        log(f"key-lock holds: {holds:.0f} ({holds / n:.2f} per step); per hold: wait {1000 * wait_s / holds:.2f} ms, "
            f"held {1000 * hold_s / holds:.2f} ms, {statements / holds:.1f} statements; the key held "
            f"{hold_s / wall:.0%} of the drain, waited for {wait_s / wall:.0%} (summed over threads)")
        for kind, count in (kinds1 - kinds0).most_common(40):
            log(f"  {count / holds:5.2f} per hold  {kind}")
    every = _statement_kinds(fleet) - every0
    if every:
        log(f"statements per step, every kind: {sum(every.values()) / n:.2f}")
        for kind, count in every.most_common(40):
            log(f"  {count / n:5.2f} per step  {kind}")
    if proc is not None:
        proc.wait()
        for name, share in _top(raw):
            log(f"  {share:6.1%}  {name}")


def saturated(app, fleet: ProcessFleet, seconds: float) -> None:
    pids = _worker_pids(fleet)
    holder = register(app, role="job_worker", label="profile_keyed_holder")
    held: list = []
    for attempt in range(50):  # the idle fleet polls about 10 times a second: it may win some
        time.sleep(0.5)
        insert_pending(app, ConcurrencyNap, 5 - len(held), f"p{attempt:02d}")  # (no wakeup)
        while len(held) < 5 and (got := claims.claim_batch(app, holder, 1)):
            held.extend(got)
        if len(held) == 5:
            break
    else:
        raise SystemExit("the fleet always took the slots first")
    insert_pending(app, ConcurrencyNap, int(seconds * 60), "pt")
    log("saturated: this process holds the key's slots")
    cpu0, t0, completions = _cpu_s(pids), time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        done = held.pop(0)
        held.extend(record_success(app, done, Output("0"), HandOff()))
        completions += 1
        time.sleep(0.02)
    wall, cpu = time.monotonic() - t0, _cpu_s(pids) - cpu0
    log(f"saturated: {completions} completions handed on in {wall:.1f} s; fleet worker CPU "
        f"{cpu:.2f} s = {cpu / wall:.3f} CPU-s per s ({1000 * cpu / max(completions, 1):.1f} ms per completion)")
    for c in held:
        record_success(app, c, Output("0"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--idle-seconds", type=float, default=8.0)
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--lock-stats", action="store_true")
    parser.add_argument("--statement-kinds", action="store_true")
    args = parser.parse_args()
    if args.statement_kinds:
        os.environ["BENCH_STATEMENT_KINDS"] = "1"  # read by the fleet's bench/probes/sitecustomize.py
    if args.lock_stats:
        os.environ["BENCH_LOCK_STATS"] = "1"  # read by the fleet's bench/probes/sitecustomize.py
    target = Target.from_url(args.database_url)
    target.setup()
    target.reset()
    app = target.app()
    fleet = ProcessFleet(target, role="worker", workers=2, label="profkeyed")
    try:
        fleet.start(app)
        time.sleep(1.0)
        drain(app, fleet, args.n, args.py_spy)
        saturated(app, fleet, args.idle_seconds)
    finally:
        fleet.stop()
        app.dispose()
        target.cleanup()
    log(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
