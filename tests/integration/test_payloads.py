"""The payload rule end to end, on SQLite, PostgreSQL and MySQL/MariaDB alike.

One maximum (``payloads.MAX_PAYLOAD_BYTES`` of JSON) on every database, tested with
its worst case for MySQL (a string of quotes, which PyMySQL's escaping doubles);
one byte more is a named error: raised at trigger with nothing written, and at a
step's return a failure that is not retried (exactly one execution) and halts the
branch at once. A fan-in whose list would be larger halts the run at once too,
and one of 400 × 200-byte items completes everywhere. NaN breaks the same rule at
trigger as at return.

Checks: INV-EXE-4 (a return value that cannot be stored is not retried).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ductwork import Context, Pipeline
from ductwork.db import schema
from ductwork.errors import InputError, NotJSONError, PayloadTooLargeError
from ductwork.pipelines.payloads import MAX_PAYLOAD_BYTES, STATEMENT_BYTES_NEEDED
from ductwork.testing import drain
from tests.factories import executions_of
from tests.workloads import Echo, ReturnsSet, Takes, Unkeyed

#: a str whose JSON text is 2 + 2 × n bytes: every quote is escaped (\"), and
#: PyMySQL escapes each of those two bytes again: the worst case for a statement
QUOTE = '"'


class Quotes(Takes):
    """Returns a str of ``n`` quotes: JSON text of 2 + 2n bytes."""

    def execute(self):
        return QUOTE * self.value


class Count(Takes):
    """A fan-in: returns how many outputs it gathered and their summed lengths."""

    def execute(self):
        return [len(self.value), sum(len(o) for o in self.value)]


class ReturnsNan(Takes):
    """Returns NaN, which JSON cannot hold: its execution is invalid."""

    def execute(self):
        return float("nan")


class QuotesP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Quotes).chain(to=Echo)


class FanInP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Echo).expand(to=Quotes).collapse(into=Count)


class ItemsP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Echo).expand(to=Echo).collapse(into=Count)


class NanP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(ReturnsNan)


class SetInChildP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(ReturnsSet, timeout=60)


def _count(app, table):
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


def test_the_largest_trigger_argument_round_trips(app):
    value = QUOTE * ((MAX_PAYLOAD_BYTES - 4) // 2)  # ["\"\"…"]: exactly the maximum
    run = Unkeyed.trigger(value)
    drain(app, timeout=120)
    assert run.refresh().status == "completed"
    (step,) = run.steps()
    assert step.input == [value]
    assert step.output == value


def test_a_trigger_argument_one_byte_longer_raises_and_writes_nothing(app):
    value = QUOTE * ((MAX_PAYLOAD_BYTES - 4) // 2) + "x"
    with pytest.raises(PayloadTooLargeError) as raised:
        Unkeyed.trigger(value)
    assert str(raised.value) == (
        f"Unkeyed.trigger arguments: {MAX_PAYLOAD_BYTES + 1:,} bytes of JSON, more than the maximum of "
        f"{MAX_PAYLOAD_BYTES:,} (MAX_PAYLOAD_BYTES)")
    assert isinstance(raised.value, InputError)  # what trigger raised for a bad argument before
    assert (raised.value.size, raised.value.maximum) == (MAX_PAYLOAD_BYTES + 1, MAX_PAYLOAD_BYTES)
    assert [_count(app, t) for t in (schema.runs, schema.branches, schema.steps)] == [0, 0, 0]


def test_the_largest_return_value_round_trips(app):
    n = (MAX_PAYLOAD_BYTES - 2) // 2  # "\"\"…": exactly the maximum; the next input is 2 bytes more
    run = QuotesP.trigger(n)
    drain(app, timeout=120)
    assert run.refresh().status == "completed"
    assert run.steps()[-1].output == QUOTE * n


def test_a_return_value_one_byte_longer_fails_once_and_halts(app):
    run = QuotesP.trigger((MAX_PAYLOAD_BYTES - 2) // 2 + 1)
    drain(app, timeout=120)
    assert run.refresh().status == "halted"
    assert run.halt_reasons == ["payload_too_large"]
    rows = executions_of(app, run.id)
    assert [(r.outcome, r.error_klass) for r in rows] == [("invalid", "ductwork.errors.PayloadTooLargeError")]
    assert rows[0].error_message == (
        f"tests.integration.test_payloads:Quotes returned str: {MAX_PAYLOAD_BYTES + 2:,} bytes of JSON, "
        f"more than the maximum of {MAX_PAYLOAD_BYTES:,} (MAX_PAYLOAD_BYTES)")


def test_a_collapse_of_400_items_of_200_bytes_completes(app):
    items = [f"{i:0198d}" for i in range(400)]  # JSON text of 200 bytes each
    run = ItemsP.trigger(items)
    drain(app, timeout=300)
    assert run.refresh().status == "completed"
    assert run.steps()[-1].output == [400, 400 * 198]


def test_a_collapse_larger_than_the_maximum_halts_at_once(app):
    n = MAX_PAYLOAD_BYTES // 6  # three outputs of 2 + 2n bytes: together above the maximum
    run = FanInP.trigger([n, n, n])
    drain(app, timeout=120)
    assert run.refresh().status == "halted"
    assert run.halt_reasons == ["payload_too_large"]
    a = schema.advancements
    with app.begin(readonly=True) as tx:
        errors = tx.execute(sa.select(a.c.error_klass, a.c.error_message).where(a.c.error_klass.is_not(None))).all()
    assert [e.error_klass for e in errors] == ["ductwork.errors.PayloadTooLargeError"]  # halted, not retried
    assert errors[0].error_message.startswith("collapse into Count#2: the outputs of 3 branches: ")
    assert "Count#2" not in {s.node for s in run.steps()}  # the merge never fired


def test_nan_breaks_the_same_rule_at_trigger_as_at_return(app):
    with pytest.raises(NotJSONError) as raised:
        Unkeyed.trigger(float("nan"))
    at_trigger = str(raised.value)
    assert at_trigger.startswith("Unkeyed.trigger arguments: not JSON-serialisable (Out of range float values")
    run = NanP.trigger(1)
    drain(app, timeout=60)
    rows = executions_of(app, run.id)
    assert [(r.outcome, r.error_klass) for r in rows] == [("invalid", "ductwork.errors.NotJSONError")]
    at_return = rows[0].error_message
    assert at_return.startswith("tests.integration.test_payloads:ReturnsNan returned float: not JSON-serialisable")
    assert at_return.split(": ", 1)[1] == at_trigger.split(": ", 1)[1]  # same reason, same words
    assert run.refresh().halt_reasons == ["step_return_invalid"]


def test_a_bad_return_in_a_timeout_child_is_not_retried_either(app):
    run = SetInChildP.trigger(1)
    drain(app, timeout=120)
    assert run.refresh().halt_reasons == ["step_return_invalid"]
    rows = executions_of(app, run.id)
    assert [(r.outcome, r.error_klass) for r in rows] == [("invalid", "ductwork.errors.NotJSONError")]


def test_context_values_follow_the_same_rule(app):
    context = Context(app, Unkeyed.trigger(1).id)
    with pytest.raises(PayloadTooLargeError, match=r"^context key 'k': 8,000,003 bytes of JSON"):
        context.set("k", "x" * (MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(NotJSONError, match=r"^context key 'k': not JSON-serialisable \(Out of range"):
        context.set("k", float("inf"))
    assert context.get("k") is None  # nothing written
    largest = QUOTE * ((MAX_PAYLOAD_BYTES - 2) // 2)
    assert context.set("k", largest) == largest
    assert context.get("k") == largest


def test_the_database_takes_a_statement_with_the_largest_value(app):
    from ductwork.db import dialects
    from ductwork.fleet.boot import validate

    with app.engine.connect() as conn:
        limit = dialects.statement_limit(conn)
    assert limit is None or limit >= STATEMENT_BYTES_NEEDED  # None: no limit (PostgreSQL, SQLite)
    assert not [w for w in validate(app, []) if "max_allowed_packet" in w]
