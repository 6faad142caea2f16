"""Pipeline definitions: the builder ``define`` receives, the frozen snapshot, class references.

    class SyncOrders(Pipeline):
        @classmethod
        def define(cls, pipeline):
            pipeline.start(Fetch).expand(to=Push, limit_by="vendor_api").collapse(into=Record)

``SyncOrders.definition`` is a :class:`Definition`; its :meth:`Definition.to_json` is
the snapshot (docs/semantics.md §1, format 1) frozen into every run it triggers.

Guarantees:

- Every definition error raises while the Pipeline subclass is created, as a
  :class:`~ductwork.errors.DefinitionError` (or subclass) naming the class and the
  transition.
- A definition that builds has a runnable shape: every fan-in closes the innermost
  open fan-out of every path into it, and a combine joins every branch of its divide,
  so each barrier's run-time arrival counter can reach its width and never meets a
  sibling from another fan-out (shape preconditions of INV-ADV-1 and INV-ADV-3).
- Node names are ``"<ClassName>#<i>"`` in creation order: the same ``define`` gives
  the same snapshot, byte for byte under ``json.dumps``.

Not done here: nothing touches a database or imports a step's module at build time;
:meth:`Definition.from_json` checks a stored snapshot's shape and references only,
it does not re-apply the builder's fan-in rules.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ductwork.durations import parse_interval_us
from ductwork.errors import (
    CollapseError,
    CombineError,
    ConvergeError,
    DefinitionError,
    DivertError,
    DurationError,
    MainModuleError,
    StartError,
    UnknownStepClassError,
)
from ductwork.pipelines.step import Step, check_execute

FORMAT = 1
EDGE_TYPES = ("chain", "expand", "divide", "combine", "collapse", "divert", "converge", "dampen")


# --------------------------------------------------------------------------- divert keys


def render_divert_key(value: Any) -> str | None:
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


# --------------------------------------------------------------------------- class references

#: every class a definition referenced and every Pipeline subclass, by reference: the
#: classes of the pipelines this process defined (its configuration's, which every
#: worker imports at boot, and those its own code imported). Stored names resolve only
#: through it. Strong references: a class defined inside a function stays resolvable
#: for the life of the process. A later class with the same reference replaces the earlier.
_REGISTRY: dict[str, type] = {}


def step_ref(cls: type) -> str:
    """``"module:qualname"`` of a class: ``step_ref(Fetch) == "shop.steps:Fetch"``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register_class(cls: type) -> str:
    """Record ``cls`` under its reference, so resolving it needs no import; returns the ref."""
    ref = step_ref(cls)
    _REGISTRY[ref] = cls
    return ref


def referenced_class(ref: str) -> type | None:
    """The class a definition (or Pipeline subclass) created in this process registered as
    ``ref``, without importing anything; None when none did."""
    return _REGISTRY.get(ref)


def in_main_module(ref: str) -> bool:
    """Whether ``ref`` names a class of ``__main__``: the script (or ``python -m`` module)
    this process runs, which another process cannot import under that name."""
    return ref.partition(":")[0] == "__main__"


def main_module_refs(definition: Definition) -> list[str]:
    """The pipeline's, the nodes' and the on_halt handler's class references that live in
    ``__main__``, in order."""
    refs = [definition.pipeline, *(node.klass for node in definition.nodes.values())]
    if definition.on_halt is not None:
        refs.append(definition.on_halt)
    return [ref for ref in dict.fromkeys(refs) if in_main_module(ref)]


def resolve_step(ref: str) -> type[Step]:
    """The Step subclass a stored ``klass`` names, among the classes of the pipelines this
    process defined; :class:`~ductwork.errors.UnknownStepClassError` naming ``ref`` if it
    is none of them. Never imports: a name written into a row cannot make a worker import
    a module its configuration does not."""
    return _resolve(ref, Step, "step")


