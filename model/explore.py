"""Exhaustive bounded exploration of the model: every interleaving of a small configuration.

Example::

    python -m model.explore              # the CI configurations, every invariant in every state
    python -m model.explore --deep       # the nightly bounds
    python -m model.explore --mutants    # each model mutant's shortest counterexample

    from model.explore import CONFIGS, explore
    report = explore(CONFIGS["limits"])  # report.states, report.transitions, report.depth
    assert report.violation is None

Where the hypothesis machines of ``tests/properties/`` *sample* interleavings, this visits
all of them within bounds, the way TLC explores a TLA+ spec: breadth first from the
initial state, every enabled operation applied to every state reached, each state's
fingerprint stored so a state reached twice is expanded once. Every invariant of
``model/invariants.py`` that applies is checked after every transition, and a refused
operation (``model.errors``) must change nothing. Breadth first, the first violation
found has a shortest trace: its ``Counterexample`` lists the operations from the
initial state.

What a configuration bounds (the constants of a TLA+ model): the workers, keys, jobs,
crashes, restarts and clock instants of a limits world; the definitions, runs, injected
faults, context writes, prunes and revives of a pipelines world. Time is discretised:
a limits world's clock moves by a fixed step up to a horizon or jumps to a key's
``blocked_until`` stamp (or one µs before it); a pipelines world's clock jumps to the
next instant something becomes eligible, the only instants its operations can tell apart.

The fingerprint (the TLC *view*) is the state the operations read — jobs, buckets,
stamps, runs, branches, steps, executions, hooks, the clock and the world's counters —
plus what a history checker needs that the present does not show (per key, the claim
times since the last restart and whether it was refilled since, for INV-LIM-2, -4, -5).
The append-only logs (events, commits, fence and hook logs, outcomes) are left out of
it: two interleavings that reach one state merge, and exploration goes on from the
first. That loses no violation: the invariants are checked on every transition's
target, with its own history, before it is merged, and each history checker is a
monitor whose verdict on the events a transition appends depends only on the present
state and on what the view keeps. (A pipelines invariant that reads only the view is
checked once per distinct view, the way TLC checks a state predicate once per state:
in a target whose view passed before, only the invariants that read a log run.) Not a
proof beyond the bounds: a bug that needs a third worker, a fifth node or a longer
clock is outside them (``--deep`` widens them).

Nothing here imports ``ductwork``. Not API.

PYTEST_DONT_REWRITE: this module's assertion messages (``[INV-…]`` and what failed)
are its output, compared exactly by its tests and quoted by ``ductwork verify``;
pytest would rewrite the asserts of the distribution its plugins come from,
which ships this module (as ``ductwork_model``).
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from .errors import ModelError
from .invariants import INVARIANT_FUNCTIONS, LIMITS_INVARIANTS, PIPELINE_INVARIANTS
from .limits import (
    CEILING_REFUSALS,
    Claimed,
    Decided,
    Forgotten,
    LimitsModel,
    Restarted,
    partition_key,
    split_partition_key,
)
from .pipelines import CRASH, FAILURE, INVALID, NO_INPUT, TIMED_OUT, PipelineConfig, PipelinesModel, success

__all__ = ["CONFIGS", "DEEP_CONFIGS", "MUTANT_CONFIGS", "Config", "Counterexample", "LimitsWorld", "PipelinesWorld",
           "Report", "explore", "replay"]

Action = tuple[str, Callable[[Any], object]]


class World(Protocol):
    """One state of a bounded configuration: the model and the explorer's own counters."""

    def actions(self) -> Iterable[Action]: ...
    def fingerprint(self) -> bytes: ...
    def present(self) -> Any: ...
    def copy(self) -> Any: ...
    def copier(self) -> Callable[[], Any]: ...
    def check(self, seen: bool = False) -> None: ...


def _digest(value: Any) -> bytes:
    """A fingerprint of ``value``'s content: its ``repr`` (the records are dataclasses, whose
    repr names every field), hashed. Not ``pickle``: its bytes depend on which objects are
    shared, which a copy does not keep, so equal states would not merge."""
    return hashlib.blake2b(repr(value).encode(), digest_size=16).digest()


def _shallow(record: Any) -> Any:
    """A new instance of ``record``'s class with the same attribute values (``copy.copy``
    without its ``__reduce_ex__`` detour)."""
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    return new


def _copy_run(run: Any) -> Any:
    new = _shallow(run)
    new.status_history, new.branches, new.context = list(run.status_history), list(run.branches), dict(run.context)
    return new


def _copy_branch(branch: Any) -> Any:
    new = _shallow(branch)
    new.steps, new.arrived = list(branch.steps), dict(branch.arrived)
    return new


def _copy_step(step: Any) -> Any:
    new = _shallow(step)
    new.executions = list(step.executions)
    return new


def _copy_hook(hook: Any) -> Any:
    new = _shallow(hook)
    new.attempts, new.attempt_times = list(hook.attempts), list(hook.attempt_times)
    return new


def _copy(world: Any) -> Any:
    """A deep copy (pickle round trip: several times faster than ``copy.deepcopy`` here)."""
    return pickle.loads(pickle.dumps(world, protocol=pickle.HIGHEST_PROTOCOL))


# =========================================================================== the explorer


@dataclass(frozen=True)
class Counterexample:
    """A shortest trace from the initial state to a state where ``message`` holds."""

    message: str
    trace: tuple[str, ...]

    def __str__(self) -> str:
        steps = "".join(f"\n  {i + 1:>2}. {label}" for i, label in enumerate(self.trace))
        return f"{self.message}\n  after {len(self.trace)} operations:{steps}"


@dataclass
class Report:
    """What one exploration visited: distinct states, transitions (refused ones included),
    the greatest depth (operations from the initial state), and the first violation."""

    name: str
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    complete: bool = True
    violation: Counterexample | None = None

    def line(self) -> str:
        found = "no invariant fails" if self.violation is None else f"VIOLATION: {self.violation}"
        bounded = "" if self.complete else " (stopped at max_states: not exhaustive)"
        return (f"{self.name}: {self.states} states, {self.transitions} transitions, depth {self.depth}, "
                f"{self.seconds:.1f} s{bounded}: {found}")


