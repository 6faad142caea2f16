"""A pipeline's definition, frozen: the snapshot stored in every run it triggers.

    >>> snapshot = SyncOrders.definition.to_json()       # what trigger stores
    >>> Definition.from_json(snapshot) == SyncOrders.definition
    True

:class:`Definition` and its nodes and edges (docs/semantics.md §1, format 1), read back
by :meth:`Definition.from_json` with one shape rule per check; how divert keys and step
outputs are rendered for matching (:func:`render_divert_key`). The builder that makes a
Definition is :mod:`ductwork.pipelines.definition`.

Not done here: :meth:`Definition.from_json` checks a stored snapshot's shape and
references only, it does not re-apply the builder's fan-in rules; nothing resolves or
imports a class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ductwork.errors import DefinitionError
from ductwork.pipelines.registry import in_main_module
from ductwork.values import Json

FORMAT = 1
EDGE_TYPES = ("chain", "expand", "divide", "combine", "collapse", "divert", "converge", "dampen")


# --------------------------------------------------------------------------- divert keys


def render_divert_key(value: object) -> str | None:
    """Render a divert key or a step output the way Ruby's ``to_s`` does (semantics §3.4).

        >>> [render_divert_key(v) for v in ("a", True, None, 1, 1.0, [1])]
        ['a', 'true', '', '1', '1.0', None]

    ``None`` means "matches no key": lists, dicts and other objects take ``otherwise``.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    return None


@dataclass(frozen=True)
class PartitionBy:
    """A partitioned ``limit_by=(family, field)`` (docs/semantics.md §5.1): a step's key is
    ``family[<value>]``, the value its input's positional argument ``arg`` (the position of
    the ``__init__`` parameter ``field`` names first), then each name after a dot in
    ``field`` looked up in a JSON object. Snapshotted as ``{"family", "field", "arg"}``."""

    family: str
    #: the parameter's name, or a dotted path into it (``order.account_id``)
    field: str
    #: the parameter's position among ``__init__``'s, after ``self``
    arg: int

    @staticmethod
    def valid(family: object, field: object) -> bool:
        """A family is a non-blank str without ``[``; a field is non-blank names joined by dots."""
        return (isinstance(family, str) and bool(family.strip()) and "[" not in family
                and isinstance(field, str) and all(name.strip() for name in field.split(".")))

    def __str__(self) -> str:
        return f"{self.family}[{self.field}]"


@dataclass(frozen=True)
class NodeSpec:
    """One node of a definition: the step class to run and its transition's options."""

    #: ``"module:qualname"`` of the Step subclass
    klass: str
    #: > 0 when set: the node's job becomes eligible this long after the step is created
    delay_us: int | None = None
    #: > 0 when set: an execution running longer ends ``timed_out``
    timeout_us: int | None = None
    #: a non-blank limit key, or None for the unkeyed lane; values come from config at claim time
    limit_by: str | None = None
    #: a partitioned ``limit_by`` (each step's key rendered from its input); ``limit_by`` is None
    partition: PartitionBy | None = None

    def to_json(self) -> dict[str, Json]:
        """``klass``, ``delay_us``, ``timeout_us`` and ``limit_by`` (a static key, null or a
        partition's object), in that order."""
        by = self.partition
        limit_by: Json = self.limit_by if by is None else {"family": by.family, "field": by.field, "arg": by.arg}
        return {"klass": self.klass, "delay_us": self.delay_us, "timeout_us": self.timeout_us, "limit_by": limit_by}


@dataclass(frozen=True)
class EdgeSpec:
    """The one outgoing edge of a node. Treat ``to`` and ``barrier`` as read-only."""

    #: one of :data:`EDGE_TYPES`
    type: str
    #: node names; for ``divert`` a dict from rendered key to node, always with ``"otherwise"``
    to: list[str] | dict[str, str]
    #: ``combine``/``collapse`` only: the nodes whose divide/expand this fan-in closes
    barrier: list[str] | None = None

    def first(self) -> str:
        """The first target of an edge whose ``to`` is a list (every kind but ``divert``)."""
        assert isinstance(self.to, list), self
        return self.to[0]

    def divert_target(self, key: str | None) -> str | None:
        """A ``divert`` edge's target for a rendered key: its own, else ``"otherwise"``'s."""
        assert isinstance(self.to, dict), self
        return (self.to.get(key) if key is not None else None) or self.to.get("otherwise")

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = {"type": self.type, "to": copy_targets(self.to)}
        if self.barrier is not None:
            out["barrier"] = list(self.barrier)
        return out


