"""The report of ``ductwork verify --report DIR`` (ductwork_proof/report.py): the series its
pictures draw, counted as the checkers count; the page, self-contained and escaped; the
files it writes."""

from __future__ import annotations

import base64
import html
import json
import re
import sys
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ductwork.limit_entries import LimitEntry, RateEntry
from ductwork_proof.checkers import check_inv_lim_1, check_inv_lim_2
from ductwork_proof.history import Execution, History, RunRow
from ductwork_proof.report import (
    NO_MATPLOTLIB,
    NOT_CHECKED_DEFAULT,
    bucket_levels,
    history_span,
    inflight_series,
    render_html,
    window_counts,
    write_report,
)
from ductwork_proof.results import Check, Round, VerifyResult

S = 1_000_000  # µs
PNG = b"\x89PNG\r\n\x1a\n"


def ex(n: int, key: str | None, claimed: int | None, completed: int | None = None,
       claim_seq: int | None = None, release_seq: int | None = None) -> Execution:
    return Execution(f"e{n}", f"s{n}", "r1", key, claimed, completed, "succeeded" if completed else None,
                     claim_seq, release_seq)


def run_ended(at_us: int) -> RunRow:
    return RunRow("r1", "completed", {}, "P", 0, at_us)


# --------------------------------------------------------------------------- in flight


def test_three_overlapping_executions_are_three_in_flight_in_sequence_order():
    history = History(executions=[ex(1, "api", 0, 100, 1, 4), ex(2, "api", 10, 110, 2, 5),
                                  ex(3, "api", 20, 120, 3, 6), ex(4, "other", 5, 6, 1, 2), ex(5, None, 7)],
                      runs=[run_ended(200)])
    assert inflight_series(history, "api") == [(0, 1), (10, 2), (20, 3), (100, 2), (110, 1), (120, 0), (200, 0)]
    assert history_span(history) == (0, 200)


def test_an_execution_never_completed_counts_until_the_history_ends():
    history = History(executions=[ex(1, "api", 0, None, 1), ex(2, "api", 10, 30, 2, 3)], runs=[run_ended(500)])
    assert inflight_series(history, "api") == [(0, 1), (10, 2), (30, 1), (500, 1)]


def test_events_go_in_the_keys_sequence_order_as_inv_lim_1_reads_them():
    """e2's claim read its clock (40) before e1's release (50) but took the key's lock after
    it: one in flight, never two, as the checker counts; drawn at 50, not back at 40."""
    history = History(executions=[ex(1, "api", 0, 50, 1, 2), ex(2, "api", 40, 90, 3, 4)],
                      limits={"api": LimitEntry("api", 1, ())})
    assert inflight_series(history, "api") == [(0, 1), (50, 0), (50, 1), (90, 0)]
    assert check_inv_lim_1(history) == []
    # the same times with the sequence saying they overlapped: two, and the checker agrees
    history.executions = [ex(1, "api", 0, 50, 1, 3), ex(2, "api", 40, 90, 2, 4)]
    assert max(n for _, n in inflight_series(history, "api")) == 2
    assert len(check_inv_lim_1(history)) == 1


def test_without_sequences_a_release_comes_before_a_claim_at_the_same_microsecond():
    history = History(executions=[ex(2, "api", 10, 20), ex(1, "api", 0, 10)])
    assert inflight_series(history, "api") == [(0, 1), (10, 0), (10, 1), (20, 0)]


def test_a_key_without_claims_has_an_empty_series():
    assert inflight_series(History(executions=[ex(1, "api", None)]), "api") == []
    assert history_span(History()) is None


# --------------------------------------------------------------------------- rates

RATE = RateEntry(limit=2, per_s=1, burst=1)  # a token every 0.5 s, one banked: ≤ 3 claims in any 1 s


def claims_at(*times: int, rate: RateEntry = RATE) -> History:
    return History(executions=[ex(i, "k", t) for i, t in enumerate(times)],
                   limits={"k": LimitEntry("k", None, (rate,))})