def _resolve(ref: str, base: type, what: str) -> type:
    """The registry, else a name in a module a registered class comes from (an alias such
    as ``OldName = NewName`` left for running runs), looked up in the module already
    imported. Anything else is unknown; nothing is imported."""
    found: object = _REGISTRY.get(ref)
    if found is None:
        module_name, _, qualname = ref.partition(":")
        module = sys.modules.get(module_name) if module_name in _registered_modules() else None
        found = module
        for part in qualname.split(".") if module is not None and qualname else ():
            found = getattr(found, part, None)
        if found is None or found is module:
            raise UnknownStepClassError(what, ref)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise UnknownStepClassError(what, ref, f"names {found!r}, not a {base.__name__} subclass")
    return found


def _registered_modules() -> set[str]:
    return {cls.__module__ for cls in list(_REGISTRY.values())}


def _import(ref: str, what: str) -> Any:
    module_name, _, qualname = ref.partition(":")
    cannot = f"cannot resolve {what} class {ref!r}"
    if not module_name or not qualname:
        raise ImportError(f"{cannot}: expected 'module:qualname'")
    if "<locals>" in qualname:
        raise ImportError(
            f"{cannot}: it is defined inside a function and no definition in this process "
            "referenced it (such classes resolve only where they were defined)",
            name=module_name,
        )
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"{cannot}: {exc}", name=module_name) from exc
    if ref in _REGISTRY:  # importing the module created (and registered) it
        return _REGISTRY[ref]
    for part in qualname.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ImportError(
                f"{cannot}: module {module_name!r} has no {qualname!r}", name=module_name
            ) from None
    return found


# --------------------------------------------------------------------------- the snapshot


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

    def to_json(self) -> dict[str, Any]:
        return {
            "klass": self.klass,
            "delay_us": self.delay_us,
            "timeout_us": self.timeout_us,
            "limit_by": self.limit_by,
        }


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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "to": _copy(self.to)}
        if self.barrier is not None:
            out["barrier"] = list(self.barrier)
        return out


def _copy(to: list[str] | dict[str, str]) -> list[str] | dict[str, str]:
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

    def to_json(self) -> dict[str, Any]:
        """The format-1 snapshot: plain dicts, lists, strs, ints and None; deterministic order.

        ``on_halt`` is written only when a handler is declared, so a definition without
        one has the snapshot (and the digest) it had before hooks existed."""
        out: dict[str, Any] = {
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
    def from_json(cls, data: Any) -> Definition:
        """Read a snapshot back; ``DefinitionError(pipeline, "snapshot", …)`` on any bad shape."""
        return _SnapshotReader(data).read()

    def limit_keys(self) -> set[str]:
        """Every ``limit_by`` key the nodes reference (boot validation checks each has config)."""
        return {node.limit_by for node in self.nodes.values() if node.limit_by is not None}

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


def _positive_int(value: Any) -> bool:
    return type(value) is int and value > 0


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
            self.check(raw[key] is None or _positive_int(raw[key]),
                       f"{where}: {key} must be a positive int or null, got {raw[key]!r}")
        limit_by = raw["limit_by"]
        self.check(limit_by is None or (isinstance(limit_by, str) and bool(limit_by.strip())),
                   f"{where}: limit_by must be a non-blank str or null, got {limit_by!r}")
        return NodeSpec(raw["klass"], raw["delay_us"], raw["timeout_us"], limit_by)

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
            targets = list(to.values())
        elif kind == "divide":
            self.check(isinstance(to, list) and len(to) >= 1,
                       f"{where}: divide 'to' must be a list of node names, got {to!r}")
            targets = to
        else:
            self.check(isinstance(to, list) and len(to) == 1,
                       f"{where}: {kind} 'to' must be a list of one node name, got {to!r}")
            targets = to
        self.check(self.names(targets, nodes), f"{where}: 'to' names unknown nodes: {to!r}")
        barrier = raw.get("barrier")
        if fan_in:
            self.check(isinstance(barrier, list) and bool(barrier) and self.names(barrier, nodes),
                       f"{where}: barrier must be a non-empty list of node names, got {barrier!r}")
        return EdgeSpec(kind, _copy(to), list(barrier) if fan_in else None)

    @staticmethod
    def names(values: list[Any], nodes: dict[str, NodeSpec]) -> bool:
        return all(isinstance(value, str) and value in nodes for value in values)


# --------------------------------------------------------------------------- the builder

#: fan-in transition -> the fan-out it closes
_CLOSES = {"combine": "divide", "collapse": "expand", "converge": "divert"}
#: transition -> the error class for its structural mistakes
_ERRORS: dict[str, type[DefinitionError]] = {
    "combine": CombineError, "collapse": CollapseError, "converge": ConvergeError,
}
_GERUND = {
    "chain": "chaining", "expand": "expanding", "collapse": "collapsing", "divide": "dividing",
    "combine": "combining", "divert": "diverting", "converge": "converging",
    "dampen": "dampening", "unpack": "unpacking",
}
_PAST = {"divide": "divided", "expand": "expanded", "divert": "diverted"}


@dataclass(frozen=True)
class _Frame:
    """An open fan-out (divide, expand or divert) and the nodes it fans out from."""

    kind: str
    sources: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.kind} at {', '.join(self.sources)}"


