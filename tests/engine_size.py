"""The engine's size and shape, and the budgets on them (issue 31); the lint tier checks them.

    python -m tests.engine_size            # the report; exit status 1 when a budget is broken

Prints the engine core's code lines per package (``ductwork/db``, ``limits``, ``pipelines``,
``fleet``), the largest modules, the most complex functions, and each budget's status:

- no function of ``ductwork/`` (methods and nested functions included, migrations
  excluded) above cyclomatic complexity :data:`MAX_COMPLEXITY`, as radon counts it (each
  ``def`` on its own: a nested function's branches count for it, not for the one around it);
- no module of ``ductwork/`` (migrations included) above :data:`MAX_MODULE_LINES` lines;
- no ``import Database as App`` (a layer below the top takes a ``Database`` and says so);
- no ``Any`` at a package boundary: no name defined below the top (in ``fleet``,
  ``pipelines``, ``limits``, ``db`` or a base module) and imported into another layer (the
  layers of ``[tool.importlinter]`` in pyproject.toml) says ``Any`` in its signature, its
  public methods' signatures or its annotated fields (SQLAlchemy's ``Row[Any]``,
  ``Select[Any]``… aside: ``Any`` is their own parameter). The top's own names (the public
  face, the CLI, the dashboard) are not checked. A JSON value is ``ductwork.values.Json``;
  a value a function validates is ``object``;
- the engine core's code lines (lines that are not blank, not comments and not docstrings;
  migrations excluded) at most :data:`CODE_LINES_BUDGET`: a ratchet, so the engine may not
  grow. The commit that removes code lowers the number (the report prints the count);
- the engine core's code tokens (the same code, counted in Python tokens) at most
  :data:`CODE_TOKENS_BUDGET`: the same ratchet, which joining lines cannot satisfy.

``tests/lint/test_budgets.py`` asserts each, and shows each check failing on a copy of the
package with one budget broken. Counting needs ``radon`` (the ``test`` extra).
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the engine core: the packages under the public face, whose code lines the ratchet counts
CORE = ("db", "limits", "pipelines", "fleet")
#: the highest cyclomatic complexity (radon's) of any function in ductwork/
MAX_COMPLEXITY = 15
#: the most lines (all of them) of any module in ductwork/
MAX_MODULE_LINES = 600
#: the engine core's code lines at the start of issue 31 (commit 6bcd6ac), by :func:`code_lines`
CODE_LINES_AT_ISSUE_31 = 6_305
#: issue 31's goal: at least 20 % below the count at its start
CODE_LINES_GOAL = CODE_LINES_AT_ISSUE_31 * 4 // 5
#: the ratchet: the engine core's code lines may not exceed this; lower it in the commit
#: that removes code (``python -m tests.engine_size`` prints the count). Raised from 6,581
#: by 38 for issue 35's refusal counts (``ductwork_key_refusals``: its table, the upsert
#: that adds, the worker's count and the heartbeat that writes it); lowered to 6,458 by
#: issue 32's one keyed path (the lane routine replaced the Python claim and its parallel
#: paths; its SQL is reported beside the count by :func:`sql_code_lines`); raised by 6 for
#: the CPU share of a thread's bodies (``fleet.batching``: CPU-bound bodies take the
#: process's share of a key) and lowered to 6,421 when a step came to hold its job
#: (revision 0011: no job row to write, join or carry), then to 6,416 when the lane module lost two
#: functions nothing called (``precedes``, ``next_lane``: found by the guard modules' mutants),
#: then to 6,120 by issue 31's clean-ups, two beside each other: db/, fleet/ and limits/ (-102:
#: near-duplicates folded into one function each: dialect variants, schema columns, /proc
#: reads, a URL's checks) and pipelines/ (-194: history's records built from their rows by
#: name, a step's failure, invalid return and crash recorded by one function, helpers used
#: once, loops a comprehension says and guards no caller needs); 6,119 when the log's traceback became
#: ErrorInfo.log_traceback (outcomes had imported it from hooks); 6,106 when a success's output
#: came to be written by its step's guarded status write (``branches.set_status_if``: four
#: statement builders folded into it), a worker's inline move stopped writing an advancement
#: row, a trigger's handle came from what it wrote, a transaction's wake-ups became one
#: statement, and ``Tx.backend`` (unread) went; 6,031 when fleet/ and db/ lost 75 (the map of
#: unique constraints derived from the tables; names nothing read gone: ``Loop.busy``,
#: ``dialects.BACKENDS``, ``schema.LIMIT_TABLES``, ``wakeup.CHANNEL``; one pid probe for hosts
#: and processes, a two-constant seam become a table, the error columns and SQLite's pragmas
#: said once, helpers used once inlined); 5,997 when pipelines/ lost 34 more: a definition's
#: transitions adding their nodes and edges through one ``PipelineBuilder._extend``
#: (``_fan_out`` and ``_Graph.connect`` folded in) with one step-class check, history's
#: queries selecting their records' fields by name (``_columns``), ``registry.referenced_class``
#: (read once) inlined, and smaller folds in step.py, snapshot.py and ``parse_since``; 5,994
#: when three names nothing needed left guard modules (``lanes._e`` assigned twice,
#: ``advance.MAX_CLAIM_ATTEMPTS`` unread, ``definition``'s re-export of ``Definition``). Then a
#: feature, not a speed pass: partitioned
#: keys (issue 34) add what :data:`PARTITIONED_KEYS_LINES` counts, named apart so that the
#: clean-ups' ratchet stays visible: ``limit_by=(family, field)`` (its declaration checked and
#: resolved, its snapshot, its key rendered from each step's input, a worker's inline move
#: leaving an unrenderable one to an advancer, the boot check of the families its pipelines
#: use), and its enforcement (a partition's entry and family resolved, the family's lock, count
#: and ceiling on the Python path and in the lane scan)
PARTITIONED_KEYS_LINES = 109
#: and the lane walk (issue 34's B8: a poll's cost the same with 10⁴ partitions as with 10):
#: the scan that probed every key's row became a walk of the pending executions in poll order
#: that stops at the lanes it needs (``lanes.scan_lanes``), and a poll tries the lanes of one
#: walk, then walks on past them (``claims.claim_batch``); it replaced the scan, and is longer
LANE_WALK_LINES = 8
#: and forgetting idle partitions (issue 34, INV-LIM-9): ``forget_partition`` and its bounded
#: sweep, the supervisor's tick that runs it, a claim creating a forgotten key's row and a new
#: partition row numbering on from its family's seq (``lock_key``)
FORGET_PARTITIONS_LINES = 43
#: and a move, not a removal: the text and ``--json`` documents of ``ductwork runs`` and
#: ``ductwork show`` (``history_text.py``: 135 code lines of presentation) left
#: ``pipelines/`` for the top, beside ``status.py``'s text of ``ductwork status``; the engine
#: layers hold no presentation. Counted apart so that the removals stay visible
PRESENTATION_MOVED_LINES = 135
#: and a feature: the sweep's idle age and batch read from ``supervisor.forget_idle_after``
#: and ``supervisor.forget_batch`` (the supervisor's ``_forget`` reads its section and passes
#: both on; the settings themselves live in ``config.py``, outside the core)
FORGET_SETTINGS_LINES = 2
#: and a bug fix: the reasons a poll can be refused for, a ``Literal`` type
#: (``limits.plan.Refused``), so that a test can hold each against the width of the column
#: the workers count them in (``family_concurrency`` did not fit: revision 0015)
REFUSED_TYPE_LINES = 2
#: and the lease kept apart from the counters: a worker's heartbeat that failed with its
#: refusal counts is sent again without them, and the failure logged (``Runner.beat``)
HEARTBEAT_WITHOUT_COUNTS_LINES = 8
#: and bug fixes: a user's value fitted to, or refused before, the bounded column it is stored
#: in, which SQLite does not check and the servers do (tests/integration/test_column_widths.py):
#: an error's class cut and NUL written out (``ErrorInfo``); the names a definition stores
#: (class references, node names, static keys, a family's) refused past their columns
#: (``definition._Graph.check_name`` and its calls); a supervisor's label refused when a
#: child's would not fit (``Supervisor``); a batch insert's bounded strings sent as text on
#: PostgreSQL, refused by their column rather than cut by a cast (``dialects._unnest_insert``),
#: and MySQL-family sessions strict whatever the server's mode (``engines.MYSQL_SQL_MODE``);
#: a context key with whitespace around it or a NUL refused (``Context._check_key``), as a
#: trigger key is (tests/integration/test_string_compare.py)
FITTED_VALUES_LINES = 33
#: and bug fixes: names compared as PostgreSQL and SQLite compare them on MySQL-family, whose
#: collations ignore trailing spaces (tests/integration/test_string_compare.py): a class
#: reference, node name, static key or family with whitespace around it refused when defined
#: (``definition._Graph.check_name``, with the check context keys now share,
#: ``limit_entries.has_whitespace_around``), and a process's label in the binary NO PAD
#: collation of the server (``schema.NoPadBin``, revision 0016; ``schema.no_pad_bin``: an
#: older MySQL has none, and gets ``utf8mb4_bin``); and a pipeline filter of ``runs`` and
#: ``prune`` with whitespace around it refused (``history.of_pipeline``, 3 lines)
PAD_SPACE_LINES = 16
#: then lowered by 4 when a batch came to take runs of several lanes and a group commit to
#: record them in one transaction (issue 34's drain): the rule that a mixed group is recorded
#: one by one and the worker's flush on a change of lane went, ``release`` (a
#: ``release_and_claim`` that claims nothing) and the group's own exception (``_Taken``, now
#: ``CommitFailed``) with ``_commit_one`` and ``_commit_group`` were folded into their callers
CROSS_LANE_BATCHES_LINES = -4
#: and a bug fix: a poll's claim in a lane that the database rolled back for contention (a
#: deadlock's victim on MariaDB, beside a transaction inserting executions) is made again
#: (``dialects.retry_transient``, as a commit is) instead of ending the worker's ``run_once``
#: with the error (``claims._claim_lane``)
CLAIM_RETRIED_LINES = 2
#: and raised by 18 when a thread's poll came to pass a lane a sibling thread of its process is
#: trying to fill or holds full (``claims._claim_lane``, ``Database.filling``, released in
#: ``release_and_claim`` and ``outcomes._commit``; named since: :data:`MARKS_NAMED_LINES`), on
#: a server: threads walking the same oldest lanes tried the lanes a sibling had, 3 tries in 4
#: in vain, and five threads drained a family's partitions slower than one (bench/RESULTS.md,
#: "B8: threads pass the lanes a sibling fills"). A refusal made without a round trip, on the one poll path
SIBLING_FILLS_LINES = 18
#: and by 2 for a bug fix: ``prune`` refuses a pipeline filter it would refuse anyway before
#: it starts, so ``ductwork prune --pipeline " x"`` no longer prints its cutoff and then the error
PRUNE_FILTER_FIRST_LINES = 2
#: and by 4 when the marks of :data:`SIBLING_FILLS_LINES` were named: ``claims.no_longer_full``,
#: called by each outcome (``outcomes._commit``, ``outcomes._end_in``) instead of a discard
#: inside ``release_and_claim`` and a second in ``_commit``, and ``claims._try_marked``, the
#: mark around a try, out of ``_claim_lane``, which tells ``claim_batch`` whether its run
#: filled the key instead of ``claim_batch`` reading the key's entry again
MARKS_NAMED_LINES = 4
#: and by 1 when a batch's scan came to find as many lanes as the batch may still claim
#: executions (``claims.claim_batch``'s ``want``) instead of eight: ten threads of a process
#: scanned the same eight lanes, passed the seven their siblings were filling and scanned
#: again, a scan a claim (bench/RESULTS.md, "B8: a scan of the lanes a batch may claim")
BATCH_SCAN_LINES = 1
#: and a change of round trips, not of paths (issues 32 and 34): on PostgreSQL a read-only
#: block and a poll's one call of the lane routine run without BEGIN and COMMIT
#: (``dialects.runs_outside_transactions``, ``Database.begin(one_statement=)``). Paid for in
#: the same stop: the base below lost 109 lines to issue 31's clean-ups of 2026-12-08 (five
#: modules' helpers folded, dialects' two-variant seams become tables, history's run records
#: read once, …). (A pooled connection pinged only when idle, measured in the same stop,
#: was reverted: no gain, and an error logged after a connection was killed.)
ROUND_TRIPS_LINES = 5
#: and a newcomer's trip-up fixed: a step after start whose ``__init__`` cannot take the one
#: input every transition but start gives it (an expand's item spread over two parameters)
#: is refused when the pipeline is defined (``_Graph.add_nodes``), not halted at its first run
ONE_INPUT_LINES = 8
CODE_LINES_BUDGET = (5_885 + ROUND_TRIPS_LINES + ONE_INPUT_LINES + CROSS_LANE_BATCHES_LINES + CLAIM_RETRIED_LINES
                     + SIBLING_FILLS_LINES + PRUNE_FILTER_FIRST_LINES + MARKS_NAMED_LINES + BATCH_SCAN_LINES
                     + PARTITIONED_KEYS_LINES + LANE_WALK_LINES + FORGET_PARTITIONS_LINES - PRESENTATION_MOVED_LINES
                     + FORGET_SETTINGS_LINES + REFUSED_TYPE_LINES + HEARTBEAT_WITHOUT_COUNTS_LINES
                     + FITTED_VALUES_LINES + PAD_SPACE_LINES)
#: the engine core's code tokens (:func:`code_tokens`) may not exceed this either: a second
#: ratchet beside the lines', because a line count cannot tell code removed from code joined
#: onto fewer lines, and a token count can (joining two lines removes no token). Lower it in
#: the commit that removes code; a feature raises it with a named reason, as the lines' above.
#: Set at 62,712 (2026-12-07, the engine core as at the ratchet's 6,019 lines)
#: and raised by the tokens of the lines :data:`FORGET_SETTINGS_LINES` counts (``_forget``
#: reading ``supervisor.forget_batch`` and ``forget_idle_after`` and passing both on)
FORGET_SETTINGS_TOKENS = 28
#: and by the tokens of the lines :data:`REFUSED_TYPE_LINES` counts
REFUSED_TYPE_TOKENS = 16
#: and by those of :data:`HEARTBEAT_WITHOUT_COUNTS_LINES`
HEARTBEAT_WITHOUT_COUNTS_TOKENS = 44
#: and by those of :data:`FITTED_VALUES_LINES`
FITTED_VALUES_TOKENS = 345
#: and by those of :data:`PAD_SPACE_LINES` (less 12: two cuts of an ``ErrorInfo``'s
#: message to its column, which ``ErrorInfo`` makes itself, removed from outcomes and hooks)
PAD_SPACE_TOKENS = 128
#: and lowered by the tokens of :data:`CROSS_LANE_BATCHES_LINES`' change
CROSS_LANE_BATCHES_TOKENS = -39
#: and raised by those of :data:`CLAIM_RETRIED_LINES`
CLAIM_RETRIED_TOKENS = 24
#: and by those of :data:`SIBLING_FILLS_LINES`
SIBLING_FILLS_TOKENS = 156
#: and by those of :data:`PRUNE_FILTER_FIRST_LINES`
PRUNE_FILTER_FIRST_TOKENS = 16
#: and by those of :data:`MARKS_NAMED_LINES`
MARKS_NAMED_TOKENS = 64
#: and by those of :data:`BATCH_SCAN_LINES`
BATCH_SCAN_TOKENS = 15
#: and by those of :data:`ROUND_TRIPS_LINES` (the base lowered by the clean-ups' 739)
ROUND_TRIPS_TOKENS = 69
#: and by those of :data:`ONE_INPUT_LINES`
ONE_INPUT_TOKENS = 32
CODE_TOKENS_BUDGET = (61_973 + ROUND_TRIPS_TOKENS + ONE_INPUT_TOKENS + CROSS_LANE_BATCHES_TOKENS + CLAIM_RETRIED_TOKENS
                      + SIBLING_FILLS_TOKENS + PRUNE_FILTER_FIRST_TOKENS + MARKS_NAMED_TOKENS + BATCH_SCAN_TOKENS
                      + FORGET_SETTINGS_TOKENS + REFUSED_TYPE_TOKENS + HEARTBEAT_WITHOUT_COUNTS_TOKENS
                      + FITTED_VALUES_TOKENS + PAD_SPACE_TOKENS)
#: the engine core's SQL routines (``*.sql`` files), counted apart: code lines are those
#: that are not blank and not only a ``--`` comment
SQL_LINE = re.compile(r"^\s*(?:--|$)")
#: SQLAlchemy generics whose ``Any`` is their row or column type, not a hole in ours
SQLALCHEMY_ANY = re.compile(r"\b(?:sa\.)?(?:Row|Select|ColumnElement|Update|Insert|CompoundSelect|ScalarSelect"
                            r"|CursorResult|Column|Executable)\[Any\]")


def modules(package: Path, *, migrations: bool = False) -> list[Path]:
    """The modules of ``package`` (``ductwork/``), sorted; those of ``db/migrations`` only
    with ``migrations``."""
    return sorted(p for p in package.rglob("*.py") if migrations or "migrations" not in p.relative_to(package).parts)


def module_name(package: Path, path: Path) -> str:
    """``ductwork.db.database`` for ``ductwork/db/database.py``; a package's ``__init__`` is
    the package."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# --------------------------------------------------------------------------- code lines


