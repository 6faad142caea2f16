"""Definitions: builder snapshots, branch builders, definition errors, divert keys, class refs.

Pure: no database. Relates to INV-ADV-1 and INV-ADV-3 through their shape
preconditions: every definition that builds routes without ``transition_invalid``,
and each fan-in's arrival counter reaches exactly its fan-out's width
(``test_random_definitions_round_trip_and_route``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import types
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ductwork.pipelines.registry as registry
from ductwork.errors import (
    AsyncStepError,
    CollapseError,
    CombineError,
    ConvergeError,
    DefinitionError,
    DivertError,
    StartError,
    UnknownStepClassError,
)
from ductwork.pipelines.definition import PipelineBuilder
from ductwork.pipelines.pipeline import Pipeline, import_pipeline, resolve_pipeline
from ductwork.pipelines.registry import resolve_step, step_ref
from ductwork.pipelines.snapshot import (
    Definition,
    EdgeSpec,
    NodeSpec,
    PartitionBy,
    main_module_refs,
    render_divert_key,
)
from ductwork.pipelines.step import Step
from tests.conftest import spelled

MOD = __name__


class A(Step):
    def __init__(self, order=None):  # an input a partitioned limit_by can name
        self.order = order

    def execute(self):
        return type(self).__name__


class B(A):
    """Inherits A's execute: a valid step with its own node names."""


class C(A):
    pass


class D(A):
    pass


class E(A):
    pass


class Outer:
    class Inner(Step):
        def execute(self):
            return None


class NeverReferenced(Step):
    def execute(self):
        return None


def build(fn, name="P"):
    """A Pipeline subclass named ``name`` whose define calls ``fn(builder)``."""
    return type(name, (Pipeline,), {"define": classmethod(lambda _cls, p: fn(p)), "__module__": MOD})


def snapshot(fn):
    return build(fn).definition.to_json()


def node(cls, delay_us=None, timeout_us=None, limit_by=None):
    return {"klass": f"{MOD}:{cls.__name__}", "delay_us": delay_us, "timeout_us": timeout_us,
            "limit_by": limit_by}


def edge(kind, *to, barrier=None):
    out = {"type": kind, "to": to[0] if isinstance(to[0], dict) else list(to)}
    if barrier is not None:
        out["barrier"] = barrier
    return out


def expect(start, nodes, edges):
    return {"format": 1, "pipeline": f"{MOD}:P", "start": start, "nodes": nodes, "edges": edges}


def fails(fn, error, message):
    """Building ``fn`` raises exactly ``error`` with the exact message ``message``."""
    with pytest.raises(error) as info:
        build(fn)
    assert type(info.value) is error
    assert str(info.value) == message
    return info.value


# --------------------------------------------------------------------------- snapshots


def test_semantics_example_snapshot():
    """docs/semantics.md §1's example, with this module's classes."""
    got = snapshot(lambda p: p.start(A).expand(to=B, timeout=30, limit_by="vendor_api")
                   .collapse(into=C))
    assert got == expect("A#0", {
        "A#0": node(A),
        "B#1": node(B, timeout_us=30_000_000, limit_by="vendor_api"),
        "C#2": node(C),
    }, {
        "A#0": edge("expand", "B#1"),
        "B#1": edge("collapse", "C#2", barrier=["A#0"]),
    })


def test_chain_and_leaf():
    assert snapshot(lambda p: p.start(A).chain(to=B)) == expect(
        "A#0", {"A#0": node(A), "B#1": node(B)}, {"A#0": edge("chain", "B#1")})


def test_single_node_is_a_leaf():
    assert snapshot(lambda p: p.start(A)) == expect("A#0", {"A#0": node(A)}, {})


def test_same_class_twice_gives_two_nodes():
    got = snapshot(lambda p: p.start(A).chain(to=A).chain(to=A))
    assert list(got["nodes"]) == ["A#0", "A#1", "A#2"]
    assert got["edges"] == {"A#0": edge("chain", "A#1"), "A#1": edge("chain", "A#2")}


def test_dampen():
    assert snapshot(lambda p: p.start(A).dampen(before=B))["edges"] == {
        "A#0": edge("dampen", "B#1")}


def test_divide_combine():
    assert snapshot(lambda p: p.start(A).divide(to=[B, C]).combine(into=D))["edges"] == {
        "A#0": edge("divide", "B#1", "C#2"),
        "B#1": edge("combine", "D#3", barrier=["A#0"]),
        "C#2": edge("combine", "D#3", barrier=["A#0"]),
    }


def test_chain_after_divide_is_one_node_for_every_branch():
    got = snapshot(lambda p: p.start(A).divide(to=[B, C]).chain(to=D).combine(into=E))
    assert got["edges"] == {
        "A#0": edge("divide", "B#1", "C#2"),
        "B#1": edge("chain", "D#3"),
        "C#2": edge("chain", "D#3"),
        "D#3": edge("combine", "E#4", barrier=["A#0"]),
    }


def test_divert_converge_renders_keys():
    got = snapshot(lambda p: p.start(A).divert(
        to={"ok": B, True: C, None: D, 7: E, 1.5: A, "otherwise": B}).converge(into=C))
    assert got["edges"] == {
        "A#0": edge("divert", {"ok": "B#1", "true": "C#2", "": "D#3", "7": "E#4", "1.5": "A#5",
                               "otherwise": "B#6"}),
        **{name: edge("converge", "C#7") for name in ("B#1", "C#2", "D#3", "E#4", "A#5", "B#6")},
    }


def test_multi_source_expand_and_nested_chained_divide():
    got = snapshot(lambda p: p.start(A).divide(to=[B, C]).expand(to=D).collapse(into=E)
                   .divide(to=[A, B]).combine(into=C).combine(into=D))
    assert got["edges"] == {
        "A#0": edge("divide", "B#1", "C#2"),
        "B#1": edge("expand", "D#3"),
        "C#2": edge("expand", "D#3"),
        "D#3": edge("collapse", "E#4", barrier=["B#1", "C#2"]),
        "E#4": edge("divide", "A#5", "B#6"),
        "A#5": edge("combine", "C#7", barrier=["E#4"]),
        "B#6": edge("combine", "C#7", barrier=["E#4"]),
        "C#7": edge("combine", "D#8", barrier=["A#0"]),
    }


def test_branch_builders_combine_returns_the_forking_builder():
    seen = {}

    def define(p):
        b, c = p.start(A).divide(to=[B, C])
        b.chain(to=D)
        seen["joined"] = b.combine(c, into=E)
        seen["root"] = p
        p.chain(to=A)

    got = snapshot(define)
    assert seen["joined"] is seen["root"]
    assert got["edges"] == {
        "A#0": edge("divide", "B#1", "C#2"),
        "B#1": edge("chain", "D#3"),
        "C#2": edge("combine", "E#4", barrier=["A#0"]),
        "D#3": edge("combine", "E#4", barrier=["A#0"]),
        "E#4": edge("chain", "A#5"),
    }


def test_nested_divide_inside_a_divide_branch():
    def define(p):
        b, c = p.start(A).divide(to=[B, C])
        d, e = b.divide(to=[D, E])
        assert d.combine(e, into=A) is b
        b.combine(c, into=B)

    assert snapshot(define)["edges"] == {
        "A#0": edge("divide", "B#1", "C#2"),
        "B#1": edge("divide", "D#3", "E#4"),
        "C#2": edge("combine", "B#6", barrier=["A#0"]),
        "D#3": edge("combine", "A#5", barrier=["B#1"]),
        "E#4": edge("combine", "A#5", barrier=["B#1"]),
        "A#5": edge("combine", "B#6", barrier=["A#0"]),
    }


