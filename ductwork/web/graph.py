"""A pipeline's graph laid out for SVG: boxes in columns by depth, edges as curves.

    >>> layout = lay_out(run.definition(), node_states(history))
    >>> [(box.name, box.state) for box in layout.boxes]
    [('Fetch#0', 'done'), ('Push#1', 'running'), ('Record#2', 'none')]

Pure: it takes a :class:`~ductwork.pipelines.snapshot.Definition` (the run's snapshot)
and what each node's steps are doing, and returns numbers and strings; the template
draws them (every string escaped there). A node's column is its longest path from the
start, so every edge points right; nodes of one column stack in creation order.

A node's state is the most urgent of its steps' (``failed`` before ``running`` before
``waiting`` before ``advancing`` before ``dampened`` before ``done``); ``none``: no step
reached it. Not done: crossing minimisation (definitions are small), and drawing a
node's steps one by one (an expand's hundred children are one box with counts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ductwork.pipelines.history import RunHistory, StepRecord
from ductwork.pipelines.snapshot import Definition

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 190, 54, 80, 26, 16
#: most urgent first: a node shows the first of these that any of its steps is in
STATES = ("failed", "running", "waiting", "advancing", "dampened", "done")


@dataclass(frozen=True)
class Box:
    name: str
    #: the step class's qualified name (after the colon of ``module:QualName``)
    label: str
    #: a static key, or a partition as ``family[field]``
    limit_by: str | None
    state: str
    #: e.g. ``3 done, 2 running``; empty: not reached
    counts: str
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    #: an SVG path (numbers only)
    path: str
    #: the transition (``chain``, ``expand``, a divert key ``'paid' →``…)
    label: str
    kind: str
    label_x: int
    label_y: int


@dataclass(frozen=True)
class Layout:
    width: int
    height: int
    boxes: tuple[Box, ...]
    edges: tuple[Edge, ...]
    #: the on_halt handler's class, drawn apart; None: none declared
    on_halt: str | None


def step_state(step: StepRecord) -> str:
    """``done``, ``failed``, ``advancing``, ``running`` or ``waiting`` (queued, delayed,
    rate- or concurrency-blocked)."""
    if step.status == "completed":
        return "done"
    if step.status in ("failed", "advancing"):
        return step.status
    return "running" if step.wait is not None and step.wait.kind == "running" else "waiting"


def node_states(history: RunHistory) -> dict[str, Counter[str]]:
    """Per node, how many of its steps are in each state; the last step of a dampened
    branch counts as ``dampened`` (its branch waits for ``Run.resume``)."""
    last: dict[str, StepRecord] = {}
    for step in history.steps:
        last[step.branch_id] = step
    dampened = {last[branch.id].id for branch in history.branches if branch.status == "dampened"
                and branch.id in last}
    counts: dict[str, Counter[str]] = {}
    for step in history.steps:
        counts.setdefault(step.node, Counter())["dampened" if step.id in dampened else step_state(step)] += 1
    return counts


def _targets(definition: Definition, node: str) -> list[tuple[str, str]]:
    """(target, label) of the node's edge, in order."""
    edge = definition.edges.get(node)
    if edge is None:
        return []
    if isinstance(edge.to, dict):
        return [(target, f"divert {key!r}" if key != "otherwise" else "divert otherwise")
                for key, target in edge.to.items()]
    return [(target, edge.type) for target in edge.to]


def creation_order(definition: Definition) -> list[str]:
    """The nodes in the order ``define`` created them (a name is ``Class#i``; a stored
    snapshot's keys may come back sorted by name)."""
    def index(name: str) -> tuple[int, str]:
        _, _, number = name.rpartition("#")
        return (int(number) if number.isdigit() else len(definition.nodes), name)

    return sorted(definition.nodes, key=index)


def _depths(definition: Definition, order: list[str]) -> dict[str, int]:
    """Longest path from the start, relaxed in creation order until nothing moves (an edge
    leads to a node created later, so one pass settles it; the bound guards a snapshot
    that breaks that); a node no path reaches gets column 0."""
    depth = dict.fromkeys(order, 0)
    for _ in range(len(order)):
        moved = False
        for name in order:
            for target, _ in _targets(definition, name):
                if depth[target] < depth[name] + 1 <= len(order):
                    depth[target], moved = depth[name] + 1, True
        if not moved:
            break
    return depth


def _counts_text(counts: Counter[str] | None) -> str:
    if not counts:
        return ""
    return ", ".join(f"{counts[state]} {state}" for state in STATES if counts[state])


def lay_out(definition: Definition, states: dict[str, Counter[str]]) -> Layout:
    order = creation_order(definition)
    depth = _depths(definition, order)
    rows: Counter[int] = Counter()
    at: dict[str, tuple[int, int]] = {}
    for name in order:
        column = depth[name]
        at[name] = (MARGIN + column * (BOX_W + GAP_X), MARGIN + rows[column] * (BOX_H + GAP_Y))
        rows[column] += 1
    boxes = tuple(
        Box(name=name, label=node.klass.partition(":")[2] or node.klass,
            limit_by=node.limit_by if node.partition is None else str(node.partition),
            state=next((s for s in STATES if states.get(name, Counter())[s]), "none"),
            counts=_counts_text(states.get(name)), x=at[name][0], y=at[name][1])
        for name, node in ((name, definition.nodes[name]) for name in order))
    edges = tuple(_edge(at[source], at[target], label, definition.edges[source].type)
                  for source in order if source in definition.edges for target, label in _targets(definition, source))
    width = MARGIN * 2 + (max(depth.values()) + 1) * (BOX_W + GAP_X) - GAP_X
    height = MARGIN * 2 + max(rows.values()) * (BOX_H + GAP_Y) - GAP_Y
    return Layout(width, height, boxes, edges,
                  None if definition.on_halt is None else definition.on_halt.partition(":")[2])


def _edge(source: tuple[int, int], target: tuple[int, int], label: str, kind: str) -> Edge:
    x1, y1 = source[0] + BOX_W, source[1] + BOX_H // 2
    x2, y2 = target[0], target[1] + BOX_H // 2
    bend = (x2 - x1) // 2
    path = f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2 - 6},{y2}"
    return Edge(path, label, kind, (x1 + x2) // 2, (y1 + y2) // 2 - 6)


def legend() -> Iterable[str]:
    """The states in the order the legend shows them."""
    return (*STATES, "none")
