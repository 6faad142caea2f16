"""CONTRIBUTING.md's table of operations is complete and every name in it resolves.

One row per model operation: the model operation (``model.<module>.<Class>.<method>``),
the engine function(s) that are its whole transaction (a dotted path that imports), the
conformance rule(s) that call both (a hypothesis ``@rule`` of a conformance machine, or a
hypothesis ``@given`` test that drives whole runs), the invariant IDs (defined in
INVARIANTS.md) and a note. The engine function has the model operation's name unless the
row's note says why not; a ``—`` (none) also needs a note.

Which model methods are operations (each must have a row): the public methods of
``LimitsModel`` and ``PipelinesModel`` that change the model's state, found by reading
their source: a method changes state if it assigns to an attribute or an item, deletes
one, calls a mutating method (``append``, ``add``, …), or calls a method of the model
that changes state. Excluded, with the reason: ``NOT_OPERATIONS``.

Checks: the table in CONTRIBUTING.md against ``model/``, ``ductwork/``, the conformance
machines and INVARIANTS.md.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"model.limits": "LimitsModel", "model.pipelines": "PipelinesModel"}
NOT_OPERATIONS = {
    "model.pipelines.PipelinesModel.advance_clock": "time is an input (the database's clock), not an operation",
    "model.pipelines.PipelinesModel.set_clock": "time is an input (the database's clock), not an operation",
    "model.pipelines.PipelinesModel.drive": "a loop over the operations (the oracle picks them)",
}
MUTATING_CALLS = {"append", "add", "clear", "pop", "popitem", "update", "extend", "setdefault", "remove",
                  "discard", "insert", "sort"}
NONE = "—"
CODE = re.compile(r"`([^`]+)`")


def table(text: str | None = None) -> list[dict[str, str]]:
    """The rows of the "Operations" table of CONTRIBUTING.md."""
    text = (ROOT / "CONTRIBUTING.md").read_text() if text is None else text
    section = text.split("\n## Operations\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["model operation", "engine function", "conformance rule", "INV IDs", "note"], header
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return [dict(zip(header, cells, strict=True)) for cells in rows]


def names(cell: str) -> list[str]:
    """The backquoted names of a cell; [] for a cell that is only ``—``."""
    if cell == NONE:
        return []
    found = CODE.findall(cell)
    assert found, f"cell {cell!r}: neither backquoted names nor {NONE}"
    return found


def resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted`` and get the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError: the name does not exist
        return obj
    raise ModuleNotFoundError(dotted)


def root(node: ast.AST) -> str | None:
    """The name an access starts from (``self`` in ``self.jobs[k].x``, ``d`` in ``d.get(k).y``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def fresh_containers(func: ast.FunctionDef) -> set[str]:
    """Local names bound to a container the method builds itself (changing it changes no state)."""
    built = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    fresh = set()
    for node in ast.walk(func):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        value = getattr(node, "value", None)
        is_built = isinstance(value, built) or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                                                and value.func.id in ("dict", "list", "set", "Counter"))
        if is_built:
            fresh.update(t.id for t in targets if isinstance(t, ast.Name))
    return fresh


