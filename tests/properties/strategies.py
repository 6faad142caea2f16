"""Hypothesis strategies of the model-alone limits machines and config tests.

Example::

    @initialize(config=limits_configs())
    def setup(self, config):
        self.model = LimitsModel(config)

* ``limits_configs()`` — ``job_worker.limits`` mappings for keys ``a`` and ``b``
  (``c`` is never configured: it claims unlimited), periods from a small pool
  so restarts often keep a period with a new burst;
* ``rate_entry_lists()`` — a key's raw ``rate`` list (distinct periods).

Both draw plain mappings (no model object), so any test may use them with the model under
either name. The pipeline strategies (definitions, oracles, scenarios, configs) are the
conformance hunts': ``ductwork_proof/conformance/strategies.py``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from model.limits import render_period

__all__ = ["LIMIT_KEYS", "limits_configs", "rate_entry_lists"]

LIMIT_KEYS = ("a", "b", "c")

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


@st.composite
def limits_configs(draw) -> dict[str, dict]:
    """A ``job_worker.limits`` mapping: ``a`` always, ``b`` usually, ``c`` never configured."""
    config = {"a": draw(_key_entry())}
    if draw(st.integers(0, 3)):
        config["b"] = draw(_key_entry())
    return config
