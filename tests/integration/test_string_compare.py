"""Strings the engine compares, as each database compares them: trailing spaces and case.

PostgreSQL and SQLite compare a ``VARCHAR`` as it is stored: ``'api'`` and ``'api '`` are two
values, and so are ``'api'`` and ``'API'``. MySQL-family compares by the column's collation.
Revision 0007 gave the columns holding limit keys, pipeline names and context keys the binary
collation (``schema.ExactKey``, ``utf8mb4_bin``), so case and accents count there
(``test_exact_names.py``); but ``utf8mb4_bin``, like the default ``utf8mb4_general_ci``, is a
PAD SPACE collation on MariaDB 10.x (and MySQL's ``utf8mb4_bin`` too): a shorter value is
padded with spaces before it is compared, so ``'api' = 'api '`` is true, a unique index or a
primary key holds only one of them, and a look-up of either finds the other. Only trailing
U+0020 spaces count: a tab or a space inside the value compares as on the other databases.

Those columns are large (executions, steps, runs), so rather than a NO PAD collation for
each, the engine keeps such values out of them before they reach a database: a name or key
with whitespace around it (``limit_entries.has_whitespace_around``, ``str.strip``'s
whitespace) is refused where it is declared or written, on every database: a trigger key
(TriggerKeyError), a context key (InputError), a static ``limit_by`` key, a key family, a
pipeline's or a class's reference and a node name (DefinitionError, when the class is
created), a key or family of ``job_worker.limits`` (ConfigError); a blank limit key too (the
unkeyed lane is ``''``). A partition's value is rendered so that no trailing space is left
(quoted in its key). The one column of the default collation that the engine compares,
``ductwork_processes.label`` (case, accents and trailing spaces ignored), is small: revision
0016 gave it the binary NO PAD collation (``schema.NoPadBin``).

Each test states what PostgreSQL and SQLite do, and shows that it happens on the three
databases.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from ductwork import DefinitionError, Pipeline, Step
from ductwork.config import Config
from ductwork.db import schema
from ductwork.errors import ConfigError, InputError, RunFilterError, TriggerKeyError
from ductwork.fleet.processes import heartbeat, register
from ductwork.limits import claims
from ductwork.pipelines.history import list_runs
from ductwork.pipelines.prune import prune
from ductwork.testing import drain
from tests.conftest import TEST_CONFIG, installed, make_app
from tests.workloads import Echo


def _pipeline(name: str, define: Callable[[Any], object]) -> type[Pipeline]:
    """A pipeline of this module named ``name`` (``module:name``), defined by ``define(p)``."""
    return type(name, (Pipeline,), {"__module__": __name__, "define": classmethod(lambda _cls, p: define(p))})


def _header_keys(app: Any) -> list[str]:
    """The keys of ``ductwork_limit_keys``' rows (one per key: the key's lock), sorted."""
    with app.begin(readonly=True) as tx:
        return sorted(tx.execute(sa.select(schema.limit_keys.c.key)).scalars())


# --------------------------------------------------------------------------- limit keys

#: a key with whitespace around it, each way: trailing spaces (what PAD SPACE ignores),
#: leading ones, a tab, a no-break space (refused as a trigger key's are)
SPACED_KEYS = ("acct ", "acct  ", " acct", "acct\t", "acct\xa0")
KEYED = _pipeline("SpacedKey", lambda p: p.start(Echo, limit_by="acct"))


def _limits(limits: dict[str, Any]) -> Config:
    """The test config with ``job_worker.limits`` ``limits``."""
    return Config.from_section({**TEST_CONFIG, "job_worker": {**TEST_CONFIG.get("job_worker", {}), "limits": limits}},
                               source="<tests>")


def test_a_static_limit_key_with_whitespace_around_it_is_refused_on_every_database(db_url):
    """Static keys ``acct``, ``acct `` and ``acct  `` would be three keys on PostgreSQL and
    SQLite and one on MariaDB: one row of ``ductwork_limit_keys`` (its primary key;
    ``enqueue``'s INSERT IGNORE drops the others without a word), so one lock, one in-flight
    count, one set of buckets and one rate stamp for three keys with three configs. So a
    key with whitespace around it is refused where it is declared, naming it: ``limit_by=``
    (DefinitionError, when the class is created) and ``job_worker.limits`` (ConfigError, when
    the config is read), before any database. ``acct`` itself (concurrency 1) is one key
    with one header row, on the three databases."""
    for key in SPACED_KEYS:
        with pytest.raises(DefinitionError, match=rf"^SpacedKey\.start: limit_by has whitespace around it, .*: "
                                                  rf"{re.escape(repr(key))}$"):
            _pipeline("SpacedKey", lambda p, key=key: p.start(Echo, limit_by=key))
        with pytest.raises(ConfigError, match=rf"={re.escape(repr(key))}: a limit key may not have whitespace "
                                              "around it"):
            make_app(db_url, job_worker={"limits": {"acct": {"concurrency": 1}, key: {"concurrency": 1}}})
    for app in installed(make_app(db_url, job_worker={"limits": {"acct": {"concurrency": 1}}})):
        KEYED.trigger(0)
        KEYED.trigger(1)
        process = app.process_id()
        claimed = claims.claim(app, process)
        assert {
            "claimed": None if claimed is None else claimed.limit_key,
            "then": claims.claim(app, process),  # the key is full
            "header rows": _header_keys(app),
        } == {"claimed": "acct", "then": None, "header rows": ["acct"]}


def test_a_key_family_with_whitespace_around_its_name_is_refused_on_every_database(db_url):
    """A static key ``acct`` and a family ``acct `` would have a header row each on
    PostgreSQL and SQLite and share one on MariaDB: each partition's claim locking the
    static key too, a forgotten partition's ``seq`` written into the static key's row. So a
    family whose name has whitespace around it is refused, naming it, in ``limit_by=(family,
    field)`` (DefinitionError) and in ``job_worker.limits`` (ConfigError), on the three
    databases."""
    for family in SPACED_KEYS:
        with pytest.raises(DefinitionError, match=rf"^SpacedFamily\.start: limit_by's family has whitespace around "
                                                  rf"it, .*: {re.escape(repr(family))}$"):
            _pipeline("SpacedFamily", lambda p, family=family: p.start(Echo, limit_by=(family, "value")))
        with pytest.raises(ConfigError, match=rf"={re.escape(repr(family))}: a key family may not have whitespace "
                                              "around it"):
            make_app(db_url, job_worker={"limits": {"acct": {"concurrency": 1},
                                                    family: {"per_partition": {"concurrency": 1}}}})


PARTITIONED = _pipeline("SpacedPartitions", lambda p: p.start(Echo, limit_by=("acct", "value")))


def test_partition_values_that_differ_only_in_trailing_spaces_are_distinct_partitions(db_url):
    """A partition's key is ``family[<JSON of the value>]``: a string value is quoted, so its
    trailing spaces are inside the key (``acct["x "]``), which always ends with ``]``, and
    PAD SPACE never meets them. ``x``, ``x `` and ``x  `` (per partition 1) are three
    partitions, claimed at once, on the three databases."""
    values = ("x", "x ", "x  ")
    limits = {"acct": {"per_partition": {"concurrency": 1}}}
    for app in installed(make_app(db_url, job_worker={"limits": limits})):
        for value in values:
            PARTITIONED.trigger(value)
        process = app.process_id()
        claimed = [claims.claim(app, process) for _ in values]
        keys = sorted(f'acct["{value}"]' for value in values)
        assert {
            "claimed": sorted(c.limit_key for c in claimed if c is not None),
            "then": claims.claim(app, process),
            "header rows": _header_keys(app),
        } == {"claimed": keys, "then": None, "header rows": sorted(["acct", *keys])}


def test_a_blank_limit_key_is_refused_so_no_key_is_the_unkeyed_lane():
    """The unkeyed lane is ``''`` (``pending_lane``, ``lanes.UNKEYED``); under PAD SPACE a key
    of spaces would be equal to it, one lane on MariaDB and two elsewhere. The engine refuses
    a blank key where it is written, before any database: ``limit_by=`` (DefinitionError) and
    ``job_worker.limits`` (ConfigError), and a family's name too."""
    with pytest.raises(DefinitionError, match="non-blank"):
        _pipeline("BlankKey", lambda p: p.start(Echo, limit_by="  "))
    with pytest.raises(DefinitionError, match="non-blank"):
        _pipeline("BlankFamily", lambda p: p.start(Echo, limit_by=("  ", "value")))
    for limits in ({"  ": {"concurrency": 1}}, {"  ": {"per_partition": {"concurrency": 1}}}):
        with pytest.raises(ConfigError, match="non-blank"):
            _limits(limits)


