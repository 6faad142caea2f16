"""Hypothesis strategies of the pipeline conformance hunts (and of the model-alone
pipeline machines, ``tests/properties/test_model_pipelines.py``).

Example::

    @given(pipeline_scenarios())
    def test_agree(scenario):
        definition, args, oracle = scenario   # snapshot JSON (semantics §1), list, Oracle
        expected = run_to_quiescence(definition, args, oracle)

* ``definitions()`` — random snapshot-format-1 definitions covering every
  transition kind (chain, divert with and without converge, divide/combine,
  expand/collapse, dampen, leaf, and invalid fan-ins), nested up to
  ``max_depth`` fan-outs;
* ``oracles(definition)`` — an ``Oracle`` whose outputs fit each node's edge;
* ``pipeline_scenarios()`` — ``(definition, trigger args, oracle)``;
* ``pipeline_configs()`` — small budgets and batch sizes so limits are hit.

Node classes are named ``f"{STEP_MODULE}:{cls}"`` with ``cls`` from
``CLASS_POOL``; an engine test provides those classes and has each consult the
oracle with ``(node, input args, attempt)`` (:mod:`ductwork_proof.conformance.oracle_steps`).
The oracle's outcomes and the configs are the shipped model's (``ductwork_model``): a test
that hands them to the model imports it under that name, never as ``model``. (The limits
strategies of the model-alone machines are the test suite's: ``tests/properties/strategies.py``.)
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from ductwork_model.pipelines import Outcome, PipelineConfig, canonical_json, success

__all__ = [
    "CLASS_POOL",
    "DIVERT_KEYS",
    "STEP_MODULE",
    "NodePlan",
    "Oracle",
    "definitions",
    "oracles",
    "pipeline_configs",
    "pipeline_scenarios",
]

STEP_MODULE = "ductwork_proof.conformance.oracle_steps"
CLASS_POOL = ("Fetch", "Push", "Record", "Check", "Split")
#: (rendered divert key, a step output that renders to it) — semantics §3.4
DIVERT_KEYS = (("a", "a"), ("true", True), ("", None), ("7", 7), ("1.0", 1.0), ("false", False))
#: outputs that match no key and so take ``otherwise``
UNMATCHED = (["a"], "zzz", 2.5, {"k": 1})
FAULTS = ("failure", "timed_out", "process_crashed", "invalid")
#: what a fault is drawn from: ``invalid`` ends the step's branch at once, so it is rarer
_FAULT_DRAW = ("failure", "timed_out", "process_crashed") * 3 + ("invalid",)

# --------------------------------------------------------------------------- oracle


def _hash(node: str, input_args: list) -> int:
    return zlib.crc32(canonical_json([node, input_args]).encode())


@dataclass(frozen=True)
class NodePlan:
    """How one node's executions end, as a pure function of ``(input, attempt)``.

    ``kind``: ``value`` (an int), ``list`` (1..max_items ints, none if
    ``max_items`` is 0, for expand) or
    ``divert`` (one of ``choices``). Inputs whose hash ``% 4 < unlucky`` first
    go through ``faults`` (one outcome kind per attempt); ``bad_first`` makes
    the first would-be success return something the step may not return (a
    non-list for expand, a non-JSON value otherwise), which is a failure.
    """

    kind: str = "value"
    faults: tuple[str, ...] = ()
    unlucky: int = 0
    max_items: int = 2
    choices: tuple = ()
    bad_first: bool = False


@dataclass(frozen=True)
class Oracle:
    """``oracle(node, input_args, attempt) -> Outcome``: deterministic, picklable, JSON-able."""

    plans: Mapping[str, NodePlan] = field(default_factory=dict)

    def __call__(self, node: str, input_args: list, attempt: int) -> Outcome:
        plan = self.plans.get(node, NodePlan())
        h = _hash(node, input_args)
        faults = plan.faults if h % 4 < plan.unlucky else ()
        if attempt < len(faults):
            return Outcome(faults[attempt])
        if plan.bad_first and attempt == len(faults):
            return success({"not": "a list"} if plan.kind == "list" else {1, 2})
        if plan.kind == "list":  # max_items 0: always empty; else 1..max_items items
            length = 1 + h % plan.max_items if plan.max_items else 0
            return success([(h >> (4 * i)) % 100 for i in range(length)])
        if plan.kind == "divert":
            return success(plan.choices[h % len(plan.choices)])
        return success(h % 1000)

    def to_json(self) -> str:
        return json.dumps({node: plan.__dict__ for node, plan in self.plans.items()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Oracle:
        plans = {}
        for node, raw in json.loads(text).items():
            raw["faults"], raw["choices"] = tuple(raw["faults"]), tuple(raw["choices"])
            plans[node] = NodePlan(**raw)
        return cls(plans)


# --------------------------------------------------------------------------- definitions


class _Builder:
    """Grows a definition from the start node; ``closer`` is the fan-in a path must end with."""

    def __init__(self, draw, max_nodes: int, max_depth: int) -> None:
        self.draw, self.max_nodes, self.max_depth = draw, max_nodes, max_depth
        self.nodes: dict[str, dict] = {}
        self.edges: dict[str, dict] = {}

    def options(self) -> dict[str, Any]:
        return {
            "delay_us": self.draw(st.sampled_from([None, None, None, 1, 1_000_000])),  # delays are positive
            "timeout_us": self.draw(st.sampled_from([None, 30_000_000])),
            "limit_by": self.draw(st.sampled_from([None, None, "a", "b"])),
        }

    def node(self, options: dict[str, Any]) -> str:
        cls = self.draw(st.sampled_from(CLASS_POOL))
        name = f"{cls}#{len(self.nodes)}"
        self.nodes[name] = {"klass": f"{STEP_MODULE}:{cls}", **options}
        return name

    def grow(self, tail: str, depth: int, closer: tuple[str, str, str] | None) -> None:
        room = len(self.nodes) < self.max_nodes
        kinds = ["leaf"] + ["close"] * 3 * bool(closer)
        if room:
            kinds += ["chain", "divert", "dampen", "bad_fan_in"]
            if depth < self.max_depth:
                kinds += ["divide"] * 2 + ["expand"] * 3
        kind = self.draw(st.sampled_from(kinds))
        if kind == "close":
            assert closer is not None, "'close' is among the kinds only when there is a fan-in to close"
            fan_in, target, barrier = closer
            self.edges[tail] = {"type": fan_in, "to": [target], "barrier": [barrier]}
        elif kind == "bad_fan_in":  # no barrier, or the wrong one: halts transition_invalid
            target = self.node(self.options())
            fan_in = self.draw(st.sampled_from(["combine", "collapse"]))
            self.edges[tail] = {"type": fan_in, "to": [target], "barrier": [tail]}
        elif kind in ("chain", "dampen"):
            target = self.node(self.options())
            self.edges[tail] = {"type": kind, "to": [target]}
            self.grow(target, depth, closer)
        elif kind == "divert":
            self._divert(tail, depth, closer)
        elif kind in ("divide", "expand"):
            self._fan_out(kind, tail, depth, closer)

    def _divert(self, tail: str, depth: int, closer) -> None:
        keys = self.draw(st.lists(st.sampled_from([k for k, _ in DIVERT_KEYS]), min_size=1, max_size=2, unique=True))
        options = self.options()
        to = {key: self.node(options) for key in [*keys, "otherwise"]}
        self.edges[tail] = {"type": "divert", "to": to}
        if self.draw(st.booleans()):
            merge = self.node(self.options())
            for target in to.values():
                self.edges[target] = {"type": "converge", "to": [merge]}
            self.grow(merge, depth, closer)
        else:
            for target in to.values():
                self.grow(target, depth, closer)

    def _fan_out(self, kind: str, tail: str, depth: int, closer) -> None:
        options = self.options()
        count = self.draw(st.integers(2, 3)) if kind == "divide" else 1
        targets = [self.node(options) for _ in range(count)]
        self.edges[tail] = {"type": kind, "to": targets}
        if self.draw(st.integers(0, 3)):  # usually close the fan-out again
            merge = self.node(self.options())
            fan_in = "combine" if kind == "divide" else "collapse"
            for target in targets:
                self.grow(target, depth + 1, (fan_in, merge, tail))
            self.grow(merge, depth, closer)
        else:
            for target in targets:
                self.grow(target, depth + 1, None)


@st.composite
def definitions(draw, max_nodes: int = 14, max_depth: int = 2) -> dict:
    """A snapshot-format-1 definition (semantics §1) with every transition kind reachable."""
    builder = _Builder(draw, max_nodes, max_depth)
    start = builder.node(builder.options())
    builder.grow(start, 0, None)
    return {"format": 1, "pipeline": f"{STEP_MODULE}:Generated", "start": start,
            "nodes": builder.nodes, "edges": builder.edges}


@st.composite
def oracles(draw, definition: Mapping[str, Any]) -> Oracle:
    """An ``Oracle`` for ``definition``: lists for expand nodes, key-matching (or not) divert outputs."""
    plans = {}
    for node in definition["nodes"]:
        edge = definition["edges"].get(node)
        kind = {"expand": "list", "divert": "divert"}.get(edge["type"] if edge else "", "value")
        choices: tuple = ()
        if kind == "divert":
            by_key = dict(DIVERT_KEYS)
            choices = (*tuple(by_key[k] for k in edge["to"] if k != "otherwise"), draw(st.sampled_from(UNMATCHED)))
        plans[node] = NodePlan(
            kind=kind,
            faults=tuple(draw(st.lists(st.sampled_from(_FAULT_DRAW), max_size=3))),
            unlucky=draw(st.integers(0, 4)),
            max_items=draw(st.integers(0, 4)) if kind == "list" else 2,
            choices=choices,
            bad_first=draw(st.integers(0, 7)) == 0,
        )
    return Oracle(plans)


@st.composite
def pipeline_scenarios(draw, max_nodes: int = 14, max_depth: int = 2) -> tuple[dict, list, Oracle]:
    """``(definition, trigger args, oracle)``."""
    definition = draw(definitions(max_nodes=max_nodes, max_depth=max_depth))
    args = draw(st.lists(st.integers(0, 9), max_size=2))
    return definition, args, draw(oracles(definition))


@st.composite
def pipeline_configs(draw) -> PipelineConfig:
    """Small budgets and batches, so budgets run out and expands take several batches."""
    return PipelineConfig(
        max_retry=draw(st.integers(0, 3)),
        max_crash=draw(st.integers(0, 4)),
        expand_batch=draw(st.sampled_from([1, 1, 2])),
        advancer_max_retry=draw(st.integers(0, 3)),
        advancer_max_crash=draw(st.integers(1, 3)),
    )
