"""Pipelines and steps the benchmarks run (importable by ``ductwork start`` children).

Not a benchmark itself: ``bench/*.py`` trigger these, and the fleets they start load
them through ``pipelines: ["bench.workloads:..."]`` in the generated ``ductwork.yml``.
Run any benchmark with ``python -m bench --only B1 [--database-url URL]``.
"""

from __future__ import annotations

import os
import threading
import time

from ductwork import Pipeline, Step

CHAIN_LENGTH = 5
NAP_S = 0.020
NAP3_S = 0.050

CONCURRENCY_KEY = "bench_concurrency"
RATE_KEY = "bench_rate"
RATE_BURST1_KEY = "bench_rate_burst1"
BLOCKED_KEY = "bench_blocked"
BACKLOG_KEY = "bench_backlog"
LIMIT3_KEY = "bench_limit3"
WIDE_KEY = "bench_wide"
#: its concurrency (B6; pgqueuer's peer registers its entrypoint with the same limit)
WIDE_LIMIT = 50
SATURATED_KEY = "bench_saturated"
#: B8's key family (``Tenants``): not in :data:`LIMITS` or :data:`PIPELINES`, so no other
#: bench's fleet or lane scan carries it; bench/b8_partitions.py adds both to its own
TENANT_FAMILY = "bench_tenant"
TENANT_LIMITS = {TENANT_FAMILY: {"per_partition": {"concurrency": 1}}}

#: ``job_worker.limits`` of every bench fleet (keys nobody references only warn).
LIMITS = {
    CONCURRENCY_KEY: {"concurrency": 5},
    RATE_KEY: {"rate": {"limit": 200, "per": "1s"}},  # default burst: one second's worth, 200
    RATE_BURST1_KEY: {"rate": {"limit": 200, "per": "1s", "burst": 1}},
    BLOCKED_KEY: {"rate": {"limit": 1, "per": "1h"}},
    BACKLOG_KEY: {"concurrency": 1_000_000, "rate": {"limit": 1_000_000, "per": "1s"}},
    LIMIT3_KEY: {"concurrency": 3},
    WIDE_KEY: {"concurrency": WIDE_LIMIT},  # B6: a key that never binds (50 > the fleet's threads)
    SATURATED_KEY: {"concurrency": 2},  # B6 idle: 2 long bodies hold it, the backlog waits
}

#: where step bodies write their witness lines (set by ``ProcessFleet`` for every fleet)
WITNESS_ENV = "BENCH_WITNESS_DIR"
_witness_fd: list[int] = []
_witness_lock = threading.Lock()


def witness(tag, started: float, ended: float) -> None:
    """Append ``tag started ended`` (wall-clock seconds) to this process's witness file.

    One ``write`` of one short line to a file opened ``O_APPEND``, per body: a few
    microseconds, no database round trip, so the body's own interval is what is recorded
    and the database sees no extra load. Wall-clock time (``time.time``) is shared by every
    process on the host, so the bench can merge the files of several fleets.
    """
    directory = os.environ.get(WITNESS_ENV)
    if not directory:
        return
    if not _witness_fd:
        with _witness_lock:
            if not _witness_fd:
                _witness_fd.append(os.open(os.path.join(directory, f"witness-{os.getpid()}.txt"),
                                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    os.write(_witness_fd[0], f"{tag} {started:.6f} {ended:.6f}\n".encode())


class Noop(Step):
    """Returns its input: a chain passes the value along."""

    def __init__(self, value=None):
        self.value = value

    def execute(self):
        return self.value


class Nap(Step):
    """Sleeps ``seconds`` (20 ms: a short call to a limited API) and writes its witness line.

    Its input is ``[tag]`` or ``[tag, seconds]``; the tag names the bench batch.
    """

    def __init__(self, value=None, seconds=NAP_S):
        self.value, self.seconds = value, seconds

    def execute(self):
        started = time.time()
        if self.seconds:
            time.sleep(self.seconds)
        witness(self.value, started, time.time())
        return self.value


class Items(Step):
    """Returns ``list(range(n))`` (B4 writes its output in bulk instead of running it)."""

    def __init__(self, n):
        self.n = n

    def execute(self):
        return list(range(self.n))


class Chain(Pipeline):
    """Five no-op steps in a chain."""

    @classmethod
    def define(cls, p):
        tip = p.start(Noop)
        for _ in range(CHAIN_LENGTH - 1):
            tip = tip.chain(to=Noop)


class One(Pipeline):
    """One unkeyed no-op step."""

    @classmethod
    def define(cls, p):
        p.start(Noop)


class ConcurrencyNap(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Nap, limit_by=CONCURRENCY_KEY)


class RateNap(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Nap, limit_by=RATE_KEY)


class RateBurst1Nap(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Nap, limit_by=RATE_BURST1_KEY)


class Limit3Nap(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Nap, limit_by=LIMIT3_KEY)


class WideNoop(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Noop, limit_by=WIDE_KEY)


class SaturatedNap(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Nap, limit_by=SATURATED_KEY)


class Blocked(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Noop, limit_by=BLOCKED_KEY)


class Backlog(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Noop, limit_by=BACKLOG_KEY)


class Expand(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Noop)


class AsyncSleep(Step):
    """Awaits ``asyncio.sleep(seconds)`` (a network call of an async step), returns nothing."""

    def __init__(self, value=None, seconds=0.1):  # noqa: ARG002 - bench.harness.insert_pending's input is [0]
        self.seconds = seconds

    async def execute(self):
        import asyncio

        await asyncio.sleep(self.seconds)


class AsyncNaps(Pipeline):
    """One unkeyed async step awaiting 0.1 s (B7)."""

    @classmethod
    def define(cls, p):
        p.start(AsyncSleep)


class TenantNoop(Step):
    """B8's step: a no-op whose ``tenant`` picks its partition of :data:`TENANT_FAMILY`."""

    def __init__(self, tenant, value=None):
        self.tenant, self.value = tenant, value

    def execute(self):
        return None


class Tenants(Pipeline):
    """B8: one no-op step partitioned by its input's ``tenant``
    (``limit_by=("bench_tenant", "tenant")``, key ``bench_tenant[<tenant>]``)."""

    @classmethod
    def define(cls, p):
        p.start(TenantNoop, limit_by=(TENANT_FAMILY, "tenant"))


PIPELINES = [f"bench.workloads:{cls.__name__}" for cls in
             (Chain, One, ConcurrencyNap, RateNap, RateBurst1Nap, Limit3Nap, WideNoop, SaturatedNap,
              Blocked, Backlog, Expand, AsyncNaps)]


# --------------------------------------------------------------------------- the dashboard (issue 35)


class WebWork(Step):
    """The step of bench/web_dashboard.py's bulk runs (never executed: the rows are made in SQL)."""

    def __init__(self, n):
        self.n = n

    def execute(self):
        return self.n


class WebMonthly(Pipeline):
    """bench/web_dashboard.py's runs: one keyed step."""

    @classmethod
    def define(cls, p):
        p.start(WebWork, limit_by="key-00000")