# --------------------------------------------------------------------------- trigger keys and pipeline names

ORDERS = _pipeline("SpacedOrders", lambda p: p.start(Echo))


def test_a_trigger_key_with_whitespace_around_it_is_refused_on_every_database(db_url):
    """``runs.trigger_key`` is compared exactly for case (revision 0005) but PAD SPACE on
    MariaDB, so ``2026-12`` and ``2026-12 `` would be one key there and two elsewhere.
    ``trigger.check_key`` refuses whitespace around a key (TriggerKeyError) before anything
    is written, on the three databases; the key without it triggers as usual."""
    for app in installed(make_app(db_url)):
        for key in ("2026-12 ", " 2026-12", "2026-12\t", "2026-12\xa0"):
            with pytest.raises(TriggerKeyError, match="whitespace around it"):
                ORDERS.trigger(1, key=key)
        with app.begin(readonly=True) as tx:
            assert tx.execute(sa.select(sa.func.count()).select_from(schema.runs)).scalar_one() == 0
        run = ORDERS.trigger(1, key="2026-12")
        assert ORDERS.trigger(1, key="2026-12").id == run.id


#: a pipeline whose name (``module:qualname``) has whitespace around it: a class made by a
#: factory (``type()``), or given a ``__qualname__``; no ``class`` statement makes one
SPACED_NAMES = ("Ledger ", "Ledger\t")
LEDGER = _pipeline("Ledger", lambda p: p.start(Echo))


