"""The duration grammar, one grammar: the engine's and the model's period parsers agree.

``docs/configuration.md``'s grammar is ASCII digits and ``w d h m s`` groups. The engine
(``ductwork.durations``) and the model (``model.limits.parse_period``) parse it
independently; on every string, both reject it or both give the same seconds, and
``parse_interval_us`` gives that many seconds in µs. Strings are drawn from the grammar's
alphabet plus the characters a parser might let through by accident: non-ASCII decimal
digits (Arabic-Indic ``'\\u0661'``, fullwidth ``'\\uff10'``, which ``int()`` and a Unicode ``\\d`` accept), signs,
dots, spaces, upper case and month/year suffixes. ``tests/symbolic.py`` states the same
contract for CrossHair; this is the sampled half, which found that the engine accepted
``'\\u0661h'`` (Arabic-Indic one, then h) as an hour.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ductwork.durations import parse_interval_us, parse_period
from ductwork.errors import DurationError
from model import limits as model
from model.errors import ConfigError

ALPHABET = "0123456789wdhmsWDHMSoy.+- _" + "\u0661\u0663\u0669\uff10\uff11\u00b2\u2155\u0967"


def _engine(text: str) -> int | None:
    try:
        return parse_period(text)
    except DurationError:
        return None


def _model(text: str) -> int | None:
    try:
        return model.parse_period(text)
    except ConfigError:
        return None


@given(st.text(alphabet=ALPHABET, max_size=10))
@example("\u0661h")  # Arabic-Indic one: an hour to a Unicode \d, not in the grammar
@example("1\uff10s")  # fullwidth zero
@example("\u0663")
@example("1h30m")
def test_engine_and_model_parse_the_same_periods(text):
    seconds = _engine(text)
    assert seconds == _model(text), f"{text!r}: engine {seconds}, model {_model(text)}"
    if seconds is not None:
        assert parse_interval_us(text) == seconds * 1_000_000


@pytest.mark.parametrize("text", ["\u0661", "\u0661h", "1\uff10s", "\uff11m", "1h\u00b2m"])
def test_non_ascii_digits_are_rejected_naming_the_value(text):
    with pytest.raises(DurationError, match="expected whole seconds") as raised:
        parse_period(text)
    assert repr(text) in str(raised.value) or text in str(raised.value)
    with pytest.raises(DurationError):
        parse_interval_us(text)


def test_model_render_period_gives_the_canonical_string():
    assert [model.render_period(n) for n in (1, 60, 5400, 694_861)] == ["1s", "1m", "1h30m", "1w1d1h1m1s"]


@pytest.mark.parametrize("seconds", [0, -1, True, 1.0, "60"])
def test_model_render_period_refuses_what_is_not_whole_seconds(seconds):
    with pytest.raises(ConfigError) as raised:
        model.render_period(seconds)
    assert (raised.value.path, raised.value.value, raised.value.reason) == (
        "seconds", seconds, "a period must be a whole number of seconds >= 1")
    assert type(raised.value.value) is type(seconds)
