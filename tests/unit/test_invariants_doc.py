"""INVARIANTS.md is complete and every reference in it resolves, in both directions.

For each invariant ID: a statement, what it relies on, where it is enforced (each
named function exists and carries a ``# [INV-…]`` tag for that ID), the model
predicate, the history checker, the engine tests (whose module docstrings name
the ID) and the mutants killed (which exist in ``tests/mutants.py`` and name the ID);
each row of scenarios accounts for the adversarial classes (partial loss, columns that
disagree, every refused state, a grandchild) with tests, ``n/a`` or ``not covered``;
the engine-mutant table lists every mutant, in the registry's order, with its guard
and detector (its times come from a run: the "engine mutants" section that
``pytest -m slow tests/properties/test_mutants.py`` prints). Conversely, every
ID cited by engine code or by a test module is defined on the page, and every ID
is enforced somewhere in ``ductwork/``, except the model-only IDs (``MODEL_ONLY``: specified
and modelled, engine pending), whose enforcement points are the model's and which
``ductwork/`` may not cite until they leave that list.

Checks: the audit page for every ID (INV-LIM-1 … INV-CLK-1, INV-REV-1 … INV-REV-3, INV-TRG-1, INV-TRG-2,
INV-LIM-8, and the model-only INV-LIM-9).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "INVARIANTS.md").read_text()
ID = re.compile(r"INV-[A-Z]{3}-\d+")
REF = re.compile(r"`([\w/.]+\.(?:py|sql))(?:::(\w+))?`")
ROWS = ("Relies on", "Enforced at", "Model", "History checker", "Engine tests", "Mutants killed", "Scenarios")
#: the adversarial scenarios each invariant's Scenarios row accounts for, in this order
SCENARIOS = ("partial loss", "columns that disagree", "every refused state", "a grandchild")
EXPECTED = {
    "INV-LIM-1", "INV-LIM-2", "INV-LIM-3", "INV-LIM-4", "INV-LIM-5", "INV-LIM-6", "INV-LIM-7", "INV-LIM-8",
    "INV-LIM-9",
    "INV-ADV-1", "INV-ADV-2", "INV-ADV-3", "INV-ADV-4",
    "INV-EXE-1", "INV-EXE-2", "INV-EXE-3", "INV-EXE-4", "INV-EXE-5",
    "INV-RUN-1", "INV-CTX-1", "INV-CLK-1",
    "INV-HLT-1", "INV-HLT-2",
    "INV-PRN-1", "INV-PRN-2",
    "INV-REV-1", "INV-REV-2", "INV-REV-3", "INV-TRG-1", "INV-TRG-2",
}
#: IDs specified and modelled whose engine is pending (issue 34, partitioned keys): the page
#: marks them "model only (issue 34): engine pending", their enforcement points are the model's
#: (tagged there), and no file of ``ductwork/`` may cite them. This list must be empty once the
#: engine lands: the engine's tag on one of them fails the test below until it leaves the list.
MODEL_ONLY: set[str] = set()  # (INV-LIM-9 left it when the engine's forget landed)
MODEL_ONLY_MARK = "model only (issue 34): engine pending"


def sections() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for block in re.split(r"^### ", PAGE, flags=re.M)[1:]:
        inv = block.split()[0]
        assert inv not in out, f"{inv} defined twice"
        fields = {"Statement": (re.search(r"\*\*Statement\.\*\*(.+?)\n\n", block, re.S) or [None, ""])[1].strip()}
        for row in ROWS:
            match = re.search(rf"^\| {row} \| (.+) \|$", block, re.M)
            fields[row] = match.group(1).strip() if match else ""
        out[inv] = fields
    return out


def defined_span(path: Path, name: str) -> tuple[int, int] | None:
    """The lines of ``name`` in ``path``: a function or class of a module, or a routine of
    the lane routine's SQL (from its ``CREATE`` to the next statement break, or the end)."""
    if path.suffix == ".sql":
        lines = path.read_text().splitlines()
        create = re.compile(rf"CREATE (?:FUNCTION|PROCEDURE) {name}\(")
        starts = [i for i, line in enumerate(lines, start=1) if create.match(line)]
        if not starts:
            return None
        ends = [i for i, line in enumerate(lines, start=1) if i > starts[0] and line.startswith("-- ---- ")]
        return starts[0], (ends[0] if ends else len(lines))
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node.lineno, node.end_lineno or node.lineno
    return None