@dataclass(frozen=True)
class Config:
    """A named bounded configuration: ``make(model_class)`` builds its initial world."""

    name: str
    make: Callable[[type | None], Any]
    #: the model family its mutants replace ("limits" or "pipelines")
    machine: str
    description: str


def explore(config: Config, model_class: type | None = None, max_states: int | None = None,
            progress: Callable[[Report], None] | None = None) -> Report:
    """Breadth-first search of every state ``config`` reaches; stops at the first violation.

    ``model_class`` replaces the model (a mutant of ``model/mutants.py``). ``max_states``
    stops early (then ``Report.complete`` is False and nothing is claimed exhaustive).
    ``progress`` is called with the report so far every 10 000 states.
    """
    started = time.monotonic()
    report = Report(config.name)
    initial = config.make(model_class)
    parents: dict[bytes, tuple[bytes | None, str]] = {}
    root = initial.fingerprint()
    parents[root] = (None, "")
    try:
        initial.check()
    except AssertionError as error:
        report.violation = Counterexample(_first_line(error), ())
        return _done(report, started, 1)
    queue: deque[tuple[Any, bytes, int]] = deque([(initial, root, 0)])
    while queue:
        world, fp, depth = queue.popleft()
        report.depth = max(report.depth, depth)
        copy_of_world = world.copier()  # (a pickled world is pickled once for all its successors)
        for label, operation in world.actions():
            report.transitions += 1
            successor = copy_of_world()
            try:
                operation(successor)
            except ModelError:
                refused = True
            else:
                refused = False
            try:
                if refused:  # a refusal may log what it refused (a context write)
                    unchanged = successor.present() == world.present()
                    successor.check(seen=unchanged)
                    if not unchanged:
                        raise AssertionError(f"a refused operation changed the state: {label}")
                else:
                    child = successor.fingerprint()
                    successor.check(seen=child in parents)
            except AssertionError as error:
                report.violation = Counterexample(_first_line(error), (*_trace(parents, fp), label))
                return _done(report, started, len(parents))
            if refused or child in parents:
                continue  # refused, nothing changed (a self-loop), or a state reached before
            parents[child] = (fp, label)
            if progress is not None and len(parents) % 10_000 == 0:
                progress(_done(report, started, len(parents)))
            if max_states is not None and len(parents) >= max_states:
                report.complete = False
                return _done(report, started, len(parents))
            queue.append((successor, child, depth + 1))
    return _done(report, started, len(parents))


def _first_line(error: AssertionError) -> str:
    return (str(error).splitlines() or [repr(error)])[0]


def _done(report: Report, started: float, states: int) -> Report:
    report.states = states
    report.seconds = time.monotonic() - started
    return report


def _trace(parents: dict[bytes, tuple[bytes | None, str]], fp: bytes) -> tuple[str, ...]:
    labels: list[str] = []
    at: bytes | None = fp
    while at is not None:
        parent, label = parents[at]
        if parent is not None:
            labels.append(label)
        at = parent
    return tuple(reversed(labels))


def replay(config: Config, trace: Iterable[str], model_class: type | None = None) -> Any:
    """Apply the operations named by ``trace`` from the initial state, checking every
    invariant after each (an ``AssertionError`` names the first that fails); returns the
    world reached. A label that is not enabled raises ``KeyError``."""
    world = config.make(model_class)
    world.check()
    for label in trace:
        operation = dict(world.actions())[label]
        before = world.present()
        try:
            operation(world)
        except ModelError:
            world.check()
            assert world.present() == before, f"a refused operation changed the state: {label}"
            continue
        world.check()
    return world


# =========================================================================== limits worlds


@dataclass(frozen=True)
class LimitsBounds:
    """The constants of a limits world."""

    limits: dict[str, Any]
    #: the config a restart switches to (None: no restart)
    restart_to: dict[str, Any] | None
    #: keys jobs are enqueued on (None: the unkeyed lane)
    keys: tuple[str | None, ...]
    jobs: int
    workers: int
    crashes: int
    #: reaps (each of a dead worker, or of a live one that missed its heartbeats)
    reaps: int
    restarts: int
    #: enqueue delays, µs
    delays: tuple[int, ...]
    #: the clock's fixed step and its horizon, µs
    tick_us: int
    horizon_us: int
    #: jobs are enqueued while the clock is at most this (µs; None: until the horizon)
    arrive_until_us: int | None = None
    #: the batch size of ``claim_batch`` and of a success's hand-off (``complete_all_and_hand_off``
    #: of one job; 0: not explored)
    batch: int = 2
    #: ``forget_partition`` calls (each on a partition key of ``keys``, idle or not: a busy one
    #: must be refused and change nothing)
    forgets: int = 0


