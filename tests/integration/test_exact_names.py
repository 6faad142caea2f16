"""Names are compared exactly on every database: case and accents included.

MySQL and MariaDB compare strings by a column's collation, which by default ignores case
and accents; revision 0007 gives the columns holding limit keys, pipeline names and
context keys the binary collation (``schema.ExactKey``), as PostgreSQL and SQLite compare
them. Before it, on MariaDB, ``api`` and ``API`` were one key: one lock, one in-flight
count, so each ran below its own limit.
"""

from __future__ import annotations

import sqlalchemy as sa

from ductwork import Pipeline, Step
from ductwork.db import schema
from ductwork.limits import claims
from tests.conftest import installed, make_app
from tests.workloads import Echo

SPELLINGS = ("api", "API", "cafe", "café")


def _keyed(key: str) -> type[Pipeline]:
    class Keyed(Pipeline):
        @classmethod
        def define(cls, p):
            p.start(Echo, limit_by=key)

    Keyed.__qualname__ = Keyed.__name__ = f"Keyed_{SPELLINGS.index(key)}"
    return Keyed


KEYED = [_keyed(key) for key in SPELLINGS]


class Remember(Step):
    """Sets two context keys that differ only in case, then reads both back."""

    def __init__(self, n):
        self.n = n

    def execute(self):
        self.context.set("Total", 1)
        self.context.set("total", 2)
        return [self.context.get("Total"), self.context.get("total")]


class Ledger(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Remember)


class LEDGER(Pipeline):  # a name that differs from Ledger's only in case, on purpose
    @classmethod
    def define(cls, p):
        p.start(Remember)


def test_limit_keys_that_differ_only_in_case_or_accents_are_distinct_keys(db_url):
    """Four keys of concurrency 1 each, one run of each: all four are claimed at once,
    each in its own key's count (one key, on MariaDB before revision 0007, admitted only
    the first of api/API and of cafe/café)."""
    limits = {key: {"concurrency": 1} for key in SPELLINGS}
    for app in installed(make_app(db_url, job_worker={"limits": limits})):
        for pipeline in KEYED:
            pipeline.trigger(0)
        process = app.process_id()
        claimed = [claims.claim(app, process) for _ in SPELLINGS]
        assert sorted(c.limit_key for c in claimed if c is not None) == sorted(SPELLINGS)
        assert claims.claim(app, process) is None  # and each key is now full
        k = schema.limit_keys
        with app.begin(readonly=True) as tx:
            assert sorted(tx.execute(sa.select(k.c.key)).scalars()) == sorted(SPELLINGS)


def test_pipelines_whose_names_differ_only_in_case_keep_their_own_trigger_keys(db_url):
    """One trigger key, two pipelines named Ledger and LEDGER: two runs, one each
    (``uq_run_trigger_key`` is per pipeline name, compared exactly)."""
    for _app in installed(make_app(db_url)):
        first, second = Ledger.trigger(1, key="2026-12"), LEDGER.trigger(1, key="2026-12")
        assert first.id != second.id
        assert Ledger.trigger(1, key="2026-12").id == first.id  # the key still finds each one's run
        assert LEDGER.trigger(1, key="2026-12").id == second.id


def test_context_keys_that_differ_only_in_case_are_two_keys(db_url):
    from ductwork.testing import drain

    for app in installed(make_app(db_url)):
        run = Ledger.trigger(1)
        drain(app)
        assert run.refresh().status == "completed"
        assert run.steps()[-1].output == [1, 2]