def test_expand_collapse_inside_a_divide_branch():
    def define(p):
        b, c = p.start(A).divide(to=[B, C])
        b.expand(to=D).collapse(into=E)
        b.combine(c, into=A)

    assert snapshot(define)["edges"] == {
        "A#0": edge("divide", "B#1", "C#2"),
        "B#1": edge("expand", "D#3"),
        "C#2": edge("combine", "A#5", barrier=["A#0"]),
        "D#3": edge("collapse", "E#4", barrier=["B#1"]),
        "E#4": edge("combine", "A#5", barrier=["A#0"]),
    }


def test_divert_unpacks_in_dict_order_and_converges():
    def define(p):
        x, y, z = p.start(A).divert(to={"a": B, 2: C, "otherwise": D})
        y.chain(to=E)
        x.converge(y, z, into=A)

    assert snapshot(define)["edges"] == {
        "A#0": edge("divert", {"a": "B#1", "2": "C#2", "otherwise": "D#3"}),
        "B#1": edge("converge", "A#5"),
        "C#2": edge("chain", "E#4"),
        "D#3": edge("converge", "A#5"),
        "E#4": edge("converge", "A#5"),
    }


def test_forking_builder_continues_from_every_branch():
    """Ruby's block form followed by a top-level combine."""
    def define(p):
        b, c = p.start(A).divide(to=[B, C])
        b.chain(to=D)
        c.chain(to=E)
        p.combine(into=A)

    assert snapshot(define)["edges"] == {
        "A#0": edge("divide", "B#1", "C#2"),
        "B#1": edge("chain", "D#3"),
        "C#2": edge("chain", "E#4"),
        "D#3": edge("combine", "A#5", barrier=["A#0"]),
        "E#4": edge("combine", "A#5", barrier=["A#0"]),
    }


def test_unjoined_branches_end_as_leaves():
    def define(p):
        b, _c = p.start(A).divide(to=[B, C])
        b.expand(to=D)

    got = snapshot(define)
    assert set(got["edges"]) == {"A#0", "B#1"}


def test_snapshot_is_deterministic_and_json():
    define = lambda p: p.start(A).divide(to=[B, C]).chain(to=D).combine(into=E)  # noqa: E731
    first, second = build(define).definition, build(define).definition
    assert json.dumps(first.to_json()) == json.dumps(second.to_json())
    assert Definition.from_json(json.loads(json.dumps(first.to_json()))) == first


# --------------------------------------------------------------------------- options

OPTION_CASES = {
    "start": (lambda p, o: p.start(A, **o), ["A#0"]),
    "chain": (lambda p, o: p.start(A).chain(to=B, **o), ["B#1"]),
    "expand": (lambda p, o: p.start(A).expand(to=B, **o), ["B#1"]),
    "collapse": (lambda p, o: p.start(A).expand(to=B).collapse(into=C, **o), ["C#2"]),
    "divide": (lambda p, o: p.start(A).divide(to=[B, C], **o), ["B#1", "C#2"]),
    "combine": (lambda p, o: p.start(A).divide(to=[B, C]).combine(into=D, **o), ["D#3"]),
    "divert": (lambda p, o: p.start(A).divert(to={1: B, "otherwise": C}, **o), ["B#1", "C#2"]),
    "converge": (lambda p, o: p.start(A).divert(to={"otherwise": B}).converge(into=C, **o),
                 ["C#2"]),
    "dampen": (lambda p, o: p.start(A).dampen(before=B, **o), ["B#1"]),
    "branch combine": (lambda p, o: (lambda b, c: b.combine(c, into=D, **o))(
        *p.start(A).divide(to=[B, C])), ["D#3"]),
}


@pytest.mark.parametrize("case", OPTION_CASES, ids=str)
@pytest.mark.parametrize(("options", "fields"), [
    ({"delay": 5, "timeout": "1m", "limit_by": "api"},
     {"delay_us": 5_000_000, "timeout_us": 60_000_000, "limit_by": "api"}),
    ({"delay": timedelta(milliseconds=1), "timeout": 0.5},
     {"delay_us": 1_000, "timeout_us": 500_000, "limit_by": None}),
])
def test_options_apply_to_created_nodes_only(case, options, fields):
    fn, created = OPTION_CASES[case]
    definition = build(lambda p: fn(p, options)).definition
    for name, spec in definition.nodes.items():
        want = fields if name in created else dict.fromkeys(fields)
        assert {k: getattr(spec, k) for k in want} == want, name
    assert definition.limit_keys() == ({"api"} if fields["limit_by"] else set())


@pytest.mark.parametrize(("options", "reason"), [
    ({"delay": 0}, "delay=0: must be positive"),
    ({"delay": -1.5}, "delay=-1.5: must be positive"),
    ({"timeout": "1mo"}, "timeout='1mo': months and years are not supported (their length varies)"),
    ({"timeout": True},
     "timeout=True: expected seconds, a timedelta or a duration string, got bool"),
    ({"limit_by": ""}, "limit_by must be a non-blank str, got ''"),
    ({"limit_by": "  "}, "limit_by must be a non-blank str, got '  '"),
    ({"limit_by": 5}, "limit_by must be a non-blank str, got 5"),
])
@pytest.mark.parametrize("case", ["start", "expand", "divert", "combine"])
def test_bad_options_name_the_value(case, options, reason):
    fn, _ = OPTION_CASES[case]
    transition = case.split()[-1]
    fails(lambda p: fn(p, options), DefinitionError, f"P.{transition}: {reason}")


# --------------------------------------------------------------------------- partitioned limit_by


@pytest.mark.parametrize("case", OPTION_CASES, ids=str)
@pytest.mark.parametrize("limit_by", [("vendor_api", "order.account_id"), ["vendor_api", "order.account_id"]],
                         ids=["tuple", "list"])
def test_a_partitioned_limit_by_on_every_transition(case, limit_by):
    """``limit_by=(family, field)``: the created nodes partition by the field's argument
    (resolved to its position), snapshotted as an object that reads back; no static key."""
    fn, created = OPTION_CASES[case]
    definition = build(lambda p: fn(p, {"limit_by": limit_by})).definition
    by = PartitionBy("vendor_api", "order.account_id", 0)
    assert {name: spec.partition for name, spec in definition.nodes.items()} == {
        name: by if name in created else None for name in definition.nodes}
    assert all(spec.limit_by is None for spec in definition.nodes.values())
    assert definition.to_json()["nodes"][created[0]]["limit_by"] == {
        "family": "vendor_api", "field": "order.account_id", "arg": 0}
    assert Definition.from_json(json.loads(json.dumps(definition.to_json()))) == definition
    assert (definition.limit_keys(), definition.limit_families()) == (set(), {"vendor_api"})
    assert str(by) == "vendor_api[order.account_id]"


class Two(Step):
    def __init__(self, order, account_id, /, note=None):
        self.args = (order, account_id, note)

    def execute(self):
        return None


class Starred(Step):
    def __init__(self, *account_id, **order):
        self.args = (account_id, order)

    def execute(self):
        return None


class KeywordOnly(Step):
    def __init__(self, order, *, account_id=None):
        self.args = (order, account_id)

    def execute(self):
        return None


@pytest.mark.parametrize(("fn", "transition"), [
    (lambda p: p.start(A).chain(to=Two), "chain"),
    (lambda p: p.start(A).expand(to=Two).collapse(into=A), "expand"),
    (lambda p: p.start(A).divide(to=[A, Two]).combine(into=A), "divide"),
    (lambda p: p.start(A).expand(to=A).collapse(into=Two), "collapse"),
])
def test_a_step_after_start_must_take_one_input(fn, transition):
    """Every transition but start builds its step from one input (a chain's the output, an
    expand's one item): a class that cannot take one is refused when the pipeline is
    defined, not when its first step halts ``job_invalid``."""
    fails(fn, DefinitionError, f"P.{transition}: Two.__init__(self, order, account_id, /, note=None) must take one "
                               "input: a step after start gets one (a chain's the output, an expand's one item); "
                               "take it whole and read its fields")


