"""Replay every scenario of ``vectors/`` through ``model/``; results must match exactly.

Checks: INV-LIM-4 (levels, clamp, restarts), INV-LIM-5 (``blocked_until``),
INV-LIM-1 (concurrency refusals), INV-LIM-7 (periods and rate entries).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.errors import ConfigError
from model.invariants import LIMITS_INVARIANTS, check_all
from model.limits import LimitsModel, drop_dominated, parse_period, parse_rate_entries

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
BUCKETS = json.loads((VECTORS / "buckets.json").read_text())
RATE_ENTRIES = json.loads((VECTORS / "rate_entries.json").read_text())
PERIODS = json.loads((VECTORS / "periods.json").read_text())
CLAIM_FIELDS = ("admitted", "refused_for", "blocked_until_us", "levels", "in_flight")


@pytest.mark.parametrize("scenario", BUCKETS, ids=lambda s: s["name"])
def test_bucket_scenario(scenario):
    """Each op at ``at_us``; ``complete`` ends the oldest admitted claim; invariants hold throughout."""
    model = LimitsModel({"k": scenario["entry"]})
    held = []
    for index, op in enumerate(scenario["ops"]):
        if op["op"] == "claim":
            decision = model.decide("k", op["at_us"])
            if decision.admitted:
                held.append(decision.job_id)
            got = {**decision.__dict__, "levels": list(decision.levels)}
            assert {f: got[f] for f in CLAIM_FIELDS} == {f: op[f] for f in CLAIM_FIELDS}, f"op {index}: {op}"
        elif op["op"] == "complete":
            model.complete(held.pop(0), op["at_us"])
            assert model.in_flight("k") == op["in_flight"], f"op {index}: {op}"
        else:
            assert op["op"] == "restart_with"
            model.restart_with({"k": op["entry"]}, op["at_us"])
        check_all(model)
    assert len(LIMITS_INVARIANTS) == 8  # INV-LIM-1…6, and INV-LIM-8, -9 (partitioned keys: vacuous on a static key)


@pytest.mark.parametrize("case", RATE_ENTRIES, ids=lambda c: json.dumps(c["rate"]))
def test_rate_entries(case):
    if case.get("error"):
        with pytest.raises(ConfigError):
            parse_rate_entries(case["rate"])
    else:
        assert [e.as_dict() for e in drop_dominated(parse_rate_entries(case["rate"]))] == case["kept"]


@pytest.mark.parametrize("case", PERIODS, ids=lambda c: repr(c["per"]))
def test_periods(case):
    if case.get("error"):
        with pytest.raises(ConfigError) as info:
            parse_period(case["per"])
        assert repr(case["per"]) in str(info.value)
    else:
        assert parse_period(case["per"]) == case["seconds"]