class _Graph:
    """The mutable state of one ``define`` call, shared by every builder handed out for it."""

    def __init__(self, pipeline: type):
        self.name = pipeline.__name__
        self.ref = step_ref(pipeline)
        self.nodes: dict[str, NodeSpec] = {}
        self.edges: dict[str, EdgeSpec] = {}
        self.start: str | None = None
        self.on_halt: str | None = None
        self.frozen = False

    def error(self, transition: str, reason: str, kind: type[DefinitionError] = DefinitionError) -> DefinitionError:
        return kind(self.name, transition, reason)

    def options(self, transition: str, delay: Any, timeout: Any, limit_by: Any) -> dict[str, Any]:
        """Validate ``delay=``/``timeout=``/``limit_by=`` into NodeSpec fields."""
        parsed: dict[str, Any] = {"delay_us": None, "timeout_us": None, "limit_by": None}
        for key, value in (("delay", delay), ("timeout", timeout)):
            if value is not None:
                try:
                    parsed[f"{key}_us"] = parse_interval_us(value)
                except DurationError as exc:
                    raise self.error(transition, f"{key}={exc}") from exc
        if limit_by is not None:
            if not isinstance(limit_by, str) or not limit_by.strip():
                raise self.error(transition, f"limit_by must be a non-blank str, got {limit_by!r}")
            parsed["limit_by"] = limit_by
        return parsed

    def add_nodes(self, transition: str, classes: list[Any], options: dict[str, Any]) -> list[str]:
        """Check every class, then add one node per class (all or none)."""
        for klass in classes:
            if not _is_step_class(klass):
                what = ("Arguments must be valid step classes (Step subclasses" if len(classes) > 1
                        else "Argument must be a valid step class (a Step subclass")
                raise self.error(transition, f"{what} defining execute(self)), got {klass!r}")
            check_execute(klass)  # (again: execute may have been replaced after the class statement)
            if options["timeout_us"] is not None and in_main_module(step_ref(klass)):
                raise self.error(transition, f"{klass.__qualname__} is defined in __main__ and has "
                                             "timeout=, so it runs in a child process, which cannot "
                                             "import __main__: move it into an importable module",
                                 MainModuleError)
        names = []
        for klass in classes:
            name = f"{klass.__name__}#{len(self.nodes)}"
            self.nodes[name] = NodeSpec(register_class(klass), **options)
            names.append(name)
        return names

    def connect(self, sources: list[str], kind: str, to: list[str] | dict[str, str],
                barrier: tuple[str, ...] | None = None) -> None:
        for source in sources:
            assert source not in self.edges, f"{self.name}: node {source} already has an edge"
            fan_in = None if barrier is None else list(barrier)
            self.edges[source] = EdgeSpec(kind, _copy(to), fan_in)

    def freeze(self) -> Definition:
        assert self.start is not None
        self.frozen = True
        edges = {name: self.edges[name] for name in self.nodes if name in self.edges}
        return Definition(self.ref, self.start, dict(self.nodes), edges, self.on_halt)


def _is_step_class(klass: Any) -> bool:
    """A Step subclass that overrides ``execute`` with a method callable without arguments."""
    if not (isinstance(klass, type) and issubclass(klass, Step)):
        return False
    raw = inspect.getattr_static(klass, "execute")
    if raw is Step.__dict__["execute"]:
        return False
    unbound = () if isinstance(raw, (staticmethod, classmethod)) else (None,)
    try:
        inspect.signature(klass.execute).bind(*unbound)
    except (TypeError, ValueError):
        return False
    return True