def test_a_step_after_start_may_take_one_input_in_any_form():
    definition = build(lambda p: p.start(Two).chain(to=KeywordOnly).chain(to=Starred).chain(to=A)).definition
    assert list(definition.nodes) == ["Two#0", "KeywordOnly#1", "Starred#2", "A#3"]


def test_a_field_resolves_to_its_parameters_position_in_each_class():
    definition = build(lambda p: p.start(A).divide(to=[KeywordOnly, A], limit_by=("f", "order"))).definition
    assert [spec.partition for spec in definition.nodes.values()] == [
        None, PartitionBy("f", "order", 0), PartitionBy("f", "order", 0)]
    definition = build(lambda p: p.start(Two, limit_by=("f", "account_id.id"))).definition
    assert definition.nodes["Two#0"].partition == PartitionBy("f", "account_id.id", 1)


@pytest.mark.parametrize(("fn", "reason"), [
    (lambda p: p.start(A).expand(to=Two, limit_by=("f", "account")),
     "P.expand: limit_by field 'account' is no parameter of Two.__init__(self, order, account_id, /, note=None)"),
    (lambda p: p.start(A).divide(to=[A, Starred], limit_by=("f", "order")),  # A has it, Starred not
     "P.divide: limit_by field 'order' is no parameter of Starred.__init__(self, *account_id, **order)"),
    (lambda p: p.start(A).chain(to=Starred, limit_by=("f", "account_id")),
     "P.chain: limit_by field 'account_id' is no parameter of Starred.__init__(self, *account_id, **order)"),
    (lambda p: p.start(KeywordOnly, limit_by=("f", "account_id.x")),
     "P.start: limit_by field 'account_id' is no parameter of KeywordOnly.__init__(self, order, *, "
     "account_id=None)"),
    (lambda p: p.start(A).divert(to={"otherwise": NeverReferenced}, limit_by=("f", "self")),
     "P.divert: limit_by field 'self' is no parameter of NeverReferenced.__init__(self, /, *args, **kwargs)"),
])
def test_a_field_that_is_no_positional_parameter_names_the_class(fn, reason):
    fails(fn, DefinitionError, reason)


@pytest.mark.parametrize("limit_by", [
    ("vendor_api",), ("vendor_api", "order", "x"), ("", "order"), (" ", "order"), ("vendor[api", "order"),
    ("vendor_api", ""), ("vendor_api", " "), ("vendor_api", "order..x"), ("vendor_api", "order."),
    (1, "order"), ("vendor_api", None), (), ["vendor_api"]], ids=repr)
@pytest.mark.parametrize("case", ["start", "combine", "divert"])
def test_a_bad_partition_declaration_names_the_value(case, limit_by):
    fn, _ = OPTION_CASES[case]
    fails(lambda p: fn(p, {"limit_by": limit_by}), DefinitionError,
          f"P.{case}: limit_by must be a key or a (family, field) pair: a non-blank family without '[' and a "
          f"field 'name' or 'name.sub', got {limit_by!r}")


# --------------------------------------------------------------------------- errors

BEFORE_START = {
    "chain": lambda p: p.chain(to=A),
    "expand": lambda p: p.expand(to=A),
    "collapse": lambda p: p.collapse(into=A),
    "divide": lambda p: p.divide(to=[A, B]),
    "combine": lambda p: p.combine(into=A),
    "divert": lambda p: p.divert(to={"otherwise": A}),
    "converge": lambda p: p.converge(into=A),
    "dampen": lambda p: p.dampen(before=A),
}


@pytest.mark.parametrize("transition", BEFORE_START)
def test_transition_before_start(transition):
    gerund = {"chain": "chaining", "expand": "expanding", "collapse": "collapsing",
              "divide": "dividing", "combine": "combining", "divert": "diverting",
              "converge": "converging", "dampen": "dampening"}[transition]
    fails(BEFORE_START[transition], StartError,
          f"P.{transition}: Must start pipeline definition before {gerund}")


def test_start_twice_and_never():
    fails(lambda p: p.start(A).start(B), StartError,
          "P.start: Can only start pipeline definition once")
    fails(lambda _p: None, StartError, "P.define: Must start pipeline definition before completing")


class NotAStep:
    def execute(self):
        return None


class NoExecute(Step):
    pass


class ExecuteTakesArgs(Step):
    def execute(self, extra):
        return extra


class StaticExecute(Step):
    @staticmethod
    def execute():
        return None


@pytest.mark.parametrize("bad", [42, "A", NotAStep, Step, NoExecute, ExecuteTakesArgs, A()])
def test_class_arguments_must_be_step_classes(bad):
    fails(lambda p: p.start(bad), DefinitionError,
          f"P.start: Argument must be a valid step class (a Step subclass defining execute(self)), "
          f"got {bad!r}")
    fails(lambda p: p.start(A).divide(to=[B, bad]), DefinitionError,
          f"P.divide: Arguments must be valid step classes (Step subclasses defining "
          f"execute(self)), got {bad!r}")


def test_static_execute_without_arguments_is_a_valid_step():
    assert build(lambda p: p.start(StaticExecute)).definition.start == "StaticExecute#0"


@pytest.mark.parametrize(("fn", "error", "message"), [
    (lambda p: p.start(A).combine(into=B), CombineError,
     "P.combine: Must divide pipeline definition before combining"),
    (lambda p: p.start(A).collapse(into=B), CollapseError,
     "P.collapse: Must expand pipeline definition before collapsing"),
    (lambda p: p.start(A).converge(into=B), ConvergeError,
     "P.converge: Must divert pipeline definition before converging"),
    (lambda p: p.start(A).divide(to=[B, C]).combine(into=D).combine(into=E), CombineError,
     "P.combine: Must divide pipeline definition before combining"),
    (lambda p: p.start(A).divide(to=[B, C]).expand(to=D).combine(into=E), CombineError,
     "P.combine: Ambiguous combine on most recently expanded definition"),
    (lambda p: p.start(A).divert(to={"otherwise": B}).combine(into=E), CombineError,
     "P.combine: Ambiguous combine on most recently diverted definition"),
    (lambda p: p.start(A).expand(to=B).divide(to=[C, D]).collapse(into=E), CollapseError,
     "P.collapse: Ambiguous collapse on most recently divided definition"),
    (lambda p: p.start(A).divide(to=[B, C]).converge(into=E), ConvergeError,
     "P.converge: Ambiguous converge on most recently divided definition"),
])
def test_fan_in_must_close_the_innermost_fan_out(fn, error, message):
    fails(fn, error, message)


def _branches(p, n=2):
    return list(p.start(A).divide(to=[B, C, D][:n]))


