"""Defining a pipeline: the builder ``define`` receives, which freezes into a Definition.

    class SyncOrders(Pipeline):
        @classmethod
        def define(cls, pipeline):
            pipeline.start(Fetch).expand(to=Push, limit_by="vendor_api").collapse(into=Record)

``SyncOrders.definition`` is a :class:`~ductwork.pipelines.snapshot.Definition`; its
``to_json`` is the snapshot (docs/semantics.md §1, format 1) frozen into every run it
triggers (:mod:`ductwork.pipelines.snapshot`). The classes it names are registered by
reference (:mod:`ductwork.pipelines.registry`).

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
- The names a run stores (class references, node names, ``limit_by`` keys and families)
  fit their columns and have no whitespace around them, which MySQL-family would ignore
  when comparing (``"acct "`` would be ``"acct"``'s key there, another one elsewhere).

Not done here: nothing touches a database or imports a step's module at build time.
"""

from __future__ import annotations

import inspect
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
)
from ductwork.limit_entries import MAX_FAMILY_CHARS, MAX_KEY_CHARS, has_whitespace_around
from ductwork.pipelines.registry import in_main_module, register_class, step_ref
from ductwork.pipelines.snapshot import Definition, EdgeSpec, NodeSpec, PartitionBy, copy_targets, render_divert_key
from ductwork.pipelines.step import Step, check_execute
from ductwork.values import Json

# --------------------------------------------------------------------------- the builder

#: the most characters of a name a run stores: a class's ``module:qualname`` (the pipeline's,
#: a step's, the on_halt handler's) and a node's name, in ``schema.Name`` columns. SQLite
#: stores a longer one; PostgreSQL and MySQL refuse it, at a trigger or deep in a worker's
#: transaction, so it is refused here (tests/unit/test_column_widths.py holds it to the columns)
NAME_LIMIT = 255