def code_tokens(source: str) -> list[tokenize.TokenInfo]:
    """The tokens of ``source`` that are code: not a comment, a line break, an indentation
    or a docstring (a module's, a class's or a function's first statement, when a string).
    A multi-line string that is not a docstring (SQL text) is one token of code."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER)
    return [token for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type not in skip and not (token.type == tokenize.STRING and token.start[0] in docstrings)]


def code_lines(source: str) -> int:
    """Lines of ``source`` that hold code (:func:`code_tokens`): not blank, not only a
    comment, not part of a docstring. A line of a multi-line string that is not a docstring
    (SQL text) is code."""
    return len({line for token in code_tokens(source) for line in range(token.start[0], token.end[0] + 1)})


def sql_code_lines(package: Path) -> dict[str, int]:
    """The code lines of each SQL routine file under the engine core, by path: read by an
    auditor like the Python, reported beside it, not in the ratchet (which counts Python).
    Not the older versions a migration keeps as history (``db/migrations/routines/``)."""
    return {str(path.relative_to(package.parent)): sum(1 for line in path.read_text().splitlines()
                                                       if not SQL_LINE.match(line))
            for name in CORE for path in sorted((package / name).rglob("*.sql")) if "migrations" not in path.parts}


def core_code_lines(package: Path) -> dict[str, int]:
    """The engine core's code lines per package (``db``, ``limits``, ``pipelines``,
    ``fleet``), migrations excluded."""
    return {name: sum(code_lines(path.read_text()) for path in modules(package / name)) for name in CORE}


def core_code_tokens(package: Path) -> int:
    """The engine core's code tokens (:func:`code_tokens`), migrations excluded."""
    return sum(len(code_tokens(path.read_text())) for name in CORE for path in modules(package / name))