@pytest.mark.parametrize(("fn", "error", "message"), [
    (lambda p: (lambda b, c, _d: b.combine(c, into=E))(*_branches(p, 3)), CombineError,
     "P.combine: combine must join every branch of the divide at A#0: got 2 of 3"),
    (lambda p: (lambda b, c: b.combine(c, c, into=E))(*_branches(p)), CombineError,
     "P.combine: the same branch builder is passed to combine twice"),
    (lambda p: (lambda b, c: (b.expand(to=E), b.combine(c, into=E)))(*_branches(p)), CombineError,
     "P.combine: branch 0 of the divide at A#0 has an open expand at B#1; close it on that "
     "branch first"),
    (lambda p: (lambda b, c: (list(c.divide(to=[D, E])), b.combine(c, into=E)))(*_branches(p)),
     CombineError, "P.combine: branch 1 of the divide at A#0 has an open divide at C#2; close it "
                   "on that branch first"),
    (lambda p: (lambda b, _c: (b.divert(to={"otherwise": D}), p.combine(into=E)))(*_branches(p)),
     CombineError, "P.combine: branch 0 of the divide at A#0 has an open divert at B#1; close it "
                   "on that branch first"),
    (lambda p: (lambda b, _c: (b.expand(to=D), p.chain(to=E)))(*_branches(p)), DefinitionError,
     "P.chain: branch 0 of the divide at A#0 has an open expand at B#1; close it on that "
     "branch first"),
    # a branch of a branch, checked when the outer fork settles
    (lambda p: (lambda b, _c: (lambda d, _e: (d.expand(to=A), p.chain(to=E)))(*b.divide(to=[D, E])))(
        *_branches(p)), DefinitionError,
     "P.chain: branch 0 of the divide at B#1 has an open expand at D#3; close it on that branch first"),
    (lambda p: (lambda b, _c: b.combine(into=E))(*_branches(p)), CombineError,
     "P.combine: combine must join every branch of the divide at A#0: got 1 of 2"),
    (lambda p: (lambda b, _c: b.collapse(into=E))(*_branches(p)), CollapseError,
     "P.collapse: Must expand pipeline definition before collapsing"),
    (lambda p: (lambda b, c: b.converge(c, into=E))(*_branches(p)), ConvergeError,
     "P.converge: Ambiguous converge on most recently divided definition"),
    (lambda p: (lambda x, y: x.combine(y, into=E))(*p.start(A).divert(to={1: B, "otherwise": C})),
     CombineError, "P.combine: Ambiguous combine on most recently diverted definition"),
    (lambda p: p.start(A).combine(p, into=E), CombineError,
     "P.combine: can only combine branch builders unpacked from one fork"),
    (lambda p: (lambda b, _c: b.combine(42, into=E))(*_branches(p)), CombineError,
     "P.combine: can only combine branch builders of this definition, got 42"),
    (lambda p: (lambda d, _e: d.combine(into=A))(*p.start(A).divide(to=[B, C]).divide(to=[D, E])),
     CombineError, "P.combine: combine must join every branch of the divide at B#1, C#2: got 1 of 2"),
    (lambda p: (lambda b, c: (b.combine(c, into=D), b.combine(c, into=E)))(*_branches(p)),
     DefinitionError, "P.combine: this branch builder was joined into its parent; continue on the "
                      "builder combine/converge returned"),
])
def test_branch_joins(fn, error, message):
    fails(fn, error, message)


def test_branches_of_different_forks_do_not_combine():
    def define(p):
        b, c = p.start(A).divide(to=[B, C])
        d, _e = b.divide(to=[D, E])
        d.combine(c, into=A)

    fails(define, CombineError,
          "P.combine: can only combine branch builders unpacked from one fork")


def test_joined_branch_is_closed():
    def define(p):
        b, c = p.start(A).divide(to=[B, C])
        b.combine(c, into=D)
        b.chain(to=E)

    fails(define, DefinitionError, "P.chain: this branch builder was joined into its parent; "
                                   "continue on the builder combine/converge returned")


def _unpack_after_a_failed_transition(p):
    """A transition that raised (and define swallowed) leaves no fork to unpack either."""
    fork = p.start(A).divide(to=[B, C])
    with contextlib.suppress(DefinitionError):
        fork.chain(to=int)
    return list(fork)


@pytest.mark.parametrize("fn", [
    lambda p: list(p),
    lambda p: list(p.start(A)),
    _unpack_after_a_failed_transition,
    lambda p: list(p.start(A).divide(to=[B, C]).chain(to=D)),
    lambda p: (list(p.start(A).divide(to=[B, C])), list(p)),
    lambda p: list(p.start(A).divide(to=[B, C]).divide(to=[D, E]).combine(into=A)),
])
def test_unpacking_only_right_after_a_fork(fn):
    fails(fn, DefinitionError, "P.unpack: Can only unpack a divide() or divert() right after it")


def test_builder_unusable_after_define():
    kept = []
    build(lambda p: kept.append(p.start(A)))
    with pytest.raises(DefinitionError) as info:
        kept[0].chain(to=B)
    assert str(info.value) == "P.chain: the definition is complete; a builder cannot be used after define() returns"
    with pytest.raises(DefinitionError, match=r"^P\.start: the definition is complete"):
        kept[0].start(B)
    with pytest.raises(DefinitionError, match=r"^P\.unpack: the definition is complete"):
        list(kept[0])


def test_a_joined_branch_cannot_be_unpacked():
    def define(p):
        b, c = p.start(A).divide(to=[B, C])
        b.combine(c, into=D)
        list(b)

    fails(define, DefinitionError, "P.unpack: this branch builder was joined into its parent; "
                                   "continue on the builder combine/converge returned")


def test_builder_repr_names_its_last_nodes():
    seen = []
    build(lambda p: (seen.append(repr(p)), seen.append(repr(p.start(A).divide(to=[B, C])))))
    assert seen == ["<PipelineBuilder P at (unstarted)>", "<PipelineBuilder P at B#1, C#2>"]


# --------------------------------------------------------------------------- on_halt


class ReplacedLater(Step):
    def execute(self):
        return None


def test_on_halt_names_the_handler_in_the_snapshot():
    definition = build(lambda p: p.start(A).on_halt(B).chain(to=C)).definition
    assert definition.on_halt == f"{MOD}:B"
    assert definition.to_json() == {**expect("A#0", {"A#0": node(A), "C#1": node(C)},
                                             {"A#0": edge("chain", "C#1")}), "on_halt": f"{MOD}:B"}
    assert Definition.from_json(definition.to_json()) == definition
    # anywhere in define, before start too
    assert build(lambda p: p.on_halt(B).start(A)).definition.on_halt == f"{MOD}:B"


@pytest.mark.parametrize(("fn", "error", "message"), [
    (lambda p: p.start(A).on_halt(B).on_halt(C), DefinitionError,
     f"P.on_halt: on_halt is declared once per pipeline, already '{MOD}:B'"),
    (lambda p: p.start(A).on_halt(NotAStep), DefinitionError,
     "P.on_halt: Argument must be a valid step class (a Step subclass defining execute(self)), "
     f"got {NotAStep!r}"),
])
def test_on_halt_refusals(fn, error, message):
    fails(fn, error, message)


def test_on_halt_checks_execute_again(monkeypatch):
    async def stream(_self):
        yield 1

    monkeypatch.setattr(ReplacedLater, "execute", stream)  # after the class statement checked it
    fails(lambda p: p.start(A).on_halt(ReplacedLater), AsyncStepError,
          "ReplacedLater.execute: an async generator is not a step's work (it yields values, and a "
          "step returns one): define `async def execute(self)` with a `return`")


def test_on_halt_after_define_is_refused():
    kept = []
    build(lambda p: kept.append(p.start(A)))
    with pytest.raises(DefinitionError, match=r"^P\.on_halt: the definition is complete"):
        kept[0].on_halt(B)


@pytest.mark.parametrize(("transition", "fn"), [
    ("collapse", lambda p: p.start(A).expand(to=B).collapse(into=NotAStep)),
    ("combine", lambda p: p.start(A).divide(to=[B, C]).combine(into=NotAStep)),
    ("converge", lambda p: p.start(A).divert(to={"otherwise": B}).converge(into=NotAStep)),
])
def test_fan_ins_name_themselves_refusing_a_class(transition, fn):
    fails(fn, DefinitionError, f"P.{transition}: Argument must be a valid step class (a Step subclass "
                               f"defining execute(self)), got {NotAStep!r}")


def test_main_module_refs_include_the_on_halt_handler():
    definition = Definition("__main__:P", "A#0", {"A#0": NodeSpec(f"{MOD}:A")}, {}, "__main__:H")
    assert main_module_refs(definition) == ["__main__:P", "__main__:H"]