#: fan-in transition -> the fan-out it closes
_CLOSES = {"combine": "divide", "collapse": "expand", "converge": "divert"}
#: transition -> the error class for its structural mistakes
_ERRORS: dict[str, type[DefinitionError]] = {
    "combine": CombineError, "collapse": CollapseError, "converge": ConvergeError,
}


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

    def check_name(self, transition: str, what: str, name: str, limit: int = NAME_LIMIT) -> None:
        """Raise unless ``name`` (``what`` it is) has at most ``limit`` characters, as stored,
        and no whitespace around it (MySQL-family would compare it equal to another name)."""
        if len(name) > limit:
            raise self.error(transition, f"{what} has {len(name)} characters, more than the {limit} a run "
                                         f"stores: {name[:80]!r}…")
        if has_whitespace_around(name):
            raise self.error(transition, f"{what} has whitespace around it, which MySQL-family ignores when it "
                                         f"compares names: {name!r}")

    def add_nodes(self, transition: str, classes: list[Any], delay: object, timeout: object,
                  limit_by: object) -> list[str]:
        """Validate ``delay=``/``timeout=``/``limit_by=`` into NodeSpec fields, check every
        class, then add one node per class with them (all or none)."""
        parsed: dict[str, Any] = {}
        for key, value in (("delay", delay), ("timeout", timeout)):
            try:
                parsed[f"{key}_us"] = None if value is None else parse_interval_us(value)
            except DurationError as exc:
                raise self.error(transition, f"{key}={exc}") from exc
        parsed["limit_by"], by = self.limit_option(transition, limit_by)
        partitions: list[PartitionBy | None] = []
        for i, klass in enumerate(classes):
            self.check_class(transition, klass, several=len(classes) > 1)
            self.check_name(transition, "the node name", f"{klass.__name__}#{len(self.nodes) + i}")
            if parsed["timeout_us"] is not None and in_main_module(step_ref(klass)):
                raise self.error(transition, f"{klass.__qualname__} is defined in __main__ and has "
                                             "timeout=, so it runs in a child process, which cannot "
                                             "import __main__: move it into an importable module",
                                 MainModuleError)
            partitions.append(None if by is None else PartitionBy(*by, self.argument(transition, klass, by[1])))
            if transition != "start":  # every other transition builds its step from one input
                try:
                    klass._ductwork_bind([None])
                except TypeError:
                    raise self.error(transition, f"{klass.__qualname__}.__init__{inspect.signature(klass.__init__)} "
                                                 f"must take one input: a step after start gets one (a chain's the "
                                                 f"output, an expand's one item); take it whole and read its "
                                                 f"fields") from None
        for klass, partition in zip(classes, partitions, strict=True):
            name = f"{klass.__name__}#{len(self.nodes)}"
            self.nodes[name] = NodeSpec(register_class(klass), **parsed, partition=partition)
        return list(self.nodes)[-len(classes):]  # the nodes just added

    def check_class(self, transition: str, klass: Any, *, several: bool = False) -> None:
        """Raise unless ``klass`` is a valid step class (``several``: one of the transition's)."""
        if not _is_step_class(klass):
            what = ("Arguments must be valid step classes (Step subclasses" if several
                    else "Argument must be a valid step class (a Step subclass")
            raise self.error(transition, f"{what} defining execute(self)), got {klass!r}")
        check_execute(klass)  # (again: execute may have been replaced after the class statement)
        self.check_name(transition, f"{klass.__qualname__}'s reference", step_ref(klass))

    def limit_option(self, transition: str, limit_by: object) -> tuple[str | None, tuple[str, str] | None]:
        """``limit_by=`` as a static key or a partition's ``(family, field)``, at most one set."""
        if isinstance(limit_by, (tuple, list)):
            if len(limit_by) != 2 or not PartitionBy.valid(*limit_by):
                raise self.error(transition, "limit_by must be a key or a (family, field) pair: a non-blank family "
                                             f"without '[' and a field 'name' or 'name.sub', got {limit_by!r}")
            # the shortest partition key, family[0], fits the key columns
            self.check_name(transition, "limit_by's family", limit_by[0], MAX_FAMILY_CHARS)
            return None, (limit_by[0], limit_by[1])
        if limit_by is None or (isinstance(limit_by, str) and limit_by.strip()):
            if limit_by is not None:
                self.check_name(transition, "limit_by", limit_by, MAX_KEY_CHARS)
            return limit_by, None
        raise self.error(transition, f"limit_by must be a non-blank str, got {limit_by!r}")

    def argument(self, transition: str, klass: Any, field: str) -> int:
        """The position (after ``self``) of the ``__init__`` parameter a partition's ``field``
        names first: a plain positional one, not ``*args``, ``**kwargs`` or keyword-only."""
        signature = inspect.signature(klass.__init__)  # (a Step subclass's: a Python function, or object's)
        params = list(signature.parameters.values())[1:]
        index = next((i for i, p in enumerate(params) if p.name == field.split(".")[0]
                      and p.kind <= p.POSITIONAL_OR_KEYWORD), None)
        if index is None:
            raise self.error(transition, f"limit_by field {field.split('.')[0]!r} is no parameter of "
                                         f"{klass.__qualname__}.__init__{signature}")
        return index


def _is_step_class(klass: Any) -> bool:
    """A Step subclass that overrides ``execute`` with a method callable without arguments."""
    if not (isinstance(klass, type) and issubclass(klass, Step)):
        return False
    raw = inspect.getattr_static(klass, "execute")
    unbound = () if isinstance(raw, (staticmethod, classmethod)) else (None,)
    try:
        inspect.signature(klass.execute).bind(*unbound)
    except (TypeError, ValueError):
        return False
    return raw is not Step.__dict__["execute"]


def build_definition(pipeline: type, define: Callable[[PipelineBuilder], object]) -> Definition:
    """Call ``define`` with a fresh builder and freeze what it built.

    Raises the builder's DefinitionError unchanged, and StartError if ``start`` never
    ran. Builders handed out are unusable afterwards.
    """
    graph = _Graph(pipeline)
    graph.check_name("define", "the pipeline's reference", graph.ref)
    define(PipelineBuilder(graph))
    if graph.start is None:
        raise graph.error("define", "Must start pipeline definition before completing", StartError)
    graph.frozen = True
    edges = {name: graph.edges[name] for name in graph.nodes if name in graph.edges}
    return Definition(graph.ref, graph.start, dict(graph.nodes), edges, graph.on_halt)