def build_definition(pipeline: type, define: Callable[[PipelineBuilder], object]) -> Definition:
    """Call ``define`` with a fresh builder and freeze what it built.

    Raises the builder's DefinitionError unchanged, and StartError if ``start`` never
    ran. Builders handed out are unusable afterwards.
    """
    graph = _Graph(pipeline)
    define(PipelineBuilder(graph))
    if graph.start is None:
        raise graph.error("define", "Must start pipeline definition before completing", StartError)
    return graph.freeze()


class PipelineBuilder:
    """The cursor ``define`` receives; every transition adds nodes after the current last nodes.

        pipeline.start(Fetch).divide(to=[Bill, Ship]).combine(into=Notify)
        bill, ship = pipeline.start(Fetch).divide(to=[Bill, Ship]); bill.chain(to=Audit)

    Each transition takes ``delay=``, ``timeout=`` (positive seconds, ``timedelta`` or
    duration string) and ``limit_by=`` (non-blank ``str``); they apply to the node(s)
    the transition creates. Transitions return the builder to continue on.

    ``divide``/``divert`` return a fork. Chained on, it acts on every branch at once
    (``.chain(to=D)`` adds ONE node D after each branch's last node; at run time each
    branch runs its own D step). Unpacked right away, it yields one branch builder per
    target; ``first.combine(*others, into=K)`` (``converge`` for a divert) joins every
    branch and returns the builder that forked, now at K. Using the forking builder
    before that continues from every branch's last node, provided no branch left a
    fan-out open.
    """

    def __init__(self, graph: _Graph, tips: list[str] | None = None,
                 parent: PipelineBuilder | None = None, index: int = 0):
        self._graph = graph
        self._tips: list[str] = tips or []   # the nodes the next transition leaves from
        self._stack: list[_Frame] = []       # fan-outs opened on this builder, innermost last
        self._parent = parent                # the builder whose fork this branch came from
        self._index = index                  # position of this branch in the parent's fork
        self._fork: list[str] | None = None  # targets of a divide/divert that may be unpacked
        self._children: list[PipelineBuilder] | None = None  # branches unpacked, not joined
        self._closed = False                 # joined into the parent; unusable

    def __repr__(self) -> str:
        return f"<PipelineBuilder {self._graph.name} at {', '.join(self._tips) or '(unstarted)'}>"

    # ----------------------------------------------------------------- transitions

    def start(self, klass: type[Step], *, delay: Any = None, timeout: Any = None,
              limit_by: Any = None) -> PipelineBuilder:
        """Add the first node; exactly once per definition."""
        graph = self._graph
        self._check_usable("start")
        if graph.start is not None:
            raise graph.error("start", "Can only start pipeline definition once", StartError)
        [node] = graph.add_nodes("start", [klass], graph.options("start", delay, timeout, limit_by))
        graph.start = node
        self._tips = [node]
        return self

    def chain(self, *, to: type[Step], delay: Any = None, timeout: Any = None,
              limit_by: Any = None) -> PipelineBuilder:
        """Run ``to`` with the last step's output."""
        return self._extend("chain", to, delay, timeout, limit_by)

    def expand(self, *, to: type[Step], delay: Any = None, timeout: Any = None,
               limit_by: Any = None) -> PipelineBuilder:
        """Run one ``to`` step per item of the last step's output (a list); close with collapse."""
        return self._extend("expand", to, delay, timeout, limit_by)

    def dampen(self, *, before: type[Step], delay: Any = None, timeout: Any = None,
               limit_by: Any = None) -> PipelineBuilder:
        """Pause the branch until ``run.resume(input=...)``, then run ``before``."""
        return self._extend("dampen", before, delay, timeout, limit_by)

    def divide(self, *, to: list[type[Step]], delay: Any = None, timeout: Any = None,
               limit_by: Any = None) -> PipelineBuilder:
        """Run each class of ``to`` on its own branch with the last output; close with combine."""
        self._begin("divide")
        if not isinstance(to, (list, tuple)) or not to:
            raise self._graph.error(
                "divide", f"to must be a non-empty list of step classes, got {to!r}")
        return self._fan_out("divide", list(to), None, delay, timeout, limit_by)

    def divert(self, *, to: Mapping[Any, type[Step]], delay: Any = None, timeout: Any = None,
               limit_by: Any = None) -> PipelineBuilder:
        """Run the class whose key renders like the last output (semantics §3.4), else otherwise."""
        self._begin("divert")
        graph = self._graph
        if not isinstance(to, Mapping) or "otherwise" not in to:
            raise graph.error("divert", f"Must define an 'otherwise' target when diverting, "
                                        f"got {to!r}", DivertError)
        keys: dict[str, Any] = {}
        for key in to:
            text = render_divert_key(key)
            if text is None:
                raise graph.error("divert", f"key {key!r} can never match a step output "
                                            "(keys are str, int, float, bool or None)", DivertError)
            if text in keys:
                raise graph.error("divert", f"keys {keys[text]!r} and {key!r} both render as "
                                            f"{text!r}", DivertError)
            keys[text] = key
        return self._fan_out("divert", list(to.values()), list(keys), delay, timeout, limit_by)

    def combine(self, *others: PipelineBuilder, into: type[Step], delay: Any = None,
                timeout: Any = None, limit_by: Any = None) -> PipelineBuilder:
        """Close the innermost divide: run ``into`` once with every branch's output."""
        return self._fan_in("combine", others, into, delay, timeout, limit_by)

    def collapse(self, *, into: type[Step], delay: Any = None, timeout: Any = None,
                 limit_by: Any = None) -> PipelineBuilder:
        """Close the innermost expand: run ``into`` once with every item step's output."""
        return self._fan_in("collapse", (), into, delay, timeout, limit_by)

    def converge(self, *others: PipelineBuilder, into: type[Step], delay: Any = None,
                 timeout: Any = None, limit_by: Any = None) -> PipelineBuilder:
        """Close the innermost divert: whichever target ran, continue with ``into``."""
        return self._fan_in("converge", others, into, delay, timeout, limit_by)

    def on_halt(self, handler: type[Step]) -> PipelineBuilder:
        """Run ``handler`` (a Step subclass) once the run halts: exactly one hook per halted
        run, its outcome recorded once, its code at least once (docs/semantics.md,
        "on_halt hooks"). The handler's ``__init__`` takes one argument, the halt (a dict:
        ``run_id``, ``pipeline``, ``halt_reasons``, ``errors``); ``execute()`` does the work;
        :attr:`Step.idempotency_key` is the hook's id, the same on every attempt.
        At most once per definition, anywhere in ``define``."""
        graph = self._graph
        self._check_usable("on_halt")
        if graph.on_halt is not None:
            raise graph.error("on_halt", f"on_halt is declared once per pipeline, already {graph.on_halt!r}")
        if not _is_step_class(handler):
            raise graph.error("on_halt", "Argument must be a valid step class (a Step subclass defining "
                                         f"execute(self)), got {handler!r}")
        check_execute(handler)
        graph.on_halt = register_class(handler)
        return self

    def __iter__(self) -> Iterator[PipelineBuilder]:
        """Unpack a fork into branch builders, one per divide target or divert key, in order."""
        self._check_usable("unpack")
        if self._fork is None:
            raise self._graph.error(
                "unpack", "Can only unpack a divide() or divert() right after it")
        self._children = [PipelineBuilder(self._graph, [node], self, index)
                          for index, node in enumerate(self._fork)]
        self._fork = None
        return iter(self._children)

    # ----------------------------------------------------------------- internals

    def _check_usable(self, action: str) -> None:
        if self._graph.frozen:
            raise self._graph.error(action, "the definition is complete; a builder cannot be "
                                            "used after define() returns")
        if self._closed:
            raise self._graph.error(action, "this branch builder was joined into its parent; "
                                            "continue on the builder combine/converge returned")

    def _begin(self, action: str) -> None:
        """Checks common to every transition after start; joins unpacked branches back in."""
        self._check_usable(action)
        if self._graph.start is None:
            raise self._graph.error(action, f"Must start pipeline definition before "
                                            f"{_GERUND[action]}", StartError)
        self._settle(action)
        self._fork = None

    def _settle(self, action: str) -> None:
        """Continue from every unpacked branch's last nodes; each must have closed its fan-outs."""
        if self._children is None:
            return
        tips: list[str] = []
        for child in self._children:
            child._settle(action)
            child._check_closed(action, self._stack[-1])
            tips.extend(child._tips)
            child._closed = True
        self._tips = list(dict.fromkeys(tips))
        self._children = None

    def _check_closed(self, action: str, fork: _Frame) -> None:
        """A branch joining its fork must not leave a fan-out open (its fan-in would never fire)."""
        if self._stack:
            raise self._graph.error(
                action, f"branch {self._index} of the {fork} has an open {self._stack[-1]}; "
                        f"close it on that branch first", _ERRORS.get(action, DefinitionError))

    def _extend(self, kind: str, klass: Any, delay: Any, timeout: Any,
                limit_by: Any) -> PipelineBuilder:
        self._begin(kind)
        graph = self._graph
        [node] = graph.add_nodes(kind, [klass], graph.options(kind, delay, timeout, limit_by))
        graph.connect(self._tips, kind, [node])
        if kind == "expand":
            self._stack.append(_Frame(kind, tuple(self._tips)))
        self._tips = [node]
        return self

    def _fan_out(self, kind: str, classes: list[Any], keys: list[str] | None,
                 delay: Any, timeout: Any, limit_by: Any) -> PipelineBuilder:
        graph = self._graph
        nodes = graph.add_nodes(kind, classes, graph.options(kind, delay, timeout, limit_by))
        graph.connect(self._tips, kind, nodes if keys is None else dict(zip(keys, nodes, strict=True)))
        self._stack.append(_Frame(kind, tuple(self._tips)))
        self._tips = nodes
        self._fork = list(nodes)
        return self

    def _fan_in(self, kind: str, others: tuple[PipelineBuilder, ...], klass: Any,
                delay: Any, timeout: Any, limit_by: Any) -> PipelineBuilder:
        graph, error, closes = self._graph, _ERRORS[kind], _CLOSES[kind]
        if others or (kind != "collapse" and self._parent is not None and not self._stack):
            owner = self._join_branches(kind, others)  # a branch with nothing open joins its fork
        else:
            self._begin(kind)
            if not self._stack:
                raise graph.error(kind, f"Must {closes} pipeline definition before "
                                        f"{_GERUND[kind]}", error)
            owner = self
        frame = owner._stack[-1]
        if frame.kind != closes:
            raise graph.error(kind, f"Ambiguous {kind} on most recently {_PAST[frame.kind]} "
                                    f"definition", error)
        owner._settle(kind)
        [node] = graph.add_nodes(kind, [klass], graph.options(kind, delay, timeout, limit_by))
        graph.connect(owner._tips, kind, [node], None if kind == "converge" else frame.sources)
        owner._stack.pop()
        owner._tips = [node]
        return owner

    def _join_branches(self, kind: str, others: tuple[Any, ...]) -> PipelineBuilder:
        """``first.combine(*others, into=K)``: all branches of one fork; returns the forking one."""
        graph, error = self._graph, _ERRORS[kind]
        branches = [self, *others]
        for branch in branches:
            if not isinstance(branch, PipelineBuilder) or branch._graph is not graph:
                raise graph.error(kind, f"can only {kind} branch builders of this definition, "
                                        f"got {branch!r}", error)
            branch._check_usable(kind)
        parent = self._parent
        siblings = parent._children if parent is not None else None
        if parent is None or siblings is None or any(branch not in siblings for branch in branches):
            raise graph.error(
                kind, f"can only {kind} branch builders unpacked from one fork", error)
        if len({id(branch) for branch in branches}) != len(branches):
            raise graph.error(kind, f"the same branch builder is passed to {kind} twice", error)
        if len(branches) != len(siblings):
            raise graph.error(kind, f"{kind} must join every branch of the {parent._stack[-1]}: "
                                    f"got {len(branches)} of {len(siblings)}", error)
        return parent