def test_window_counts_count_the_closed_window_of_one_period_ending_at_each_claim():
    history = claims_at(0, S // 2, S, S + 1, 5 * S // 2)
    assert window_counts(history, "k", RATE) == [(0, 1), (S // 2, 2), (S, 3), (S + 1, 3), (5 * S // 2, 1)]


def test_bucket_levels_are_a_bucket_started_full_and_go_below_zero_when_inv_lim_2_fails():
    fits = claims_at(0, S // 2, S)
    assert bucket_levels(fits, "k", RATE) == [(0, 0), (S // 2, 0), (S, 0)]
    assert check_inv_lim_2(fits) == []
    crowded = claims_at(0, S // 2, S, S + 1)  # 2 claims in 1 µs: 1 + 2·10⁻⁶ allowed
    assert bucket_levels(crowded, "k", RATE)[-1] == (S + 1, Fraction(2, S) - 1)
    assert len(check_inv_lim_2(crowded)) == 1


def test_bucket_levels_are_capped_at_the_burst():
    assert bucket_levels(claims_at(0, 10 * S), "k", RATE) == [(0, 0), (10 * S, 0)]


@given(rate=st.builds(RateEntry, limit=st.integers(1, 5), per_s=st.integers(1, 3), burst=st.integers(1, 4)),
       times=st.lists(st.integers(0, 4 * S), min_size=1, max_size=30))
def test_the_pictures_agree_with_inv_lim_2s_window_bound(rate, times):
    """Below zero exactly when the checker reports a window (no ``eligible_at``: its replay
    from empty is off); while it holds, no window of one period exceeds B + L."""
    history = claims_at(*times, rate=rate)
    crossed = min(level for _, level in bucket_levels(history, "k", rate)) < 0
    assert crossed == bool(check_inv_lim_2(history))
    if not crossed:
        assert max(n for _, n in window_counts(history, "k", rate)) <= rate.burst + rate.limit


# --------------------------------------------------------------------------- the page

HOSTILE = "<script>alert(1)</script> \"q\" 'a' & <img src=x onerror=alert(2)>"


def hostile(field: str) -> str:
    return f"{HOSTILE} {field}"


def a_result(**changes) -> VerifyResult:
    result = VerifyResult(ductwork_version="0.1.0", backend="postgresql",
                          database_url="postgresql://bob:s3cret@db:5432/prod", server_version="16.4",
                          settings={"transaction_isolation": "read committed"}, seed=7, quick=True,
                          started_at="2026-12-06T08:00:00Z", duration_s=12.5,
                          limits={"api": {"concurrency": 3}}, pipelines=["orders"],
                          environment=[Check("ENV-ISO", "The isolation level is supported", "probe", True)],
                          conformance=[Check("CONF-LIM", "Limits agree with the model", "LimitsMachine", True)],
                          invariants=[Check("INV-LIM-1", "", "check_inv_lim_1", True, counts={"violations": 0})],
                          rounds=[Round(7, {"kills": 3}, "/tmp/h.jsonl", {}, "ductwork verify --seed 7")])
    for name, value in changes.items():
        setattr(result, name, value)
    return result


def hostile_result() -> VerifyResult:
    check = Check(hostile("id"), hostile("statement"), hostile("checker"), False, hostile("detail"),
                  {hostile("count"): 1}, [hostile("finding")])
    return a_result(
        ductwork_version=hostile("version"), backend=hostile("backend"), server_version=hostile("server"),
        settings={hostile("setting"): hostile("value")}, started_at=hostile("started"),
        limits={hostile("key"): {hostile("limit"): hostile("limit value")}}, pipelines=[hostile("pipeline")],
        environment=[check], conformance=[check], invariants=[check],
        rounds=[Round(1, {hostile("round count"): 2}, hostile("history"), {hostile("violation"): ["v"]},
                      hostile("replay"))],
        not_checked=[hostile("not checked")])


def test_every_value_from_data_is_escaped():
    page = render_html(hostile_result(), None, None)
    for field in ("id", "statement", "checker", "detail", "count", "finding", "version", "backend", "server",
                  "setting", "value", "started", "key", "pipeline", "round count", "history", "violation",
                  "replay", "not checked"):
        assert html.escape(hostile(field)) in page, field
    # a limit's value is shown as JSON, escaped
    assert html.escape(json.dumps({hostile("limit"): hostile("limit value")})) in page
    assert "<script" not in page
    assert "<img src=x" not in page
    assert HOSTILE not in page


def test_the_page_is_self_contained(tmp_path):
    pytest.importorskip("matplotlib")
    history = History(executions=[ex(1, "api", 0, S, 1, 2)], limits={"api": LimitEntry("api", 2, (RATE,))})
    page = write_report(a_result(), tmp_path, [history])["report.html"].read_text()
    assert "<link" not in page
    assert "<script" not in page
    assert "@import" not in page
    assert "url(" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 2
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"(?:src|href)=\"?(?:https?:|//)", page)


def test_the_url_shown_has_its_password_masked():
    page = render_html(a_result(), None, None)
    assert "postgresql://bob:***@db:5432/prod" in page
    assert "s3cret" not in page


def test_the_verdict_names_the_failed_checks():
    failed = a_result(invariants=[Check("INV-LIM-1", "", "c", False), Check("INV-LIM-2", "", "c", True)],
                      conformance=[Check("CONF-PIPE", "s", "PipelinesMachine", False)])
    banner = render_html(failed, None, None).split("<section>")[0]
    assert '"banner bad"' in banner
    assert "2 failed: CONF-PIPE, INV-LIM-1" in banner
    assert "INV-LIM-2" not in banner
    assert '"banner ok"><h1>Passed' in render_html(a_result(), None, None)
    skipped = a_result(environment=[Check("ENV-TZ", "s", "c", None, "no server")], conformance=[], invariants=[])
    assert "Nothing was checked" in render_html(skipped, None, None)


def test_what_was_not_checked_is_said_even_when_the_orchestrator_gave_no_list():
    page = render_html(a_result(not_checked=[]), None, None)
    assert "<h2>Not checked</h2>" in page
    assert all(f"<li>{item}</li>" in page for item in NOT_CHECKED_DEFAULT)
    page = render_html(a_result(not_checked=["replicas"]), None, None)
    assert "<li>replicas</li>" in page
    assert NOT_CHECKED_DEFAULT[0] not in page


def test_the_sections_come_in_order():
    page = render_html(a_result(), None, None)
    titles = re.findall(r"<h2>([^<(]*)", page)
    assert [t.strip() for t in titles] == ["What was verified", "Environment checks",
                                           "Conformance: engine against model",
                                           "Invariants on the chaos rounds&#x27; histories", "Chaos rounds",
                                           "Pictures", "Not checked"]
    assert page.index('"banner ok"') < page.index("<h2>")


def test_an_invariant_is_stated_as_invariants_md_states_it():
    assert "In-flight executions of a key never exceed its concurrency" in render_html(a_result(), None, None)


# --------------------------------------------------------------------------- files


def test_report_json_reads_back_equal(tmp_path):
    result = hostile_result()
    paths = write_report(result, tmp_path / "new" / "dir")
    assert VerifyResult.from_json(json.loads(paths["report.json"].read_text())) == result
    assert set(paths) == {"report.json", "report.html"}


def test_pictures_are_pngs_beside_the_page_and_in_it(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    backend, had_pyplot = matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules
    vendor = LimitEntry("../vendor", 2, (RATE, RateEntry(10, 60, 5)))
    history = History(executions=[ex(1, "api", 0, S, 1, 2), ex(2, "../vendor", S, None, 1)],
                      limits={"api": LimitEntry("api", 3, ()), "../vendor": vendor}, seed=7)
    paths = write_report(a_result(), tmp_path, [history, history])
    pictures = {name: path for name, path in paths.items() if name.endswith(".png")}
    assert sorted(pictures) == ["inflight-_vendor.png", "inflight-api.png", "rate-_vendor-0.png",
                                "rate-_vendor-1.png"]
    page = paths["report.html"].read_text()
    for path in pictures.values():
        assert path.parent == tmp_path
        assert path.read_bytes().startswith(PNG)
        assert base64.b64encode(path.read_bytes()).decode() in page
    assert matplotlib.get_backend() == backend
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot


def test_without_matplotlib_the_page_says_so_and_nothing_fails(tmp_path, monkeypatch):
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.ticker"):
        monkeypatch.setitem(sys.modules, module, None)
    history = History(executions=[ex(1, "api", 0, S, 1, 2)], limits={"api": LimitEntry("api", 3, ())})
    paths = write_report(a_result(), tmp_path, [history])
    assert set(paths) == {"report.json", "report.html"}
    assert html.escape(NO_MATPLOTLIB) in paths["report.html"].read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json"]