class PipelineBuilder:
    """The cursor ``define`` receives; every transition adds nodes after the current last nodes.

        pipeline.start(Fetch).divide(to=[Bill, Ship]).combine(into=Notify)
        bill, ship = pipeline.start(Fetch).divide(to=[Bill, Ship]); bill.chain(to=Audit)

    Each transition takes ``delay=``, ``timeout=`` (positive seconds, ``timedelta`` or
    duration string) and ``limit_by=`` (a non-blank ``str`` key without whitespace around
    it, or ``(family, field)``: each step's key is its partition of the family, ``field`` a
    parameter of the class's ``__init__`` or a dotted path into it, docs/semantics.md
    §5.1); they apply to the node(s) the transition creates. Transitions return the
    builder to continue on.

    ``divide``/``divert`` return a fork. Chained on, it acts on every branch at once
    (``.chain(to=D)`` adds ONE node D after each branch's last node; at run time each
    branch runs its own D step). Unpacked right away, it yields one branch builder per
    target; ``first.combine(*others, into=K)`` (``converge`` for a divert) joins every
    branch and returns the builder that forked, now at K. Using the forking builder
    before that continues from every branch's last node, provided no branch left a
    fan-out open.
    """

    def __init__(self, graph: _Graph, tips: list[str] | None = None, parent: PipelineBuilder | None = None):
        self._graph = graph
        self._tips: list[str] = tips or []   # the nodes the next transition leaves from
        self._stack: list[_Frame] = []       # fan-outs opened on this builder, innermost last
        self._parent = parent                # the builder whose fork this branch came from
        self._fork: list[str] | None = None  # targets of a divide/divert that may be unpacked
        self._children: list[PipelineBuilder] | None = None  # branches unpacked, not joined
        self._closed = False                 # joined into the parent; unusable

    def __repr__(self) -> str:
        return f"<PipelineBuilder {self._graph.name} at {', '.join(self._tips) or '(unstarted)'}>"

    # ----------------------------------------------------------------- transitions

    def start(self, klass: type[Step], *, delay: object = None, timeout: object = None,
              limit_by: object = None) -> PipelineBuilder:
        """Add the first node; exactly once per definition."""
        graph = self._graph
        self._check_usable("start")
        if graph.start is not None:
            raise graph.error("start", "Can only start pipeline definition once", StartError)
        self._extend("start", [klass], delay, timeout, limit_by)  # (no last nodes yet: no edge)
        graph.start = self._tips[0]
        return self

    def chain(self, *, to: type[Step], delay: object = None, timeout: object = None,
              limit_by: object = None) -> PipelineBuilder:
        """Run ``to`` with the last step's output."""
        return self._begin("chain")._extend("chain", [to], delay, timeout, limit_by)

    def expand(self, *, to: type[Step], delay: object = None, timeout: object = None,
               limit_by: object = None) -> PipelineBuilder:
        """Run one ``to`` step per item of the last step's output (a list); close with collapse."""
        return self._begin("expand")._extend("expand", [to], delay, timeout, limit_by)

    def dampen(self, *, before: type[Step], delay: object = None, timeout: object = None,
               limit_by: object = None) -> PipelineBuilder:
        """Pause the branch until ``run.resume(input=...)``, then run ``before``."""
        return self._begin("dampen")._extend("dampen", [before], delay, timeout, limit_by)

    def divide(self, *, to: list[type[Step]], delay: object = None, timeout: object = None,
               limit_by: object = None) -> PipelineBuilder:
        """Run each class of ``to`` on its own branch with the last output; close with combine."""
        self._begin("divide")
        if not isinstance(to, (list, tuple)) or not to:
            raise self._graph.error(
                "divide", f"to must be a non-empty list of step classes, got {to!r}")
        return self._extend("divide", list(to), delay, timeout, limit_by)

    def divert(self, *, to: Mapping[Json, type[Step]], delay: object = None, timeout: object = None,
               limit_by: object = None) -> PipelineBuilder:
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
        return self._extend("divert", list(to.values()), delay, timeout, limit_by, keys=list(keys))

    def combine(self, *others: PipelineBuilder, into: type[Step], delay: object = None,
                timeout: object = None, limit_by: object = None) -> PipelineBuilder:
        """Close the innermost divide: run ``into`` once with every branch's output."""
        return self._fan_in("combine", others, into, delay, timeout, limit_by)

    def collapse(self, *, into: type[Step], delay: object = None, timeout: object = None,
                 limit_by: object = None) -> PipelineBuilder:
        """Close the innermost expand: run ``into`` once with every item step's output."""
        return self._fan_in("collapse", (), into, delay, timeout, limit_by)

    def converge(self, *others: PipelineBuilder, into: type[Step], delay: object = None,
                 timeout: object = None, limit_by: object = None) -> PipelineBuilder:
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
        graph.check_class("on_halt", handler)
        graph.on_halt = register_class(handler)
        return self

    def __iter__(self) -> Iterator[PipelineBuilder]:
        """Unpack a fork into branch builders, one per divide target or divert key, in order."""
        self._check_usable("unpack")
        if self._fork is None:
            raise self._graph.error(
                "unpack", "Can only unpack a divide() or divert() right after it")
        self._children = [PipelineBuilder(self._graph, [node], self) for node in self._fork]
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

    def _begin(self, action: str) -> PipelineBuilder:
        """Checks common to every transition after start; joins unpacked branches back in."""
        self._check_usable(action)
        if self._graph.start is None:
            raise self._graph.error(action, f"Must start pipeline definition before "
                                            f"{action.removesuffix('e')}ing", StartError)
        self._settle(action)
        self._fork = None
        return self

    def _settle(self, action: str) -> None:
        """Continue from every unpacked branch's last nodes; each must have closed its fan-outs."""
        if self._children is None:
            return
        for index, child in enumerate(self._children):  # (in fork order: the branch's position)
            child._settle(action)
            if child._stack:  # a branch joining its fork must not leave a fan-out open (its fan-in would never fire)
                raise self._graph.error(
                    action, f"branch {index} of the {self._stack[-1]} has an open {child._stack[-1]}; "
                            f"close it on that branch first", _ERRORS.get(action, DefinitionError))
            child._closed = True
        self._tips = list(dict.fromkeys(tip for child in self._children for tip in child._tips))
        self._children = None

    def _extend(self, kind: str, classes: list[Any], delay: object, timeout: object, limit_by: object,
                keys: list[str] | None = None, barrier: tuple[str, ...] | None = None) -> PipelineBuilder:
        """Add a node per class and a ``kind`` edge to them from each last node (a divert's by the
        rendered ``keys``, a combine's or collapse's with its ``barrier``), once the
        transition's checks passed: an expand, divide or divert opens a fan-out, and a
        divide's or divert's nodes may be unpacked."""
        graph = self._graph
        nodes = graph.add_nodes(kind, classes, delay, timeout, limit_by)
        to = nodes if keys is None else dict(zip(keys, nodes, strict=True))
        for source in self._tips:  # (each its own copy of the targets and barrier)
            assert source not in graph.edges, f"{graph.name}: node {source} already has an edge"
            graph.edges[source] = EdgeSpec(kind, copy_targets(to), None if barrier is None else list(barrier))
        if kind in _CLOSES.values():  # a fan-out
            self._stack.append(_Frame(kind, tuple(self._tips)))
        self._tips = nodes
        self._fork = list(nodes) if kind in ("divide", "divert") else None
        return self

    def _fan_in(self, kind: str, others: tuple[PipelineBuilder, ...], klass: Any,
                delay: object, timeout: object, limit_by: object) -> PipelineBuilder:
        graph, error, closes = self._graph, _ERRORS[kind], _CLOSES[kind]
        if others or (kind != "collapse" and self._parent is not None and not self._stack):
            owner = self._join_branches(kind, others)  # a branch with nothing open joins its fork
        else:
            self._begin(kind)
            if not self._stack:
                raise graph.error(kind, f"Must {closes} pipeline definition before "
                                        f"{kind.removesuffix('e')}ing", error)
            owner = self
        frame = owner._stack[-1]
        if frame.kind != closes:
            raise graph.error(kind, f"Ambiguous {kind} on most recently {frame.kind.removesuffix('e')}ed "
                                    f"definition", error)
        owner._settle(kind)
        owner._extend(kind, [klass], delay, timeout, limit_by, barrier=None if kind == "converge" else frame.sources)
        owner._stack.pop()  # the fan-out it closed
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