def test_a_pipeline_name_with_whitespace_around_it_is_refused_on_every_database(db_url):
    """Pipelines ``…:Ledger`` and ``…:Ledger `` would keep their own trigger keys on
    PostgreSQL and SQLite (``uq_run_trigger_key`` is per pipeline name); on MariaDB the
    second's trigger would find the first's run by the key (``pipeline_klass = 'm:Ledger '``
    matches ``m:Ledger``) and return it: a run of another pipeline. So a pipeline, step class
    or on_halt handler whose reference has whitespace around it is refused when the class is
    created (DefinitionError naming it), and so is a node name (``<ClassName>#<i>``) that
    begins with whitespace; ``…:Ledger`` triggers once per key and ``list_runs`` of its name
    lists its run, on the three databases."""
    for name in SPACED_NAMES:
        ref = re.escape(repr(f"{__name__}:{name}"))
        with pytest.raises(DefinitionError, match=rf"^{name}\.define: the pipeline's reference has whitespace "
                                                  rf"around it, .*: {ref}$"):
            _pipeline(name, lambda p: p.start(Echo))
        step = type(name, (Echo,), {"__module__": __name__})
        for transition, define in (("start", lambda p, step=step: p.start(step)),
                                   ("on_halt", lambda p, step=step: p.start(Echo).on_halt(step))):
            with pytest.raises(DefinitionError, match=rf"^Halting\.{transition}: {re.escape(name)}'s reference has "
                                                      rf"whitespace around it, .*: {ref}$"):
                _pipeline("Halting", define)
    node = type(" Echo", (Echo,), {"__module__": __name__})  # its reference, "…: Echo", has none around it
    with pytest.raises(DefinitionError, match=r"^Nodes\.start: the node name has whitespace around it, .*: ' Echo#0'$"):
        _pipeline("Nodes", lambda p: p.start(node))
    for app in installed(make_app(db_url)):
        run = LEDGER.trigger(1, key="2026-12")
        assert {
            "again": LEDGER.trigger(1, key="2026-12").id,
            "listed": [r.id for r in list_runs(app, pipeline=f"{__name__}:Ledger")],
        } == {"again": run.id, "listed": [run.id]}