def refs(text: str) -> list[tuple[Path, str | None]]:
    return [(ROOT / path, name) for path, name in REF.findall(text)]


def test_every_id_has_a_section():
    assert set(sections()) == EXPECTED


@pytest.mark.parametrize("inv", sorted(EXPECTED))
def test_every_field_is_filled_and_resolves(inv):
    fields = sections()[inv]
    for row in ("Statement", *ROWS):
        assert fields[row], f"{inv}: '{row}' is empty"
    for row in ROWS:
        for path, name in refs(fields[row]):
            assert path.exists(), f"{inv} {row}: {path} does not exist"
            if name:
                assert defined_span(path, name), f"{inv} {row}: {path.name} defines no {name}"


@pytest.mark.parametrize("inv", sorted(EXPECTED))
def test_enforcement_points_carry_the_tag(inv):
    points = refs(sections()[inv]["Enforced at"])
    assert points, f"{inv}: no enforcement point named"
    if inv in MODEL_ONLY:
        fields = sections()[inv]
        assert MODEL_ONLY_MARK in fields["Statement"], f"{inv}: model-only, and its statement does not say so"
        assert fields["Enforced at"].startswith(MODEL_ONLY_MARK), f"{inv}: model-only, Enforced at must say so"
        assert all(path.is_relative_to(ROOT / "model") for path, _ in points), f"{inv}: model-only, points {points}"
    for path, name in points:
        start, end = defined_span(path, name)
        body = "\n".join(path.read_text().splitlines()[start - 1:end])
        assert re.search(rf"\[(?:INV-[A-Z]+-\d+, )*{inv}\b", body), f"{inv}: {path.name}::{name} has no [{inv}] tag"


@pytest.mark.parametrize("inv", sorted(EXPECTED))
def test_model_checker_tests_and_mutants_name_the_id(inv):
    from model.invariants import INVARIANT_FUNCTIONS
    from tests.mutants import MUTANTS

    fields = sections()[inv]
    model = fields["Model"]
    if inv in INVARIANT_FUNCTIONS:
        assert f"model/invariants.py::{INVARIANT_FUNCTIONS[inv].__name__}" in model
    else:
        assert model.startswith("not modelled:") or refs(model), f"{inv}: model row says neither how nor why not"
    for path, name in refs(fields["History checker"]):
        if name:
            start, end = defined_span(path, name)
            body = "\n".join(path.read_text().splitlines()[start - 1:end])
            assert inv in body, f"{inv}: {path.name}::{name} does not mention it"
    for path, _ in refs(fields["Engine tests"]):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert inv in doc, f"{inv}: {path.name}'s docstring does not list it"
    for mutant in re.findall(r"`(\w+)`", fields["Mutants killed"]):
        assert mutant in MUTANTS, f"{inv}: unknown mutant {mutant}"
        assert inv in MUTANTS[mutant].description, f"{inv}: mutant {mutant} does not name it"


@pytest.mark.parametrize("inv", sorted(EXPECTED))
def test_every_id_accounts_for_each_adversarial_scenario(inv):
    """The Scenarios row names each class in order, each with the tests that include it, or
    ``n/a (why)``, or ``not covered (what is missing)``: an auditor sees which are covered."""
    row = sections()[inv]["Scenarios"]
    parts = re.split(rf"(?:^|; )({'|'.join(SCENARIOS)}): ", row)[1:]
    assert parts[0::2] == list(SCENARIOS), f"{inv}: Scenarios names {parts[0::2]}, not {list(SCENARIOS)}"
    for name, text in zip(parts[0::2], parts[1::2], strict=True):
        justified = text.startswith(("n/a (", "not covered (", "the same test", "every test")) or "`tests/" in text
        assert justified, f"{inv} {name}: neither a test, nor n/a (why), nor not covered (what): {text!r}"


