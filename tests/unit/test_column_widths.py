"""Every value the engine writes into a bounded string column fits it, without a database.

SQLite does not check a ``VARCHAR(n)``'s length; PostgreSQL and MySQL-family refuse a longer
value (``value too long``, error 1406), or, on PostgreSQL, cut it silently where it is cast
(``dialects.insert_rows``' arrays). So a value one character too long passes every test on
SQLite and fails only on the servers, at run time: ``family_concurrency`` (18 characters) in
``ductwork_key_refusals.reason VARCHAR(16)`` failed every heartbeat after it until revision
0015 (``tests/unit/test_plan.py`` holds the refusal reasons; they are a row here too).

Here each set of values the engine writes, from where it is defined (a ``Literal``, a tuple,
constants, the function that computes them) or, where no one place defines it, listed with
the places that write it, is held against the width of every column it is written into, and
against the MySQL lane routine's declarations it passes through (a ``VARCHAR(n)`` parameter
or variable refuses a longer value as the column does). Each limit the engine validates or
cuts to (``MESSAGE_LIMIT``, ``MAX_TRIGGER_KEY``, ``MAX_KEY_CHARS``) is a row too, as the
longest value it lets through. Alembic's version column holds the revision ids.

``test_every_bounded_column_is_accounted_for`` makes a new bounded column (or a new
declaration in the routine) choose: a row here, or an entry in ``USER_CONTROLLED`` saying
where a user's value is checked or cut, or which test reproduces what happens to it
(``tests/integration/test_column_widths.py``).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest
import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import ductwork
import ductwork.errors
import ductwork.fleet.invoke
from ductwork.db import ids, migrate, schema
from ductwork.errors import TriggerKeyError
from ductwork.fleet import hooks as fleet_hooks
from ductwork.fleet import reaper, worker
from ductwork.limit_entries import MAX_KEY_CHARS, LimitEntry, RateEntry, entry_digest
from ductwork.limits import claims
from ductwork.limits.buckets import Decision
from ductwork.limits.executions import MESSAGE_LIMIT
from ductwork.limits.plan import Refused
from ductwork.pipelines import branches, hooks, rules
from ductwork.pipelines.runs import RunStatus, StepStatus
from ductwork.pipelines.snapshot import EDGE_TYPES

ENGINE = Path(ductwork.__file__).resolve().parent
TABLES = schema.metadata.tables


def _column(name: str) -> sa.Column[str]:
    table, column = name.split(".")
    return TABLES[table].c[column]


def _width(name: str) -> int:
    length = _column(name).type.length  # type: ignore[attr-defined]
    assert isinstance(length, int), name
    return length


# --------------------------------------------------------------------------- the values

#: an execution's outcome (``ductwork_executions.outcome``): no one place defines the set.
#: ``success``: ``pipelines.outcomes.record_successes`` (``limits.executions.Ending``'s
#: default); ``failure`` and ``timed_out``: ``record_failure`` (its assert); ``invalid``:
#: ``record_invalid``; ``process_crashed``: ``crash_in``
OUTCOMES = ("success", "failure", "timed_out", "invalid", "process_crashed")

#: a branch's status (``ductwork_branches.status``): ``in_progress`` and ``advancing``
#: (``rules.ACTIVE_BRANCH``, written by ``steps.create_branches`` and ``branches.claim``),
#: and what ``rules.simple_move`` and the advancer's halts move a branch to
BRANCH_STATUSES = (*rules.ACTIVE_BRANCH, "completed", "halted", "dampened")

#: why a branch halted (``ductwork_branches.halt_reason``): ``rules.job_halt_reason`` of every
#: outcome and error class it reads (``rules.INVALID_HALTS``), and the advancer's own, written
#: by ``pipelines/advance.py`` (``_simple_move``, ``advance``, ``_record_error``)
HALT_REASONS = ({rules.job_halt_reason(outcome, klass) for outcome in (*OUTCOMES, None)
                 for klass in (None, *rules.INVALID_HALTS)}
                | {"advancer_crashes_exhausted", "advancer_retries_exhausted", "transition_invalid",
                   "payload_too_large"})

#: an on_halt hook's status (``ductwork_halt_hooks.status``): ``pending`` when owed
#: (``hooks.owe_hooks``) or due again, ``running`` once claimed (``hooks.claim_hook``), and
#: every status ``rules.decide_hook`` returns (``hooks.FINAL`` among them)
HOOK_STATUSES = ("pending", "running", *hooks.FINAL)

#: a process row's role (``ductwork_processes.role``): the supervisor's and the inline
#: process's (``fleet/supervisor.py``, ``app.py``), the runners' (``supervisor.Runner``
#: refuses any other), and ``test``, the conformance machines' (``ductwork_proof``)
ROLES = ("supervisor", "inline", "job_worker", "pipeline_advancer", "test")

#: ``error_klass`` that the engine writes itself: the crashes the reaper, the sweep, the
#: workers and the child runner record, and the class of every error of its own it records
#: (``ErrorInfo.of``: ``module.qualname``; ``fleet.invoke``'s recorded as
#: ``ductwork.execute.<name>``)
ENGINE_ERROR_CLASSES = {
    *branches.CRASH_CLASSES, reaper.ORPHANED, reaper.ABANDONED, worker.ABANDONED, fleet_hooks.ABANDONED.klass,
    "ductwork.ChildStartup", "ductwork.ChildDied",  # fleet/child.py
    rules.UNKNOWN_CLASS, *rules.INVALID_HALTS,
    *(f"{cls.__module__}.{cls.__qualname__}" for module in (ductwork.errors, ductwork.fleet.invoke)
      for _, cls in inspect.getmembers(module, inspect.isclass)
      if issubclass(cls, BaseException) and cls.__module__.startswith("ductwork.")),
}

#: ``error_message`` that the engine writes itself (recoveries' and abandoned claims'); any
#: other is cut to ``MESSAGE_LIMIT`` (``ErrorInfo.of``, ``crash_in``, ``hooks._record_in``)
ENGINE_ERROR_MESSAGES = {
    "Reaped from a dead process", "Orphaned claim swept", "Claim held by no thread of its process",  # reaper
    "execution abandoned by its worker thread", "success could not be recorded",  # fleet/worker.py
    fleet_hooks.ABANDONED.message, "on_halt hook reaped from a dead process",  # hooks
    "Advancement was abandoned by its thread",  # pipelines/advance.py
    "m" * MESSAGE_LIMIT,  # the longest a cut message is
}

#: the key fingerprints (``entry_digest``): of no entry, of a concurrency, of rates
DIGESTS = {entry_digest(None), entry_digest(LimitEntry("k", 5, ())),
           entry_digest(LimitEntry("k", None, (RateEntry(limit=10**9, per_s=3_155_760_000, burst=10**9),)))}

#: ids and claim tokens (``ids.new_id``: UUIDv7, ``ids.new_token``: UUIDv4)
IDS = {ids.new_id(), ids.new_token()}

#: the longest key a validation lets through: a trigger key (``trigger.check_key``), a
#: partition's key (``limit_entries.partition_key``)
LONGEST_TRIGGER_KEY = "t" * TriggerKeyError.MAX_TRIGGER_KEY
LONGEST_LIMIT_KEY = "k" * MAX_KEY_CHARS

#: every column of the key of a limit key (its lanes, its header, its buckets, its refusals)
KEY_COLUMNS = ("ductwork_steps.limit_key", "ductwork_executions.limit_key", "ductwork_executions.pending_lane",
               "ductwork_executions.inflight_key", "ductwork_limit_keys.key", "ductwork_limit_buckets.key",
               "ductwork_key_refusals.key")
ERROR_TABLES = ("ductwork_executions", "ductwork_advancements", "ductwork_halt_hooks")


# --------------------------------------------------------------------------- where they go

#: the lane routine on MySQL-family (``claims.ROUTINE``): its declarations ``name VARCHAR(n)``
ROUTINE_SQL = ENGINE / "limits" / "sql" / f"{claims.ROUTINE.removeprefix('ductwork_')}.mysql.sql"


def _routine_widths() -> dict[str, int]:
    declared: dict[str, set[int]] = {}
    for name, width in re.findall(r"\b(\w+) VARCHAR\((\d+)\)", ROUTINE_SQL.read_text()):
        declared.setdefault(name, set()).add(int(width))
    assert all(len(widths) == 1 for widths in declared.values()), declared  # one width per name
    return {name: widths.pop() for name, widths in declared.items()}


ROUTINE = _routine_widths()


def _literals(annotation: Any) -> set[str]:
    """The strings of a ``Literal`` annotation, within a union too (``Literal["a"] | None``)."""
    return {arg for arg in get_args(annotation) if isinstance(arg, str)} | {
        value for arg in get_args(annotation) if not isinstance(arg, str) for value in _literals(arg)}


def _routine_literals(variable: str) -> set[str]:
    """The literals the routine sets ``variable`` to (``SET v_status = 'taken'``)."""
    return set(re.findall(rf"\b{variable} = '(\w+)'", ROUTINE_SQL.read_text()))


def _engine_literals() -> dict[str, set[str]]:
    """Each string literal the writing layers (``db``, ``limits``, ``pipelines``, ``fleet``,
    and ``app.py``'s inline process row) pass as a keyword argument or dict key named after
    a bounded column (``status="running"``, ``{"status": "pending"}``), by that name: a
    literal written where no set above names it is held too."""
    names = {column.name for table in TABLES.values() for column in table.columns
             if isinstance(column.type, sa.String) and column.type.length}
    paths = [ENGINE / "app.py", *(path for package in ("db", "limits", "pipelines", "fleet")
                                  for path in sorted((ENGINE / package).rglob("*.py"))
                                  if "migrations" not in path.parts)]
    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            pairs = [(node.arg, node.value)] if isinstance(node, ast.keyword) and node.arg else []
            if isinstance(node, ast.Dict):
                pairs += [(key.value, value) for key, value in zip(node.keys, node.values, strict=True)
                          if isinstance(key, ast.Constant) and isinstance(key.value, str)]
            for name, value in pairs:
                if name in names and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.setdefault(name, set()).add(value.value)
    return found


def _named(name: str) -> list[str]:
    """Every bounded column called ``name``."""
    return [f"{table.name}.{name}" for table in TABLES.values()
            if name in table.c and isinstance(table.c[name].type, sa.String) and table.c[name].type.length]


#: where a set is stored, its width, the values, and where they come from
Row = tuple[str, int, frozenset[str], str]


def _rows() -> Iterator[Row]:
    def into(columns: Iterable[str], values: Iterable[str], source: str) -> Iterator[Row]:
        for column in columns:
            yield column, _width(column), frozenset(values), source

    def routine(names: Iterable[str], values: Iterable[str], source: str) -> Iterator[Row]:
        for name in names:
            yield f"routine:{name}", ROUTINE[name], frozenset(values), source

    yield from into(["ductwork_runs.status"], get_args(RunStatus), "runs.RunStatus")
    yield from into(["ductwork_branches.status"], BRANCH_STATUSES, "BRANCH_STATUSES")
    yield from into(["ductwork_steps.status"], get_args(StepStatus), "runs.StepStatus")
    yield from into(["ductwork_steps.to_transition"], (*EDGE_TYPES, "start"),
                    "snapshot.EDGE_TYPES+start")
    yield from into(["ductwork_executions.outcome"], OUTCOMES, "OUTCOMES")
    yield from into(["ductwork_branches.halt_reason"], HALT_REASONS, "HALT_REASONS")
    yield from into(["ductwork_halt_hooks.status"], HOOK_STATUSES, "HOOK_STATUSES")
    yield from into(["ductwork_halt_hooks.last_outcome"], rules.HOOK_OUTCOMES, "rules.HOOK_OUTCOMES")
    yield from into(["ductwork_processes.role"], ROLES, "ROLES")
    yield from into(["ductwork_processes.label"], ("inline", "supervisor"),  # app.py; `ductwork start`'s default
                    "inline+supervisor")
    yield from into(["ductwork_key_refusals.reason"], get_args(Refused), "plan.Refused")
    yield from into(["ductwork_limit_keys.config_digest"], DIGESTS, "entry_digest")
    yield from into(["ductwork_runs.definition_sha1"], [hashlib.sha1(b"{}").hexdigest()],  # trigger.trigger's
                    "sha1.hexdigest")
    yield from into([f"{table.name}.{column.name}" for table in TABLES.values() for column in table.columns
                     if column.type is schema.Id], IDS, "ids.new_id+new_token")
    yield from into([f"{table}.error_klass" for table in ERROR_TABLES], ENGINE_ERROR_CLASSES,
                    "ENGINE_ERROR_CLASSES")
    yield from into([f"{table}.error_message" for table in ERROR_TABLES], ENGINE_ERROR_MESSAGES,
                    "ENGINE_ERROR_MESSAGES+MESSAGE_LIMIT")
    yield from into(["ductwork_runs.trigger_key"], [LONGEST_TRIGGER_KEY], "MAX_TRIGGER_KEY")
    yield from into(KEY_COLUMNS, [LONGEST_LIMIT_KEY], "MAX_KEY_CHARS")
    for name, values in sorted(_engine_literals().items()):
        yield from into(_named(name), values, f"literals:{name}=")
    # the MySQL lane routine's declarations, each holding what it is given or sets
    yield from routine(["v_status"], _routine_literals("v_status") | set(get_args(Refused)),
                       "routine_statuses+plan.Refused")
    yield from routine(["o_refused", "d_refused"],
                       _routine_literals("o_refused") | _literals(get_type_hints(Decision)["refused_for"]),
                       "buckets.Decision.refused_for")
    yield from routine(["p_outcome"], OUTCOMES, "OUTCOMES")
    yield from routine(["p_digest", "p_unconfigured", "v_digest", "d"], DIGESTS, "entry_digest")
    yield from routine(["p_error_klass"], ["e" * _width("ductwork_executions.error_klass")],
                       "ductwork_executions.error_klass")
    yield from routine(["p_error_message"], ["m" * MESSAGE_LIMIT], "MESSAGE_LIMIT")
    yield from routine(["p_key", "p_family", "v_lane", "v_walk_lane", "k"], [LONGEST_LIMIT_KEY],
                       "MAX_KEY_CHARS")
    yield from routine(["p_owner", "v_id", "v_bound_id", "v_walk_id", "v_last_id", "id"], IDS,
                       "ids.new_id+new_token")
    # alembic's version table (ductwork_alembic_version): its version_num holds each revision id
    # (``MigrationContext._version`` is the Table alembic creates it from: VARCHAR(32) today)
    context = MigrationContext.configure(dialect_name="postgresql", opts={"version_table": migrate.VERSION_TABLE})
    revisions = [script.revision for script in ScriptDirectory(str(migrate.MIGRATIONS)).walk_revisions()]
    yield f"{migrate.VERSION_TABLE}.version_num", context._version.c.version_num.type.length, frozenset(revisions), \
        "revision_ids"


ROWS = list(_rows())


# --------------------------------------------------------------------------- the test


@pytest.mark.parametrize(("where", "width", "values", "source"),
                         [pytest.param(*row, id=f"{row[0]}<-{row[3]}") for row in ROWS])
def test_every_value_the_engine_writes_fits_where_it_is_stored(where, width, values, source):
    """Each value of the set fits the column (or the routine's declaration) it is written
    into, as the servers count it: characters."""
    assert values, f"{source}: no values (the set moved?)"
    assert {value: len(value) for value in values if len(value) > width} == {}, \
        f"{where} is VARCHAR({width}); these values of {source} do not fit it"


#: the bounded columns a user's value goes into, and what keeps it within the width (or, for
#: a gap, the test of tests/integration/test_column_widths.py that reproduces what happens)
USER_CONTROLLED = {
    "ductwork_processes.machine_identifier": "the host name: cut to 120, the whole to 255 "
                                             "(db.hosts.machine_identifier)",
    "ductwork_processes.label": "`ductwork start --label`, and its children's <label>.worker.<i>: checked, at "
                                "most LABEL_LIMIT (fleet.supervisor.Supervisor; test_a_supervisor_label_too_long_"
                                "for_its_childrens_rows_is_refused)",
    "ductwork_runs.pipeline_klass": "the Pipeline class's module:qualname: checked, at most NAME_LIMIT "
                                    "(definition._Graph.check_name; test_a_pipeline_whose_name_is_longer_than_the_"
                                    "column_is_refused_when_defined)",
    "ductwork_runs.trigger_key": "checked: TriggerKeyError, at most MAX_TRIGGER_KEY (trigger.check_key)",
    "ductwork_steps.node": "<ClassName>#<i>: checked, at most NAME_LIMIT (definition._Graph.add_nodes)",
    "ductwork_steps.klass": "the step class's module:qualname: checked, at most NAME_LIMIT (definition._Graph."
                            "check_class; test_a_step_class_whose_name_is_longer_than_the_column_is_refused_when_"
                            "defined)",
    "ductwork_halt_hooks.klass": "the on_halt handler's module:qualname: checked, at most NAME_LIMIT (definition."
                                 "_Graph.check_class; test_an_on_halt_handler_whose_name_is_longer_than_the_column_"
                                 "is_refused_when_defined)",
    "ductwork_steps.limit_key": "a partition's: checked (PartitionValueError, MAX_KEY_CHARS); a static limit_by=: "
                                "checked, at most MAX_KEY_CHARS (definition._Graph.limit_option; test_a_static_limit_"
                                "key_longer_than_the_column_is_refused_when_defined)",
    "ductwork_executions.limit_key": "the step's limit_key",
    "ductwork_executions.pending_lane": "the execution's limit_key (generated)",
    "ductwork_executions.inflight_key": "the execution's limit_key (generated)",
    "ductwork_limit_keys.key": "a step's limit_key, or a partition's family (shorter than the partition's key)",
    "ductwork_limit_buckets.key": "a key that has a ductwork_limit_keys row",
    "ductwork_key_refusals.key": "a key that has a ductwork_limit_keys row",
    "ductwork_context.key": "checked: InputError, at most 255 characters (context.Context._check_key)",
    "ductwork_executions.error_klass": "the class a step raised, module.qualname: cut to CLASS_LIMIT, its end "
                                       "kept (ErrorInfo; test_a_step_failure_whose_exception_class_has_a_long_"
                                       "name_is_recorded_as_a_failure)",
    "ductwork_halt_hooks.error_klass": "the class a handler raised, module.qualname: cut to CLASS_LIMIT, its end "
                                       "kept (ErrorInfo; test_an_on_halt_hook_failure_whose_exception_class_has_a_"
                                       "long_name_is_recorded_as_a_failure)",
    "ductwork_advancements.error_klass": "the class a transition raised: the engine's, SQLAlchemy's and the "
                                         "standard library's (no step code runs in an advancer)",
    "ductwork_executions.error_message": "the error's text: cut to MESSAGE_LIMIT, a NUL written \\x00 (ErrorInfo)",
    "ductwork_halt_hooks.error_message": "the error's text: cut to MESSAGE_LIMIT, a NUL written \\x00 (ErrorInfo)",
    "ductwork_advancements.error_message": "the error's text: cut to MESSAGE_LIMIT, a NUL written \\x00 "
                                           "(ErrorInfo)",
}


def test_every_bounded_column_is_accounted_for():
    """Every ``String(n)`` column of ``schema.py`` and every ``VARCHAR(n)`` declaration of
    the MySQL routine has a row above, or says where a user's value in it is kept within
    its width (``USER_CONTROLLED``); a new one fails here until it does."""
    bounded = {f"{table.name}.{column.name}" for table in TABLES.values() for column in table.columns
               if isinstance(column.type, sa.String) and column.type.length}
    held = {where for where, *_ in ROWS}
    assert sorted(bounded - held - set(USER_CONTROLLED)) == []
    assert sorted(set(USER_CONTROLLED) - bounded) == []  # no entry for a column that is gone
    assert sorted(f"routine:{name}" for name in ROUTINE if f"routine:{name}" not in held) == []
    reproducers = Path(__file__).resolve().parents[1] / "integration" / "test_column_widths.py"
    defined = {node.name for node in ast.parse(reproducers.read_text()).body if isinstance(node, ast.FunctionDef)}
    named = {name for note in USER_CONTROLLED.values() for name in re.findall(r"\btest_\w+", note)}
    assert sorted(named - defined) == []  # each gap names its reproducer


def test_an_error_is_fitted_to_its_columns_whoever_makes_it():
    """``ErrorInfo``, from an exception or built by hand (a child's report, a crash): a class
    name longer than ``error_klass`` keeps its end, the class's own name; a message its first
    ``MESSAGE_LIMIT`` characters; a NUL, which PostgreSQL's text cannot hold, is written
    ``\\x00`` in the class, the message and the backtrace. One that fits is kept as it is."""
    from ductwork.limits.executions import CLASS_LIMIT, MESSAGE_LIMIT, ErrorInfo

    assert CLASS_LIMIT == _width("ductwork_executions.error_klass") == _width("ductwork_halt_hooks.error_klass")
    long_class = "pkg." + "Outer." * 60 + "TheError"
    fitted = ErrorInfo(long_class, "m" * 300, "frame\0\n")
    assert (len(fitted.klass), fitted.klass[0], fitted.klass.endswith(".TheError")) == (CLASS_LIMIT, "…", True)
    assert fitted.message == "m" * MESSAGE_LIMIT
    assert fitted.backtrace == "frame\\x00\n"
    assert ErrorInfo("a.B\0", "x\0y", None) == ErrorInfo("a.B\\x00", "x\\x00y", None)
    exact = ErrorInfo("k" * CLASS_LIMIT, "m" * MESSAGE_LIMIT, None)
    assert (exact.klass, exact.message) == ("k" * CLASS_LIMIT, "m" * MESSAGE_LIMIT)

    class Deep(Exception):
        pass

    Deep.__qualname__ = "Nested." * 50 + "Deep"
    try:
        raise Deep("deep\0message")
    except Deep as error:
        of = ErrorInfo.of(error)
    assert (len(of.klass), of.klass.endswith("Nested.Deep"), of.message) == (CLASS_LIMIT, True, "deep\\x00message")


def test_the_limits_names_are_checked_against_are_the_columns_widths():
    """``definition.NAME_LIMIT`` (class references, node names) is the width of the columns
    they are stored in, and ``limit_entries.MAX_KEY_CHARS`` that of the key columns."""
    from ductwork.fleet.supervisor import LABEL_LIMIT
    from ductwork.limit_entries import MAX_KEY_CHARS
    from ductwork.pipelines.definition import NAME_LIMIT

    names = ("ductwork_runs.pipeline_klass", "ductwork_steps.klass", "ductwork_steps.node", "ductwork_halt_hooks.klass")
    assert {column: _width(column) for column in names} == dict.fromkeys(names, NAME_LIMIT)
    assert _width("ductwork_processes.label") == LABEL_LIMIT
    assert {column: _width(column) for column in KEY_COLUMNS} == dict.fromkeys(KEY_COLUMNS, MAX_KEY_CHARS)