@dataclass
class LimitsWorld:
    """A ``LimitsModel`` with the workers that poll it, the jobs left to enqueue and a clock."""

    bounds: LimitsBounds
    model: LimitsModel
    now: int = 0
    live: list[str] = field(default_factory=list)
    workers_started: int = 0
    jobs_enqueued: int = 0
    crashes: int = 0
    reaps: int = 0
    restarts: int = 0
    forgets: int = 0
    #: jobs reaped while their worker lived: its late completion must be refused
    reaped_alive: list[Any] = field(default_factory=list)

    @classmethod
    def start(cls, bounds: LimitsBounds, model_class: type | None) -> LimitsWorld:
        world = cls(bounds, (model_class or LimitsModel)(bounds.limits))
        for _ in range(bounds.workers):
            world._add_worker()
        return world

    _MODEL_FIELDS = frozenset(("limits", "config", "jobs", "buckets", "stamps", "dead_workers", "events", "log",
                               "_created", "_synthetic"))

    def copier(self) -> Callable[[], LimitsWorld]:
        """Copies of this world as it is now (:meth:`copy`: it shares the frozen parts)."""
        return self.copy

    def copy(self) -> LimitsWorld:
        """A copy sharing only immutable parts (events, buckets and parsed configs are
        frozen, and a restart replaces ``config``); a model with other fields is pickled."""
        old = self.model
        if not set(vars(old)) <= self._MODEL_FIELDS:
            return _copy(self)  # type: ignore[no-any-return]
        model = _shallow(old)
        model.jobs = {job_id: _shallow(job) for job_id, job in old.jobs.items()}
        model.buckets, model.stamps = dict(old.buckets), dict(old.stamps)
        model.dead_workers, model.events, model.log = set(old.dead_workers), list(old.events), list(old.log)
        world: LimitsWorld = _shallow(self)
        world.model, world.live, world.reaped_alive = model, list(self.live), list(self.reaped_alive)
        return world

    def _add_worker(self) -> None:
        self.live.append(f"w{self.workers_started}")
        self.workers_started += 1

    # ----------------------------------------------------------------- operations

    def actions(self) -> Iterator[Action]:
        b, m = self.bounds, self.model
        if self.jobs_enqueued < b.jobs and (b.arrive_until_us is None or self.now <= b.arrive_until_us):
            for key in b.keys:
                for delay in b.delays:
                    yield f"enqueue(key={key!r}, eligible_at={self.now + delay})", _enqueue(key, delay)
        idle = [w for w in self.live if not m.in_flight_jobs(w)]
        # symmetry: idle live workers are interchangeable, so only the first of them acts
        acting = [w for w in self.live if w not in idle[1:]]
        for worker in acting:
            yield f"claim({worker}, now={self.now})", _claim(worker, 0)
            if b.batch:
                yield (f"claim_batch({worker}, now={self.now}, limit={b.batch}, keyed_limit={b.batch})",
                       _claim(worker, b.batch))
        for job_id in m.in_flight_jobs():
            owner = m.jobs[job_id].worker
            if owner in self.live:
                yield f"complete(job {job_id}, {owner}, now={self.now})", _complete(job_id)
                if b.batch:
                    yield (f"complete_all_and_hand_off([job {job_id}], {owner}, now={self.now})",
                           _hand_off(job_id, b.batch))
        for job_id in self.reaped_alive:
            yield f"late complete(job {job_id}) after its reap (refused)", _complete(job_id)
        if self.crashes < b.crashes:
            for worker in acting:
                yield f"crash_worker({worker})", _crash(worker)
        owners = {m.jobs[j].worker or "" for j in m.in_flight_jobs()} if self.reaps < b.reaps else set()
        for owner in sorted(owners):
            yield f"reap({owner}, requeue, now={self.now})", _reap(owner, True)
            yield f"reap({owner}, budget spent, now={self.now})", _reap(owner, False)
        if self.restarts < b.restarts and b.restart_to is not None:
            yield f"restart_with({b.restart_to}, now={self.now})", _restart
        if self.forgets < b.forgets:
            for key in b.keys:
                if key is not None and split_partition_key(key) is not None:
                    yield f"forget_partition({key!r}, now={self.now})", _forget(key)
        if self.now + b.tick_us <= b.horizon_us:
            yield f"clock +{b.tick_us} µs -> {self.now + b.tick_us}", _tick(b.tick_us)
        for stamp in sorted(set(m.stamps.values())):
            for at in (stamp - 1, stamp):
                if self.now < at <= b.horizon_us:
                    yield f"clock -> {at} (stamp {stamp}{' - 1' if at < stamp else ''})", _set_clock(at)

    # ----------------------------------------------------------------- state

    def fingerprint(self) -> bytes:
        """The view, up to the names of workers (a symmetry: workers are interchangeable, so
        each is named by what it holds, and two idle live workers are one class)."""
        names = self._canonical_workers()
        return _digest((self.now, tuple(sorted(names[w] for w in self.live)), self.jobs_enqueued, self.crashes,
                        self.reaps, self.restarts, self.forgets, tuple(sorted(map(repr, self.reaped_alive))),
                        self.present(names)))

    def _canonical_workers(self) -> dict[str, str]:
        m = self.model
        held: dict[str, list[str]] = {}
        for job_id in m.in_flight_jobs():
            held.setdefault(m.jobs[job_id].worker or "", []).append(repr(job_id))
        workers = sorted(set(self.live) | set(held), key=lambda w: (w not in self.live, sorted(held.get(w, []))))
        return {w: f"W{i}" for i, w in enumerate(workers)}

    def present(self, names: dict[str, str] | None = None) -> tuple[Any, ...]:
        """The model's state as its operations and checkers read it (see the module's
        docstring); with ``names``, workers renamed and completed jobs' owners dropped."""
        m = self.model

        def owner(job: Any) -> str:
            if names is None:
                return job.worker or ""
            return names.get(job.worker, "") if job.state == "in_flight" else ""

        # a job's claim time and outcome are history no operation reads (the checkers read the events)
        jobs = tuple(sorted((repr(j.job_id), j.key or "", j.eligible_at_us, j.created, j.state, owner(j))
                            for j in m.jobs.values()))
        dead = sorted(m.dead_workers) if names is None else sorted(names[w] for w in m.dead_workers if w in names)
        claims: dict[str, list[int]] = {}
        refilled: set[str] = set()
        forgotten: set[str] = set()  # forgotten and not decided since (INV-LIM-9)
        for event in m.events:  # since the last restart: the part of the history checkers read
            if isinstance(event, Restarted):
                claims, refilled = {}, refilled - event.rebased
            elif isinstance(event, Claimed) and event.key is not None:
                claims.setdefault(event.key, []).append(event.at_us)
            elif isinstance(event, Forgotten):
                refilled.discard(event.key)
                forgotten.add(event.key)
            elif isinstance(event, Decided) and event.refused_for not in CEILING_REFUSALS:
                forgotten.discard(event.key)
                if not event.unconfigured:
                    refilled.add(event.key)
        return (sorted(m.config.items()), jobs, tuple(sorted(m.buckets.items())), tuple(sorted(m.stamps.items())),
                tuple(dead), m._created, m._synthetic,
                tuple(sorted((k, tuple(sorted(t))) for k, t in claims.items())), tuple(sorted(refilled)),
                tuple(sorted(forgotten)))

    def check(self, seen: bool = False) -> None:  # noqa: ARG002 - each limits invariant reads the event log
        """Every limits invariant, ``seen`` or not (each reads the event log)."""
        for inv_id in LIMITS_INVARIANTS:
            INVARIANT_FUNCTIONS[inv_id](self.model)