@pytest.mark.parametrize(("to", "message"), [
    ({"a": B}, f"Must define an 'otherwise' target when diverting, got {{'a': {B!r}}}"),
    ([B], f"Must define an 'otherwise' target when diverting, got [{B!r}]"),
    ({1: B, "1": C, "otherwise": D}, "keys 1 and '1' both render as '1'"),
    ({True: B, "true": C, "otherwise": D}, "keys True and 'true' both render as 'true'"),
    ({None: B, "": C, "otherwise": D}, "keys None and '' both render as ''"),
    ({(1, 2): B, "otherwise": D}, "key (1, 2) can never match a step output "
                                  "(keys are str, int, float, bool or None)"),
])
def test_divert_errors(to, message):
    fails(lambda p: p.start(A).divert(to=to), DivertError, f"P.divert: {message}")


@pytest.mark.parametrize("to", [[], (), B, None])
def test_divide_needs_a_list(to):
    fails(lambda p: p.start(A).divide(to=to), DefinitionError,
          f"P.divide: to must be a non-empty list of step classes, got {to!r}")


def test_define_must_be_a_classmethod():
    with pytest.raises(DefinitionError) as info:
        class Bad(Pipeline):
            def define(cls, pipeline):
                pipeline.start(A)
    assert str(info.value) == "Bad.define: define must be a @classmethod taking the builder"


# --------------------------------------------------------------------------- pipeline and step


class TakesTwo(Step):
    def __init__(self, n, s):
        self.n, self.s = n, s

    def execute(self):
        return self.n


def test_abstract_pipeline_and_trigger(monkeypatch):
    class Base(Pipeline):
        pass

    class Concrete(Base):
        @classmethod
        def define(cls, pipeline):
            pipeline.start(TakesTwo)

    class Derived(Concrete):
        pass

    assert Base.definition is None
    assert Concrete.definition.pipeline == step_ref(Concrete)
    assert Derived.definition.pipeline == step_ref(Derived)
    with pytest.raises(DefinitionError) as info:
        Base.trigger(1)
    assert str(info.value) == ("Base.trigger: Must define pipeline before triggering "
                               "(override the classmethod define)")

    calls = []
    runs = types.ModuleType("ductwork.pipelines.runs")
    runs.trigger_run = lambda app, cls, args, **_: calls.append((app, cls, args)) or "handle"
    monkeypatch.setitem(sys.modules, "ductwork.pipelines.runs", runs)
    assert Concrete.trigger(1, "x", app="app") == "handle"
    assert calls == [("app", Concrete, [1, "x"])]


def test_step_binding():
    class Recorder(Step):
        def __init__(self, value):
            self.value = value
            self.key_in_init = self.idempotency_key

        def execute(self):
            return self.value

    context = object()
    step = Recorder._ductwork_build([7], "step-1", "run-1", context)
    assert (step.value, step.key_in_init, step.idempotency_key, step.context) == \
        (7, "step-1", "step-1", context)
    assert step.execute() == 7

    unbound = Recorder.__new__(Recorder)
    for attribute in ("idempotency_key", "context"):
        with pytest.raises(RuntimeError, match="only available while ductwork runs the step"):
            getattr(unbound, attribute)
    with pytest.raises(NotImplementedError):
        Step().execute()


# --------------------------------------------------------------------------- divert keys


@pytest.mark.parametrize(("value", "text"), [
    ("x", "x"), ("", ""), (True, "true"), (False, "false"), (None, ""), (1, "1"), (0, "0"),
    (-12, "-12"), (10**30, "1" + "0" * 30), (1.0, "1.0"), (0.1, "0.1"), (-2.5, "-2.5"),
    ([1], None), ({"a": 1}, None), ((1,), None), (object(), None),
])
def test_render_divert_key(value, text):
    assert render_divert_key(value) == text


# --------------------------------------------------------------------------- class references


def test_refs_resolve_through_registry_and_registered_modules():
    assert step_ref(A) == f"{MOD}:A"
    assert resolve_step(f"{MOD}:A") is A
    # a name in a module a registered class comes from (an alias), looked up without import
    assert resolve_step(f"{MOD}:NeverReferenced") is NeverReferenced
    assert resolve_step(f"{MOD}:Outer.Inner") is Outer.Inner
    assert resolve_pipeline(step_ref(build(lambda p: p.start(A), "Q"))).__name__ == "Q"


def test_classes_defined_inside_functions_resolve_once_referenced():
    class Local(Step):
        def execute(self):
            return None

    class LocalPipeline(Pipeline):
        @classmethod
        def define(cls, pipeline):
            pipeline.start(Local)

    assert "<locals>" in step_ref(Local)
    assert resolve_step(LocalPipeline.definition.nodes["Local#0"].klass) is Local
    assert resolve_pipeline(LocalPipeline.definition.pipeline) is LocalPipeline

    class Unused(Step):
        def execute(self):
            return None

    with pytest.raises(UnknownStepClassError, match="is not in the configured pipelines"):
        resolve_step(step_ref(Unused))


