"""The engine renders a partition's key as the model does (docs/semantics.md §5.1).

Checks: ``ductwork.limit_entries.partition_key`` and ``model/limits.py``'s ``partition_key``
agree on every value, hostile ones first (quotes, brackets, backslashes, NUL and control
characters, SQL, emoji, lone surrogates, long strings, big ints, other types): the same key,
or both refuse. A key the engine renders is valid UTF-8, at most 255 characters, ends with
its value's JSON and reads back as the value (one-to-one).
"""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from ductwork.limit_entries import MAX_KEY_CHARS, partition_key
from model.limits import partition_key as model_partition_key

HOSTILE = ['"', "]", "[", "\\", "\x00", "\x1f\x7f", "'); DROP TABLE x; --", "a\"]b[\"c", "🦆", "\ud800",
           "x\udfffy", "", " ", "\u2028", "]" * 300, "é" * 240]
FAMILIES = st.sampled_from(["vendor_api", "f", "fam ily", "a]b", "🦆"])
VALUES = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(),  # surrogates included: hypothesis draws them
    st.text(st.characters(codec="utf-8"), min_size=200, max_size=300),
    st.integers(),
    st.integers(min_value=10**240, max_value=10**300),
    st.sampled_from([True, False, None, 1.5, 0.0, [1], {"a": 1}, b"x", 10**5000]),
)


def _either(render, family: str, value: object) -> str | None:
    """The key, or None when the value is refused (a ValueError, as both raise)."""
    try:
        return render(family, value)
    except ValueError:
        return None


@given(FAMILIES, VALUES)
@example("vendor_api", "acct-42")
@example("vendor_api", 42)
def test_the_engine_renders_as_the_model(family, value):
    key = _either(partition_key, family, value)
    assert key == _either(model_partition_key, family, value)
    if key is not None:
        assert len(key) <= MAX_KEY_CHARS
        key.encode("utf-8")
        assert key.startswith(family + "[")
        assert key.endswith("]")
        assert json.loads(key[len(family) + 1:-1]) == value  # the value, whole: one-to-one


@given(st.text(st.characters(codec="utf-8")), st.text(st.characters(codec="utf-8")))
def test_two_values_are_two_keys(a, b):
    if a != b and (ka := _either(partition_key, "f", a)) is not None:
        assert ka != _either(partition_key, "f", b)