def _enqueue(key: str | None, delay: int) -> Callable[[LimitsWorld], object]:
    def apply(w: LimitsWorld) -> None:
        w.jobs_enqueued += 1
        w.model.enqueue(f"j{w.jobs_enqueued}", key, w.now + delay)
    return apply


def _claim(worker: str, batch: int) -> Callable[[LimitsWorld], object]:
    if batch:
        return lambda w: w.model.claim_batch(worker, w.now, batch, batch)
    return lambda w: w.model.claim(worker, w.now)


def _hand_off(job_id: Any, batch: int) -> Callable[[LimitsWorld], object]:
    return lambda w: w.model.complete_all_and_hand_off([job_id], w.now, batch)


def _complete(job_id: Any) -> Callable[[LimitsWorld], object]:
    return lambda w: w.model.complete(job_id, w.now)


def _crash(worker: str) -> Callable[[LimitsWorld], object]:
    def apply(w: LimitsWorld) -> None:
        w.model.crash_worker(worker, w.now)
        w.live.remove(worker)
        w.crashes += 1
        w._add_worker()
    return apply


def _reap(owner: str, requeue: bool) -> Callable[[LimitsWorld], object]:
    def apply(w: LimitsWorld) -> None:
        w.reaps += 1
        plan = None
        if requeue:
            plan = {j: (f"{j}r", w.now) for j in w.model.in_flight_jobs(owner)}
        reaped = w.model.reap(owner, w.now, plan)
        if owner in w.live:
            w.reaped_alive += reaped
    return apply


def _restart(w: LimitsWorld) -> None:
    w.restarts += 1
    w.model.restart_with(w.bounds.restart_to or {}, w.now)


def _forget(key: str) -> Callable[[LimitsWorld], object]:
    def apply(w: LimitsWorld) -> None:
        w.forgets += 1
        w.model.forget_partition(key, w.now)
    return apply


def _tick(dt: int) -> Callable[[LimitsWorld], object]:
    def apply(w: LimitsWorld) -> None:
        w.now += dt
    return apply


def _set_clock(at: int) -> Callable[[LimitsWorld], object]:
    def apply(w: LimitsWorld) -> None:
        w.now = at
    return apply


# =========================================================================== pipelines worlds

_HOOK = "explore:OnHalt"
#: what an execution may end in, beside success: each one uses one of the world's faults
_FAULTS = {"failure": FAILURE, "timed_out": TIMED_OUT, "crash": CRASH, "invalid": INVALID}


@dataclass(frozen=True)
class PipelinesBounds:
    """The constants of a pipelines world."""

    definition: dict[str, Any]
    #: node → the value its executions succeed with
    outputs: dict[str, Any]
    config: PipelineConfig
    runs: int = 1
    #: executions ending otherwise than in success, advancer errors and crashes, in all
    faults: int = 2
    fault_kinds: tuple[str, ...] = ("failure", "crash", "invalid")
    advancer_faults: bool = True
    context_writes: int = 0
    prunes: int = 0
    revives: int = 0
    hooks: bool = False
    #: also explore a group commit of every runnable execution and an advancer batch
    batches: bool = True
    #: triggers with the key "k" (plain, with the window, rolled back in the caller's
    #: transaction), beside the world's first, unkeyed run
    keyed_triggers: int = 0
    key_window_us: int | None = None