def test_stored_names_never_import_but_configured_pipelines_do(tmp_path, monkeypatch):
    (tmp_path / "dw_fresh_steps.py").write_text(
        "from ductwork import Pipeline, Step\n"
        "class Fresh(Step):\n"
        "    def execute(self):\n"
        "        return None\n"
        "class FreshPipeline(Pipeline):\n"
        "    @classmethod\n"
        "    def define(cls, p):\n"
        "        p.start(Fresh)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "dw_fresh_steps", raising=False)
    # as if never imported, also on a second run in one process (mutmut reruns the tests in
    # the process that collected its stats, whose registry already holds the classes)
    for ref in [ref for ref in registry._REGISTRY if ref.startswith("dw_fresh_steps:")]:
        monkeypatch.delitem(registry._REGISTRY, ref)
    with pytest.raises(UnknownStepClassError, match="'dw_fresh_steps:Fresh' is not in the configured"):
        resolve_step("dw_fresh_steps:Fresh")
    with pytest.raises(UnknownStepClassError, match="pipeline class 'dw_fresh_steps:FreshPipeline'"):
        resolve_pipeline("dw_fresh_steps:FreshPipeline")
    assert "dw_fresh_steps" not in sys.modules
    # a configuration entry imports its module, which registers the pipeline's classes
    assert import_pipeline("dw_fresh_steps:FreshPipeline").__name__ == "FreshPipeline"
    fresh = resolve_step("dw_fresh_steps:Fresh")
    assert fresh.__module__ == "dw_fresh_steps"
    assert issubclass(fresh, Step)
    monkeypatch.delitem(sys.modules, "dw_fresh_steps")


@pytest.mark.parametrize(("resolve", "ref", "needle"), [
    (resolve_step, "no_such_module_xyz:A", "step class 'no_such_module_xyz:A' is not in the configured"),
    (resolve_step, f"{MOD}:Missing", "is not in the configured pipelines"),
    (resolve_step, "no-colon", "is not in the configured pipelines"),
    (resolve_step, f"{MOD}:NotAStep", "not a Step subclass"),
    (resolve_step, f"{MOD}:build", "not a Step subclass"),
    (resolve_pipeline, f"{MOD}:A", "not a Pipeline subclass"),
    # an attribute of None is not looked up for a module that is not there
    (resolve_step, "no_such_module_xyz:__class__", "is not in the configured pipelines"),
])
def test_unresolvable_stored_refs_name_the_ref(resolve, ref, needle):
    with pytest.raises(UnknownStepClassError) as info:
        resolve(ref)
    what = "step" if resolve is resolve_step else "pipeline"
    assert str(info.value).startswith(f"{what} class {ref!r} ")
    assert needle in str(info.value)
    assert repr(ref) in str(info.value)
    assert "nothing was imported" in str(info.value)


@pytest.mark.parametrize(("ref", "needle"), [
    ("no_such_module_xyz:A", "cannot resolve pipeline class 'no_such_module_xyz:A'"),
    (f"{MOD}:Missing", f"module '{MOD}' has no 'Missing'"),
    ("no-colon", "expected 'module:qualname'"),
    (f"{MOD}:A", "not a Pipeline subclass"),
    (f"{MOD}:A:B", f"module '{MOD}' has no 'A:B'"),
    (f"{MOD}:make.<locals>.Local", "it is defined inside a function and no definition in this process "
                                   "referenced it (such classes resolve only where they were defined)"),
])
def test_unimportable_configured_pipelines_name_the_ref(ref, needle):
    with pytest.raises(ImportError) as info:
        import_pipeline(ref)
    assert needle in str(info.value)
    assert repr(ref) in str(info.value)
    module_name = ref.partition(":")[0]
    # the module the ref names, for an importer's report; none when the ref is not module:qualname
    assert info.value.name == (module_name if ":" in ref and ref != f"{MOD}:A" else None)


def test_stored_names_resolve_only_in_modules_of_registered_classes(monkeypatch):
    loose = types.ModuleType("dw_loose_steps")
    loose.Loose = type("Loose", (A,), {"__module__": "dw_loose_steps"})
    monkeypatch.setitem(sys.modules, "dw_loose_steps", loose)  # imported, but no class of it registered
    with pytest.raises(UnknownStepClassError, match="'dw_loose_steps:Loose' is not in the configured"):
        resolve_step("dw_loose_steps:Loose")


class Aliases:
    Nested = build(lambda p: p.start(A), "Aliased")


def test_configured_pipelines_resolve_through_nested_names():
    # not the class's own ref, so not in the registry: looked up part by part in its module
    assert import_pipeline(f"{MOD}:Aliases.Nested") is Aliases.Nested


# --------------------------------------------------------------------------- snapshots read back


GOOD = {
    "format": 1, "pipeline": "m:P", "start": "A#0",
    "nodes": {"A#0": {"klass": "m:A", "delay_us": None, "timeout_us": 5, "limit_by": "k"},
              "B#1": {"klass": "m:B", "delay_us": 1, "timeout_us": None, "limit_by": None}},
    "edges": {"A#0": {"type": "expand", "to": ["B#1"]},
              "B#1": {"type": "collapse", "to": ["A#0"], "barrier": ["A#0"]}},
}


def mutate(path, value):
    data = json.loads(json.dumps(GOOD))
    *parents, last = path
    target = data
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return data


def test_from_json_reads_good_snapshot():
    definition = Definition.from_json(GOOD)
    assert definition.to_json() == GOOD
    assert definition.node_options("A#0") == NodeSpec("m:A", None, 5, "k")
    assert definition.edges["B#1"] == EdgeSpec("collapse", ["A#0"], ["A#0"])
    assert definition.limit_keys() == {"k"}
    with pytest.raises(KeyError, match="m:P has no node 'Z#9'"):
        definition.node_options("Z#9")


#: trigger's digest of GOOD's snapshot, computed before partitioned keys existed (at 7b854f8)
SHA1_OF_GOOD = "89e81bc419c0df9a7f658fb66cc9bd921fcbbfed"
PARTITIONED = mutate(["nodes", "B#1", "limit_by"], {"family": "vendor_api", "field": "order.id", "arg": 0})


def test_from_json_reads_a_partitioned_limit_by():
    definition = Definition.from_json(PARTITIONED)
    assert definition.node_options("B#1") == NodeSpec("m:B", 1, None, None, PartitionBy("vendor_api", "order.id", 0))
    assert definition.to_json() == PARTITIONED
    assert (definition.limit_keys(), definition.limit_families()) == ({"k"}, {"vendor_api"})


def test_a_static_keys_snapshot_and_digest_are_as_before_partitions():
    """A static key's node snapshots as it did (the four keys, in order), so a definition
    digest (``trigger``'s sha1 of the sorted JSON) is unchanged: pinned for GOOD."""
    import hashlib

    text = json.dumps(Definition.from_json(GOOD).to_json(), sort_keys=True)
    assert list(Definition.from_json(GOOD).nodes["A#0"].to_json()) == ["klass", "delay_us", "timeout_us", "limit_by"]
    assert hashlib.sha1(text.encode()).hexdigest() == SHA1_OF_GOOD


@pytest.mark.parametrize("bad", [
    {"family": "vendor_api", "field": "order"}, {"family": "vendor_api", "field": "order", "arg": 0, "x": 1},
    {"family": "v[", "field": "order", "arg": 0}, {"family": " ", "field": "order", "arg": 0},
    {"family": "vendor_api", "field": "a..b", "arg": 0}, {"family": "vendor_api", "field": 3, "arg": 0},
    {"family": "vendor_api", "field": "order", "arg": -1}, {"family": "vendor_api", "field": "order", "arg": True},
    {"family": "vendor_api", "field": "order", "arg": "0"}, {}], ids=repr)
def test_from_json_refuses_a_bad_partition(bad):
    with pytest.raises(DefinitionError) as info:
        Definition.from_json(mutate(["nodes", "B#1", "limit_by"], bad))
    assert (info.value.pipeline, info.value.transition) == ("m:P", "snapshot")
    assert info.value.reason == (
        "node 'B#1': a partitioned limit_by must be {family, field, arg} (a non-blank family without '[', a "
        f"dotted field, an int arg >= 0), got {bad!r}")


def test_from_json_reads_on_halt():
    hooked = {**GOOD, "on_halt": "m:H"}
    definition = Definition.from_json(hooked)
    assert definition.on_halt == "m:H"
    assert definition.to_json() == hooked


@pytest.mark.parametrize(("data", "reason"), [
    (mutate(["nodes"], {}), "nodes must be a non-empty object"),
    (mutate(["edges"], []), "edges must be an object"),
    ({**GOOD, "on_halt": 3}, "on_halt must be 'module:qualname', got 3"),
    ({**GOOD, "on_halt": "H"}, "on_halt must be 'module:qualname', got 'H'"),
    ({**GOOD, "on_halt": "m:H", "extra": 1},
     "expected keys ['edges', 'format', 'nodes', 'pipeline', 'start'] (and optionally ['on_halt']), "
     "got ['edges', 'extra', 'format', 'nodes', 'on_halt', 'pipeline', 'start']"),
])
def test_from_json_refusal_reasons(data, reason):
    with pytest.raises(DefinitionError) as info:
        Definition.from_json(data)
    assert (info.value.pipeline, info.value.transition, info.value.reason) == ("m:P", "snapshot", reason)


def test_edge_targets():
    assert EdgeSpec("divide", ["B#1", "C#2"]).first() == "B#1"
    divert = EdgeSpec("divert", {"a": "B#1", "": "C#2", "otherwise": "D#3"})
    # None: an output no key matches (a list, a dict), even with a key rendered ""
    assert [divert.divert_target(key) for key in ("a", "", "zz", None)] == ["B#1", "C#2", "D#3", "D#3"]


@pytest.mark.parametrize(("data", "needle"), [
    ([], "expected a JSON object, got list"),
    (mutate(["format"], 2), "format=2: only format 1 is understood"),
    (mutate(["format"], True), "format=True"),
    (mutate(["extra"], 1), "expected keys"),
    (mutate(["edges"], KeyError), "expected keys"),
    (mutate(["pipeline"], 5), "pipeline must be 'module:qualname', got 5"),
    (mutate(["start"], "Z#9"), "start 'Z#9' is not a node"),
    (mutate(["start"], ["A#0"]), "is not a node"),
    (mutate(["nodes"], {}), "nodes must be a non-empty object"),
    (mutate(["nodes", "A#0", "klass"], KeyError), "node 'A#0': expected keys"),
    (mutate(["nodes", "A#0", "klass"], "noclass"), "klass must be 'module:qualname'"),
    (mutate(["nodes", "A#0", "delay_us"], 0), "delay_us must be a positive int or null, got 0"),
    (mutate(["nodes", "A#0", "timeout_us"], True), "timeout_us must be a positive int or null"),
    (mutate(["nodes", "A#0", "limit_by"], " "), "limit_by must be a non-blank str or null"),
    (mutate(["edges", "Z#9"], {"type": "chain", "to": ["A#0"]}), "edge from 'Z#9': no such node"),
    (mutate(["edges", "A#0", "type"], "teleport"),
     "type must be one of chain, expand, divide, combine, collapse, divert, converge, dampen, got"),
    (mutate(["edges", "A#0", "to"], ["B#1", "A#0"]), "expand 'to' must be a list of one node name"),
    (mutate(["edges", "A#0", "to"], ["Z#9"]), "'to' names unknown nodes"),
    (mutate(["edges", "A#0", "barrier"], ["A#0"]), "expected keys ['to', 'type']"),
    (mutate(["edges", "B#1", "barrier"], KeyError), "expected keys ['barrier', 'to', 'type']"),
    (mutate(["edges", "B#1", "barrier"], []), "barrier must be a non-empty list of node names"),
    (mutate(["edges", "B#1", "barrier"], ["Z#9"]), "barrier must be a non-empty list"),
    (mutate(["edges", "A#0"], {"type": "divert", "to": {"a": "B#1"}}), "with an 'otherwise' key"),
    (mutate(["edges", "A#0"], {"type": "divert", "to": ["B#1"]}), "with an 'otherwise' key"),
    (mutate(["edges", "A#0"], {"type": "divide", "to": []}), "divide 'to' must be a list of node"),
])
def test_from_json_rejects_garbage(data, needle):
    with pytest.raises(DefinitionError) as info:
        Definition.from_json(data)
    assert info.value.transition == "snapshot"
    assert info.value.pipeline == ("m:P" if isinstance(data, dict) and data.get("pipeline") == "m:P"
                                   else "<snapshot>")
    assert needle in str(info.value)


# --------------------------------------------------------------------------- random definitions

CLASSES = st.sampled_from([A, B, C, D, E])
INTERVALS = st.one_of(
    st.integers(1, 10**6), st.sampled_from(["1m", "1h30m", "90"]),
    st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=3)),
    st.floats(min_value=1e-6, max_value=1e6),
)
OPTIONS = st.fixed_dictionaries({}, optional={
    "delay": INTERVALS, "timeout": INTERVALS, "limit_by": st.sampled_from(["api", "db", ("fam", "order.id")])})
