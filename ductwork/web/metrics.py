"""``/metrics``: the fleet's state in Prometheus text format, read from the database at
scrape time.

    >>> registry = CollectorRegistry()
    >>> registry.register(FleetCollector(app))
    >>> print(generate_latest(registry).decode())

Each scrape is :func:`ductwork.status.snapshot` (runs, processes, keys: one read-only
transaction, no key lock), :func:`ductwork.status.execution_outcomes` and
:func:`ductwork.status.key_refusals` (one read-only statement each), so every process of
every host is counted, whichever dashboard is scraped. :data:`METRICS` lists each
family, its type and labels (docs/dashboard.md prints it).

Refusals come two ways: ``ductwork_key_refusals_total`` counts the claims a key's lock
refused, as each worker process's heartbeat adds them (at most one heartbeat behind, and
a process that dies loses what it counted since its last heartbeat);
``ductwork_key_refusing`` says, per key and reason, whether a claim made now would be
refused (a poll passes over a key known full or rate-blocked without claiming, so the
counter grows only when a claim races: the gauge is the steady state).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ductwork.pipelines.history import RUN_STATUSES
from ductwork.status import KeyStatus, ProcessStatus, Status, execution_outcomes, key_refusals, snapshot
from ductwork.web.rates import ClaimRates

if TYPE_CHECKING:
    from ductwork.app import App

#: (name as exposed, type, labels, what it is): the table of docs/dashboard.md
METRICS = (
    ("ductwork_runs", "gauge", "status", "runs by status (in_progress, dampened, completed, halted)"),
    ("ductwork_executions", "gauge", "state",
     "executions by outcome (success, failure, timed_out, process_crashed), and pending and running ones"),
    ("ductwork_halt_hooks", "gauge", "status", "on_halt hooks by status (pending, running, succeeded, failed)"),
    ("ductwork_processes", "gauge", "role, state",
     "process rows by role and heartbeat state (ok, late, stale, dead)"),
    ("ductwork_process_heartbeat_age_seconds", "gauge", "process, label, role, host",
     "seconds since each process row's last heartbeat, database time"),
    ("ductwork_key_in_flight", "gauge", "key", "executions of the key claimed and not completed"),
    ("ductwork_key_concurrency", "gauge", "key", "the key's configured concurrency (keys that have one)"),
    ("ductwork_key_pending", "gauge", "key", "executions of the key waiting to be claimed"),
    ("ductwork_key_tokens", "gauge", "key, period_seconds",
     "tokens in each rate bucket of the key, refilled to now"),
    ("ductwork_key_burst", "gauge", "key, period_seconds", "each rate bucket's capacity"),
    ("ductwork_key_blocked_seconds", "gauge", "key",
     "seconds until the key's blocked_until (0: not rate-blocked)"),
    ("ductwork_key_refusing", "gauge", "key, reason",
     "1 when a claim of the key made now would be refused for the reason (concurrency, rate), else 0"),
    ("ductwork_key_claims_total", "counter", "key", "claims the key ever admitted, fleet-wide"),
    ("ductwork_key_refusals_total", "counter", "key, reason",
     "claims the key's limits refused, by reason (concurrency, rate), fleet-wide, as of each worker's last heartbeat"),
    ("ductwork_scrape_duration_seconds", "gauge", "", "how long reading the database took for this scrape"),
)
_HELP = {name: (kind, text) for name, kind, _, text in METRICS}
_OUTCOMES = ("success", "failure", "timed_out", "process_crashed", "pending", "running")
_HOOK_STATUSES = ("pending", "running", "succeeded", "failed")


def _gauge(name: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _HELP[name][1], labels=labels)


def process_state(proc: ProcessStatus) -> str:
    return "dead" if proc.dead else "stale" if proc.stale else "late" if proc.late else "ok"


class FleetCollector(Collector):
    """A prometheus-client collector over one App. ``rates``: also record each scrape's
    claims counters there (the dashboard's charts)."""

    def __init__(self, app: App, rates: ClaimRates | None = None):
        self.app, self.rates = app, rates

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        status = snapshot(self.app)
        outcomes = execution_outcomes(self.app)
        refused = key_refusals(self.app)
        took = time.perf_counter() - started
        if self.rates is not None:
            self.rates.record(status.now, {key.key: key.claims for key in status.keys})
        yield from _fleet(status, outcomes)
        yield from _keys(status)
        counted = CounterMetricFamily("ductwork_key_refusals", _HELP["ductwork_key_refusals_total"][1],
                                      labels=["key", "reason"])
        for (key, reason), count in refused.items():
            counted.add_metric([key, reason], count)
        yield counted
        yield GaugeMetricFamily("ductwork_scrape_duration_seconds", _HELP["ductwork_scrape_duration_seconds"][1],
                                value=took)


def _fleet(status: Status, outcomes: dict[str, int]) -> Iterator[Metric]:
    runs = _gauge("ductwork_runs", ["status"])
    for state in RUN_STATUSES:
        runs.add_metric([state], status.runs.get(state, 0))
    executions = _gauge("ductwork_executions", ["state"])
    for state in _OUTCOMES:
        executions.add_metric([state], outcomes.get(state, 0))
    hooks = _gauge("ductwork_halt_hooks", ["status"])
    for state in _HOOK_STATUSES:
        hooks.add_metric([state], status.hooks.get(state, 0))
    processes = _gauge("ductwork_processes", ["role", "state"])
    by_role: dict[tuple[str, str], int] = {}
    age = _gauge("ductwork_process_heartbeat_age_seconds", ["process", "label", "role", "host"])
    for proc in status.processes:
        by_role[(proc.role, process_state(proc))] = by_role.get((proc.role, process_state(proc)), 0) + 1
        age.add_metric([proc.id, proc.label, proc.role, proc.host], proc.heartbeat_age_s)
    for (role, state), count in sorted(by_role.items()):
        processes.add_metric([role, state], count)
    yield from (runs, executions, hooks, processes, age)


def _keys(status: Status) -> Iterator[Metric]:
    in_flight, concurrency, pending = (_gauge(name, ["key"]) for name in (
        "ductwork_key_in_flight", "ductwork_key_concurrency", "ductwork_key_pending"))
    tokens, burst = (_gauge(name, ["key", "period_seconds"]) for name in ("ductwork_key_tokens", "ductwork_key_burst"))
    blocked = _gauge("ductwork_key_blocked_seconds", ["key"])
    refusing = _gauge("ductwork_key_refusing", ["key", "reason"])
    claims = CounterMetricFamily("ductwork_key_claims", _HELP["ductwork_key_claims_total"][1], labels=["key"])
    for key in status.keys:
        in_flight.add_metric([key.key], key.in_flight)
        pending.add_metric([key.key], key.pending)
        claims.add_metric([key.key], key.claims)
        if key.concurrency is not None:
            concurrency.add_metric([key.key], key.concurrency)
        for period, level, capacity in key.buckets:
            tokens.add_metric([key.key, str(period)], float(level))
            burst.add_metric([key.key, str(period)], capacity)
        until = key.blocked_until
        blocked.add_metric([key.key], max(0.0, (until - status.now).total_seconds()) if until else 0.0)
        for reason, refused in refusals(key, status).items():
            refusing.add_metric([key.key, reason], int(refused))
    yield from (in_flight, concurrency, pending, tokens, burst, blocked, refusing, claims)


def refusals(key: KeyStatus, status: Status) -> dict[str, bool]:
    """Whether a claim of ``key`` made at ``status.now`` would be refused, per reason: its
    in-flight count has reached its concurrency; it is rate-blocked, or a bucket holds less
    than one token (a bucket starts empty)."""
    full = key.concurrency is not None and key.in_flight >= key.concurrency
    blocked = key.blocked_until is not None and key.blocked_until > status.now
    return {"concurrency": full, "rate": blocked or any(level < 1 for _, level, _ in key.buckets)}