def copy_targets(to: list[str] | dict[str, str]) -> list[str] | dict[str, str]:
    """A copy of an edge's targets: a list of nodes, or a divert's rendered key -> node."""
    return dict(to) if isinstance(to, dict) else list(to)


@dataclass(frozen=True)
class Definition:
    """A pipeline's graph, frozen at class creation and snapshotted into each run.

        snapshot = SyncOrders.definition.to_json()      # what trigger stores
        Definition.from_json(snapshot) == SyncOrders.definition

    Routing reads only the run's snapshot, so a run is immune to later edits of
    ``define``; classes are still resolved by reference when a step runs.
    """

    #: ``"module:qualname"`` of the Pipeline subclass
    pipeline: str
    #: the node ``trigger`` creates the first step for
    start: str
    #: every node by name, in creation order
    nodes: dict[str, NodeSpec]
    #: the outgoing edge of each non-leaf node, in node order
    edges: dict[str, EdgeSpec]
    #: ``"module:qualname"`` of the ``on_halt`` handler (a Step subclass); None: no hook
    on_halt: str | None = None

    def to_json(self) -> dict[str, Json]:
        """The format-1 snapshot: plain dicts, lists, strs, ints and None; deterministic order.

        ``on_halt`` is written only when a handler is declared, so a definition without
        one has the snapshot (and the digest) it had before hooks existed."""
        out: dict[str, Json] = {
            "format": FORMAT,
            "pipeline": self.pipeline,
            "start": self.start,
            "nodes": {name: node.to_json() for name, node in self.nodes.items()},
            "edges": {name: edge.to_json() for name, edge in self.edges.items()},
        }
        if self.on_halt is not None:
            out["on_halt"] = self.on_halt
        return out

    @classmethod
    def from_json(cls, data: object) -> Definition:
        """Read a snapshot back; ``DefinitionError(pipeline, "snapshot", …)`` on any bad shape."""
        return _SnapshotReader(data).read()

    def limit_keys(self) -> set[str]:
        """Every static ``limit_by`` key the nodes reference (boot validation checks each has config)."""
        return {node.limit_by for node in self.nodes.values() if node.limit_by is not None}

    def limit_families(self) -> set[str]:
        """Every key family the nodes partition by (boot validation checks each has a family entry)."""
        return {node.partition.family for node in self.nodes.values() if node.partition is not None}

    def node_options(self, node: str) -> NodeSpec:
        """The spec of ``node`` (klass, delay_us, timeout_us, limit_by); KeyError if unknown."""
        try:
            return self.nodes[node]
        except KeyError:
            raise KeyError(f"{self.pipeline} has no node {node!r}") from None


_SNAPSHOT_KEYS = {"format", "pipeline", "start", "nodes", "edges"}
#: keys a snapshot may add (absent from every snapshot written before they existed)
_OPTIONAL_KEYS = {"on_halt"}
_NODE_KEYS = {"klass", "delay_us", "timeout_us", "limit_by"}