def test_a_pipeline_filter_with_whitespace_around_it_is_refused_on_every_database(db_url):
    """No pipeline's name has whitespace around it (above), so a filter naming one is a
    mistake: on MariaDB ``pipeline_klass = 'm:Ledger '`` matches ``m:Ledger``'s runs (PAD
    SPACE), and ``prune(pipeline="m:Ledger ")`` would delete them. ``list_runs`` and
    ``prune`` refuse it (RunFilterError naming ``--pipeline`` and the value) and delete
    nothing, on the three databases; ``prune`` before it starts (``ductwork prune`` printed
    its cutoff, then the error)."""
    for app in installed(make_app(db_url)):
        run = LEDGER.trigger(1)
        drain(app)
        refused, started = [], []
        for name in (f"{__name__}:Ledger ", "Ledger\t", " Ledger"):
            for call in (lambda app=app, name=name: list_runs(app, pipeline=name),
                         lambda app=app, name=name, to=started: prune(app, timedelta(0), pipeline=name,
                                                                      on_start=to.append)):
                with pytest.raises(RunFilterError) as raised:
                    call()
                refused.append(str(raised.value) == f"--pipeline={name!r}: a pipeline's name has no whitespace "
                                                     "around it")
        assert (refused, started, [r.id for r in list_runs(app, pipeline="Ledger")]) == ([True] * 6, [], [run.id])


# --------------------------------------------------------------------------- context keys


class Totals(Step):
    """Sets context keys with whitespace around them or a NUL, each refused, then one without."""

    def __init__(self, n):
        self.n = n

    def execute(self):
        refused = []
        for key in ("total ", " total", "total\t", "total\xa0", "to\x00tal"):
            try:
                self.context.set(key, 2)
            except InputError as error:
                refused.append(str(error))
            try:
                self.context.get(key)
            except InputError:
                refused.append("get")
        self.context.set("total", 1)
        return {"refused": len(refused), "total": self.context.get("total"),
                "says": refused[0]}


SPACED_CONTEXT = _pipeline("SpacedContext", lambda p: p.start(Totals))


def test_a_context_key_with_whitespace_around_it_or_a_nul_is_refused_on_every_database(db_url):
    """``context.key`` is PAD SPACE on MariaDB (``utf8mb4_bin``): ``total`` and ``total `` would
    be one key there (``get('total ')`` reading ``total``'s value, ``set('total ',
    overwrite=True)`` silently replacing it) and two elsewhere; PostgreSQL's text holds no
    NUL. So ``Context.get`` and ``set`` refuse such a key (InputError naming it), as
    ``trigger.check_key`` refuses a trigger key, on the three databases."""
    for app in installed(make_app(db_url)):
        run = SPACED_CONTEXT.trigger(1)
        drain(app)
        assert (run.refresh().status, run.steps()[-1].output) == ("completed", {
            "refused": 10, "total": 1,
            "says": "Context key has whitespace around it or a NUL character: 'total '"})


# --------------------------------------------------------------------------- process labels


def test_process_labels_that_differ_only_in_case_or_trailing_spaces_are_three_processes(db_url):
    """Several process identities may live in one OS process (embedded use; ``register``'s
    ``label``): ``worker``, ``Worker`` and ``worker `` registered in this process are three
    rows, each alive (its heartbeat lands), and the first keeps the execution it claimed.
    Before revision 0016 ``ductwork_processes.label`` had the table's default collation,
    which on MariaDB ignores case, accents and trailing spaces: ``register``'s look-up of a
    previous incarnation of this pid by label (``label = 'Worker'`` found ``worker``) took
    the live ``worker`` for a dead one and reaped it, recovering its claim as crashed while
    it ran. Now the binary NO PAD collation (``schema.NoPadBin``), on the three databases."""
    for app in installed(make_app(db_url)):
        ORDERS.trigger(1)
        labels = ("worker", "Worker", "worker ")
        first = register(app, role="job_worker", label=labels[0])
        held = claims.claim(app, first)
        assert held is not None
        others = [register(app, role="job_worker", label=label) for label in labels[1:]]
        p, e = schema.processes, schema.executions
        with app.begin(readonly=True) as tx:
            rows = sorted(tx.execute(sa.select(p.c.label).where(p.c.role == "job_worker")).scalars())
            holder = tx.execute(sa.select(e.c.process_id, e.c.completed_at)
                                .where(e.c.id == held.execution_id)).one()
        assert {
            "rows": rows,
            "alive": [heartbeat(app, process) for process in (first, *others)],
            "claim": (holder.process_id, holder.completed_at),
        } == {
            "rows": sorted(labels),
            "alive": [True, True, True],
            "claim": (first, None),
        }