def test_engine_tags_and_test_docstrings_cite_only_known_ids_and_every_id_is_enforced():
    tagged = set()
    for path in [*(ROOT / "ductwork").rglob("*.py"), *(ROOT / "ductwork").rglob("*.sql")]:
        for inv in ID.findall(path.read_text()):
            assert inv in EXPECTED, f"{path.name} cites unknown {inv}"
            assert inv not in MODEL_ONLY, f"{path.name} cites {inv}: the engine enforces it, remove it from MODEL_ONLY"
            tagged.add(inv)
    assert tagged == EXPECTED - MODEL_ONLY, f"never tagged in ductwork/: {sorted(EXPECTED - MODEL_ONLY - tagged)}"
    for path in list((ROOT / "tests").rglob("test_*.py")) + list((ROOT / "model").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        unknown = set(ID.findall(doc)) - EXPECTED
        assert not unknown, f"{path.relative_to(ROOT)} cites unknown {sorted(unknown)}"


def test_the_engine_mutant_table_lists_every_mutant_with_its_guard_and_detector():
    from tests.mutants import MUTANTS
    from tests.properties.test_mutants import detector_label

    start = PAGE.index("| mutant | guard removed | detector | killed in |")
    table = [line for line in PAGE[start:].split("\n\n")[0].splitlines()[2:] if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert [row[0] for row in rows] == [f"`{name}`" for name in MUTANTS]
    for (name, mutant), row in zip(MUTANTS.items(), rows, strict=False):
        assert row[1:3] == [mutant.guard, detector_label(name)], f"{name}: {row}"
        assert re.fullmatch(r"\d+\.\d s", row[3]), f"{name}: no time measured: {row}"


COUNTS = ("prunes 2, pruned runs 3, connection kills {c}, runs 45, steps 294, claims 324, "
          "keyed claims 163, batched claims 114, witnesses 314, halted runs 6, on_halt hooks 2, "
          "revived runs 4, concurrent revive calls 8")
SAMPLE_LOG = f"""ci: commit abc1234 at 2026-12-01 10:00 UTC
================================ chaos evidence ================================
passed test_chaos_round[sqlite-20261129]: sqlite: chaos seed 20261129: kills 11, {COUNTS.format(c=0)}; violations 0
failed test_killed_database_container_recovers[mysql]: mysql: chaos seed 2: kills 0, {COUNTS.format(c=3)}; violations 2
================================ engine mutants ================================
| mutant | guard removed | detector | killed in |
|---|---|---|---:|
| `no_key_lock` | the key's row lock [INV-LIM-1] | the race test | 7.7 s |
================================== tier times ==================================
ci: tier times unit 12 s, properties 1210 s, integration 300 s, chaos 180 s, other 1 s (summed test durations)
============ 1 failed, 1875 passed, 12 skipped in 551.88s (0:09:11) ============
ci: versions Python 3.11.7
ci: total 609 s
"""


def test_the_evidence_blocks_are_generated_from_a_ci_log():
    from tests import evidence

    blocks = evidence.render(evidence.parse(SAMPLE_LOG))
    assert blocks["run"] == ("Run of 2026-12-01 10:00 UTC, from a fresh clone at commit `abc1234`: "
                             "**1,875 passed, 12 skipped, **1 failed** in 552 s** (the whole `.ci/run`, "
                             "databases and containers included: 609 s). Tier times (test durations summed "
                             "across the xdist workers, so more than the wall time): unit 12 s, properties "
                             "1,210 s, integration 300 s, chaos 180 s, other 1 s. Versions: Python 3.11.7.")
    assert blocks["mutants"].splitlines()[2] == (
        "| `no_key_lock` | the key's row lock [INV-LIM-1] | the race test | 7.7 s |")
    chaos = blocks["chaos"].splitlines()
    assert chaos[2] == (
        "| round (seed 20261129) | SQLite | 11 | 0 | 45 | 294 | 324 (163, 114) | 314 | 6 / 2 / 4 (8) | 2 / 3 | 0 | 0 |")
    assert chaos[3].startswith("| database container SIGKILLed | MariaDB | 0 | 3 |")
    assert chaos[3].endswith("| 2 |")
    assert chaos[4] == "| **all 2 rounds** | | **11** | 3 | | | | | | | 0 | **2** |"


def test_the_tier_times_line_the_suite_prints_is_parsed_into_the_run_block():
    from tests import evidence
    from tests.conftest import tier, tier_times_line

    assert [tier(n) for n in ("tests/unit/test_a.py::t", "tests/chaos/test_chaos.py::t[sqlite-1]",
                              "examples/x/test_y.py::t", "test_top.py::t")] == ["unit", "chaos", "other", "other"]
    line = tier_times_line({"integration": 299.6, "unit": 0.4, "other": 2.0, "chaos": 1800.2})
    assert line == "ci: tier times unit 0 s, integration 300 s, chaos 1800 s, other 2 s (summed test durations)"
    printed = SAMPLE_LOG.splitlines()[9]
    assert printed.startswith("ci: tier times ")
    figures = evidence.parse(SAMPLE_LOG.replace(printed, line))
    assert figures["tiers"] == {"unit": 0, "integration": 300, "chaos": 1800, "other": 2}
    assert "): unit 0 s, integration 300 s, chaos 1,800 s, other 2 s. Versions:" in evidence.render(figures)["run"]
    without = evidence.parse(SAMPLE_LOG.replace(printed, ""))
    assert "tiers" not in without
    assert "Tier times" not in evidence.render(without)["run"]


def test_each_page_has_its_evidence_blocks_and_replace_keeps_the_prose():
    from tests import evidence

    for page, names in evidence.PAGES.items():
        text = page.read_text()
        blocks = {name: f"generated {name}" for name in names}
        replaced = evidence.replace(text, blocks, page.name)
        for name in names:
            assert f"<!-- evidence:{name} -->\ngenerated {name}\n<!-- /evidence:{name} -->" in replaced
        assert replaced.count("\n") <= text.count("\n")  # the blocks went, the markers stayed
        first = names[0]
        assert replaced.split(f"<!-- evidence:{first} -->")[0] == text.split(f"<!-- evidence:{first} -->")[0]
        with pytest.raises(ValueError, match=f"{page.name} has no <!-- evidence:missing -->"):
            evidence.replace(text, {"missing": "x"}, page.name)


#: a .ci/run log of the three steps (lint, unit, the rest), each pytest's output then its step line
STEPS_LOG = """ci: commit def5678 at 2026-12-03 09:00 UTC
================================== tier times ==================================
ci: tier times lint 9 s (summed test durations)
ci: tier tests lint 14 (passed, failed or skipped)
============================= 14 passed in 10.02s ==============================
ci: step lint 11 s (pytest tests/lint)
================================== tier times ==================================
ci: tier times unit 12 s (summed test durations)
ci: tier tests unit 1265 (passed, failed or skipped)
============================ 1265 passed in 9.72s ==============================
ci: step unit 13 s (pytest tests/unit -n 2)
================================== tier times ==================================
ci: tier times properties 660 s, integration 1240 s, chaos 540 s, other 1 s (summed test durations)
ci: tier tests properties 350, integration 1500, chaos 40, other 2 (passed, failed or skipped)
================ 1865 passed, 27 skipped in 1290.40s (0:21:30) =================
ci: step rest 1296 s (pytest -n 2 --ignore=tests/lint --ignore=tests/unit)
ci: versions Python 3.11.7
ci: total 1340 s
"""


def test_the_steps_and_tiers_blocks_are_generated_from_a_ci_log_of_three_steps():
    from tests import evidence
    from tests.conftest import tier_tests_line

    assert tier_tests_line({"unit": 1265, "lint": 14, "other": 2}) == (
        "ci: tier tests lint 14, unit 1265, other 2 (passed, failed or skipped)")
    figures = evidence.parse(STEPS_LOG)
    assert figures["summary"] == {"passed": 3144, "skipped": 27, "seconds": 10.02 + 9.72 + 1290.40}
    assert [(s["name"], s["seconds"]) for s in figures["steps"]] == [("lint", 11), ("unit", 13), ("rest", 1296)]
    blocks = evidence.render(figures)
    assert blocks["steps"] == (
        "From a fresh clone at `def5678` on 2026-12-03 09:00 UTC, each command's wall time: `pytest tests/lint`, "
        "14 passed in **11 s**; `pytest tests/unit -n 2`, 1,265 passed in **13 s**; `pytest -n 2 --ignore=tests/lint "
        "--ignore=tests/unit`, 1,865 passed, 27 skipped in **1,296 s**.")
    assert blocks["tiers"] == (
        "The whole suite, in the `.ci/run` of 2026-12-03 09:00 UTC from a fresh clone at `def5678`: **3,144 passed, "
        "27 skipped in 1,310 s** of pytest, 1,340 s for the whole `.ci/run` (databases and containers included). "
        "Per tier, the tests run and their durations summed across the xdist workers (so more than the wall time): "
        "lint 14 tests, 9 s; unit 1,265 tests, 12 s; properties 350 tests, 660 s; integration 1,500 tests, 1,240 s; "
        "chaos 40 tests, 540 s; other 2 tests, 1 s.")
    assert "**3,144 passed, 27 skipped in 1310 s**" in blocks["run"]
    assert "): lint 9 s, unit 12 s, properties 660 s," in blocks["run"]
    # a log of the first steps alone (a run stopped early, or those commands run by hand)
    # measures them, and says nothing of the whole suite
    partial = evidence.render(evidence.parse(STEPS_LOG.split("ci: step unit")[0] + "ci: step unit 13 s (x)\n"))
    assert set(partial) == {"steps"}
    assert partial["steps"].endswith("`pytest tests/lint`, 14 passed in **11 s**; `x`, 1,265 passed in **13 s**.")


#: what the generated blocks of CONTRIBUTING.md look like (the figures are not checked to be current)
_COMMIT_DATE = r"`[0-9a-f]{7,40}` on \d{4}-\d\d-\d\d \d\d:\d\d UTC"
_OUTCOME = r"[\d,]+ passed(, [\d,]+ skipped)?(, \*\*\d+ failed\*\*)?"
WELL_FORMED = {
    "steps": rf"From a fresh clone at {_COMMIT_DATE}, each command's wall time: "
             rf"`pytest tests/lint`, {_OUTCOME} in \*\*[\d,]+ s\*\*; `pytest tests/unit -n 2`, {_OUTCOME} in "
             rf"\*\*[\d,]+ s\*\*(; `[^`]+`, {_OUTCOME} in \*\*[\d,]+ s\*\*)*\.",
    "tiers": rf"The whole suite, in the `\.ci/run` of \d{{4}}-\d\d-\d\d \d\d:\d\d UTC from a fresh clone at "
             rf"`[0-9a-f]{{7,40}}`: \*\*{_OUTCOME} in [\d,]+ s\*\* of pytest, [\d,]+ s for the whole `\.ci/run` "
             rf"\(databases and containers included\)(\. Per tier, the tests run and their durations summed across "
             rf"the xdist workers \(so more than the wall time\): \w+ ([\d,]+ tests, )?[\d,]+ s"
             rf"(; \w+ ([\d,]+ tests, )?[\d,]+ s)*)?\.",
}


def test_contributing_md_has_its_generated_test_times_and_they_are_well_formed():
    from tests import evidence

    text = (ROOT / "CONTRIBUTING.md").read_text()
    for name in evidence.PAGES[evidence.CONTRIBUTING]:
        found = re.search(rf"<!-- evidence:{name} -->\n(.*?)\n<!-- /evidence:{name} -->", text, re.DOTALL)
        assert found, f"CONTRIBUTING.md has no <!-- evidence:{name} --> block"
        assert re.fullmatch(WELL_FORMED[name], found.group(1)), f"{name}: {found.group(1)}"
    for name, body in evidence.render(evidence.parse(STEPS_LOG)).items():  # the checks accept what is generated
        if name in WELL_FORMED:
            assert re.fullmatch(WELL_FORMED[name], body), f"{name}: {body}"