@dataclass
class PipelinesWorld:
    """A ``PipelinesModel`` with its budget of runs and injected faults left."""

    bounds: PipelinesBounds
    model: PipelinesModel
    triggered: int = 0
    faults: int = 0
    context_writes: int = 0
    prunes: int = 0
    revives: int = 0
    keyed: int = 0

    @classmethod
    def start(cls, bounds: PipelinesBounds, model_class: type | None) -> PipelinesWorld:
        world = cls(bounds, (model_class or PipelinesModel)(bounds.config))
        world.model.trigger(bounds.definition, [0])
        world.triggered = 1
        return world

    _MODEL_FIELDS = frozenset(("config", "now_us", "runs", "branches", "steps", "executions", "commits", "fence_log",
                               "outcomes", "context_writes", "hooks", "hook_outcomes", "hook_log", "prunes",
                               "revivals", "triggers", "rollbacks", "_ids"))

    def copy(self) -> PipelinesWorld:
        """A copy sharing only what no operation changes in place: the frozen parts (the
        config, definitions, log entries) and the JSON values of inputs, outputs, arguments
        and context (the model deep-copies each on the way in and replaces it, never edits
        it); each record and its lists and dicts are copied. A model with other fields is
        pickled."""
        old = self.model
        if not set(vars(old)) <= self._MODEL_FIELDS:
            return _copy(self)  # type: ignore[no-any-return]
        model = _shallow(old)
        model.runs = {k: _copy_run(v) for k, v in old.runs.items()}
        model.branches = {k: _copy_branch(v) for k, v in old.branches.items()}
        model.steps = {k: _copy_step(v) for k, v in old.steps.items()}
        model.executions = {k: _shallow(v) for k, v in old.executions.items()}
        model.hooks = {k: _copy_hook(v) for k, v in old.hooks.items()}
        for log in ("commits", "fence_log", "outcomes", "context_writes", "hook_outcomes", "hook_log", "prunes",
                    "revivals", "triggers", "rollbacks"):
            setattr(model, log, list(getattr(old, log)))
        model._ids = old._ids.copy()
        world: PipelinesWorld = _shallow(self)
        world.model = model
        return world

    def copier(self) -> Callable[[], PipelinesWorld]:
        """Copies of this world as it is now (:meth:`copy`)."""
        return self.copy

    def actions(self) -> Iterator[Action]:
        b, m = self.bounds, self.model
        if self.triggered < b.runs:
            yield f"trigger([{self.triggered}])", _trigger
        runnable = m.runnable_executions()
        for exec_id in runnable:
            node = m.steps[m.executions[exec_id].step_id].node
            yield f"run_execution(e{exec_id} {node}, success)", _run(exec_id, None)
            yield f"advance_on_successes([e{exec_id}] {node})", _group((exec_id,))  # a group of one
            if self.faults < b.faults:
                for kind in b.fault_kinds:
                    yield f"run_execution(e{exec_id} {node}, {kind})", _run(exec_id, kind)
        if b.batches and len(runnable) > 1:
            yield f"advance_on_successes({[f'e{e}' for e in runnable]})", _group(tuple(runnable))
        done = [e.id for e in m.executions.values() if e.state == "completed"]
        if done:
            yield f"run_execution(e{done[-1]}) again (refused)", _run(done[-1], None)
        for branch_id in m.advanceable_branches():
            yield f"advance({branch_id})", _advance_with(branch_id, None)
            if b.advancer_faults and self.faults < b.faults:
                yield f"advancer_crash({branch_id})", _advancer(branch_id, "crash")
                yield f"advancer_error({branch_id})", _advancer(branch_id, "error")
                if m.steps[m.branches[branch_id].latest_step].status == "advancing":
                    yield f"advancer_error({branch_id}, TransitionError)", _advancer(branch_id, "transition")
            stale = _stale_token(m, m.branches[branch_id].claim_token)
            if stale is not None:
                yield f"advance({branch_id}, stale token {stale})", _advance_with(branch_id, stale)
        batchable = [x for x in m.claimable_branches() if m.batchable(x)]
        if b.batches and len(batchable) > 1:
            yield f"advance_batch(claim_branches({batchable}))", _batch(tuple(batchable))
        if self.context_writes < b.context_writes:
            for run_id in m.live_runs():
                yield f"context_set({run_id}, 'k')", _context(run_id, False)
                yield f"context_set({run_id}, 'k', overwrite)", _context(run_id, True)
        if self.prunes < b.prunes and m.live_runs():
            yield f"prune(cutoff={m.now_us + 1}, asked about every run)", _prune
        if self.revives < b.revives:
            for run_id in m.live_runs():
                if m.runs[run_id].status == "halted":
                    yield f"revive({run_id})", _revive(run_id)
        if any(r.status == "dampened" for r in m.runs.values()):
            for run_id in m.live_runs():
                if m.runs[run_id].status == "dampened":
                    yield f"resume({run_id})", _resume(run_id)
        yield from self._refused_recoveries()
        if b.hooks:
            yield from self._hook_actions()
        if self.keyed < b.keyed_triggers:
            yield "trigger(key 'k')", _keyed_trigger(None, True)
            yield "trigger_in(key 'k', rolled back)", _keyed_trigger(None, False)
            if b.key_window_us is not None:
                yield f"trigger(key 'k', window {b.key_window_us})", _keyed_trigger(b.key_window_us, True)
        if b.key_window_us is not None:  # to the instant each finished run's key may move
            for at in sorted({r.finished_at_us + b.key_window_us for r in m.runs.values()
                              if r.finished_at_us is not None and r.finished_at_us + b.key_window_us > m.now_us}):
                yield f"clock -> {at} (a key's window ends)", _set_model_clock(at)
        waits = [e.eligible_at_us for e in m.executions.values() if e.state == "pending"]
        waits += [h.eligible_at_us for h in m.hooks.values() if h.status == "pending"]
        later = [t for t in waits if t > m.now_us]
        if later:
            yield f"clock -> {min(later)}", _set_model_clock(min(later))

    def _refused_recoveries(self) -> Iterator[Action]:
        """The recovery operations the model refuses, over every state a run or hook is in:
        revive of a run that is not halted (or pruned), resume of one with no dampened
        branch (or pruned), a context write to a pruned run (offered in worlds that revive
        or prune), the reap of a hook that is not running (pending, succeeded or failed:
        in worlds with hooks). Each is a self-loop (the explorer checks that the refusal
        changed nothing), so none spends a bound."""
        m, b = self.model, self.bounds
        if b.hooks:
            for hook in m.hooks.values():
                if hook.status != "running":
                    yield f"reap_hook({hook.id}) refused ({hook.status})", _refused("reap_hook", hook.id)
        if not (b.revives or b.prunes):
            return
        for run_id, run in m.runs.items():
            state = "pruned" if run.pruned else run.status
            if state != "halted":
                yield f"revive({run_id}) refused ({state})", _refused("revive", run_id)
            if state != "dampened":
                yield f"resume({run_id}) refused ({state})", _refused("resume", run_id)
            if run.pruned and b.context_writes:
                yield f"context_set({run_id}, 'k') refused (pruned)", _refused("context_set", run_id)

    def _hook_actions(self) -> Iterator[Action]:
        m = self.model
        for hook_id in m.runnable_hooks():
            yield f"claim_hook({hook_id})", _claim_hook(hook_id)
        for hook in m.hooks.values():
            if hook.status != "running":
                continue
            token = hook.claim_token
            for kind, outcome in (("success", success(None)), ("failure", FAILURE), ("invalid", INVALID)):
                if kind != "success" and self.faults >= self.bounds.faults:
                    continue
                yield (f"run_hook({hook.id}, token {token}, {kind})",
                       _hook_run(hook.id, token, outcome, kind != "success"))
            yield f"reap_hook({hook.id})", _hook_reap(hook.id)
            stale = _stale_token(m, token)
            if stale is not None:  # pragma: no branch  a hook's claim never takes token 1: its run halted in an advance
                yield f"run_hook({hook.id}, stale token {stale}, success)", _hook_run(hook.id, stale, success(None),
                                                                                        False)

    def fingerprint(self) -> bytes:
        return _digest((self.triggered, self.faults, self.context_writes, self.prunes, self.revives,
                        self.keyed, self.present()))

    def present(self) -> tuple[Any, ...]:
        """The model's state as its operations read it: everything but the append-only logs."""
        m = self.model
        return (m.now_us, m.runs, m.branches, m.steps, m.executions, m.hooks,
                sorted(m._ids.items()))

    def check(self, seen: bool = False) -> None:
        """Every pipelines invariant; with ``seen`` (a state with this :meth:`present` passed
        them all before) only those that read the append-only logs the view leaves out."""
        for inv_id in _HISTORY_INVARIANTS if seen else PIPELINE_INVARIANTS:
            INVARIANT_FUNCTIONS[inv_id](self.model)


