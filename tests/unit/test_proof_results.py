"""The records and pure decisions of ``ductwork verify`` (ductwork_proof): no database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ductwork.limit_entries import parse_limits
from ductwork_proof import verify
from ductwork_proof.invariants import STATEMENTS
from ductwork_proof.results import Check, Round, VerifyResult
from ductwork_proof.workload import SYNTHETIC_ITEMS, AdopterShapes, items_for

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_statements_are_invariants_mds_headings():
    """Every heading but the model-only IDs' (specified and modelled, engine pending): a
    report of ``ductwork verify`` names none of them, since no engine check exists."""
    from tests.unit.test_invariants_doc import MODEL_ONLY

    headings = dict(re.findall(r"^### (INV-[A-Z]+-\d+) — (.+)$", (REPO / "INVARIANTS.md").read_text(), re.M))
    assert set(headings) >= MODEL_ONLY
    assert {inv: text for inv, text in headings.items() if inv not in MODEL_ONLY} == STATEMENTS


def _result(**changes) -> VerifyResult:
    base = VerifyResult(ductwork_version="0.1.0", backend="sqlite", database_url="sqlite:///x", server_version="3",
                        settings={}, seed=7, quick=True, started_at="2026-12-06T00:00:00+00:00")
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def test_a_result_round_trips_through_json_and_its_verdict_is_its_failed_checks():
    result = _result(environment=[Check("ENV-A", "a", "probe_a", True, "fine")],
                     invariants=[Check("INV-LIM-1", "s", "check_inv_lim_1", False, findings=["4 > 3"]),
                                 Check("INV-LIM-7", "s", "-", None, "not checked")],
                     rounds=[Round(8, {"claims": 3}, "/h.jsonl", {"INV-LIM-1": ["4 > 3"]}, "ductwork verify ...")])
    again = VerifyResult.from_json(result.to_json())
    assert again == result
    assert [c.id for c in again.failed] == ["INV-LIM-1"]
    assert not again.ok
    assert _result(environment=[Check("ENV-A", "a", "probe_a", True)]).ok


def _round(seed: int, violations: dict[str, list[str]]) -> Round:
    return Round(seed, {"claims": 10, "kills": 2}, f"/h{seed}.jsonl", violations, f"replay {seed}")


def test_an_invariant_fails_when_a_round_violates_it_and_names_the_round_to_replay():
    checks = {c.id: c for c in verify.invariant_checks([_round(1, {}), _round(2, {"INV-ADV-1": ["twice"]})], [])}
    assert checks["INV-ADV-1"].passed is False
    assert checks["INV-ADV-1"].findings == ["seed 2: twice"]
    assert "replay 2" in checks["INV-ADV-1"].detail
    assert "replay 1" not in checks["INV-ADV-1"].detail
    assert checks["INV-ADV-1"].counts == {"rounds": 2, "violations": 1, "claims": 20, "kills": 4}
    assert checks["INV-LIM-1"].passed is True
    # no chaos checker and no round: not checked, said so
    assert checks["INV-LIM-7"].passed is None
    assert "not checked" in checks["INV-LIM-7"].detail


def test_a_conformance_finding_that_names_an_invariant_fails_that_invariant_only():
    machine = Check("CONF-LIMITS", "s", "LimitsMachine", False, findings=["INV-LIM-2 violated: 4 claims in 1 s"])
    checks = {c.id: c for c in verify.invariant_checks([], [machine])}
    assert checks["INV-LIM-2"].passed is False
    assert checks["INV-LIM-1"].passed is True  # checked by the same machine, not named
    assert checks["INV-ADV-1"].passed is None  # a pipelines invariant: that machine did not run
    assert "CONF-LIMITS" in checks["INV-LIM-5"].checker


@pytest.mark.parametrize(("concurrency", "rates", "items"), [
    (2, [], 6),                       # three times the ceiling
    (None, [], SYNTHETIC_ITEMS),      # unlimited in flight: the most
    (10, [], SYNTHETIC_ITEMS),        # capped
    (3, [(2, 1, 5)], 9),              # 2/s for 8 s = 16 admitted; 9 wanted
    (3, [(1, 1, 5)], 8),              # 1/s from an empty bucket: 8 in 8 s
    (3, [(1, 10, 1)], 0),             # one per 10 s: none in a round
    (3, [(60, 60, 1), (1, 2, 1)], 4),  # the tighter entry decides
])
def test_a_synthetic_keys_items_are_what_its_ceiling_wants_and_its_rates_admit(concurrency, rates, items):
    assert items_for(concurrency, rates) == items


def test_the_adopters_limits_run_on_synthetic_keys_with_their_values():
    entries = parse_limits({"stripe": {"concurrency": 2, "rate": {"limit": 5, "per": "1s", "burst": 2}},
                            "slow": {"rate": {"limit": 1, "per": "1h"}}})
    shapes = AdopterShapes.from_limits(entries)
    assert shapes.limits == {"verify:stripe": {"concurrency": 2, "rate": [{"limit": 5, "per": "1s", "burst": 2}]}}
    assert parse_limits(shapes.limits)["verify:stripe"].rates == entries["stripe"].rates
    assert shapes.skipped == ["slow"]
    assert shapes.items == {"verify:stripe": 6}
    (pipeline,) = shapes.pipelines
    (edge_types,) = [{e.type for e in pipeline.definition.edges.values()}]
    assert edge_types == {"expand", "collapse"}
    assert shapes.environ() == {"DUCTWORK_VERIFY_KEYS": '["verify:stripe"]'}


def test_the_adopters_key_families_run_on_synthetic_families_with_their_values():
    """A family's per-partition entry and ceiling are kept; its run fans out to twice what
    one partition's entry wants (half of the items go to one partition); a family whose
    partitions' rate admits nothing in a round is skipped, as a key is."""
    from ductwork.config import Config

    config = Config.from_section({"job_worker": {"limits": {
        "acct": {"per_partition": {"concurrency": 2, "rate": {"limit": 10, "per": "1s"}}, "concurrency": 3},
        "open": {"per_partition": {"concurrency": 1}},
        "slow": {"per_partition": {"rate": {"limit": 1, "per": "1h"}}},
        "stripe": {"concurrency": 2}}}}, source="<test>")
    shapes = AdopterShapes.from_limits(config.limits, config.families)
    assert shapes.limits == {
        "verify:stripe": {"concurrency": 2},
        "verify:acct": {"per_partition": {"concurrency": 2, "rate": [{"limit": 10, "per": "1s", "burst": 10}]},
                        "concurrency": 3},
        "verify:open": {"per_partition": {"concurrency": 1}}}
    again = Config.from_section({"job_worker": {"limits": shapes.limits}}, source="<again>")
    assert again.families["verify:acct"].per_partition.rates == config.families["acct"].per_partition.rates
    assert again.families["verify:acct"].concurrency == 3
    assert shapes.items == {"verify:stripe": 6, "verify:acct": 12, "verify:open": 6}
    assert shapes.families == ["verify:acct", "verify:open"]
    assert shapes.skipped == ["slow"]
    assert [p.__name__ for p in shapes.pipelines] == ["AdopterFan0", "AdopterTenantFan0", "AdopterTenantFan1"]
    fan = shapes.pipelines[1].definition
    (partitioned,) = [n for n in fan.nodes.values() if n.partition is not None]
    assert str(partitioned.partition) == "verify:acct[value.tenant]"
    assert shapes.environ() == {"DUCTWORK_VERIFY_KEYS": '["verify:stripe"]',
                                "DUCTWORK_VERIFY_FAMILIES": '["verify:acct", "verify:open"]'}


def test_the_replay_command_masks_the_password_and_names_the_seed():
    opts = verify.Options("postgresql://app:s3cret@db.example/prod", config="ductwork.yml")
    command = verify.replay(opts, 42, part="chaos")
    assert "s3cret" not in command
    assert "--seed 42" in command
    assert "--only chaos" in command
    assert "-c ductwork.yml" in command


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--examples", "-1"], []])
def test_bad_options_are_refused_by_name(argv, monkeypatch):
    monkeypatch.delenv(verify.URL_ENV, raising=False)
    args = ["--database-url", "sqlite:///x.db", *argv] if argv else []
    with pytest.raises(SystemExit, match=r"--rounds 0|--examples -1|--database-url"):
        verify.options(args)
