"""Pipelines: the executable specification of semantics §1–§4.

Example::

    m = PipelinesModel()
    run = m.trigger(snapshot, [42])                  # snapshot: semantics §1 JSON
    m.run_execution(m.runnable_executions()[0], success([1, 2]))
    m.advance(m.advanceable_branches()[0])           # one fenced transaction

Runs, branches, steps (each holding its job: input, output) and executions (one per attempt),
driven one atomic operation at a time by the caller, so hypothesis can
interleave them: ``trigger`` (idempotent per pipeline and trigger key),
``trigger_in`` (inside the caller's transaction, committed or rolled back),
``run_execution``, ``claim_branch``, ``advance``,
``advance_on_successes`` (a worker's successes, one or a group, advancing their
branches in their own transaction), ``claim_branches`` and
``advance_batch`` (an advancer's batch; each defined as the single operations one by
one, and ``advance`` of a simple transition is the batch's one move), ``advancer_error``,
``advancer_crash``, ``resume``, ``revive``, ``context_set``, ``prune`` (retention:
deletes final runs whole) and ``advance_clock``; and the ``on_halt`` hook a halted run
owes (``claim_hook``, ``run_hook``, ``reap_hook``).
``drive(oracle)`` and the module-level ``run_to_quiescence`` run everything to
quiescence deterministically and ``summary`` gives the comparable result.

The model is time-aware: it keeps a clock in integer µs (``now_us``) that only
``advance_clock``/``set_clock`` move; delays, retry back-off and crash back-off
make executions eligible later (``runnable_executions`` lists only eligible ones).

Every step records the step(s) it came from (``Step.predecessors``) and every
fenced transaction is logged (``commits``), so ``model/invariants.py`` can
re-derive the expected successors from the snapshot alone [INV-ADV-1].
Nothing here imports ``ductwork``.

PYTEST_DONT_REWRITE: this module's assertion messages (``[INV-…]`` and what failed)
are its output, compared exactly by its tests and quoted by ``ductwork verify``;
pytest would rewrite the asserts of the distribution its plugins come from,
which ships this module (as ``ductwork_model``).
"""

from __future__ import annotations

import copy
import json
import math
import pickle
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import CommitFailed, DefinitionError, OverwriteError, PreconditionError, StaleClaim

__all__ = [
    "CRASH",
    "EDGE_TYPES",
    "FAILURE",
    "FAN_IN",
    "FAN_OUT",
    "INLINE_EDGES",
    "INVALID",
    "NO_INPUT",
    "TIMED_OUT",
    "Branch",
    "Definition",
    "Execution",
    "HaltHook",
    "Outcome",
    "PipelineConfig",
    "PipelinesModel",
    "Prune",
    "Run",
    "RunSummary",
    "Step",
    "Trigger",
    "canonical_json",
    "is_json_value",
    "job_halt_reason",
    "render_key",
    "resolve_run_status",
    "run_and_model",
    "run_to_quiescence",
    "success",
]

EDGE_TYPES = ("chain", "expand", "divide", "combine", "collapse", "divert", "converge", "dampen")
FAN_OUT = ("divide", "expand")
FAN_IN = ("combine", "collapse")
FINAL_RUN_STATES = ("completed", "halted")
#: edges a success advances past inside its own transaction (and a leaf, no edge)
INLINE_EDGES = ("chain", "converge", "divert", "dampen")


class _NoInput:
    def __repr__(self) -> str:
        return "NO_INPUT"


#: ``resume(run_id)`` without ``input``: dampened branches continue with their own output.
NO_INPUT: Any = _NoInput()

# --------------------------------------------------------------------------- values


def canonical_json(value: Any) -> str:
    """A stable text form of a JSON value (sorted keys), for ordering and hashing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def is_json_value(value: Any) -> bool:
    """True when ``value`` serialises to JSON (finite floats, string keys, no tuples).

    The model's reading of "JSON-serialisable" (semantics §4): the value must
    survive ``json.loads(json.dumps(value))`` unchanged, so tuples, non-string
    keys and NaN/∞ are rejected rather than silently converted.
    """
    if value is None or isinstance(value, (bool, str, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if type(value) is list:
        return all(is_json_value(item) for item in value)
    if type(value) is dict:
        return all(isinstance(k, str) and is_json_value(v) for k, v in value.items())
    return False


def render_key(value: Any) -> str | None:
    """Render a step output as a divert key the way Ruby's ``to_s`` does (semantics §3.4).

    ``str`` → itself, ``True``/``False`` → ``"true"``/``"false"``, ``None`` →
    ``""``, ``int`` → decimal digits, ``float`` → ``repr`` (``1.0`` → ``"1.0"``);
    anything else renders to ``None``, which matches no key (→ ``otherwise``).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return None


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Outcome:
    """What one execution ended with: ``success`` (with ``value``), ``failure``,
    ``timed_out``, ``invalid`` (the step can never run as stored: its class does not
    resolve or its input does not bind) or ``process_crashed``."""

    kind: str
    value: Any = None

    def __post_init__(self) -> None:
        if self.kind not in ("success", "failure", "timed_out", "invalid", "process_crashed"):
            raise PreconditionError(f"unknown outcome kind {self.kind!r}")


def job_halt_reason(outcome: str | None, return_rejected: bool = False) -> str:
    """The halt reason of a branch whose step failed, from its last execution: its outcome,
    and for an ``invalid`` one whether the step's return value was rejected."""
    if outcome == "process_crashed":
        return "job_crashes_exhausted"
    if outcome == "invalid":
        return "step_return_invalid" if return_rejected else "job_invalid"
    return "job_retries_exhausted"


def success(value: Any) -> Outcome:
    """``success(v)``: the step returned ``v``."""
    return Outcome("success", value)


FAILURE = Outcome("failure")
TIMED_OUT = Outcome("timed_out")
INVALID = Outcome("invalid")
CRASH = Outcome("process_crashed")

# --------------------------------------------------------------------------- definitions


@dataclass(frozen=True)
class Definition:
    """A validated snapshot format 1 (semantics §1): ``start``, ``nodes`` and ``edges``."""

    snapshot: Mapping[str, Any]

    @classmethod
    def parse(cls, snapshot: Mapping[str, Any]) -> Definition:
        """Validate ``snapshot``; raise ``DefinitionError`` naming the first problem."""
        if not isinstance(snapshot, Mapping) or snapshot.get("format") != 1:
            raise DefinitionError("snapshot must be a mapping with format 1")
        nodes, edges = snapshot.get("nodes"), snapshot.get("edges", {})
        if not isinstance(nodes, Mapping) or snapshot.get("start") not in nodes:
            raise DefinitionError(f"start {snapshot.get('start')!r} is not a node")
        for name, options in nodes.items():
            if not isinstance(options, Mapping) or not {"klass", "delay_us"} <= set(options):
                raise DefinitionError(f"node {name!r} lacks klass/delay_us")
        for name, edge in edges.items():
            if name not in nodes or edge.get("type") not in EDGE_TYPES:
                raise DefinitionError(f"edge from {name!r}: unknown node or type {edge.get('type')!r}")
            targets = list(edge["to"].values()) if edge["type"] == "divert" else list(edge["to"])
            if edge["type"] == "divert" and "otherwise" not in edge["to"]:
                raise DefinitionError(f"divert from {name!r} lacks 'otherwise'")
            if any(target not in nodes for target in targets):
                raise DefinitionError(f"edge from {name!r} targets an unknown node")
            if edge["type"] in FAN_IN and not isinstance(edge.get("barrier"), list):
                raise DefinitionError(f"{edge['type']} from {name!r} lacks barrier")
        on_halt = snapshot.get("on_halt")
        if on_halt is not None and not (isinstance(on_halt, str) and on_halt):
            raise DefinitionError(f"on_halt must be a class name, got {on_halt!r}")
        return cls(copy.deepcopy(dict(snapshot)))

    @property
    def start(self) -> str:
        start: str = self.snapshot["start"]
        return start

    def edge(self, node: str) -> Mapping[str, Any] | None:
        """The edge out of ``node``; ``None`` (or an empty ``to``) is a leaf."""
        edge = self.snapshot.get("edges", {}).get(node)
        return edge if edge and edge["to"] else None

    def delay_us(self, node: str) -> int:
        return self.snapshot["nodes"][node].get("delay_us") or 0

    def limit_by(self, node: str) -> str | None:
        key: str | None = self.snapshot["nodes"][node].get("limit_by")
        return key

    @property
    def on_halt(self) -> str | None:
        """The handler class a halted run of this definition owes a hook to; None: no hook."""
        klass: str | None = self.snapshot.get("on_halt")
        return klass

    @property
    def pipeline(self) -> str:
        """The pipeline's name: the scope of a trigger key (``""`` when the snapshot has none)."""
        name: str = self.snapshot.get("pipeline") or ""
        return name


