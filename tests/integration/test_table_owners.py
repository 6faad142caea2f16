"""Each layer writes only its own tables: every write statement the engine issues while a
broad workload runs comes from the package that owns its table (CONTRIBUTING.md, "Layers
own their tables").

The workload: runs of every transition kind (chain, divide, expand, collapse, divert,
dampen and resume, a leaf), keyed steps on a key with a concurrency and a rate (claims,
batches, hand-offs, group commits, releases first), failures with retries, a halt and
its on_halt hook, a revive, a context write, a keyed trigger, a crash recovered by a
reap, an orphan sweep and a reconciliation, a heartbeat with refusal counts, and a
prune. A statement's writer is the innermost frame of the engine that is not
``ductwork.db`` (whose helpers execute statements for their callers:
``dialects.insert_rows``, ``Tx.execute``). One database suffices: the statements and
their callers are the same code on all three.

Checks: none of the INV IDs directly; the layering the audit relies on.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from datetime import timedelta

import sqlalchemy as sa

from ductwork import Pipeline
from ductwork.db import schema
from ductwork.fleet.processes import heartbeat, register
from ductwork.fleet.reaper import reap, reconcile, sweep_orphans
from ductwork.limits.claims import claim
from ductwork.pipelines.prune import prune
from ductwork.testing import drain
from tests.conftest import installed, make_app, migrated_sqlite, skip_ahead
from tests.workloads import Approval, Echo, FailsOnce, Items, Square, Takes
from tests.workloads.hooks import HaltingPipeline

#: which package writes which table: the one statement of the layering
OWNERS: dict[str, set[str]] = {
    "ductwork.limits": {"ductwork_limit_keys", "ductwork_limit_buckets", "ductwork_executions"},
    "ductwork.pipelines": {"ductwork_runs", "ductwork_branches", "ductwork_steps", "ductwork_expand_items",
                           "ductwork_advancements", "ductwork_context", "ductwork_halt_hooks"},
    "ductwork.fleet": {"ductwork_processes", "ductwork_key_refusals"},
}
_WRITE = re.compile(r"^\s*(?:INSERT\s+(?:OR\s+\w+\s+|IGNORE\s+)?INTO|UPDATE|DELETE\s+FROM)\s+[`\"]?(\w+)", re.I)


class SumToContext(Takes):
    """A fan-in: writes the sum of what it gathered to the run's context, and returns it."""

    def execute(self):
        self.context.set("total", sum(self.value))
        return sum(self.value)


class Label(Takes):
    """Returns ``"big"`` for a total above 10, else ``"small"``: a divert's key."""

    def execute(self):
        return "big" if self.value > 10 else "small"


class EveryKind(Pipeline):
    """expand (keyed, rated) → collapse → divert → chain → divide → combine: every kind."""

    @classmethod
    def define(cls, p):
        (p.start(Items).expand(to=Square, limit_by="owned_key").collapse(into=SumToContext)
          .chain(to=Label).divert(to={"big": FailsOnce, "otherwise": FailsOnce})
          .divide(to=[Echo, Echo]).combine(into=Echo))


def test_each_package_writes_only_its_own_tables(tmp_path):
    from ductwork.db.clock import OffsetClock

    url = migrated_sqlite(tmp_path, "owners")
    app_gen = installed(make_app(url, clock=OffsetClock(), job_worker={"limits": {"owned_key": {
        "concurrency": 2, "rate": [{"limit": 1000, "per": "1s"}]}}, "max_retry": 1}))
    app = next(app_gen)
    written: dict[tuple[str, str], set[str]] = defaultdict(set)

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - SQLAlchemy's signature
        match = _WRITE.match(statement)
        writer = _writer() if match else None
        if writer is not None and match.group(1) != "ductwork_alembic_version":
            written[(writer[0], match.group(1))].add(writer[1])

    sa.event.listen(app.engine, "before_cursor_execute", record)
    try:
        _workload(app)
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", record)
        next(app_gen, None)
    owner_of = {table: package for package, tables in OWNERS.items() for table in tables}
    wrong = {f"{package} wrote {table} (in {sorted(where)})": owner_of.get(table)
             for (package, table), where in written.items() if owner_of.get(table) != package}
    assert wrong == {}
    # the workload reached every table, so the check above saw each one written
    assert {table for _, table in written} == set(owner_of)


def _writer() -> tuple[str, str] | None:
    """The package and function of the innermost engine frame that is not ``ductwork.db``;
    None for a statement no engine code issued (the test's own)."""
    frame = sys._getframe(2)
    seen_db = False
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("ductwork.") and not module.startswith("ductwork.db"):
            return ".".join(module.split(".")[:2]), f"{module}.{frame.f_code.co_name}"
        seen_db = seen_db or module.startswith("ductwork.db")
        frame = frame.f_back
    return ("ductwork.db", "?") if seen_db else None


def _workload(app) -> None:
    runs = [EveryKind.trigger(n) for n in (2, 5)]
    keyed = EveryKind.trigger(3, key="owned-1")
    assert EveryKind.trigger(3, key="owned-1").id == keyed.id  # a keyed trigger: one run
    approval = Approval.trigger(1)
    halting = HaltingPipeline.trigger(1)
    drain(app, timeout=60, skip_delays=True)
    assert {r.refresh().status for r in [*runs, keyed]} == {"completed"}
    approval.refresh().resume(2)
    drain(app, timeout=60)
    assert halting.refresh().status == "halted"
    halting.revive()
    # a crash: a process claims and dies; the reap recovers it
    dead = register(app, role="test", label="dead")
    Approval.trigger(3)
    assert claim(app, dead) is not None
    assert reap(app, dead, force=True)
    # an orphan (its process row gone) and a claim no thread holds (a live process)
    ghost = register(app, role="test", label="ghost")
    Approval.trigger(4)
    assert claim(app, ghost) is not None
    live = register(app, role="test", label="live")
    Approval.trigger(5)
    assert claim(app, live) is not None
    with app.engine.begin() as conn:  # the ghost's row vanished (a reap that raced its claim): the test's write
        conn.execute(schema.processes.delete().where(schema.processes.c.id == ghost))
    skip_ahead(app, timedelta(seconds=3 * app.config.supervisor.reaper_timeout + 1))
    assert sweep_orphans(app) == 1
    assert reconcile(app, live, set(), grace_s=0) == 1
    assert heartbeat(app, live, {("owned_key", "rate"): 2})  # a worker process's refusal counts
    drain(app, timeout=60, skip_delays=True)
    skip_ahead(app, timedelta(days=2))
    assert prune(app, timedelta(days=1)).runs >= 1