DIVERT_KEYS = st.lists(
    st.one_of(st.text(max_size=3), st.integers(-5, 5), st.booleans(), st.none(),
              st.floats(allow_nan=False, allow_infinity=False)),
    unique_by=render_divert_key, max_size=3,
).map(lambda keys: [k for k in keys if render_divert_key(k) != "otherwise"] + ["otherwise"])
CLOSER = {"divide": "combine", "expand": "collapse", "divert": "converge"}
CLOSER_OF = {"combine": "divide", "collapse": "expand"}


def grow(draw, builder, depth, close_all):
    """Apply random valid transitions to ``builder``; returns the builder to continue on."""
    stack = []
    for _ in range(draw(st.integers(0, 4))):
        ops = ["chain", "expand", "dampen", "divide", "divert"] + [CLOSER[k] for k in stack[-1:]]
        op, options = draw(st.sampled_from(ops)), draw(OPTIONS)
        if op in ("chain", "expand"):
            getattr(builder, op)(to=draw(CLASSES), **options)
        elif op == "dampen":
            builder.dampen(before=draw(CLASSES), **options)
        elif op in CLOSER.values():
            getattr(builder, op)(into=draw(CLASSES), **options)
            stack.pop()
        elif op == "divide":
            builder.divide(to=draw(st.lists(CLASSES, min_size=1, max_size=3)), **options)
        else:
            builder.divert(to={key: draw(CLASSES) for key in draw(DIVERT_KEYS)}, **options)
        if op in CLOSER:
            stack.append(op)
        if op in ("divide", "divert") and depth < 2 and draw(st.booleans()):
            branches = list(builder)
            leave_open = depth == 0 and not close_all and draw(st.booleans())
            for branch in branches:
                grow(draw, branch, depth + 1, close_all=not leave_open)
            if leave_open:
                return builder
            if draw(st.booleans()):  # join on the branches; else the forking builder absorbs them
                joined = getattr(branches[0], CLOSER[op])(*branches[1:], into=draw(CLASSES))
                assert joined is builder
                stack.pop()
    while close_all and stack:
        getattr(builder, CLOSER[stack.pop()])(into=draw(CLASSES))
    return builder


def route(snapshot, rnd):
    """Walk a snapshot as docs/semantics.md §3 routes it; assert every fan-in is valid and fires."""
    edges, branches = snapshot["edges"], []

    def branch(barrier):
        branches.append(
            {"barrier": barrier, "fanout": None, "width": 0, "arrivals": 0, "into": None})
        return branches[-1]

    queue = [(branch(None), snapshot["start"])]
    while queue:
        current, name = queue.pop(rnd.randrange(len(queue)))
        edge = edges.get(name)
        if edge is None:
            continue
        kind = edge["type"]
        if kind == "divert":
            queue.append((current, rnd.choice(list(edge["to"].values()))))
        elif kind in ("chain", "converge", "dampen"):
            queue.append((current, edge["to"][0]))
        elif kind in ("divide", "expand"):
            # an empty expand is a leaf whose collapse never fires (§3.6), so draw >= 1 item
            targets = edge["to"] if kind == "divide" else edge["to"] * rnd.randint(1, 3)
            current.update(fanout=(kind, name), width=len(targets))
            queue.extend((branch(current), target) for target in targets)
        else:
            barrier = current["barrier"]
            assert barrier is not None, f"{name}: fan-in on a branch without a barrier"
            fan_kind, fan_node = barrier["fanout"]
            assert fan_node in edge["barrier"], f"{name}: transition_invalid ({fan_node})"
            assert fan_kind == CLOSER_OF[kind], f"{name}: {kind} closes a {fan_kind}"
            assert barrier["into"] in (None, edge["to"][0]), "siblings merge into different nodes"
            barrier["into"] = edge["to"][0]
            barrier["arrivals"] += 1
            if barrier["arrivals"] == barrier["width"]:
                queue.append((branch(barrier["barrier"]), edge["to"][0]))
    closed = {node for e in edges.values() for node in e.get("barrier", [])}
    for b in branches:
        if b["width"]:
            expected = b["width"] if b["fanout"][1] in closed else 0
            assert b["arrivals"] == expected, b



@given(st.data(), st.randoms(use_true_random=False))
def test_random_definitions_round_trip_and_route(data, rnd):
    drawn = []

    def record(strategy):
        drawn.append(data.draw(strategy))
        return drawn[-1]

    def define(p):
        grow(record, p.start(record(CLASSES), **record(OPTIONS)), 0, record(st.booleans()))

    definition = build(define).definition
    replayed = iter(drawn)
    again = build(lambda p: grow(lambda _: next(replayed),
                                 p.start(next(replayed), **next(replayed)), 0, next(replayed)))
    text = json.dumps(definition.to_json())
    assert json.dumps(again.definition.to_json()) == text  # deterministic names and order
    assert Definition.from_json(json.loads(text)) == definition
    assert Definition.from_json(json.loads(text)).to_json() == definition.to_json()
    assert list(definition.nodes) == [f"{n.klass.split(':')[1]}#{i}"
                                      for i, n in enumerate(definition.nodes.values())]
    for _ in range(3):
        route(definition.to_json(), rnd)