class _SnapshotReader:
    """Shape checks for :meth:`Definition.from_json`, one rule per line."""

    def __init__(self, data: Any):
        self.data = data
        name = data.get("pipeline") if isinstance(data, dict) else None
        self.name = name if isinstance(name, str) and name else "<snapshot>"

    def check(self, ok: bool, reason: str) -> None:
        if not ok:
            raise DefinitionError(self.name, "snapshot", reason)

    def read(self) -> Definition:
        data = self.data
        self.check(isinstance(data, dict), f"expected a JSON object, got {type(data).__name__}")
        self.check(type(data.get("format")) is int and data["format"] == FORMAT,
                   f"format={data.get('format')!r}: only format {FORMAT} is understood")
        self.check(_SNAPSHOT_KEYS <= set(data) <= _SNAPSHOT_KEYS | _OPTIONAL_KEYS,
                   f"expected keys {sorted(_SNAPSHOT_KEYS)} (and optionally {sorted(_OPTIONAL_KEYS)}), "
                   f"got {sorted(data)}")
        on_halt = data.get("on_halt")
        self.check(on_halt is None or (isinstance(on_halt, str) and ":" in on_halt),
                   f"on_halt must be 'module:qualname', got {on_halt!r}")
        self.check(isinstance(data["pipeline"], str) and ":" in data["pipeline"],
                   f"pipeline must be 'module:qualname', got {data['pipeline']!r}")
        self.check(isinstance(data["nodes"], dict) and bool(data["nodes"]),
                   "nodes must be a non-empty object")
        nodes = {name: self.node(name, raw) for name, raw in data["nodes"].items()}
        self.check(isinstance(data["start"], str) and data["start"] in nodes,
                   f"start {data['start']!r} is not a node")
        self.check(isinstance(data["edges"], dict), "edges must be an object")
        edges = {name: self.edge(name, raw, nodes) for name, raw in data["edges"].items()}
        return Definition(data["pipeline"], data["start"], nodes, edges, on_halt)

    def node(self, name: str, raw: Any) -> NodeSpec:
        where = f"node {name!r}"
        self.check(isinstance(raw, dict) and set(raw) == _NODE_KEYS,
                   f"{where}: expected keys {sorted(_NODE_KEYS)}, got {raw!r}")
        self.check(isinstance(raw["klass"], str) and ":" in raw["klass"],
                   f"{where}: klass must be 'module:qualname', got {raw['klass']!r}")
        for key in ("delay_us", "timeout_us"):
            self.check(raw[key] is None or (type(raw[key]) is int and raw[key] > 0),
                       f"{where}: {key} must be a positive int or null, got {raw[key]!r}")
        limit_by, by = raw["limit_by"], None
        if isinstance(limit_by, dict):
            arg = limit_by.get("arg")
            self.check(set(limit_by) == {"family", "field", "arg"} and type(arg) is int and arg >= 0
                       and PartitionBy.valid(limit_by["family"], limit_by["field"]),
                       f"{where}: a partitioned limit_by must be {{family, field, arg}} (a non-blank family "
                       f"without '[', a dotted field, an int arg >= 0), got {limit_by!r}")
            by = PartitionBy(limit_by["family"], limit_by["field"], limit_by["arg"])
            limit_by = None
        self.check(limit_by is None or (isinstance(limit_by, str) and bool(limit_by.strip())),
                   f"{where}: limit_by must be a non-blank str or null, got {limit_by!r}")
        return NodeSpec(raw["klass"], raw["delay_us"], raw["timeout_us"], limit_by, by)

    def edge(self, source: str, raw: Any, nodes: dict[str, NodeSpec]) -> EdgeSpec:
        where = f"edge from {source!r}"
        self.check(source in nodes, f"{where}: no such node")
        self.check(isinstance(raw, dict) and raw.get("type") in EDGE_TYPES,
                   f"{where}: type must be one of {', '.join(EDGE_TYPES)}, got {raw!r}")
        kind, to = raw["type"], raw.get("to")
        fan_in = kind in ("combine", "collapse")
        keys = {"type", "to", "barrier"} if fan_in else {"type", "to"}
        self.check(set(raw) == keys, f"{where}: expected keys {sorted(keys)}, got {sorted(raw)}")
        if kind == "divert":
            self.check(isinstance(to, dict) and "otherwise" in to,
                       f"{where}: divert 'to' must be an object with an 'otherwise' key, "
                       f"got {to!r}")
        elif kind == "divide":
            self.check(isinstance(to, list) and len(to) >= 1,
                       f"{where}: divide 'to' must be a list of node names, got {to!r}")
        else:
            self.check(isinstance(to, list) and len(to) == 1,
                       f"{where}: {kind} 'to' must be a list of one node name, got {to!r}")
        self.check(self.names(list(to.values()) if kind == "divert" else to, nodes),
                   f"{where}: 'to' names unknown nodes: {to!r}")
        barrier = raw.get("barrier")
        if fan_in:
            self.check(isinstance(barrier, list) and bool(barrier) and self.names(barrier, nodes),
                       f"{where}: barrier must be a non-empty list of node names, got {barrier!r}")
        return EdgeSpec(kind, copy_targets(to), list(barrier) if fan_in else None)

    @staticmethod
    def names(values: list[Any], nodes: dict[str, NodeSpec]) -> bool:
        return all(isinstance(value, str) and value in nodes for value in values)


def main_module_refs(definition: Definition) -> list[str]:
    """The pipeline's, the nodes' and the on_halt handler's class references that live in
    ``__main__``, in order."""
    refs = [definition.pipeline, *(node.klass for node in definition.nodes.values()), definition.on_halt]
    return [ref for ref in dict.fromkeys(refs) if ref is not None and in_main_module(ref)]
