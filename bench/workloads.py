"""Pipelines and steps the benchmarks run (importable by ``ductwork start`` children).

Not a benchmark itself: ``bench/*.py`` trigger these, and the fleets they start load
them through ``pipelines: ["bench.workloads:..."]`` in the generated ``ductwork.yml``.
Run any benchmark with ``python -m bench --only B1 [--database-url URL]``.
"""

from __future__ import annotations

import time

from ductwork import Pipeline, Step

CHAIN_LENGTH = 5
NAP_S = 0.020

CONCURRENCY_KEY = "bench_concurrency"
RATE_KEY = "bench_rate"
RATE_BURST1_KEY = "bench_rate_burst1"
BLOCKED_KEY = "bench_blocked"
BACKLOG_KEY = "bench_backlog"

#: ``job_worker.limits`` of every bench fleet (keys nobody references only warn).
LIMITS = {
    CONCURRENCY_KEY: {"concurrency": 5},
    RATE_KEY: {"rate": {"limit": 200, "per": "1s"}},  # default burst: one second's worth, 200
    RATE_BURST1_KEY: {"rate": {"limit": 200, "per": "1s", "burst": 1}},
    BLOCKED_KEY: {"rate": {"limit": 1, "per": "1h"}},
    BACKLOG_KEY: {"concurrency": 1_000_000, "rate": {"limit": 1_000_000, "per": "1s"}},
}


class Noop(Step):
    """Returns its input: a chain passes the value along."""

    def __init__(self, value=None):
        self.value = value

    def execute(self):
        return self.value


class Nap(Step):
    """Sleeps 20 ms (a stand-in for a short call to a limited API)."""

    def __init__(self, value=None):
        self.value = value

    def execute(self):
        time.sleep(NAP_S)
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


PIPELINES = [f"bench.workloads:{cls.__name__}" for cls in
             (Chain, One, ConcurrencyNap, RateNap, RateBurst1Nap, Blocked, Backlog, Expand)]