def state_changing(cls: type) -> set[str]:
    """Methods of ``cls`` (public or not) whose source changes state, closed over calls to
    each other (``self.x(...)``)."""
    direct, calls = set(), {}
    (class_def,) = (node for node in ast.parse(inspect.getsource(inspect.getmodule(cls))).body
                    if isinstance(node, ast.ClassDef) and node.name == cls.__name__)
    for tree in class_def.body:
        if not isinstance(tree, ast.FunctionDef) or any(
                isinstance(d, ast.Name) and d.id == "property" for d in tree.decorator_list):
            continue
        name = tree.name
        calls[name] = set()
        fresh = fresh_containers(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                if any(isinstance(t, (ast.Attribute, ast.Subscript)) and root(t) not in fresh for t in targets):
                    direct.add(name)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in MUTATING_CALLS and root(node.func.value) not in fresh:
                    direct.add(name)
                if isinstance(node.func.value, ast.Name) and node.func.value.id in ("self", "cls"):
                    calls[name].add(node.func.attr)
    changing = set(direct)
    grew = True
    while grew:
        grew = False
        for name, callees in calls.items():
            if name not in changing and callees & changing:
                changing.add(name)
                grew = True
    return changing


def operations() -> set[str]:
    found = set()
    for module, class_name in MODELS.items():
        cls = getattr(importlib.import_module(module), class_name)
        for name in state_changing(cls):
            if not name.startswith("_"):
                found.add(f"{module}.{class_name}.{name}")
    return found - set(NOT_OPERATIONS)


def defined_ids() -> set[str]:
    return set(re.findall(r"^### (INV-[A-Z]{3}-\d+)", (ROOT / "INVARIANTS.md").read_text(), re.MULTILINE))


def check_conformance(ref: str) -> None:
    path, _, qualname = ref.partition("::")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    target = module
    for attr in qualname.split("."):
        target = getattr(target, attr)
    if "." in qualname:  # a machine's rule
        assert hasattr(target, "hypothesis_stateful_rule"), f"{ref} is not a hypothesis @rule"
    else:  # a test that drives whole runs through hypothesis, itself or through a helper
        assert drives_hypothesis(module, target), f"{ref} is not a hypothesis @given test"


def drives_hypothesis(module, test) -> bool:
    """True when ``test`` is a ``@given`` test or calls a function of its module, or of the
    shipped conformance package, that is (the conformance tests share one ``hunt`` helper,
    ``ductwork_proof.conformance.pipelines.hunt``, that wraps its check in ``@given``)."""
    source = inspect.getsource(test)
    if "@given(" in source:
        return True
    helpers = [value for name, value in vars(module).items()
               if inspect.isfunction(value)
               and (value.__module__ == module.__name__ or value.__module__.startswith("ductwork_proof.conformance."))
               and value is not test and re.search(rf"\b{re.escape(name)}\(", source)]
    return any("@given(" in inspect.getsource(helper) for helper in helpers)


def problems(rows: list[dict[str, str]]) -> list[str]:
    """Everything wrong with ``rows``; empty when the table is right."""
    out = []
    ids = defined_ids()
    listed = set()
    for row in rows:
        op = names(row["model operation"])
        if len(op) != 1:
            out.append(f"row {row}: one model operation per row")
            continue
        op_name = op[0]
        listed.add(op_name)
        try:
            resolve(op_name)
        except (ImportError, AttributeError) as error:
            out.append(f"{op_name}: no such model operation ({error})")
        engine = names(row["engine function"])
        for dotted in engine:
            try:
                resolve(dotted)
            except (ImportError, AttributeError) as error:
                out.append(f"{op_name}: engine function {dotted} does not import ({error})")
        same_name = [d for d in engine if d.rsplit(".", 1)[-1] == op_name.rsplit(".", 1)[-1]]
        if not (len(engine) == 1 and same_name) and not row["note"]:
            out.append(f"{op_name}: engine {engine or NONE} is not one function of the same name, and no note says why")
        rules = names(row["conformance rule"])
        if not rules and not row["note"]:
            out.append(f"{op_name}: no conformance rule, and no note says why")
        for ref in rules:
            try:
                check_conformance(ref)
            except (ImportError, AttributeError, AssertionError) as error:
                out.append(f"{op_name}: conformance rule {ref}: {error!r}")
        cited = re.findall(r"INV-[A-Z]{3}-\d+", row["INV IDs"])
        if not cited:
            out.append(f"{op_name}: no invariant ID")
        out.extend(f"{op_name}: {inv} is not defined in INVARIANTS.md" for inv in cited if inv not in ids)
    out.extend(f"model operation {op} has no row in CONTRIBUTING.md's Operations table"
               for op in sorted(operations() - listed))
    return out


def test_the_operations_table_is_complete_and_resolves():
    rows = table()
    assert rows, "CONTRIBUTING.md has no Operations table"
    assert problems(rows) == []


def test_the_known_operations_are_found():
    """The criterion finds the operations everyone knows, and not the reads."""
    found = operations()
    for op in ("limits.LimitsModel.claim", "limits.LimitsModel.complete_all_and_hand_off",
               "limits.LimitsModel.restart_with", "pipelines.PipelinesModel.advance",
               "pipelines.PipelinesModel.resume"):
        assert f"model.{op}" in found
    for read in ("limits.LimitsModel.in_flight", "limits.LimitsModel.levels", "limits.LimitsModel.pending",
                 "pipelines.PipelinesModel.summary", "pipelines.PipelinesModel.context_get"):
        assert f"model.{read}" not in found


@pytest.mark.parametrize(("breakage", "expected"), [
    (("engine function", "`ductwork.limits.claims.restart_with`", "`ductwork.limits.claims.no_such_function`"),
     "does not import"),
    (("model operation", "`model.limits.LimitsModel.claim`", "`model.limits.LimitsModel.claim_one`"),
     "no such model operation"),
    (("conformance rule", "LimitsAgainstModel.restart_with`", "LimitsAgainstModel.inv_lim_model_invariants_hold`"),
     "is not a hypothesis @rule"),
    # a plain function that neither is @given nor calls a helper that is
    (("conformance rule", "test_engine_revives_end_where_the_model_ends", "examples"),
     "is not a hypothesis @given test"),
    (("INV IDs", "INV-LIM-4, INV-LIM-7", "INV-LIM-4, {undefined}"), "not defined in INVARIANTS.md"),
    (("engine function", "`ductwork.limits.claims.restart_with`", "`ductwork.limits.claims.claim`"),
     "no note says why"),
])
def test_a_broken_row_is_reported(breakage, expected):
    column, old, new = breakage
    # an ID one past the highest INV-LIM defined, so the case cites no real (or future-looking) ID
    undefined_lim = max(int(inv.rsplit("-", 1)[1]) for inv in defined_ids() if inv.startswith("INV-LIM-")) + 1
    new = new.replace("{undefined}", f"INV-LIM-{undefined_lim}")
    rows = table()
    hits = [row for row in rows if old in row[column]]
    assert len(hits) == 1, f"{old!r} is in {len(hits)} rows"
    hits[0][column] = hits[0][column].replace(old, new)
    assert any(expected in problem for problem in problems(rows)), problems(rows)


def test_a_missing_row_is_reported():
    rows = [row for row in table() if "LimitsModel.reap`" not in row["model operation"]]
    assert "model operation model.limits.LimitsModel.reap has no row" in " ".join(problems(rows))