# --------------------------------------------------------------------------- complexity


@dataclass(frozen=True)
class Function:
    """A function's cyclomatic complexity, where it is and its qualified name."""

    complexity: int
    path: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.complexity})"


def _defs(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from _defs(child, f"{prefix}{child.name}.<locals>.")
        elif isinstance(child, ast.ClassDef):
            yield from _defs(child, f"{prefix}{child.name}.")
        else:
            yield from _defs(child, prefix)


def complexities(package: Path) -> list[Function]:
    """Every function of ``package`` (migrations excluded), most complex first. Each
    ``def`` is measured by radon on its own (radon's visitor, given a module of that one
    function), so a method of a class defined inside a function is measured too."""
    from radon.visitors import ComplexityVisitor

    found = []
    for path in modules(package):
        for name, node in _defs(ast.parse(path.read_text()), ""):
            visited = ComplexityVisitor.from_ast(ast.Module(body=[node], type_ignores=[]))
            found.append(Function(visited.functions[0].complexity, str(path.relative_to(package.parent)),
                                  node.lineno, name))
    return sorted(found, key=lambda f: (-f.complexity, f.path, f.line))


# --------------------------------------------------------------------------- typed seams


def database_as_app(package: Path) -> list[str]:
    """Imports that name something else ``App`` (``from ductwork.db.database import
    Database as App``), as ``path:line``."""
    found = []
    for path in modules(package, migrations=True):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [f"{path.relative_to(package.parent)}:{node.lineno} {alias.name} as App"
                          for alias in node.names if alias.asname == "App" and alias.name.split(".")[-1] != "App"]
    return found


def layers(pyproject: Path) -> tuple[dict[str, int], int]:
    """Each top-level name under ``ductwork`` mapped to its layer's index in the ``layers``
    contract of ``pyproject`` (0 the highest), and the index of the lowest layer above the
    packages' (the public face: it and what is above it are the top)."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    order = next(c["layers"] for c in contracts if c["id"] == "layers")
    index = {name.strip(): i for i, layer in enumerate(order) for name in layer.split(":")}
    return index, index["app"]


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.expr]]:
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *(a for a in (args.vararg, args.kwarg) if a)]
    found = [(f"{node.name}({a.arg})", a.annotation) for a in every if a.annotation is not None]
    return found + ([(f"{node.name} ->", node.returns)] if node.returns is not None else [])


def _annotations(node: ast.AST) -> list[tuple[str, ast.expr]]:
    """What a user of ``node`` (a function or a class) sees typed: a function's parameters
    and return; a class's annotated fields, its public methods' and ``__init__``'s
    signatures, and the public attributes ``__init__`` annotates (``self.x: T``)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return _signature(node)
    if not isinstance(node, ast.ClassDef):
        return []
    found = [(f"{node.name}.{ast.unparse(n.target)}", n.annotation) for n in node.body if isinstance(n, ast.AnnAssign)]
    for method in node.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                not method.name.startswith("_") or method.name == "__init__"):
            found += [(f"{node.name}.{where}", annotation) for where, annotation in _signature(method)]
            if method.name == "__init__":
                found += [(f"{node.name}.{n.target.attr}", n.annotation) for n in ast.walk(method)
                          if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Attribute)
                          and not n.target.attr.startswith("_")]
    return found