# --------------------------------------------------------------------------- every string column

ENGINE = "engine"  # values only the engine writes (tests/unit/test_column_widths.py holds them): one spelling each
SHOWN = "shown"  # a user's value, stored and shown, never compared by a statement
EXACT = "exact"  # schema.ExactKey: utf8mb4_bin on MySQL-family, so case and accents count; trailing spaces do not
NOPAD = "nopad"  # schema.NoPadBin: binary and NO PAD on MySQL-family, so case, accents and trailing spaces count
DEFAULT = "default"  # the table's default collation on MySQL-family: case, accents and trailing spaces do not count

#: Each string column but the ids (``schema.Id``: UUIDv7 text that ``db/ids.py`` makes), how
#: MySQL-family compares it and what keeps that from differing from PostgreSQL and SQLite:
#: an engine-made value, a value never compared, a check that keeps trailing spaces out or a
#: NO PAD collation, and the test above that shows it.
COLUMNS = {
    "ductwork_processes.role": (ENGINE, "ROLES"),
    "ductwork_processes.machine_identifier": (DEFAULT, "host/machine-id/boot:pid-namespace (db.hosts): compared to "
                                                       "this process's own; only a host name can differ only in "
                                                       "case (as DNS names do), and a row without the machine id "
                                                       "and namespace proves no death (reaper.proven_dead), but "
                                                       "register's look-up of the same pid and label: not reproduced"),
    "ductwork_processes.label": (NOPAD, "--label, register(label=): compared by register's look-up and "
                                        "uq_process_host_pid_label (revision 0016); test_process_labels_that_differ_"
                                        "only_in_case_or_trailing_spaces_are_three_processes"),
    "ductwork_runs.pipeline_klass": (EXACT, "the class's module:qualname, compared with trigger keys (uq_run_trigger_"
                                            "key) and by list_runs: no whitespace around it (definition._Graph.check_"
                                            "name); test_a_pipeline_name_with_whitespace_around_it_is_refused_on_"
                                            "every_database"),
    "ductwork_runs.definition_sha1": (ENGINE, "a SHA-1 in hex"),
    "ductwork_runs.status": (ENGINE, "RunStatus; list_runs refuses any other (RunFilterError)"),
    "ductwork_runs.trigger_key": (EXACT, "no whitespace around it (trigger.check_key); test_a_trigger_key_with_"
                                         "whitespace_around_it_is_refused_on_every_database"),
    "ductwork_branches.status": (ENGINE, "BRANCH_STATUSES"),
    "ductwork_branches.halt_reason": (ENGINE, "HALT_REASONS"),
    "ductwork_steps.node": (ENGINE, "<ClassName>#<i>, <i> its own in the definition: no two nodes of a run differ "
                                    "only in case or trailing spaces (uq_step_branch_node, the fan-in's IN)"),
    "ductwork_steps.klass": (SHOWN, "a step class's module:qualname"),
    "ductwork_steps.to_transition": (ENGINE, "EDGE_TYPES"),
    "ductwork_steps.status": (ENGINE, "StepStatus"),
    "ductwork_steps.limit_key": (EXACT, "a static limit_by=, no whitespace around it (definition._Graph.check_name), "
                                        "or a partition's key, its value quoted; test_a_static_limit_key_with_"
                                        "whitespace_around_it_is_refused_on_every_database, test_partition_values_"
                                        "that_differ_only_in_trailing_spaces_are_distinct_partitions"),
    "ductwork_executions.outcome": (ENGINE, "OUTCOMES"),
    "ductwork_executions.error_klass": (SHOWN, "the class a step raised; the advancer's NOT IN CRASH_CLASSES reads "
                                               "ductwork_advancements.error_klass only"),
    "ductwork_executions.error_message": (SHOWN, "the error's text"),
    "ductwork_executions.limit_key": (EXACT, "the step's limit_key"),
    "ductwork_executions.pending_lane": (EXACT, "the execution's limit_key, or '' (the unkeyed lane): a blank key "
                                                "is refused, test_a_blank_limit_key_is_refused_so_no_key_is_the_"
                                                "unkeyed_lane"),
    "ductwork_executions.inflight_key": (EXACT, "the execution's limit_key"),
    "ductwork_advancements.error_klass": (ENGINE, "the class a transition raised: the engine's, SQLAlchemy's and the "
                                                  "standard library's (compared NOT IN CRASH_CLASSES)"),
    "ductwork_advancements.error_message": (SHOWN, "the error's text"),
    "ductwork_context.key": (EXACT, "Context.set/get's key, refused with whitespace around it or a NUL; "
                                    "test_a_context_key_with_whitespace_around_it_or_a_nul_is_refused_on_every_"
                                    "database"),
    "ductwork_limit_keys.key": (EXACT, "a step's limit_key or a partition's family, no whitespace around it "
                                       "(definition._Graph.check_name); test_a_key_family_with_whitespace_around_its_"
                                       "name_is_refused_on_every_database"),
    "ductwork_limit_keys.config_digest": (ENGINE, "limit_entries.entry_digest: hex"),
    "ductwork_limit_buckets.key": (EXACT, "a key that has a ductwork_limit_keys row"),
    "ductwork_key_refusals.key": (EXACT, "a key that has a ductwork_limit_keys row"),
    "ductwork_key_refusals.reason": (ENGINE, "limits.plan.Refused"),
    "ductwork_halt_hooks.klass": (SHOWN, "the on_halt handler's module:qualname"),
    "ductwork_halt_hooks.status": (ENGINE, "HOOK_STATUSES"),
    "ductwork_halt_hooks.last_outcome": (ENGINE, "OUTCOMES"),
    "ductwork_halt_hooks.error_klass": (SHOWN, "the class a handler raised"),
    "ductwork_halt_hooks.error_message": (SHOWN, "the error's text"),
}