@dataclass(frozen=True)
class PipelineConfig:
    """Budgets and constants (semantics §3–§4; names follow ``ductwork.yml``).

    ``max_retry = 3`` means at most 4 executions of a step end in failure or
    timeout; ``max_crash = 10`` at most 11 in ``process_crashed``.
    ``advancer_max_retry = 3`` would mean the 4th routing error on one step
    halts (default 10: the Ruby engine's code default; its template says 3).
    ``advancer_max_crash = 10``: after 10 advancer crashes on one step the next
    ``advance`` halts. ``0`` is a value, not "unset".
    """

    max_retry: int = 3
    max_crash: int = 10
    retry_delay_us: int = 10_000_000
    crash_delay_us: int = 10_000_000
    expand_batch: int = 1000
    advancer_max_retry: int = 10
    advancer_max_crash: int = 10


# --------------------------------------------------------------------------- records


@dataclass
class Execution:
    """One attempt at a step. ``state``: pending | completed (a run is atomic here)."""

    id: int
    step_id: str
    retry_count: int
    crash_count: int
    eligible_at_us: int
    state: str = "pending"
    outcome: str | None = None
    error: str | None = None
    completed_at_us: int | None = None
    #: the step's idempotency key (its id, or for a step a revive re-enqueued the key of the
    #: failed step it re-runs) [INV-EXE-3]
    key: str = ""

    @property
    def idempotency_key(self) -> str:
        """Equal across a step's executions, distinct across steps except along a revive
        chain (:meth:`PipelinesModel.revive`) [INV-EXE-3]."""
        return self.key or self.step_id

    @property
    def return_rejected(self) -> bool:
        """An ``invalid`` execution because the return value cannot be stored: it would
        recur, so it is never retried and its branch halts ``step_return_invalid`` (semantics §4)."""
        return self.outcome == "invalid" and (self.error or "").startswith("StepReturnError")


@dataclass
class HaltHook:
    """The ``on_halt`` hook a halted run owes: one per halted run [INV-HLT-1], created by
    the transaction that halts the run, then claimed and run like an execution.

    ``status``: pending | running | succeeded | failed (``succeeded`` and ``failed`` are
    final: the recorded outcome). ``claim_token`` is the fence of the current claim
    (None unless running); ``attempts`` the outcome of every attempt, in order;
    ``completed_at_us`` of each attempt in ``attempt_times``. The idempotency key the
    handler sees is the hook's id: equal across its attempts, distinct across runs.
    """

    id: str
    run_id: str
    klass: str
    eligible_at_us: int
    status: str = "pending"
    retry_count: int = 0
    crash_count: int = 0
    claim_token: int | None = None
    attempts: list[str] = field(default_factory=list)
    attempt_times: list[int] = field(default_factory=list)

    @property
    def idempotency_key(self) -> str:
        return self.id


@dataclass
class Step:
    """One visit of a node on a branch, holding its job (``input``, ``output``); its
    attempts are the list ``executions``.

    ``status``: in_progress | advancing | failed | completed. ``origin`` is the
    transition kind that created it (``trigger`` and ``resume`` included) and
    ``predecessors`` the step(s) it came from (all arrived siblings for a fan-in).
    """

    id: str
    run_id: str
    branch_id: str
    node: str
    input: list[Any]
    origin: str
    predecessors: tuple[str, ...]
    status: str = "in_progress"
    output: Any = None
    executions: list[int] = field(default_factory=list)
    #: set when an advancer halt completed this step (transition_invalid, advancer_*)
    halted_by_advancer: bool = False
    #: the step of the halted run this one was carried over from by a revive (history: it
    #: has no executions here); None otherwise
    copied_from: str | None = None
    #: the failed step of the halted run this one re-runs (a revive re-enqueued it); None otherwise
    revives: str | None = None
    #: the idempotency key its executions get: its id, or the key of the step it ``revives``
    key: str = ""


@dataclass
class Branch:
    """One thread of execution (semantics §2).

    ``barrier``/``fanout_index``: the fan-out that created it (inherited from the
    closed barrier for a fan-in target). A branch that fans out records
    ``fanout_step`` (its fan-out step), ``fanout_width`` and
    ``fanin_arrivals``; ``arrived`` maps fanout_index → arrived sibling.
    ``expand_cursor`` counts children created so far by a batched expand.
    ``merge_of`` names the barrier whose fan-in created this branch.
    """

    id: str
    run_id: str
    barrier: str | None
    fanout_index: int | None
    status: str = "in_progress"
    claim_token: int | None = None
    halt_reason: str | None = None
    steps: list[str] = field(default_factory=list)
    fanout_step: str | None = None
    fanout_width: int | None = None
    fanin_arrivals: int = 0
    arrived: dict[int, str] = field(default_factory=dict)
    expand_cursor: int | None = None
    merge_of: str | None = None
    advancer_errors: int = 0
    advancer_crashes: int = 0
    #: the branch of the halted run this one was carried over from by a revive; None otherwise
    copied_from: str | None = None

    @property
    def latest_step(self) -> str:
        return self.steps[-1]


@dataclass
class Run:
    """A triggered pipeline: its frozen definition, branches and run-scoped context."""

    id: str
    definition: Definition
    args: list[Any]
    status: str = "in_progress"
    status_history: list[str] = field(default_factory=lambda: ["in_progress"])
    branches: list[str] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)
    #: model time at which it became completed or halted; None while live
    finished_at_us: int | None = None
    #: deleted by ``prune``: its records stay here, frozen, for the invariants; the
    #: engine has no row of it left [INV-PRN-2]
    pruned: bool = False
    #: the halted run this run revives; None for a triggered run
    revived_from: str | None = None
    #: the trigger key it was started with, unique per pipeline among runs not pruned
    #: (None: no key, or a revived run) [INV-TRG-1]
    trigger_key: str | None = None
    #: model time at which a windowed trigger took its key from it (it holds the key no
    #: more; the engine's row has ``trigger_key`` NULL); None while it holds it [INV-TRG-1]
    key_released_at_us: int | None = None


@dataclass(frozen=True)
class Trigger:
    """One committed ``trigger`` call: the pipeline, its key, the run it returned and
    whether it created that run (False: the key's run existed) [INV-TRG-1]."""

    pipeline: str
    key: str | None
    run_id: str
    created: bool
    #: the key's window (``key_window``), None without one
    window_us: int | None = None
    #: model time of the trigger
    at_us: int = 0


@dataclass(frozen=True)
class Commit:
    """One committed fenced transaction: which branch, with which token, what it did."""

    branch_id: str
    token: int
    action: str
    created_steps: tuple[str, ...]


@dataclass(frozen=True)
class ContextWrite:
    """One ``context_set`` attempt and whether it was accepted [INV-CTX-1]."""

    run_id: str
    key: str
    overwrite: bool
    existed: bool
    accepted: bool


@dataclass(frozen=True)
class Prune:
    """One ``prune`` transaction: its cutoff, the runs it was asked about, and for each the
    status and finish time it had when the prune decided (the engine's lock re-read)."""

    cutoff_us: int
    considered: tuple[tuple[str, str, int | None, bool], ...]
    pruned: tuple[str, ...]
    #: digest of each pruned run's records when it was pruned (nothing may change them after)
    digests: tuple[tuple[str, bytes], ...]


def resolve_run_status(branch_statuses: Sequence[str]) -> str:
    """Semantics §3 run resolution over the run's branch statuses."""
    if any(status in ("in_progress", "advancing") for status in branch_statuses):
        return "in_progress"
    if "dampened" in branch_statuses:
        return "dampened"
    if "halted" in branch_statuses:
        return "halted"
    return "completed"


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class RunSummary:
    """A run's end state in engine-independent terms (no ids), for engine-vs-model equality.

    * ``status``: the run status;
    * ``steps``: multiset of ``(node, step status)``;
    * ``branches``: multiset of ``(latest node, branch status, halt_reason or None)``;
    * ``halt_reasons``: multiset of ``(latest node, halt_reason)`` of halted branches;
    * ``fan_in_inputs``: fan-in target node → the input lists of its steps
      (``[[sibling outputs by fanout_index]]``), sorted by canonical JSON.
    """

    status: str
    steps: Counter[tuple[str, str]]
    branches: Counter[tuple[str, str, str | None]]
    halt_reasons: Counter[tuple[str, str | None]]
    fan_in_inputs: dict[str, list[list[Any]]]

    def as_json(self) -> dict[str, Any]:
        """The same, as sorted JSON-friendly lists (for messages and files)."""

        def rows(counter: Counter[Any]) -> list[list[Any]]:
            return sorted(([*key, n] for key, n in counter.items()), key=canonical_json)

        return {"status": self.status, "steps": rows(self.steps), "branches": rows(self.branches),
                "halt_reasons": rows(self.halt_reasons), "fan_in_inputs": self.fan_in_inputs}


