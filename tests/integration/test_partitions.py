"""Partitioned limit keys rendered when a step is created (docs/semantics.md §5.1), on
SQLite, PostgreSQL and MySQL.

Checks: ``limit_by=(family, field)`` gives each step, and every execution of it (a retry
included), the key ``family[<canonical JSON>]`` of the field's value in the step's input,
rendered at trigger, by a worker's inline move and by an advancer's expand. A value that
cannot be rendered is refused by ``trigger`` before anything is written, and halts its
branch ``transition_invalid`` when the step would follow another (the success before it
recorded, the error on the advancement and in the WARNING).
"""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, Step
from ductwork.db import schema
from ductwork.errors import PartitionValueError
from ductwork.testing import drain
from tests.workloads import Echo, FailsOnce, Items


class Tenants(Pipeline):
    """Echo keyed by the input's account, then FailsOnce keyed by its ``n``."""

    @classmethod
    def define(cls, p):
        p.start(Echo, limit_by=("fam", "value.account_id")).chain(to=FailsOnce, limit_by=("fam", "value.n"))


class FanTenants(Pipeline):
    """Items, then an Echo per item keyed by the item itself (an advancer's expand)."""

    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Echo, limit_by=("fam", "value"))


class FanBadField(Pipeline):
    """Items, then an Echo per item keyed by a field an int has not."""

    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Echo, limit_by=("fam", "value.id"))


class MaybeAccount(Step):
    """Returns its value; its ``account`` has a default, so a step may be made without it."""

    def __init__(self, value, account=None):
        self.value, self.account = value, account

    def execute(self):
        return self.value


class OptionalTenant(Pipeline):
    """MaybeAccount keyed by ``account``, a parameter a trigger need not pass."""

    @classmethod
    def define(cls, p):
        p.start(MaybeAccount, limit_by=("fam", "account"))


def keys(app, run_id):
    """``(node, step key, [its executions' keys])`` of each step of the run, in start order."""
    s, e = schema.steps, schema.executions
    with app.begin(readonly=True) as tx:
        steps = tx.execute(sa.select(s.c.id, s.c.node, s.c.limit_key).where(s.c.run_id == run_id)
                           .order_by(s.c.started_at, s.c.id)).all()
        return [(step.node, step.limit_key, tx.execute(sa.select(e.c.limit_key).where(e.c.step_id == step.id)
                                                       .order_by(e.c.created_at, e.c.id)).scalars().all())
                for step in steps]


def test_each_step_and_execution_has_its_partitions_key_and_a_retry_keeps_it(app):
    run = Tenants.trigger({"account_id": "acct-1", "n": 42})
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert keys(app, run.id) == [("Echo#0", 'fam["acct-1"]', ['fam["acct-1"]']),
                                 ("FailsOnce#1", "fam[42]", ["fam[42]", "fam[42]"])]  # failed once, retried


def test_an_expands_children_each_get_their_items_key(app):
    run = FanTenants.trigger(3)
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert keys(app, run.id)[1:] == [("Echo#1", f"fam[{i}]", [f"fam[{i}]"]) for i in range(3)]


@pytest.mark.parametrize(("value", "reason"), [
    ({"n": 1}, "no such field in the input, got [{'n': 1}]"),
    ({"account_id": 1.5}, "a partition value must be a str or an int, got 1.5"),
    ({"account_id": True}, "a partition value must be a str or an int, got True"),
    ({"account_id": "\ud800"}, "a partition value must be valid Unicode (no lone surrogate), got '\\ud800'"),
    ({"account_id": "x" * 300}, f"the rendered key has 307 characters, more than 255, got '{'x' * 76}..."),
])
def test_a_trigger_whose_partition_cannot_be_rendered_writes_nothing(app, value, reason):
    with pytest.raises(PartitionValueError) as info:
        Tenants.trigger(value)
    assert str(info.value) == (f"{Tenants.definition.pipeline} node Echo#0: limit_by=('fam', 'value.account_id'): "
                               f"{reason}")
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(sa.func.count()).select_from(schema.runs)).scalar_one() == 0


def test_a_partition_parameter_left_to_its_default_is_no_field_of_the_input(app):
    """The input holds the arguments passed, not ``__init__``'s defaults: a partition field
    naming a parameter the step was made without is missing, refused like any other."""
    with pytest.raises(PartitionValueError) as info:
        OptionalTenant.trigger(1)
    assert str(info.value) == (f"{OptionalTenant.definition.pipeline} node MaybeAccount#0: "
                               "limit_by=('fam', 'account'): no such field in the input, got [1]")
    assert keys(app, OptionalTenant.trigger(1, "acct").id) == [("MaybeAccount#0", 'fam["acct"]', ['fam["acct"]'])]


@pytest.mark.parametrize(("pipeline", "value", "node", "got"), [
    (Tenants, {"account_id": "a", "n": 4.5}, "FailsOnce#1", "a partition value must be a str or an int, got 4.5"),
    (FanBadField, 2, "Echo#1", "no such field in the input, got [0]"),
])
def test_a_next_step_whose_partition_cannot_be_rendered_halts_its_branch_naming_it(app, caplog, pipeline, value,
                                                                                   node, got):
    """A worker's inline move leaves it to an advancer (a simple move), as does an expand:
    the step before is completed with its output, the branch halts ``transition_invalid``
    with the error on its advancement and in the WARNING, and no step of ``node`` exists."""
    run = pipeline.trigger(value)
    with caplog.at_level(logging.WARNING, logger="ductwork.advance"):
        drain(app, timeout=30)
    assert (run.refresh().status, run.halt_reasons) == ("halted", ["transition_invalid"])
    first = run.steps()[0]
    assert (first.status, first.output) == ("completed", value if pipeline is Tenants else [0, 1])
    assert not [s for s in run.steps() if s.node == node]
    field = "value.n" if pipeline is Tenants else "value.id"
    message = f"{pipeline.definition.pipeline} node {node}: limit_by=('fam', {field!r}): {got}"
    a = schema.advancements
    with app.begin(readonly=True) as tx:
        errors = tx.execute(sa.select(a.c.error_klass, a.c.error_message).where(a.c.error_klass.is_not(None))).all()
    assert [tuple(row) for row in errors] == [("ductwork.errors.PartitionValueError", message)]
    assert [r for r in caplog.records if "branch halted: transition_invalid" in r.getMessage()
            and message in r.getMessage()]