def boundary_anys(package: Path, pyproject: Path) -> list[str]:
    """Names defined below the top and imported into another layer, whose annotations
    (:func:`_annotations`) say ``Any`` outside SQLAlchemy's generics, as
    ``module.name.where: annotation``. A name a package's ``__init__`` re-exports is followed
    to its definition; a module imported whole (``from ductwork.db import dialects``) is
    checked for each of its names the importer uses (``dialects.upsert``)."""
    index, top = layers(pyproject)
    trees = {module_name(package, path): ast.parse(path.read_text()) for path in modules(package)}
    defs = {(module, node.name): node for module, tree in trees.items() for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}

    def layer(module: str) -> int:
        name = module.split(".")[1] if "." in module else "app"
        assert name in index, f"ductwork.{name} is in no layer of [tool.importlinter] in {pyproject}"
        return index[name]

    def definition(module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        if (module, name) in defs:
            return module, defs[module, name]
        for node in trees.get(module, ast.Module(body=[], type_ignores=[])).body:  # a re-export
            if isinstance(node, ast.ImportFrom) and node.module and depth < 5:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return definition(node.module, alias.name, depth + 1)
        return None

    found = set()
    for importer, tree in trees.items():
        used = [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module and node.module.startswith("ductwork.") for alias in node.names]
        whole = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module for alias in node.names
                 if f"{node.module}.{alias.name}" in trees}
        used += [(whole[n.value.id], n.attr) for n in ast.walk(tree)
                 if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in whole]
        for module, name in used:
            if layer(module) == layer(importer) or layer(module) <= top:
                continue
            target = definition(module, name)
            if target is None:
                continue
            for where, annotation in _annotations(target[1]):
                text = ast.unparse(annotation)
                if re.search(r"\bAny\b", SQLALCHEMY_ANY.sub("", text)):
                    found.add(f"{target[0]}.{where}: {text}")
    return sorted(found)