# --------------------------------------------------------------------------- the model

Oracle = Callable[[str, list[Any], int], Outcome]
#: ``hook_oracle(run_id, attempt) -> Outcome``: how an on_halt hook's attempt ends
HookOracle = Callable[[str, int], Outcome]


@dataclass
class PipelinesModel:
    """Runs, branches, steps and executions under semantics §2–§4.

    Example::

        m = PipelinesModel(PipelineConfig(max_retry=0))
        run_id = m.trigger(snapshot, ["2024-01-01"])
        m.drive(oracle); m.summary(run_id).status   # -> "completed"

    Every operation is one atomic transaction; a refused one (``StaleClaim``,
    ``CommitFailed``, ``OverwriteError``, ``PreconditionError``) changes nothing.
    Not modelled: the limits of an execution's ``limit_by`` key (that is
    ``LimitsModel``), timeouts as wall time (``timed_out`` is an outcome the
    caller chooses), advancer *processes* (``advancer_crash`` stands for one
    reaped while it held the claim).
    """

    config: PipelineConfig = field(default_factory=PipelineConfig)
    now_us: int = 0
    runs: dict[str, Run] = field(default_factory=dict)
    branches: dict[str, Branch] = field(default_factory=dict)
    steps: dict[str, Step] = field(default_factory=dict)
    executions: dict[int, Execution] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)
    #: ``(kind, branch_id, token)`` for every claim, commit and release, in order [INV-ADV-2]
    fence_log: list[tuple[str, str, int]] = field(default_factory=list)
    outcomes: list[tuple[int, str]] = field(default_factory=list)
    context_writes: list[ContextWrite] = field(default_factory=list)
    #: the on_halt hooks owed, by id [INV-HLT-1]
    hooks: dict[str, HaltHook] = field(default_factory=dict)
    #: ``(hook_id, final status)`` each time a hook's final outcome was recorded [INV-HLT-1]
    hook_outcomes: list[tuple[str, str]] = field(default_factory=list)
    #: ``(kind, hook_id, token)`` for every hook claim and fenced record [INV-HLT-1]
    hook_log: list[tuple[str, str, int]] = field(default_factory=list)
    prunes: list[Prune] = field(default_factory=list)
    #: ``(halted run, run returned)`` for every accepted ``revive`` call, in order [INV-REV-1]
    revivals: list[tuple[str, str]] = field(default_factory=list)
    #: every committed trigger, in order [INV-TRG-1]
    triggers: list[Trigger] = field(default_factory=list)
    #: ``(snapshot before, snapshot after)`` of every trigger its caller rolled back [INV-TRG-2]
    rollbacks: list[tuple[bytes, bytes]] = field(default_factory=list)
    _ids: Counter[str] = field(default_factory=Counter)

    # ----------------------------------------------------------------- clock

    def advance_clock(self, delta_us: int) -> None:
        """Move the model clock forward by ``delta_us >= 0`` µs."""
        if delta_us < 0:
            raise PreconditionError("the model clock only moves forward")
        self.now_us += delta_us

    def set_clock(self, now_us: int) -> None:
        """Set the clock to ``now_us`` (not earlier than now)."""
        self.advance_clock(now_us - self.now_us)

    # ----------------------------------------------------------------- queries

    def runnable_executions(self) -> list[int]:
        """Pending executions with ``eligible_at <= now``, by ``(eligible_at, id)``."""
        return [e.id for e in self._pending() if e.eligible_at_us <= self.now_us]

    def pending_executions(self) -> list[int]:
        """Every pending execution (eligible or not), by ``(eligible_at, id)``."""
        return [e.id for e in self._pending()]

    def claimable_branches(self) -> list[str]:
        """Branches an advancer may claim: in_progress, unclaimed, latest step advancing or failed."""
        return [b.id for b in self.branches.values()
                if b.status == "in_progress" and b.claim_token is None
                and self.steps[b.latest_step].status in ("advancing", "failed")]

    def advanceable_branches(self) -> list[str]:
        """Branches where ``advance`` makes progress: claimable ones plus held mid-expand ones."""
        held = [b.id for b in self.branches.values() if b.status == "advancing"]
        return sorted(self.claimable_branches() + held, key=self._id_order)

    def is_quiescent(self) -> bool:
        """Nothing pending (now or later), nothing to advance and no hook owed: only resume
        can change the state."""
        return not self.pending_executions() and not self.advanceable_branches() and not self.open_hooks()

    def runnable_hooks(self) -> list[str]:
        """Pending hooks with ``eligible_at <= now``, by ``(eligible_at, id)``."""
        return [h.id for h in self._pending_hooks() if h.eligible_at_us <= self.now_us]

    def open_hooks(self) -> list[str]:
        """Hooks whose outcome is not recorded yet (pending or running)."""
        return [h.id for h in self.hooks.values() if h.status in ("pending", "running")]

    def hook_of(self, run_id: str) -> HaltHook | None:
        """The hook the run owes (or owed), if any."""
        return next((h for h in self.hooks.values() if h.run_id == run_id), None)

    def hook_summary(self, run_id: str) -> dict[str, Any] | None:
        """The run's hook in engine-independent terms: its status, counters and the outcome
        of each attempt (None: the run owes no hook)."""
        hook = self.hook_of(run_id)
        if hook is None:
            return None
        return {"klass": hook.klass, "status": hook.status, "retry_count": hook.retry_count,
                "crash_count": hook.crash_count, "attempts": list(hook.attempts)}

    def execution_input(self, exec_id: int) -> tuple[str, list[Any], int]:
        """``(node, input args, attempt)`` of an execution, as an oracle receives them."""
        execution = self.executions[exec_id]
        step = self.steps[execution.step_id]
        return step.node, step.input, step.executions.index(exec_id)

    def latest_outcome(self, step_id: str) -> str | None:
        """Outcome of the step's last completed execution."""
        done = [self.executions[e] for e in self.steps[step_id].executions
                if self.executions[e].state == "completed"]
        return done[-1].outcome if done else None

    # ----------------------------------------------------------------- trigger / execute

    def trigger(self, definition: Mapping[str, Any] | Definition, args: Sequence[Any] = (),
                key: str | None = None, key_window_us: int | None = None) -> str:
        """Start a run: one branch with a step for ``start`` whose input is ``args``.

        With ``key`` (a non-empty string): when a run of this pipeline holds the key (it
        was triggered with it, is not pruned and was not released), that run is returned and
        nothing is written; ``args`` are not compared [INV-TRG-1]. A pruned run no longer
        holds its key: the next trigger with it starts a new run. With ``key_window_us``
        (positive microseconds) too: a holder that finished (completed or halted) at least
        the window before now releases the key (it keeps its history) and a new run takes
        it, in the same step. A key that is not a non-empty string, a window that is not
        positive, or a window without a key raise ``PreconditionError``, changing nothing.
        """
        definition = definition if isinstance(definition, Definition) else Definition.parse(definition)
        if key is not None and not (isinstance(key, str) and key):
            raise PreconditionError(f"a trigger key must be a non-empty string, got {key!r}")
        if key_window_us is not None and (key is None or isinstance(key_window_us, bool)
                                          or not isinstance(key_window_us, int) or key_window_us <= 0):
            raise PreconditionError(f"a key window is positive microseconds with a key, got {key_window_us!r}")
        existing = None if key is None else self._keyed_run(definition.pipeline, key)
        if existing is not None and key_window_us is not None and self._key_expired(existing, key_window_us):
            self.runs[existing].key_released_at_us = self.now_us  # [INV-TRG-1] finished a window ago
            existing = None
        if existing is not None:  # [INV-TRG-1] the key's run: nothing written
            self.triggers.append(Trigger(definition.pipeline, key, existing, created=False,
                                         window_us=key_window_us, at_us=self.now_us))
            return existing
        run = Run(self._new_id("run"), definition, copy.deepcopy(list(args)), trigger_key=key)  # not the caller's
        self.runs[run.id] = run
        branch = self._new_branch(run, barrier=None, fanout_index=None)
        self._new_step(branch, definition.start, list(args), "trigger", ())
        self.triggers.append(Trigger(definition.pipeline, key, run.id, created=True,
                                     window_us=key_window_us, at_us=self.now_us))
        return run.id

    def _key_expired(self, run_id: str, window_us: int) -> bool:
        """Whether ``run_id`` finished (completed or halted) at least ``window_us`` before now."""
        run = self.runs[run_id]
        return (run.status in FINAL_RUN_STATES and run.finished_at_us is not None
                and run.finished_at_us + window_us <= self.now_us)

    def trigger_in(self, definition: Mapping[str, Any] | Definition, args: Sequence[Any] = (),
                   key: str | None = None, commit: bool = True, key_window_us: int | None = None) -> str | None:
        """A trigger written through the caller's transaction, which the caller then commits
        (``commit``) or rolls back.

        Committed, it is exactly ``trigger`` (the same run, the same key rule) and returns
        its run. Rolled back, it is a no-op: no run, branch, step or execution, the key
        still free, ``None`` returned [INV-TRG-2]. What the caller's transaction wrote
        besides is not modelled (it commits or rolls back with the run, never apart).
        """
        if commit:
            return self.trigger(definition, args, key, key_window_us)
        before = self.snapshot()
        self._rolled_back(definition, args, key)  # [INV-TRG-2] nothing of it survives
        self.rollbacks.append((before, self.snapshot()))
        return None

    def run_execution(self, exec_id: int, outcome: Outcome) -> None:
        """A worker claims ``exec_id``, runs it and records ``outcome`` in one guarded commit.

        Raises ``CommitFailed`` if the execution is already completed (its
        outcome is recorded at most once [INV-EXE-2]) and ``PreconditionError``
        if it is not eligible yet. A success whose value is not JSON, or not a
        list on an ``expand`` edge, is recorded as ``invalid`` (StepReturnError) and
        fails the step at once. Other failures and timeouts retry while ``retry_count < max_retry`` after
        ``retry_delay``; a crash retries while ``crash_count < max_crash``, at
        once for the first ``max_crash // 3`` crashes, then after
        ``(crash_count + 1) × crash_delay``; past the budget the step fails
        [INV-EXE-4]. An ``invalid`` execution fails the step at once, whatever
        budget is left: running it again could not end otherwise.
        """
        execution = self.executions.get(exec_id)
        if execution is None or execution.state != "pending":
            raise CommitFailed(f"execution {exec_id} is not open")
        if execution.eligible_at_us > self.now_us:
            raise PreconditionError(f"execution {exec_id} is not eligible until {execution.eligible_at_us}")
        step = self.steps[execution.step_id]
        definition = self.runs[step.run_id].definition
        kind, error = outcome.kind, None
        if kind == "success":
            edge = definition.edge(step.node)
            if not is_json_value(outcome.value):
                kind, error = "invalid", f"StepReturnError: {step.node} returned {type(outcome.value).__name__}"
            elif edge is not None and edge["type"] == "expand" and type(outcome.value) is not list:
                kind, error = ("invalid",
                               f"StepReturnError: {step.node} must return a list, not {type(outcome.value).__name__}")
        execution.state, execution.outcome, execution.error = "completed", kind, error
        execution.completed_at_us = self.now_us
        self.outcomes.append((exec_id, kind))  # [INV-EXE-2] recorded once, guarded above
        if kind == "success":
            step.output, step.status = copy.deepcopy(outcome.value), "advancing"
            return
        retry, crash = execution.retry_count, execution.crash_count
        if not self._may_retry(execution):  # [INV-EXE-4] budget spent, or invalid
            step.status = "failed"
        elif kind in ("failure", "timed_out"):
            self._new_execution(step, retry + 1, crash, self.now_us + self.config.retry_delay_us)
        else:
            immediate = crash + 1 <= self.config.max_crash // 3
            delay = 0 if immediate else (crash + 1) * self.config.crash_delay_us
            self._new_execution(step, retry, crash + 1, self.now_us + delay)

    # ----------------------------------------------------------------- advancement

    def claim_branch(self, branch_id: str) -> int:
        """Claim a claimable branch for advancing; returns its fresh claim token."""
        if branch_id not in self.claimable_branches():
            raise PreconditionError(f"branch {branch_id} is not claimable")
        branch = self.branches[branch_id]
        branch.status, branch.claim_token = "advancing", self._next_token()
        self.fence_log.append(("claim", branch_id, branch.claim_token))
        return branch.claim_token

    def advance(self, branch_id: str, token: int | None = None) -> Commit:
        """One fenced transaction on ``branch_id`` (semantics §3); returns what it committed.

        With ``token=None`` the branch is claimed first if claimable, or the
        current holder continues (a batched expand). A ``token`` that is not the
        branch's current one raises ``StaleClaim`` and commits nothing
        [INV-ADV-2]. A simple transition (a halt of a failed step or of a spent crash
        budget, a leaf, ``chain``, ``converge``, ``divert``, ``dampen``) is the one
        move :meth:`advance_batch` makes of each of its branches (:meth:`_move`), as
        the engine's ``Advancer.advance`` makes a lone simple move through its one move
        function (``branches.move_branches``); so this is ``advance_batch`` of the
        branch alone wherever that accepts it (:meth:`batchable`). An expand commits
        one batch of at most ``expand_batch`` children per call and keeps the claim
        until the last batch [INV-ADV-4].
        """
        branch = self.branches.get(branch_id)
        if branch is None:
            raise PreconditionError(f"no branch {branch_id}")
        if token is None:  # the holder continues, or the branch is claimed first
            token = self._claim_or_hold(branch_id)
        if not self._fence_ok(branch, token):  # [INV-ADV-2] the fence
            raise StaleClaim(f"branch {branch_id}: token {token} is not the claim token {branch.claim_token}")
        step = self.steps[branch.latest_step]
        crashed_out = branch.advancer_crashes >= self.config.advancer_max_crash
        if crashed_out or step.status == "failed" or self.advances_inline(step.id):
            return self._move(branch, token)  # a simple transition: the one move
        run = self.runs[branch.run_id]
        edge = run.definition.edge(step.node)
        assert edge is not None, "a leaf is a simple transition"
        kind = edge["type"]
        if kind == "expand" and not step.output:
            step.status = "completed"
            return self._finish(branch, token, "completed", kind, ())
        if kind == "divide":
            step.status = "completed"
            branch.fanout_step, branch.fanout_width = step.id, len(edge["to"])
            children = tuple(self._new_step(self._new_branch(run, branch.id, i), node, [step.output], kind, (step.id,))
                             for i, node in enumerate(edge["to"]))
            return self._finish(branch, token, "completed", kind, children)
        if kind == "expand":
            return self._expand_batch(run, branch, step, edge, token)
        if kind in FAN_IN:
            return self._fan_in(run, branch, step, edge, token)
        raise AssertionError(f"unknown edge type {kind!r}")  # pragma: no cover  Definition.parse rejects these

    def _move(self, branch: Branch, token: int) -> Commit:
        """A simple transition of a held branch (:meth:`batchable`), in the decision order
        of semantics §3: a spent crash budget, a failed step, then the edge (a leaf,
        ``chain``, ``converge``, ``divert``, ``dampen``). The engine's ``Move``, made by
        ``branches.move_branches``."""
        step = self.steps[branch.latest_step]
        if branch.advancer_crashes >= self.config.advancer_max_crash:
            return self._halt(branch, token, "advancer_crashes_exhausted", step_completed=True)
        if step.status == "failed":
            last = self.executions[step.executions[-1]]
            return self._halt(branch, token, job_halt_reason(last.outcome, last.return_rejected), step_completed=False)
        edge = self.runs[branch.run_id].definition.edge(step.node)
        step.status = "completed"
        if edge is None:
            return self._finish(branch, token, "completed", "leaf", ())
        kind = edge["type"]
        if kind == "dampen":
            return self._finish(branch, token, "dampened", kind, ())
        to = edge["to"]
        target = to[0] if kind != "divert" else to.get(render_key(step.output), to["otherwise"])
        created = self._new_step(branch, target, [step.output], kind, (step.id,))
        return self._release(branch, token, kind, (created,))

    # ----------------------------------------------------------------- batches

    def advances_inline(self, step_id: str) -> bool:
        """Whether a success of this step advances its branch in the success's own
        transaction: a leaf, ``chain``, ``converge``, ``divert`` or ``dampen`` edge (one
        step on the same branch, or the branch ends); never a fan-out, fan-in or expand."""
        edge = self.runs[self.steps[step_id].run_id].definition.edge(self.steps[step_id].node)
        return edge is None or edge["type"] in INLINE_EDGES

    def batchable(self, branch_id: str) -> bool:
        """Whether an advancer may advance this branch inside a batch: its advance is one
        of the simple transitions (a halt of a failed step or of a spent crash budget, a
        leaf, ``chain``, ``converge``, ``divert``, ``dampen``); fan-out, expand and fan-in
        are advanced one by one."""
        branch = self.branches[branch_id]
        step = self.steps[branch.latest_step]
        if step.status == "failed" or branch.advancer_crashes >= self.config.advancer_max_crash:
            return True
        return step.status == "advancing" and self.advances_inline(step.id)

    def _advance_inline(self, step_id: str) -> Commit | None:
        """``claim_branch`` and ``advance`` of the step's branch when the step is
        ``advancing``, its edge advances inline and its branch is free; else nothing."""
        step = self.steps[step_id]
        if step.status != "advancing" or not self.advances_inline(step.id):
            return None
        if step.branch_id not in self.claimable_branches():  # [INV-ADV-2] an advancer holds it, or it ended
            return None
        return self.advance(step.branch_id)

    def advance_on_successes(self, items: Sequence[tuple[int, Outcome]]) -> list[Commit | None]:
        """A worker records the outcome of each ``(execution, outcome)`` and, in the same
        transaction, advances each branch past its step when the step succeeded, its edge
        advances inline (:meth:`advances_inline`) and the branch is free (unclaimed, in
        progress): the next step is created, or the branch ends (``completed`` for a
        leaf, ``dampened``) and the run is resolved [INV-RUN-1]. One success is a group of
        one, as in the engine (``pipelines.outcomes.record_successes``, whose inline part
        is ``branches.advance_on_successes``). Returns, per item, what the advance
        committed (None: the step is left ``advancing`` for an advancer, or did not
        succeed).

        Defined as ``run_execution(exec_id, outcome)``, then ``claim_branch`` and
        ``advance`` of its branch when those conditions hold, for each item in the order
        given, as one transaction. Refused as a whole (``CommitFailed``, nothing changed)
        when any execution is not open or is listed twice [INV-EXE-2], and
        (``PreconditionError``) when any is not eligible yet: exactly when
        ``run_execution`` of one of them would be.
        """
        ids = [exec_id for exec_id, _ in items]
        if len(set(ids)) != len(ids) or any(
                self.executions.get(i) is None or self.executions[i].state != "pending" for i in ids):
            raise CommitFailed(f"executions {ids}: not all open")  # [INV-EXE-2] the group's one guard
        if any(self.executions[i].eligible_at_us > self.now_us for i in ids):
            raise PreconditionError(f"executions {ids}: not all eligible")
        done = []
        for exec_id, outcome in items:
            self.run_execution(exec_id, outcome)
            done.append(self._advance_inline(self.executions[exec_id].step_id))
        return done

    def claim_branches(self, branch_ids: Sequence[str]) -> dict[str, int]:
        """Claim every claimable branch of ``branch_ids`` in one transaction; returns the
        tokens of those claimed. Equal to ``claim_branch`` of each claimable one in turn
        (the others, e.g. taken meanwhile by another advancer, are skipped)."""
        tokens: dict[str, int] = {}
        for branch_id in dict.fromkeys(branch_ids):
            if branch_id in self.claimable_branches():
                tokens[branch_id] = self.claim_branch(branch_id)
        return tokens

    def advance_batch(self, claims: Mapping[str, int]) -> dict[str, Commit | None]:
        """Advance several claimed branches in one fenced transaction; returns, per
        branch, what it committed, or None when its token was stale.

        Equal to ``advance(branch, token)`` of each branch in id order (which is this
        operation of the branch alone: the model's one move, as ``branches.move_branches``
        is the engine's). The fence is per branch [INV-ADV-2]: a branch whose token is
        stale commits nothing and only it is refused, the others commit. Only
        :meth:`batchable` branches: any other raises ``PreconditionError``, changing
        nothing.
        """
        for branch_id in claims:
            if branch_id not in self.branches or not self.batchable(branch_id):
                raise PreconditionError(f"branch {branch_id} is not advanced in a batch")
        done: dict[str, Commit | None] = {}
        for branch_id in sorted(claims, key=self._id_order):
            branch = self.branches[branch_id]
            if not self._fence_ok(branch, claims[branch_id]):  # [INV-ADV-2] per branch
                done[branch_id] = None
                continue
            done[branch_id] = self._move(branch, claims[branch_id])
        return done

    def advancer_error(self, branch_id: str, transition_error: bool = False) -> None:
        """Routing raised: everything rolls back and the claim is released.

        The ``advancer_max_retry + 1``-th error on one step halts the branch
        ``advancer_retries_exhausted``; a ``TransitionError`` (raised only by
        routing, so only for an ``advancing`` step) halts ``transition_invalid``
        at once. The halting step is marked completed unless it had failed.
        """
        branch = self.branches.get(branch_id)
        if transition_error and branch is not None and self.steps[branch.latest_step].status != "advancing":
            raise PreconditionError(f"branch {branch_id}: only routing raises TransitionError")
        token = self._claim_or_hold(branch_id)
        branch = self.branches[branch_id]  # it exists: it was claimed or is held
        if transition_error:
            self._halt(branch, token, "transition_invalid", step_completed=True)
        elif branch.advancer_errors >= self.config.advancer_max_retry:
            self._halt(branch, token, "advancer_retries_exhausted", step_completed=True)
        else:
            branch.advancer_errors += 1
            self._drop_claim(branch, token)

    def advancer_crash(self, branch_id: str) -> None:
        """The advancer holding ``branch_id`` was reaped mid-way: its open transaction is lost.

        Committed batches stay (resumed at the cursor [INV-ADV-4]); the claim is
        released and the crash counts towards ``advancer_max_crash``; once the
        count reaches it, the next ``advance`` halts ``advancer_crashes_exhausted``.
        """
        token = self._claim_or_hold(branch_id)
        branch = self.branches[branch_id]
        branch.advancer_crashes += 1
        self._drop_claim(branch, token)

    def resume(self, run_id: str, input: Any = NO_INPUT) -> int:  # noqa: A002 - the engine's name
        """Give every dampened branch of the run a step for its dampen target; returns how many.

        Input is ``[input]`` if given, else ``[output of the dampen step]``
        (semantics §3 item 8). A run without dampened branches (in progress, or final: a
        dampened branch makes its run ``dampened``) is refused with ``PreconditionError``,
        changing nothing, as the engine's ``Run.resume`` raises ``RunStateError``; so is a
        pruned run.
        """
        run = self._live(run_id)
        if run.status in FINAL_RUN_STATES or not any(self.branches[b].status == "dampened" for b in run.branches):
            raise PreconditionError(f"run {run_id} is {run.status} with no dampened branch; nothing to resume")
        resumed = 0
        for branch_id in run.branches:
            branch = self.branches[branch_id]
            if branch.status != "dampened":
                continue
            step = self.steps[branch.latest_step]
            edge = run.definition.edge(step.node)
            assert edge is not None, "a dampened branch's step has its dampen edge"
            target = edge["to"][0]
            value = step.output if input is NO_INPUT else copy.deepcopy(input)
            branch.status = "in_progress"
            self._new_step(branch, target, [value], "resume", (step.id,))
            resumed += 1
        self._resolve(run)
        return resumed

    # ----------------------------------------------------------------- on_halt hooks

    def claim_hook(self, hook_id: str) -> int:
        """A worker claims a pending, eligible hook: it becomes ``running`` with a fresh claim
        token, the fence of the outcome it will record. ``PreconditionError`` otherwise."""
        hook = self.hooks.get(hook_id)
        if hook is None or hook.status != "pending":
            raise PreconditionError(f"hook {hook_id} is not pending")
        if hook.eligible_at_us > self.now_us:
            raise PreconditionError(f"hook {hook_id} is not eligible until {hook.eligible_at_us}")
        hook.status, hook.claim_token = "running", self._next_token()
        self.hook_log.append(("claim", hook_id, hook.claim_token))
        return hook.claim_token

    def run_hook(self, hook_id: str, token: int, outcome: Outcome) -> str:
        """The claimer ran the handler and records how it ended, fenced by its token; returns
        the hook's status afterwards.

        A ``token`` that is not the hook's current claim (the reaper took it, another
        worker re-claimed it) raises ``StaleClaim`` and records nothing [INV-HLT-1].
        ``success`` ends the hook ``succeeded``; ``failure`` (or ``timed_out``) is retried
        after ``retry_delay`` while ``retry_count < max_retry``, ``process_crashed`` (the
        handler could not be built, the thread left) at once for the first
        ``max_crash // 3`` crashes then backing off, while ``crash_count < max_crash``; an
        ``invalid`` outcome (the class does not resolve) or a spent budget ends it
        ``failed``. ``succeeded`` and ``failed`` are final: the recorded outcome.
        """
        hook = self.hooks.get(hook_id)
        if hook is None or not self._hook_fence_ok(hook, token):  # [INV-HLT-1] the fence
            raise StaleClaim(f"hook {hook_id}: token {token} is not its claim")
        self.hook_log.append(("record", hook_id, token))
        self._end_attempt(hook, outcome.kind)
        return hook.status

    def reap_hook(self, hook_id: str) -> str:
        """The worker running ``hook_id`` died: the reaper crashes its claim (a re-run within
        the crash budget, else ``failed``) [INV-HLT-2]; returns the status afterwards.
        ``PreconditionError`` unless the hook is running."""
        hook = self.hooks.get(hook_id)
        if hook is None or hook.status != "running":
            raise PreconditionError(f"hook {hook_id} is not running")
        self._end_attempt(hook, "process_crashed")
        return hook.status

    def _end_attempt(self, hook: HaltHook, kind: str) -> None:
        hook.attempts.append(kind)
        hook.attempt_times.append(self.now_us)
        hook.claim_token = None
        cfg = self.config
        if kind == "success":
            final = "succeeded"
        elif kind in ("failure", "timed_out") and hook.retry_count < cfg.max_retry:  # [INV-HLT-2] budget
            hook.status, hook.retry_count = "pending", hook.retry_count + 1
            hook.eligible_at_us = self.now_us + cfg.retry_delay_us
            return
        elif kind == "process_crashed" and hook.crash_count < cfg.max_crash:
            hook.crash_count += 1
            immediate = hook.crash_count <= cfg.max_crash // 3
            hook.status = "pending"
            hook.eligible_at_us = self.now_us + (0 if immediate else hook.crash_count * cfg.crash_delay_us)
            return
        else:
            final = "failed"
        hook.status = final
        self.hook_outcomes.append((hook.id, final))
    # ----------------------------------------------------------------- retention

    def prunable_runs(self, cutoff_us: int) -> list[str]:
        """Runs ``prune(cutoff_us)`` deletes: completed or halted before ``cutoff_us``,
        oldest finish first (the engine picks its batches in another order; the set a
        whole prune deletes is the same)."""
        runs = [r for r in self.runs.values() if not r.pruned and self._may_prune(r, cutoff_us)]
        return [r.id for r in sorted(runs, key=lambda r: (r.finished_at_us, self._id_order(r.id)))]

    def prune(self, cutoff_us: int, limit: int | None = None, candidates: Sequence[str] | None = None) -> list[str]:
        """One prune batch: of ``candidates`` (default: ``prunable_runs(cutoff_us)``), up
        to ``limit``, delete each run the guard still allows (final, finished before the
        cutoff) with every record of it; returns the pruned ids. A candidate the guard
        refuses (live, or finished later) is left untouched [INV-PRN-1]."""
        chosen = list(self.prunable_runs(cutoff_us) if candidates is None else candidates)
        if limit is not None:
            chosen = chosen[:limit]
        considered, pruned, digests = [], [], []
        for run_id in chosen:
            run = self.runs.get(run_id)
            if run is None or run.pruned:
                continue
            considered.append((run_id, run.status, run.finished_at_us, self._hook_open(run)))
            if not self._may_prune(run, cutoff_us):  # [INV-PRN-1] the live-run guard
                continue
            run.pruned = True  # [INV-PRN-2] the whole run: every branch, step and execution with it
            pruned.append(run_id)
            digests.append((run_id, self.run_digest(run_id)))
        self.prunes.append(Prune(cutoff_us, tuple(considered), tuple(pruned), tuple(digests)))
        return pruned

    def prune_all(self, cutoff_us: int, batch: int) -> list[str]:
        """``prune`` in batches of ``batch`` until nothing is left (the engine's ``prune``)."""
        done: list[str] = []
        while True:
            pruned = self.prune(cutoff_us, limit=batch)
            if not pruned:
                return done
            done += pruned

    def run_digest(self, run_id: str) -> bytes:
        """Every record of the run, serialised (equal digests: nothing of it changed)."""
        run = self.runs[run_id]
        branches = [self.branches[b] for b in run.branches]
        steps = [self.steps[s] for b in branches for s in b.steps]
        executions = [self.executions[e] for s in steps for e in s.executions]
        return pickle.dumps((run.status, run.status_history, run.context, run.finished_at_us, branches, steps,
                             executions))

    def live_runs(self) -> list[str]:
        """Runs not pruned (the engine has rows of exactly these)."""
        return [run_id for run_id, run in self.runs.items() if not run.pruned]

    def _live(self, run_id: str) -> Run:
        run = self.runs[run_id]
        if run.pruned:
            raise PreconditionError(f"run {run_id} was pruned")
        return run
    # ----------------------------------------------------------------- revive

    def revive(self, run_id: str, duplicate_context: bool = False) -> str:
        """Continue a halted run as a new run, in one transaction; returns the new run's id.

        The new run has the same definition and arguments and ``revived_from = run_id``.
        Every branch is carried over with its links (barrier, fan-out index, fan-out step,
        width, arrivals, expand cursor, merge) mapped to the new ids, and every step as
        history (``copied_from``; no executions: those stay with the halted run), so no
        succeeded step runs or advances again [INV-REV-2]. Each halted branch resumes where
        it stopped [INV-REV-3]: a ``failed`` latest step (a job halt: retries or crashes
        exhausted, invalid) is replaced by a fresh step on the same node with the same input,
        a fresh budget and the failed step's idempotency key (``revives``); a latest step an
        advancement halt completed is carried over ``advancing`` with its output, for an
        advancer to run the transition again. Context is copied only with
        ``duplicate_context``. ``halted_at`` is not a field here; the engine leaves it unset.

        Exactly once [INV-REV-1]: a run already revived returns the run that revived it,
        changing nothing (the engine's ``uq_run_revived_from``). A run that is not halted
        (or does not exist) raises ``PreconditionError``, changing nothing.
        """
        run = self.runs.get(run_id)
        if run is None or run.pruned:  # a pruned run is gone: the engine finds no row of it
            raise PreconditionError(f"no run {run_id}")
        existing = self._existing_revival(run_id)  # [INV-REV-1] one new run per halted run
        if existing is not None:
            self.revivals.append((run_id, existing))
            return existing
        if run.status != "halted":
            raise PreconditionError(f"run {run_id} is {run.status}, not halted: only a halted run is revived")
        new = Run(self._new_id("run"), run.definition, copy.deepcopy(run.args), revived_from=run_id)
        self.runs[new.id] = new
        branch_ids = {old: self._new_id("branch") for old in run.branches}
        step_ids = {s: self._new_id("step") for old in run.branches for s in self.branches[old].steps}
        for old_id in run.branches:
            old = self.branches[old_id]
            resumed = old.status == "halted"
            branch = Branch(branch_ids[old_id], new.id, branch_ids.get(old.barrier or ""), old.fanout_index,
                            status="in_progress" if resumed else old.status,
                            fanout_step=step_ids.get(old.fanout_step or ""), fanout_width=old.fanout_width,
                            fanin_arrivals=old.fanin_arrivals,
                            arrived={i: branch_ids[b] for i, b in old.arrived.items()},
                            expand_cursor=old.expand_cursor, merge_of=branch_ids.get(old.merge_of or ""),
                            copied_from=old.id)
            self.branches[branch.id] = branch
            new.branches.append(branch.id)
            for old_step_id in old.steps:
                self._carry_step(new, branch, self.steps[old_step_id], step_ids,
                                 resume=resumed and old_step_id == old.latest_step)
        if duplicate_context:
            for key, value in run.context.items():
                new.context[key] = copy.deepcopy(value)
                self.context_writes.append(ContextWrite(new.id, key, False, False, True))
        self._resolve(new)
        self.revivals.append((run_id, new.id))
        return new.id

    def _carry_step(self, run: Run, branch: Branch, old: Step, step_ids: Mapping[str, str], resume: bool) -> None:
        """One step of a halted run into its revived run: history, or where a halted branch resumes."""
        predecessors = tuple(step_ids[p] for p in old.predecessors)
        step = Step(step_ids[old.id], run.id, branch.id, old.node, copy.deepcopy(old.input), old.origin,
                    predecessors, status=old.status, output=copy.deepcopy(old.output), key=old.key or old.id)
        self.steps[step.id] = step
        branch.steps.append(step.id)
        if resume and old.status == "failed":  # [INV-REV-3] re-enqueued: same input, fresh budget, same key
            step.status, step.output, step.revives = "in_progress", None, old.id
            delay = run.definition.delay_us(old.node)
            self._new_execution(step, 0, 0, self.now_us + delay)
            return
        step.copied_from = old.id  # [INV-REV-2] history: no execution, never advanced again
        if resume:  # an advancement halt completed it: the transition runs again [INV-REV-3]
            step.status = "advancing"

    def _keyed_run(self, pipeline: str, key: str) -> str | None:
        """The run of ``pipeline`` holding ``key``: triggered with it, not pruned and not
        released (the engine's ``uq_run_trigger_key``; a prune deletes the row, and the key
        with it; a release sets the row's key NULL) [INV-TRG-1]."""
        return next((r.id for r in self.runs.values()
                     if r.trigger_key == key and not r.pruned and r.key_released_at_us is None
                     and r.definition.pipeline == pipeline), None)

    def _rolled_back(self, definition: Mapping[str, Any] | Definition, args: Sequence[Any],
                     key: str | None) -> None:
        """What a trigger the caller rolled back leaves: nothing [INV-TRG-2]."""

    def _existing_revival(self, run_id: str) -> str | None:
        """The run that already revived ``run_id`` (the engine's unique ``revived_from``) [INV-REV-1]."""
        return next((r.id for r in self.runs.values() if r.revived_from == run_id), None)

    # ----------------------------------------------------------------- context

    def context_set(self, run_id: str, key: str, value: Any, overwrite: bool = False) -> Any:
        """Set a run-scoped context value; a second set without ``overwrite`` raises ``OverwriteError``."""
        run = self._live(run_id)
        existed = key in run.context
        accepted = self._context_accepts(existed, overwrite)  # [INV-CTX-1] the unique (run, key) row
        self.context_writes.append(ContextWrite(run_id, key, overwrite, existed, accepted))
        if not accepted:
            raise OverwriteError(f"run {run_id}: context key {key!r} can only be set once")
        run.context[key] = copy.deepcopy(value)
        return value

    def context_get(self, run_id: str, key: str) -> Any:
        return self.runs[run_id].context.get(key)

    # ----------------------------------------------------------------- driving

    def drive(self, oracle: Oracle, max_actions: int = 100_000, stop_after: int | None = None,
              batch: int | None = None, hook_oracle: HookOracle | None = None, hooks: bool = True) -> int:
        """Run and advance everything to quiescence, deterministically; returns the action count.

        Each round makes one ``advance`` on every branch advanceable at its
        start (lowest id first; a batched expand so takes one batch per round),
        then runs every execution runnable at that point with
        ``oracle(node, input, attempt)``; when neither is possible but
        executions wait, the clock jumps to the earliest ``eligible_at``.
        ``stop_after`` returns early after that many actions (a partial drive);
        more than ``max_actions`` raises ``PreconditionError`` (no quiescence).

        ``batch``: the fleet's batched operations instead, up to ``batch`` items each (one
        action): the batchable claimable branches through ``claim_branches`` and
        ``advance_batch``, the rest one by one, then the runnable executions through
        ``advance_on_successes`` (every outcome; successes advance inline).

        Each round then claims and runs every runnable ``on_halt`` hook, its outcome
        decided by ``hook_oracle(run_id, attempt)`` (default: success); a ``process_crashed``
        outcome stands for the worker dying, so the hook is reaped (``reap_hook``).
        ``hooks=False`` leaves the hooks to the caller (quiescence then ignores them).
        """
        if batch is not None:
            return self._drive_batched(oracle, batch, max_actions, hook_oracle)
        actions = 0
        while True:
            progressed = False
            for branch_id in self.advanceable_branches():
                if actions == stop_after:
                    return actions
                if branch_id not in self.advanceable_branches():  # an earlier advance this round took it
                    continue  # pragma: no cover  defensive: an advance moves only its own branch (and adds new ones)
                self.advance(branch_id)
                actions, progressed = actions + 1, True
            for exec_id in self.runnable_executions():
                if actions == stop_after:
                    return actions
                self.run_execution(exec_id, oracle(*self.execution_input(exec_id)))
                actions, progressed = actions + 1, True
            ran = self._drive_hooks(hook_oracle) if hooks else 0
            actions, progressed = actions + ran, progressed or ran > 0
            if self._round_ended(progressed, actions, max_actions, hooks):
                return actions

    def _drive_hooks(self, hook_oracle: HookOracle | None) -> int:
        """Claim and run every runnable hook once; returns how many."""
        done = 0
        for hook_id in self.runnable_hooks():
            hook = self.hooks[hook_id]
            outcome = hook_oracle(hook.run_id, len(hook.attempts)) if hook_oracle else success(None)
            token = self.claim_hook(hook_id)
            if outcome.kind == "process_crashed":
                self.reap_hook(hook_id)
            else:
                self.run_hook(hook_id, token, outcome)
            done += 1
        return done

    def _drive_batched(self, oracle: Oracle, batch: int, max_actions: int,
                       hook_oracle: HookOracle | None = None) -> int:
        actions = 0
        while True:
            progressed = False
            simple = [b for b in self.claimable_branches() if self.batchable(b)]
            for start in range(0, len(simple), batch):
                self.advance_batch(self.claim_branches(simple[start:start + batch]))
                actions, progressed = actions + 1, True
            for branch_id in self.advanceable_branches():
                if branch_id in self.advanceable_branches():  # pragma: no branch  defensive, as in drive
                    self.advance(branch_id)
                    actions, progressed = actions + 1, True
            runnable = self.runnable_executions()
            for start in range(0, len(runnable), batch):
                chunk = runnable[start:start + batch]
                self.advance_on_successes([(e, oracle(*self.execution_input(e))) for e in chunk])
                actions, progressed = actions + 1, True
            hooks = self._drive_hooks(hook_oracle)
            actions, progressed = actions + hooks, progressed or hooks > 0
            if self._round_ended(progressed, actions, max_actions):
                return actions

    def _round_ended(self, progressed: bool, actions: int, max_actions: int, hooks: bool = True) -> bool:
        """After a round of ``drive``: True when nothing is pending; when the round did
        nothing, the clock jumps to the earliest ``eligible_at``."""
        if not progressed:
            waits = sorted([e.eligible_at_us for e in self._pending()]
                           + [h.eligible_at_us for h in self._pending_hooks() if hooks])
            if not waits:
                return True
            self.set_clock(waits[0])
        if actions > max_actions:
            raise PreconditionError(f"no quiescence after {max_actions} actions")
        return False

    def summary(self, run_id: str) -> RunSummary:
        """The run's state as a ``RunSummary`` (comparable with the engine's)."""
        run = self.runs[run_id]
        branches = [self.branches[b] for b in run.branches]
        steps = [self.steps[s] for b in branches for s in b.steps]
        fan_in: dict[str, list[list[Any]]] = {}
        for step in steps:
            if step.origin in FAN_IN:
                fan_in.setdefault(step.node, []).append(step.input)
        return RunSummary(
            status=run.status,
            steps=Counter((s.node, s.status) for s in steps),
            branches=Counter((self.steps[b.latest_step].node, b.status, b.halt_reason) for b in branches),
            halt_reasons=Counter((self.steps[b.latest_step].node, b.halt_reason)
                                 for b in branches if b.status == "halted"),
            fan_in_inputs={node: sorted(inputs, key=canonical_json) for node, inputs in sorted(fan_in.items())},
        )

    def snapshot(self) -> bytes:
        """All state, serialised: equal snapshots mean a refused operation changed nothing."""
        return pickle.dumps((self.runs, self.branches, self.steps, self.executions, self.commits,
                             self.fence_log, self.outcomes, self.now_us, self.hooks, self.hook_outcomes))

    # ----------------------------------------------------------------- hooks (mutants override)

    def _may_prune(self, run: Run, cutoff_us: int) -> bool:
        """The live-run guard: only a completed or halted run that finished before the
        cutoff, and owes no on_halt hook still to run, may be deleted [INV-PRN-1]."""
        return (run.status in FINAL_RUN_STATES and run.finished_at_us is not None
                and run.finished_at_us < cutoff_us and not self._hook_open(run))

    def _hook_open(self, run: Run) -> bool:
        """The run owes an on_halt hook whose outcome is not recorded yet (live work)."""
        hook = self.hook_of(run.id)
        return hook is not None and hook.status in ("pending", "running")

    def _fence_ok(self, branch: Branch, token: int) -> bool:
        """The fence: the branch is held and its token is the caller's [INV-ADV-2]."""
        return branch.status == "advancing" and branch.claim_token == token

    def _may_retry(self, execution: Execution) -> bool:
        """Budget left after this execution's non-success outcome [INV-EXE-4]."""
        if execution.outcome == "invalid":  # it cannot succeed: no budget applies
            return False
        if execution.outcome == "process_crashed":
            return execution.crash_count < self.config.max_crash
        return execution.retry_count < self.config.max_retry

    def _fires(self, barrier: Branch) -> bool:
        """The arrival that makes ``fanin_arrivals == fanout_width`` fires the merge [INV-ADV-3]."""
        return barrier.fanin_arrivals == barrier.fanout_width

    @staticmethod
    def _hook_fence_ok(hook: HaltHook, token: int) -> bool:
        """The hook's fence: it is running and its claim token is the caller's [INV-HLT-1]."""
        return hook.status == "running" and hook.claim_token == token

    def _hook_owed(self, run: Run) -> bool:
        """Whether the run already owes a hook: one hook row per run [INV-HLT-1]."""
        return any(h.run_id == run.id for h in self.hooks.values())

    @staticmethod
    def _context_accepts(existed: bool, overwrite: bool) -> bool:
        """A plain set only creates; ``overwrite`` upserts [INV-CTX-1]."""
        return overwrite or not existed

    # ----------------------------------------------------------------- internals

    def _new_id(self, kind: str) -> str:
        self._ids[kind] += 1
        return f"{kind}{self._ids[kind]}"

    def _next_token(self) -> int:
        self._ids["token"] += 1
        return self._ids["token"]

    @staticmethod
    def _id_order(ident: str) -> tuple[int, str]:
        digits = "".join(ch for ch in ident if ch.isdigit())
        return (int(digits or 0), ident)

    def _pending_hooks(self) -> list[HaltHook]:
        pending = [h for h in self.hooks.values() if h.status == "pending"]
        return sorted(pending, key=lambda h: (h.eligible_at_us, self._id_order(h.id)))

    def _pending(self) -> list[Execution]:
        pending = [e for e in self.executions.values() if e.state == "pending"]
        return sorted(pending, key=lambda e: (e.eligible_at_us, e.id))

    def _new_branch(self, run: Run, barrier: str | None, fanout_index: int | None) -> Branch:
        branch = Branch(self._new_id("branch"), run.id, barrier, fanout_index)
        self.branches[branch.id] = branch
        run.branches.append(branch.id)
        return branch

    def _new_step(self, branch: Branch, node: str, input: list[Any], origin: str,  # noqa: A002 - a step's input
                  predecessors: tuple[str, ...]) -> str:
        step = Step(self._new_id("step"), branch.run_id, branch.id, node, copy.deepcopy(input), origin,
                    predecessors)
        step.key = step.id
        self.steps[step.id] = step
        branch.steps.append(step.id)
        branch.advancer_errors = branch.advancer_crashes = 0  # budgets are per step
        delay = self.runs[branch.run_id].definition.delay_us(node)
        self._new_execution(step, 0, 0, self.now_us + delay)
        return step.id

    def _new_execution(self, step: Step, retry: int, crash: int, eligible_at_us: int) -> None:
        self._ids["execution"] += 1
        execution = Execution(self._ids["execution"], step.id, retry, crash, eligible_at_us, key=step.key)
        self.executions[execution.id] = execution
        step.executions.append(execution.id)

    def _claim_or_hold(self, branch_id: str) -> int:
        branch = self.branches.get(branch_id)
        if branch is not None and branch.status == "advancing":
            assert branch.claim_token is not None, "an advancing branch holds its claim's token"
            return branch.claim_token
        return self.claim_branch(branch_id)

    def _drop_claim(self, branch: Branch, token: int) -> None:
        """The holder's transaction rolled back (error) or was lost (crash): release only."""
        branch.status, branch.claim_token = "in_progress", None
        self.fence_log.append(("release", branch.id, token))

    def _commit(self, branch: Branch, token: int, action: str, created: tuple[str, ...]) -> Commit:
        commit = Commit(branch.id, token, action, created)
        self.commits.append(commit)
        self.fence_log.append(("commit", branch.id, token))
        if branch.claim_token is None:  # the transaction also released (or ended) the claim
            self.fence_log.append(("release", branch.id, token))
        self._resolve(self.runs[branch.run_id])
        return commit

    def _release(self, branch: Branch, token: int, action: str, created: tuple[str, ...]) -> Commit:
        branch.status, branch.claim_token = "in_progress", None
        return self._commit(branch, token, action, created)

    def _finish(self, branch: Branch, token: int, status: str, action: str, created: tuple[str, ...]) -> Commit:
        branch.status, branch.claim_token = status, None
        return self._commit(branch, token, action, created)

    def _halt(self, branch: Branch, token: int, reason: str, step_completed: bool) -> Commit:
        step = self.steps[branch.latest_step]
        if step_completed and step.status == "advancing":  # a failed step stays failed
            step.status, step.halted_by_advancer = "completed", True
        branch.halt_reason = reason
        return self._finish(branch, token, "halted", f"halt:{reason}", ())

    def _expand_batch(self, run: Run, branch: Branch, step: Step, edge: Mapping[str, Any], token: int) -> Commit:
        items = step.output
        if branch.expand_cursor is None:
            branch.fanout_step, branch.fanout_width, branch.expand_cursor = step.id, len(items), 0
        start = branch.expand_cursor
        stop = min(len(items), start + self.config.expand_batch)
        created = tuple(self._new_step(self._new_branch(run, branch.id, i), edge["to"][0], [items[i]],
                                       "expand", (step.id,)) for i in range(start, stop))
        branch.expand_cursor = stop  # [INV-ADV-4] the cursor commits with its batch
        if stop < len(items):
            return self._commit(branch, token, "expand", created)  # keeps the claim
        step.status = "completed"
        return self._finish(branch, token, "completed", "expand", created)

    def _fan_in(self, run: Run, branch: Branch, step: Step, edge: Mapping[str, Any], token: int) -> Commit:
        barrier = self.branches.get(branch.barrier) if branch.barrier else None
        # a barrier is a branch that fanned out, so its fanout_step is set
        fanned_out_at = None if barrier is None else self.steps[barrier.fanout_step or ""].node
        if barrier is None or fanned_out_at not in edge["barrier"]:
            return self._halt(branch, token, "transition_invalid", step_completed=True)
        assert branch.fanout_index is not None, "a branch with a barrier has its fan-out index"
        step.status = "completed"
        barrier.fanin_arrivals += 1  # [INV-ADV-3] in this same fenced transaction
        barrier.arrived[branch.fanout_index] = branch.id
        created: tuple[str, ...] = ()
        if self._fires(barrier):
            siblings = [self.branches[barrier.arrived[i]] for i in sorted(barrier.arrived)]
            sibling_steps = [self.steps[s.latest_step] for s in siblings]
            merge = self._new_branch(run, barrier.barrier, barrier.fanout_index)
            merge.merge_of = barrier.id
            created = (self._new_step(merge, edge["to"][0], [[s.output for s in sibling_steps]],
                                      edge["type"], tuple(s.id for s in sibling_steps)),)
        return self._finish(branch, token, "completed", edge["type"], created)

    def _resolve(self, run: Run) -> None:
        if run.status in FINAL_RUN_STATES:  # [INV-RUN-1] terminal states are final
            return  # pragma: no cover  defensive: every caller moved a branch of the run, so it was not final
        status = resolve_run_status([self.branches[b].status for b in run.branches])
        if status != run.status:
            run.status = status
            run.status_history.append(status)
            if status in FINAL_RUN_STATES:
                run.finished_at_us = self.now_us
            if status == "halted":
                self._owe_hook(run)

    def _owe_hook(self, run: Run) -> None:
        """The halt's own transaction records that the run owes its hook [INV-HLT-2]; at
        most one per run [INV-HLT-1] (the engine's unique constraint on the run)."""
        klass = run.definition.on_halt
        if klass is None or self._hook_owed(run):  # [INV-HLT-1] one hook per run
            return
        hook = HaltHook(self._new_id("hook"), run.id, klass, self.now_us)
        self.hooks[hook.id] = hook


