"""The payload rule as pure functions: one serialiser, one maximum, one error per breach.

Checks: INV-EXE-4 (which failures halt at once, and with which reason).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.errors import InputError, NotJSONError, PayloadTooLargeError, StepReturnError
from ductwork.fleet.worker import make_output
from ductwork.pipelines.advance import fan_in_size
from ductwork.pipelines.payloads import MAX_PAYLOAD_BYTES, check_size, dump, payload_envelope, statement_limit_warning
from ductwork.pipelines.rules import job_halt_reason
from ductwork.pipelines.snapshot import Definition

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def test_the_maximum_is_the_largest_size_accepted():
    check_size(MAX_PAYLOAD_BYTES, "v")
    with pytest.raises(PayloadTooLargeError, match=r"^v: 8,000,001 bytes of JSON, more than the maximum of 8,000,000"):
        check_size(MAX_PAYLOAD_BYTES + 1, "v")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {1, 2}, b"x", object(), [float("-inf")]])
def test_values_json_cannot_carry_are_one_error(value):
    with pytest.raises(NotJSONError, match=r"^X.trigger arguments: not JSON-serialisable \(") as raised:
        dump(value, "X.trigger arguments")
    # caught where trigger's errors were caught, and where a step's return errors are
    assert isinstance(raised.value, InputError)
    assert isinstance(raised.value, StepReturnError)
    assert isinstance(raised.value, TypeError)


def test_a_return_value_breaks_the_rule_as_a_trigger_argument_does():
    definition = Definition.from_json({
        "format": 1, "pipeline": "p:P", "start": "A#0",
        "nodes": {"A#0": {"klass": "s:A", "delay_us": None, "timeout_us": None, "limit_by": None}},
        "edges": {}})
    with pytest.raises(NotJSONError) as at_return:
        make_output("s:A", definition, "A#0", float("nan"))
    with pytest.raises(NotJSONError) as at_trigger:
        dump([float("nan")], "P.trigger arguments")
    assert str(at_return.value).startswith("s:A returned float: not JSON-serialisable (")
    assert str(at_return.value).split(": ", 1)[1] == str(at_trigger.value).split(": ", 1)[1]
    with pytest.raises(PayloadTooLargeError, match=r"^s:A returned str: 8,000,002 bytes"):
        make_output("s:A", definition, "A#0", "x" * MAX_PAYLOAD_BYTES)


@given(st.lists(json_values, max_size=6))
def test_fan_in_size_is_the_length_of_the_list_the_fan_in_builds(outputs):
    texts = [json.dumps(o, allow_nan=False) for o in outputs]
    stored = sum(len(payload_envelope(t)) for t in texts)
    assert fan_in_size(stored, len(texts)) == len("[" + ",".join(texts) + "]")


@pytest.mark.parametrize(("outcome", "error_klass", "reason"), [
    ("process_crashed", None, "job_crashes_exhausted"),
    ("failure", "builtins.ValueError", "job_retries_exhausted"),
    ("timed_out", "ductwork.execute.StepTimedOut", "job_retries_exhausted"),
    ("invalid", "ductwork.errors.StepReturnError", "step_return_invalid"),
    ("invalid", "ductwork.errors.NotJSONError", "step_return_invalid"),
    ("invalid", "ductwork.errors.PayloadTooLargeError", "payload_too_large"),
    ("invalid", "builtins.ModuleNotFoundError", "job_invalid"),
    ("failure", "ductwork.errors.PayloadTooLargeError", "job_retries_exhausted"),  # raised by the step itself
    (None, None, "job_retries_exhausted"),
])
def test_halt_reasons_of_a_failed_step(outcome, error_klass, reason):
    assert job_halt_reason(outcome, error_klass) == reason


@pytest.mark.parametrize(("limit", "warned"), [(None, False), (16 * 1024 * 1024, False), (64 * 1024 * 1024, False),
                                               (16 * 1024 * 1024 - 1, True), (4 * 1024 * 1024, True)])
def test_a_statement_limit_below_16_mib_is_warned_about(limit, warned):
    warning = statement_limit_warning(limit)
    assert (warning is not None) == warned
    if warned:
        assert warning.startswith(f"the database's max_allowed_packet is {limit:,} bytes")
        assert "SET GLOBAL max_allowed_packet = 16777216" in warning