# --------------------------------------------------------------------------- the report


def long_modules(package: Path) -> list[str]:
    """Modules of ``package`` (migrations included) above :data:`MAX_MODULE_LINES` lines."""
    return [f"{path.relative_to(package.parent)} ({lines})" for path in modules(package, migrations=True)
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES]


def budgets(package: Path, pyproject: Path, functions: list[Function] | None = None,
            counted: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Each budget's breaches (empty lists: every budget kept); ``functions`` and ``counted``
    when :func:`complexities` and :func:`core_code_lines` have been run already."""
    functions = complexities(package) if functions is None else functions
    total = sum((core_code_lines(package) if counted is None else counted).values())
    tokens = core_code_tokens(package)
    return {
        f"no function above complexity {MAX_COMPLEXITY}": [str(f) for f in functions if f.complexity > MAX_COMPLEXITY],
        f"no module above {MAX_MODULE_LINES} lines": long_modules(package),
        "no Database as App": database_as_app(package),
        "no Any at a package boundary": boundary_anys(package, pyproject),
        f"the engine core within {CODE_LINES_BUDGET:,} code lines": [f"{total:,}"] if total > CODE_LINES_BUDGET else [],
        f"the engine core within {CODE_TOKENS_BUDGET:,} code tokens": [f"{tokens:,}"] if tokens > CODE_TOKENS_BUDGET
        else [],
    }


def report(package: Path = REPO / "ductwork", pyproject: Path = REPO / "pyproject.toml") -> tuple[str, bool]:
    """The printed report, and whether every budget is kept."""
    counted = core_code_lines(package)
    total = sum(counted.values())
    functions = complexities(package)
    sizes = sorted(((len(p.read_text().splitlines()), code_lines(p.read_text()), p) for p in modules(package)),
                   key=lambda s: (-s[0], s[2]))
    out = [f"engine core code lines (not blank, comments or docstrings; migrations excluded): {total:,}",
           "  " + ", ".join(f"{name} {n:,}" for name, n in counted.items()),
           f"  at the start of issue 31 (6bcd6ac): {CODE_LINES_AT_ISSUE_31:,}; goal (20 % below): "
           f"{CODE_LINES_GOAL:,}; ratchet: {CODE_LINES_BUDGET:,}"
           + (f" (lower it to {total:,})" if total < CODE_LINES_BUDGET else ""),
           f"  code tokens (a line joined to another is no token fewer): {core_code_tokens(package):,}; ratchet: "
           f"{CODE_TOKENS_BUDGET:,}",
           "  beside it, the SQL routines (code lines): "
           + ", ".join(f"{path} {n:,}" for path, n in sql_code_lines(package).items()),
           "largest modules of ductwork/ (lines, code lines):"]
    out += [f"  {p.relative_to(package.parent)} {lines} / {code}" for lines, code, p in sizes[:8]]
    out.append("most complex functions of ductwork/ (radon's cyclomatic complexity):")
    out += [f"  {f}" for f in functions[:8]]
    out.append("budgets:")
    broken = budgets(package, pyproject, functions, counted)
    for name, breaches in broken.items():
        out.append(f"  {'BROKEN' if breaches else 'ok'}: {name}" + "".join(f"\n    {b}" for b in breaches))
    return "\n".join(out), not any(broken.values())


def main() -> int:
    text, kept = report()
    print(text)
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