def run_to_quiescence(definition: Mapping[str, Any], args: Sequence[Any], oracle: Oracle,
                      config: PipelineConfig | None = None, resumes: Sequence[Any] = (),
                      batch: int | None = None) -> RunSummary:
    """Trigger ``definition`` with ``args``, drive it with ``oracle`` until quiescent and
    return ``summary(run)`` (:func:`run_and_model` without the model)."""
    return run_and_model(definition, args, oracle, config, resumes, batch)[0]


def run_and_model(definition: Mapping[str, Any], args: Sequence[Any], oracle: Oracle,
                  config: PipelineConfig | None = None, resumes: Sequence[Any] = (),
                  batch: int | None = None, hook_oracle: HookOracle | None = None
                  ) -> tuple[RunSummary, PipelinesModel, str]:
    """Trigger ``definition`` with ``args`` and drive it with ``oracle`` until quiescent.

    ``oracle(node, input_args, attempt) -> Outcome`` decides every execution
    (``attempt`` counts the step's earlier executions from 0). Each value in
    ``resumes`` (``NO_INPUT`` or an input) resumes the run once if it is left
    dampened. ``batch``: drive with the batched operations (``drive(batch=…)``);
    ``hook_oracle``: how the attempts of an ``on_halt`` hook end (``drive``).
    Returns ``(summary(run), the model, the run's id)``.
    """
    model = PipelinesModel(config or PipelineConfig())
    run_id = model.trigger(definition, args)
    model.drive(oracle, batch=batch, hook_oracle=hook_oracle)
    for value in resumes:
        if model.runs[run_id].status != "dampened":
            break
        model.resume(run_id, value)
        model.drive(oracle, batch=batch, hook_oracle=hook_oracle)
    return model.summary(run_id), model, run_id
