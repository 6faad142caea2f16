"""Hypothesis strategies of the model-alone limits machines and config tests.

Example::

    @initialize(config=limits_configs())
    def setup(self, config):
        self.model = LimitsModel(config)

* ``limits_configs()`` — ``job_worker.limits`` mappings for keys ``a`` and ``b``
  (``c`` is never configured: it claims unlimited), periods from a small pool
  so restarts often keep a period with a new burst;
* ``rate_entry_lists()`` — a key's raw ``rate`` list (distinct periods);
* ``partitioned_limits_configs()`` — those mappings with a key family ``p`` (issue 34,
  model only) most of the time, and ``partition_values()``, hostile partition values
  (quotes, brackets, SQL, NUL, unicode, empty, very long, lone surrogates, big integers).

Both draw plain mappings (no model object), so any test may use them with the model under
either name. The pipeline strategies (definitions, oracles, scenarios, configs) are the
conformance hunts': ``ductwork_proof/conformance/strategies.py``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from model.limits import render_period

__all__ = ["FAMILY", "HOSTILE_VALUES", "LIMIT_KEYS", "limits_configs", "partition_values",
           "partitioned_limits_configs", "rate_entry_lists"]

LIMIT_KEYS = ("a", "b", "c")
#: the key family of ``partitioned_limits_configs`` (configured most of the time)
FAMILY = "p"
#: partition values a tenant's data may hold: each renders to one key or is refused by name
HOSTILE_VALUES = (
    "", " ", "x", "X", "'", '"', "\\", "[", "]", "][", '"]', "p[0]", "' OR '1'='1",
    "'); DROP TABLE ductwork_limit_keys; --",
    "\x00", "\n", "\t", "é", "e\u0301", "ß", "İ", "🙂", "\u202e", "\ud800", "x" * 250, "x" * 251, "é" * 300,
    0, -1, 1, 2**63, -(2**63) - 1,
)

# --------------------------------------------------------------------------- limits

_PERIODS_S = (1, 2, 5, 60)


def _period_text(seconds: int) -> st.SearchStrategy:
    return st.sampled_from([seconds, str(seconds), render_period(seconds)])


@st.composite
def rate_entry_lists(draw, min_size: int = 1, max_size: int = 2, max_rate: int = 4) -> list[dict]:
    """A key's raw ``rate`` list: distinct periods, 1..``max_rate`` tokens per second or less,
    burst given or defaulted (so tokens come every few seconds at most)."""
    periods = draw(st.lists(st.sampled_from(_PERIODS_S), min_size=min_size, max_size=max_size, unique=True))
    entries = []
    for seconds in periods:
        limit = draw(st.integers(1, max_rate * seconds))
        entry: dict[str, Any] = {"limit": limit, "per": draw(_period_text(seconds))}
        if draw(st.booleans()):
            entry["burst"] = draw(st.integers(1, 4))
        entries.append(entry)
    return entries


@st.composite
def _key_entry(draw) -> dict:
    entry: dict[str, Any] = {}
    if draw(st.booleans()):
        entry["concurrency"] = draw(st.integers(1, 3))
    if not entry or draw(st.booleans()):
        rates = draw(rate_entry_lists())
        entry["rate"] = rates[0] if len(rates) == 1 and draw(st.booleans()) else rates
    return entry


def partition_values() -> st.SearchStrategy:
    """A partition value from a tenant's data: hostile ones most often, any text or integer."""
    return st.one_of(st.sampled_from(HOSTILE_VALUES), st.text(max_size=8), st.integers(-3, 3))


@st.composite
def partitioned_limits_configs(draw) -> dict[str, dict]:
    """``limits_configs()`` and, three times in four, a family ``p``: per-partition limits
    as a key's, and a ceiling over the family half of the time (1 to 3, so it binds)."""
    config = draw(limits_configs())
    if draw(st.integers(0, 3)):
        family: dict[str, Any] = {"per_partition": draw(_key_entry())}
        if draw(st.booleans()):
            family["concurrency"] = draw(st.integers(1, 3))
        config[FAMILY] = family
    return config


@st.composite
def limits_configs(draw) -> dict[str, dict]:
    """A ``job_worker.limits`` mapping: ``a`` always, ``b`` usually, ``c`` never configured."""
    config = {"a": draw(_key_entry())}
    if draw(st.integers(0, 3)):
        config["b"] = draw(_key_entry())
    return config