def test_every_string_column_says_how_mysql_family_compares_it():
    """Every bounded string column of ``schema.py`` but the ids has a row in ``COLUMNS``; a
    row says ``exact`` exactly when the column has ``utf8mb4_bin`` on MySQL-family
    (``schema.ExactKey``), ``nopad`` exactly when it has another collation of its own
    (``schema.NoPadBin``: MariaDB's or MySQL's), and each test a row names is one of this
    module's. A new string column fails here until it says how its values compare."""
    from sqlalchemy.dialects import mysql

    strings = {f"{table.name}.{column.name}": column for table in schema.metadata.tables.values()
               for column in table.columns
               if isinstance(column.type, sa.String) and not isinstance(column.type, sa.Text)}
    ids = {name for name, column in strings.items() if column.type is schema.Id}
    assert sorted(set(strings) - ids - set(COLUMNS)) == []
    assert sorted(set(COLUMNS) - set(strings)) == []  # no row for a column that is gone, or an id
    for is_mariadb in (False, True):
        compiled = {name: column.type.compile(dialect=mysql.dialect(is_mariadb=is_mariadb))
                    for name, column in strings.items()}
        kinds = {name: EXACT if "COLLATE utf8mb4_bin" in sql else NOPAD if "COLLATE" in sql else None
                 for name, sql in compiled.items()}
        assert {name: kind for name, kind in kinds.items() if kind} == {
            name: kind for name, (kind, _) in COLUMNS.items() if kind in (EXACT, NOPAD)}
        nopad = "utf8mb4_nopad_bin" if is_mariadb else "utf8mb4_0900_bin"
        assert {name for name, kind in kinds.items() if kind == NOPAD and nopad not in compiled[name]} == set()
    named = {test for _, note in COLUMNS.values() for test in re.findall(r"\btest_\w+", note)}
    assert sorted(named - set(globals())) == []