#: the pipelines invariants that read only what :meth:`PipelinesWorld.present` shows (runs,
#: branches, steps, executions, hooks; the config is the world's constant): a deterministic
#: function of the view, so they hold in a state whose view passed them before
_PRESENT_INVARIANTS = frozenset(("INV-ADV-1", "INV-ADV-3", "INV-EXE-1", "INV-EXE-3", "INV-EXE-4", "INV-RUN-1",
                                 "INV-HLT-2", "INV-REV-2", "INV-REV-3"))
#: the others read a log (fence log, commits, outcomes, context writes, hook outcomes and
#: log, prunes, revivals, triggers, rollbacks): checked on every transition, in order
_HISTORY_INVARIANTS = tuple(i for i in PIPELINE_INVARIANTS if i not in _PRESENT_INVARIANTS)


def _stale_token(m: PipelinesModel, current: int | None) -> int | None:
    """A token issued before that is not the current claim's (the last one issued, or the
    one before it): what a claimer presumed dead would still hold."""
    issued = m._ids["token"]
    for token in (issued, issued - 1):
        if token >= 1 and token != current:
            return token
    return None


def _trigger(w: PipelinesWorld) -> None:
    w.model.trigger(w.bounds.definition, [w.triggered])
    w.triggered += 1


def _keyed_trigger(window_us: int | None, commit: bool) -> Callable[[PipelinesWorld], object]:
    def apply(w: PipelinesWorld) -> None:
        w.model.trigger_in(w.bounds.definition, [w.triggered + w.keyed], key="k", commit=commit,
                           key_window_us=window_us)
        w.keyed += 1
    return apply


def _outcome(w: PipelinesWorld, exec_id: int, kind: str | None) -> Any:
    if kind is not None:
        w.faults += 1
        return _FAULTS[kind]
    return success(w.bounds.outputs[w.model.steps[w.model.executions[exec_id].step_id].node])


def _run(exec_id: int, kind: str | None) -> Callable[[PipelinesWorld], object]:
    return lambda w: w.model.run_execution(exec_id, _outcome(w, exec_id, kind))


def _group(exec_ids: tuple[int, ...]) -> Callable[[PipelinesWorld], object]:
    return lambda w: w.model.advance_on_successes([(e, _outcome(w, e, None)) for e in exec_ids])


def _advancer(branch_id: str, how: str) -> Callable[[PipelinesWorld], object]:
    def apply(w: PipelinesWorld) -> None:
        w.faults += 1
        if how == "crash":
            w.model.advancer_crash(branch_id)
        else:
            w.model.advancer_error(branch_id, transition_error=how == "transition")
    return apply


def _advance_with(branch_id: str, token: int | None) -> Callable[[PipelinesWorld], object]:
    return lambda w: w.model.advance(branch_id, token)


def _resume(run_id: str) -> Callable[[PipelinesWorld], object]:
    return lambda w: w.model.resume(run_id, NO_INPUT)


def _refused(operation: str, target: str) -> Callable[[PipelinesWorld], object]:
    """A recovery operation the model must refuse here (``PreconditionError``, nothing
    changed: the explorer checks the self-loop) on a run or, for ``reap_hook``, a hook;
    no bound is spent on it."""
    def apply(w: PipelinesWorld) -> object:
        if operation == "revive":
            return w.model.revive(target)
        if operation == "resume":
            return w.model.resume(target, NO_INPUT)
        if operation == "reap_hook":
            return w.model.reap_hook(target)
        return w.model.context_set(target, "k", 0)
    return apply


def _set_model_clock(at: int) -> Callable[[PipelinesWorld], object]:
    return lambda w: w.model.set_clock(at)


def _claim_hook(hook_id: str) -> Callable[[PipelinesWorld], object]:
    return lambda w: w.model.claim_hook(hook_id)


def _batch(branch_ids: tuple[str, ...]) -> Callable[[PipelinesWorld], object]:
    return lambda w: w.model.advance_batch(w.model.claim_branches(branch_ids))


def _context(run_id: str, overwrite: bool) -> Callable[[PipelinesWorld], object]:
    def apply(w: PipelinesWorld) -> None:
        w.context_writes += 1
        w.model.context_set(run_id, "k", w.context_writes, overwrite)
    return apply


def _prune(w: PipelinesWorld) -> None:
    w.prunes += 1
    w.model.prune(w.model.now_us + 1, None, sorted(w.model.live_runs()))


def _revive(run_id: str) -> Callable[[PipelinesWorld], object]:
    def apply(w: PipelinesWorld) -> None:
        w.revives += 1
        w.model.revive(run_id)
    return apply


def _hook_run(hook_id: str, token: int | None, outcome: Any, fault: bool) -> Callable[[PipelinesWorld], object]:
    def apply(w: PipelinesWorld) -> None:
        w.faults += fault
        w.model.run_hook(hook_id, token if token is not None else -1, outcome)
    return apply


def _hook_reap(hook_id: str) -> Callable[[PipelinesWorld], object]:
    def apply(w: PipelinesWorld) -> None:
        w.faults += 1
        w.model.reap_hook(hook_id)
    return apply


# =========================================================================== configurations


def _node(klass: str) -> dict[str, Any]:
    return {"klass": f"explore:{klass}", "delay_us": 0}


def _definition(start: str, nodes: Iterable[str], edges: dict[str, Any], on_halt: bool = False) -> dict[str, Any]:
    snapshot: dict[str, Any] = {"format": 1, "start": start, "nodes": {n: _node(n) for n in nodes}, "edges": edges}
    if on_halt:
        snapshot["on_halt"] = _HOOK
    return snapshot