def test_builder_is_the_define_argument():
    seen = []
    build(lambda p: (seen.append(p), p.start(A)))
    assert isinstance(seen[0], PipelineBuilder)


# --------------------------------------------------------------------------- names a run stores


def _named(qualname: str, base: type = A, module: str = MOD) -> type:
    """A subclass of ``base`` whose reference is ``module:qualname``."""
    return type(qualname.rsplit(".", 1)[-1], (base,), {"__qualname__": qualname, "__module__": module})


def _long(ref_chars: int) -> str:
    """A qualname (nested classes) that makes ``MOD:qualname`` exactly ``ref_chars`` long."""
    room = ref_chars - len(MOD) - 1
    return "N." * ((room - 1) // 2) + "X" * (room - 2 * ((room - 1) // 2))


@pytest.mark.parametrize("chars", [255, 256])
def test_a_class_reference_fits_the_255_characters_a_run_stores_or_is_refused(chars):
    """A pipeline's, a step class's and an on_halt handler's ``module:qualname`` are stored in
    255-character columns: 255 builds, 256 is a DefinitionError naming the length and the
    limit, when the pipeline is defined (the servers would refuse it at a trigger or in a
    worker's transaction; SQLite would store it)."""
    qualname = _long(chars)
    assert len(step_ref(_named(qualname))) == chars
    cases = {
        "pipeline": (lambda: type("P", (Pipeline,), {"define": classmethod(lambda _c, p: p.start(A)),
                                                       "__module__": MOD, "__qualname__": qualname}),
                     "P.define: the pipeline's reference"),
        "step": (lambda: build(lambda p: p.start(A).chain(to=_named(qualname))),
                 f"P.chain: {qualname}'s reference"),
        "handler": (lambda: build(lambda p: p.start(A).on_halt(_named(qualname))),
                    f"P.on_halt: {qualname}'s reference"),
    }
    for make, message in cases.values():
        if chars == 255:
            make()
            continue
        with pytest.raises(DefinitionError) as info:
            make()
        assert str(info.value).startswith(f"{message} has 256 characters, more than the 255 a run stores: ")


@pytest.mark.parametrize(("chars", "ok"), [(255, True), (256, False)])
def test_a_static_limit_key_fits_the_key_columns_or_is_refused(chars, ok):
    key = "k" * chars
    if ok:
        assert build(lambda p: p.start(A, limit_by=key)).definition.limit_keys() == {key}
    else:
        fails(lambda p: p.start(A, limit_by=key), DefinitionError,
              f"P.start: limit_by has 256 characters, more than the 255 a run stores: {'k' * 80!r}…")


@pytest.mark.parametrize(("chars", "ok"), [(252, True), (253, False)])
def test_a_familys_name_leaves_room_for_its_shortest_partition_key(chars, ok):
    """``family[0]``, the shortest partition key, must fit the 255-character key columns."""
    family = "f" * chars
    if ok:
        assert build(lambda p: p.start(A, limit_by=(family, "order"))).definition.limit_families() == {family}
    else:
        fails(lambda p: p.start(A, limit_by=(family, "order")), DefinitionError,
              f"P.start: limit_by's family has 253 characters, more than the 252 a run stores: {'f' * 80!r}…")


def test_a_node_name_fits_the_255_characters_a_run_stores_or_is_refused():
    """A node is ``<ClassName>#<i>``: a class whose reference fits may still make a node name
    that does not, once the pipeline has ten nodes (``#10``)."""
    long_name = "X" * (255 - len("#0"))  # its reference, "m:" + name, fits
    klass = _named(long_name, module="m")
    assert len(step_ref(klass)) == 255
    assert len(build(lambda p: p.start(klass)).definition.start) == 255
    chain = lambda p: functools.reduce(lambda b, _: b.chain(to=A), range(9), p.start(A)).chain(to=klass)  # noqa: E731
    with pytest.raises(DefinitionError, match=r"^P\.chain: the node name has 256 characters, more than the 255 "):
        build(chain)


def test_each_of_a_transitions_classes_has_its_own_node_name_checked():
    """A divide's second class is node ``#<n + 1>``: its name is checked with that index,
    whose digits may be one more than the first's (``#9`` then ``#10``)."""
    klass = _named("X" * (255 - len("#10") + 1), module="m")  # "X…#10" is 256 characters, "X…#9" 255
    chain = lambda p: functools.reduce(lambda b, _: b.chain(to=A), range(8), p.start(A))  # noqa: E731 - #0..#8
    with pytest.raises(DefinitionError, match=r"^P\.divide: the node name has 256 characters"):
        build(lambda p: chain(p).divide(to=[A, klass]))


#: whitespace around a name, each way ``str.strip`` removes: MySQL-family compares names
#: with trailing spaces ignored, so each would be another name's there and its own elsewhere
AROUND = ["x ", "x  ", " x", "x\t", "\nx", "x\xa0", "x\u3000"]
#: one a class reference ends with (it begins with its module's name)
TRAILING = [name for name in AROUND if name[0] == "x"]
WHITESPACE = "has whitespace around it, which MySQL-family ignores when it compares names"


@pytest.mark.parametrize("key", AROUND, ids=spelled)
@pytest.mark.parametrize("case", ["start", "expand", "divert", "combine"])
def test_a_static_limit_key_or_family_with_whitespace_around_it_is_refused_naming_it(case, key):
    """``limit_by="x "`` and ``limit_by=("x ", field)``: a DefinitionError naming the key,
    when the pipeline is defined, as a trigger key's whitespace is refused at a trigger;
    the same key without it builds."""
    fn, _ = OPTION_CASES[case]
    transition = case.split()[-1]
    fails(lambda p: fn(p, {"limit_by": key}), DefinitionError, f"P.{transition}: limit_by {WHITESPACE}: {key!r}")
    fails(lambda p: fn(p, {"limit_by": (key, "order")}), DefinitionError,
          f"P.{transition}: limit_by's family {WHITESPACE}: {key!r}")
    assert build(lambda p: fn(p, {"limit_by": key.strip()})).definition.limit_keys() == {"x"}


@pytest.mark.parametrize("name", TRAILING, ids=spelled)
def test_a_class_reference_with_whitespace_around_it_is_refused_naming_it(name):
    """A pipeline's, a step class's and an on_halt handler's ``module:qualname`` ending in
    whitespace (a class made by ``type()`` or given a ``__qualname__``): a DefinitionError
    naming the reference when the pipeline is defined; a module name beginning with it
    too."""
    ref = f"{MOD}:{name}"
    cases = {
        "pipeline": (lambda: type("P", (Pipeline,), {"define": classmethod(lambda _c, p: p.start(A)),
                                                       "__module__": MOD, "__qualname__": name}),
                     f"P.define: the pipeline's reference {WHITESPACE}: {ref!r}"),
        "step": (lambda: build(lambda p: p.start(A).chain(to=_named(name))),
                 f"P.chain: {name}'s reference {WHITESPACE}: {ref!r}"),
        "handler": (lambda: build(lambda p: p.start(A).on_halt(_named(name))),
                    f"P.on_halt: {name}'s reference {WHITESPACE}: {ref!r}"),
        "module": (lambda: build(lambda p: p.start(_named("X", module=f" {MOD}"))),
                   f"P.start: X's reference {WHITESPACE}: {' ' + MOD + ':X'!r}"),
    }
    for make, message in cases.values():
        with pytest.raises(DefinitionError) as info:
            make()
        assert str(info.value) == message


def test_a_node_name_beginning_with_whitespace_is_refused_naming_it():
    """A class named `` X`` has a reference (``m: X``) without whitespace around it, but its
    node ``' X#0'`` begins with a space."""
    fails(lambda p: p.start(_named(" X", module="m")), DefinitionError, f"P.start: the node name {WHITESPACE}: ' X#0'")