#: chain, divert, converge and a leaf: A -chain-> B -divert{"a": C, otherwise: D}; C -converge-> D
CHAIN = _definition("A", "ABCD", {
    "A": {"type": "chain", "to": ["B"]},
    "B": {"type": "divert", "to": {"a": "C", "otherwise": "D"}},
    "C": {"type": "converge", "to": ["D"]},
})
#: divide and combine: A -divide-> [B, C]; B, C -combine(barrier A)-> D
DIVIDE = _definition("A", "ABCD", {
    "A": {"type": "divide", "to": ["B", "C"]},
    "B": {"type": "combine", "to": ["D"], "barrier": ["A"]},
    "C": {"type": "combine", "to": ["D"], "barrier": ["A"]},
})
#: expand and collapse, then dampen: A -expand-> B (×2); B -collapse(barrier A)-> C -dampen-> D
EXPAND = _definition("A", "ABCD", {
    "A": {"type": "expand", "to": ["B"]},
    "B": {"type": "collapse", "to": ["C"], "barrier": ["A"]},
    "C": {"type": "dampen", "to": ["D"]},
})
#: a run that halts: A -chain-> B, with an on_halt hook
HALTING = _definition("A", "AB", {"A": {"type": "chain", "to": ["B"]}}, on_halt=True)
CHAIN_AB = _definition("A", "AB", {"A": {"type": "chain", "to": ["B"]}})

_OUTPUTS = {"A": [1, 2], "B": "a", "C": 3, "D": 4}
_SMALL = PipelineConfig(max_retry=1, max_crash=1, retry_delay_us=1_000_000, crash_delay_us=1_000_000,
                        expand_batch=1, advancer_max_retry=1, advancer_max_crash=1)
#: a: a token every 0.5 s, one at most; b: 3 per 2 s (a token every 666 666⅔ µs: not a whole number of
#: µs), two at most, so its next-token instants fall between microseconds
#: an expand parked between batches while its children arrive: 3 items in batches of 1, and an
#: advancer crash budget of 2, so an expand whose advancer crashed between batches resumes at its cursor
_PARKED = {"outputs": {**_OUTPUTS, "A": [1, 2, 3]}, "config": replace(_SMALL, advancer_max_crash=2)}
_LIMITS = {"a": {"concurrency": 1, "rate": {"limit": 2, "per": 1, "burst": 1}},
           "b": {"concurrency": 2, "rate": {"limit": 3, "per": 2, "burst": 2}}}
#: the restart: b keeps its period with a lower burst (its bucket is clamped at its next refill)
_LOWERED = {"a": {"concurrency": 1, "rate": {"limit": 2, "per": 1, "burst": 1}},
            "b": {"concurrency": 1, "rate": {"limit": 3, "per": 2, "burst": 1}}}


#: a key family p: each partition 1 at a time and a token every 0.5 s (one at most), the family 1
#: at a time over all its partitions; two partitions, one of a hostile value (quote, bracket, accent)
_FAMILY = {"p": {"per_partition": {"concurrency": 1, "rate": {"limit": 2, "per": 1, "burst": 1}}, "concurrency": 1}}
_PARTITIONS = (partition_key("p", "x"), partition_key("p", "'\"]é"))


def _limits(name: str, description: str, **bounds: Any) -> Config:
    fixed = LimitsBounds(**{"limits": _LIMITS, "restart_to": _LOWERED, "keys": ("a", "b"), "jobs": 3, "workers": 2,
                            "crashes": 1, "reaps": 1, "restarts": 0, "delays": (0,), "tick_us": 500_000,
                            "horizon_us": 1_000_000, "batch": 0, "arrive_until_us": 0, **bounds})
    return Config(name, lambda cls: LimitsWorld.start(fixed, cls), "limits", description)


def _pipelines(name: str, description: str, **bounds: Any) -> Config:
    fixed = PipelinesBounds(**{"outputs": _OUTPUTS, "config": _SMALL, **bounds})
    return Config(name, lambda cls: PipelinesWorld.start(fixed, cls), "pipelines", description)


CONFIGS: dict[str, Config] = {c.name: c for c in (
    _limits("limits", "keys a (concurrency 1, 2/s burst 1) and b (concurrency 2, 3/2s burst 2); 3 jobs "
            "arriving at 0, 2 workers, 1 crash, 1 reap; clock 0..1 s in 0.5 s steps and to each stamp (and 1 µs "
            "before)"),
    _limits("limits-batch", "as limits with batch claims and hand-offs of up to 2, no crash", crashes=0, batch=2),
    _limits("limits-fifo", "3 jobs on b and the unkeyed lane, eligible at once or 0.5 s later; a restart "
            "lowering b's burst; 1 worker, no crash or reap", keys=("b", None), delays=(0, 500_000), workers=1,
            crashes=0, reaps=0, restarts=1),
    _limits("limits-partitioned", "family p (each partition: concurrency 1, 2/s burst 1; the family: concurrency "
            "1) with partitions p[\"x\"] and a hostile one; 3 jobs arriving until 0.5 s, 2 workers, hand-offs of 1, "
            "a forget (of a busy partition: refused), no crash; clock 0..1 s", limits=_FAMILY, restart_to=None,
            keys=_PARTITIONS, crashes=0, reaps=0, forgets=1, batch=1, arrive_until_us=500_000),
    _pipelines("chain", "A -chain-> B -divert-> C -converge-> D: 1 run, 3 faults (failure, crash, invalid, "
               "advancer error or crash), stale tokens, group commits", definition=CHAIN, faults=3),
    _pipelines("divide", "A -divide-> [B, C] -combine-> D: 1 run, 2 faults", definition=DIVIDE),
    _pipelines("expand", "A -expand(×2, batch 1)-> B -collapse-> C -dampen-> D, resume: 1 run, 2 faults",
               definition=EXPAND),
    _pipelines("expand-parked", "A -expand(×3, batch 1)-> B -collapse-> C -dampen-> D: children run and arrive "
               "while the expand is parked between batches; 1 advancer fault (error or crash; advancer_max_crash "
               "2, so a crashed expand resumes at its cursor)", definition=EXPAND, faults=1, fault_kinds=(),
               **_PARKED),
    _pipelines("hooks", "A -chain-> B with on_halt: 1 run, 3 faults; hook claims, records, reaps and stale "
               "records", definition=HALTING, faults=3, fault_kinds=("failure", "invalid"), advancer_faults=False,
               hooks=True),
    _pipelines("revive", "A -chain-> B: 1 run, 1 fault; two context writes, a prune asked about every run, "
               "two revives", definition=HALTING, faults=1, fault_kinds=("invalid",), advancer_faults=False,
               context_writes=2, prunes=1, revives=2),
    _pipelines("two-runs", "A -chain-> B with on_halt: 2 runs interleaved, 1 fault, group commits and "
               "advancer batches across runs, hooks, a prune", definition=HALTING, runs=2, faults=1, prunes=1,
               hooks=True),
    _pipelines("triggers", "A -chain-> B: an unkeyed run and 2 triggers with key 'k' (each plain, with a 1 s "
               "window or rolled back), 1 failure, the clock to each window's end", definition=CHAIN_AB, faults=1,
               fault_kinds=("failure",), advancer_faults=False, batches=False, keyed_triggers=2,
               key_window_us=1_000_000),
)}

DEEP_CONFIGS: dict[str, Config] = {c.name: c for c in (
    # (a 1.5 s horizon: more than 250 000 states with 2 workers and 1 reap, not finished in 2.5 min)
    _limits("limits", "as in CI with 3 workers, 2 reaps and a 1.25 s horizon (stamps past 1 s)", workers=3, reaps=2,
            horizon_us=1_250_000),
    _limits("limits-batch", "as in CI with 4 jobs, batches of 3 and a crash", jobs=4, batch=3, crashes=1),
    _limits("limits-fifo", "as in CI with key a too and jobs arriving at any instant", keys=("a", "b", None),
            delays=(0, 500_000), workers=1, crashes=0, reaps=0, restarts=1, arrive_until_us=None),
    # (with the unkeyed lane too and jobs arriving at any instant: not finished in 15 min under load)
    _limits("limits-partitioned", "as in CI with a crash and a reap", limits=_FAMILY, restart_to=None,
            keys=_PARTITIONS, crashes=1, reaps=1, forgets=1, batch=1, arrive_until_us=500_000),
    _pipelines("chain", "as in CI with 4 faults, timeouts too", definition=CHAIN, faults=4,
               fault_kinds=("failure", "timed_out", "crash", "invalid")),
    _pipelines("divide", "as in CI with 3 faults", definition=DIVIDE, faults=3),
    _pipelines("expand", "as in CI with 3 faults", definition=EXPAND, faults=3),
    _pipelines("expand-parked", "as in CI with 2 faults, a step's crash too", definition=EXPAND, faults=2,
               fault_kinds=("crash",), **_PARKED),
    _pipelines("hooks", "as in CI with 5 faults and advancer faults", definition=HALTING, faults=5,
               fault_kinds=("failure", "invalid"), hooks=True),
    # (2 faults with hooks: more than 420 000 states, not finished in 7.5 min)
    _pipelines("revive", "as in CI with a failure too (1 fault: failure or invalid) and the revived run's hooks",
               definition=HALTING, faults=1, fault_kinds=("failure", "invalid"), advancer_faults=False,
               context_writes=2, prunes=1, revives=2, hooks=True),
    # (2 faults with advancer faults too: more than 230 000 states at depth 12 after 2 min)
    _pipelines("two-runs", "as in CI with 2 faults (failure, crash, invalid, a hook's), no advancer fault",
               definition=HALTING, runs=2, faults=2, advancer_faults=False, prunes=1, hooks=True),
    _pipelines("triggers", "as in CI with 3 keyed triggers", definition=CHAIN_AB, faults=1,
               fault_kinds=("failure",), advancer_faults=False, batches=False, keyed_triggers=3,
               key_window_us=1_000_000),
)}

#: the configuration in which each model mutant is hunted
MUTANT_CONFIGS = {
    "refill_without_clamp": "limits", "no_concurrency_check": "limits", "spend_skipped": "limits",
    "stamp_off_by_one": "limits", "fifo_by_creation_only": "limits-fifo",
    "family_ceiling_ignored": "limits-partitioned", "forget_refills": "limits-partitioned",
    "fan_in_fires_on_every_arrival": "divide", "stale_token_accepted": "chain", "expand_cursor_lost": "expand",
    "fan_in_fires_on_created": "expand-parked",
    "crash_budget_off_by_one": "chain", "invalid_retried": "chain", "context_overwrite_allowed": "revive",
    "hook_fence_dropped": "hooks", "hook_not_owed": "hooks", "prune_live_run": "revive", "revive_twice": "revive",
    "revive_reruns_everything": "revive",
    "trigger_key_ignored": "triggers", "key_window_ignores_finish": "triggers", "rollback_keeps_trigger": "triggers",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.explore", description=__doc__.splitlines()[0])
    parser.add_argument("--deep", action="store_true", help="the nightly bounds (DEEP_CONFIGS)")
    parser.add_argument("--mutants", action="store_true", help="hunt each model mutant instead")
    parser.add_argument("--only", action="append", help="a configuration (or mutant) name; repeatable")
    parser.add_argument("--max-states", type=int, help="stop each exploration there (then it is not exhaustive)")
    parser.add_argument("--progress", action="store_true", help="print the counts every 10 000 states")
    args = parser.parse_args(argv)
    configs = DEEP_CONFIGS if args.deep else CONFIGS
    failed = False
    if args.mutants:
        from model.mutants import MUTANTS

        for mutant in MUTANTS:
            if args.only and mutant.name not in args.only:
                continue
            report = explore(configs[MUTANT_CONFIGS[mutant.name]], mutant.model_class)
            caught = report.violation is not None
            failed |= not caught
            print(f"mutant {mutant.name} in {report.name}: {report.states} states, {report.seconds:.1f} s: "
                  + (f"counterexample of {len(report.violation.trace)} operations: {report.violation}"
                     if report.violation else "NOT CAUGHT"), flush=True)
        return int(failed)
    for name, config in configs.items():
        if args.only and name not in args.only:
            continue
        report = explore(config, None, args.max_states,
                         (lambda r: print(f"  ... {r.line()}", file=sys.stderr, flush=True)) if args.progress else None)
        failed |= report.violation is not None or not report.complete
        print(report.line(), flush=True)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())  # pragma: no cover  run only as `python -m model.explore`; main() is tested
