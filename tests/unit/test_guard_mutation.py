"""The guard modules' mutant generator (``tests/guard_mutation.py``) writes what it says.

Every guard module yields mutants, each a one-change variant that compiles and differs
from the module; the four operators are there, including the classes issue 37 found by
hand (a sweep measuring a claim from its creation time, a where clause dropped); a
mutant changes exactly the node it names; and the mutant counts docs/verification.md and
INVARIANTS.md publish are the generator's. The nightly run itself is not run here.
"""

from __future__ import annotations

import ast
import difflib
import re

import pytest

from tests import guard_mutation
from tests.guard_mutation import ARGUED, GUARD_TESTS, OPERATORS, PACKAGE, generate, mutated_source


@pytest.mark.parametrize("module", list(GUARD_TESTS))
def test_each_guard_module_has_mutants_and_tests_that_exist(module):
    generated = generate(module)
    assert generated, module
    assert {g.operator for g in generated} <= set(OPERATORS)
    assert [g.number for g in generated] == list(range(1, len(generated) + 1))
    for path in GUARD_TESTS[module]:
        assert (guard_mutation.ROOT / path).exists(), path


def _diff(module: str, number: int) -> list[str]:
    original = ast.unparse(ast.parse((PACKAGE / module).read_text())).splitlines()
    mutated = mutated_source(module, number).splitlines()
    compile("\n".join(mutated), module, "exec")
    return [line for line in difflib.unified_diff(original, mutated, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_the_reapers_mutants_cover_every_operator_and_each_changes_one_line():
    generated = generate("fleet/reaper.py")
    assert {g.operator for g in generated} == set(OPERATORS)
    for g in generated:
        changed = _diff("fleet/reaper.py", g.number)
        assert len(changed) == 2, (g, changed)  # one line out, one line in


def test_the_sweeps_claim_time_read_as_its_creation_time_is_generated():
    swaps = [g for g in generate("fleet/reaper.py") if g.what == "`_e.c.claimed_at` read as `created_at`"]
    added = [_diff("fleet/reaper.py", g.number)[1] for g in swaps]
    assert sum("old(_e.c.created_at)" in line for line in added) == 1
    assert sum("_e.c.created_at.is_not(None)" in line for line in added) == 1


def test_a_where_of_one_argument_is_dropped_whole():
    (dropped,) = [g for g in generate("fleet/reaper.py") if g.what == "`.where(_p.c.id != own_process_id)` dropped"]
    removed, added = _diff("fleet/reaper.py", dropped.number)
    assert ".where(_p.c.id != own_process_id)" in removed
    assert ".where(" not in added


VERIFICATION = (guard_mutation.ROOT / "docs" / "verification.md").read_text()
INVARIANTS = (guard_mutation.ROOT / "INVARIANTS.md").read_text()
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10, "eleven": 11, "twelve": 12}


def test_the_published_mutant_counts_are_the_generators():
    """docs/verification.md's count per module and in all, and each "the other <n> (guard)
    modules (<m> mutants)" of it and of INVARIANTS.md (the modules its results table has
    not run yet), are what :func:`generate` yields now: a change to a guard module that
    adds or removes mutants fails here until the figures are corrected."""
    counts = {module: len(generate(module)) for module in GUARD_TESTS}
    section = VERIFICATION[VERIFICATION.index("The mutants per module"):]
    listed, total = section[:section.index(" in all")].rsplit(": ", 1)
    assert dict(re.findall(r"`([\w/]+\.py)` (\d+)", listed)) == {m: str(n) for m, n in counts.items()}
    assert int(total) == sum(counts.values())
    table = VERIFICATION[VERIFICATION.index("| module | database | generated |"):].split("\n\n")[0]
    run = set(re.findall(r"^\| `([\w/]+\.py)` \|", table, flags=re.M))
    assert run <= set(counts), run - set(counts)
    others = re.findall(r"the other (\w+) (?:guard )?modules \((\d+) mutants\)", VERIFICATION + INVARIANTS)
    for word, mutants in others:
        assert (NUMBERS[word], int(mutants)) == (len(counts) - len(run), sum(counts.values()) - sum(
            counts[m] for m in run)), f"the other {word} modules ({mutants} mutants)"


@pytest.mark.parametrize("name", sorted(ARGUED))
def test_each_argued_equivalent_names_a_mutant_of_the_current_source(name):
    """An argument holds for the numbering it was made on: a change to the module renumbers
    its mutants, and the argument must be made again (here it fails first)."""
    module, number = name.split("#")
    what, argument = ARGUED[name]
    assert generate(module)[int(number) - 1].what == what, f"{name}: renumbered, argue again"
    assert argument


@pytest.mark.parametrize(("db", "required"), [("sqlite", None), ("postgresql", "1"), ("mysql", "1")])
def test_a_run_on_a_server_fails_when_the_server_is_missing_instead_of_skipping(monkeypatch, tmp_path, db, required):
    """Skipped for want of a server, the clean run and every mutant would pass, and each
    mutant would count as a survivor: on a server the run asks for failures instead
    (``DUCTWORK_REQUIRE_CONTAINERS``, ``tests/databases.py::skip_or_fail``)."""
    seen = {}

    def run(command, **kwargs):
        seen.update(command=command, env=kwargs["env"])
        return guard_mutation.subprocess.CompletedProcess(command, 0)

    monkeypatch.delenv("DUCTWORK_REQUIRE_CONTAINERS", raising=False)
    monkeypatch.setattr(guard_mutation.subprocess, "run", run)
    assert guard_mutation._pytest(guard_mutation.GUARD_TESTS["fleet/tree.py"], db, tmp_path, 60)[0] == "survived"
    assert seen["env"].get("DUCTWORK_REQUIRE_CONTAINERS") == required
    assert seen["command"][seen["command"].index("-k") + 1] == " and ".join(
        f"not {other}" for other in guard_mutation.DATABASES if other != db)


def _result(number, verdict):
    return {"module": "pipelines/prune.py", "number": number, "operator": "comparison", "line": 1,
            "what": f"mutant {number}", "verdict": verdict, "seconds": 1.0}


def test_a_mutant_is_killed_over_the_databases_when_any_run_killed_it_and_survives_only_every_run():
    sqlite = {"results": [_result(1, "killed"), _result(2, "survived"), _result(3, "survived"), _result(4, "broken")]}
    server = {"results": [_result(2, "killed"), _result(3, "survived"), _result(4, "timeout")]}
    combined = {r["number"]: r["verdict"] for r in guard_mutation._combined([sqlite, server])}
    assert combined == {1: "killed", 2: "killed", 3: "survived", 4: "timeout"}


def test_a_servers_run_takes_only_what_the_other_databases_left(monkeypatch, tmp_path):
    monkeypatch.setattr(guard_mutation, "RESULTS", tmp_path)
    module = "pipelines/prune.py"
    record = {"module": module, "db": "sqlite", "source": guard_mutation._source(module), "clean_s": 1.0,
              "generated": 4, "results": [_result(1, "killed"), _result(2, "survived"), _result(3, "survived")]}
    guard_mutation._path(module, "sqlite").write_text(guard_mutation.json.dumps(record))
    assert guard_mutation.survivors_elsewhere(module, "postgresql") == [2, 3]
    record["source"] = "an earlier source"
    guard_mutation._path(module, "sqlite").write_text(guard_mutation.json.dumps(record))
    with pytest.raises(SystemExit, match="no stored run"):
        guard_mutation.survivors_elsewhere(module, "postgresql")


def test_coverage_contexts_become_node_ids_and_a_statement_of_several_lines_finds_its_tests():
    assert guard_mutation._node_id("tests.integration.test_revive.test_revive_a_halted_run") == (
        "tests/integration/test_revive.py::test_revive_a_halted_run")
    assert guard_mutation._node_id("tests.integration.test_revive.Kind.test_x") == (
        "tests/integration/test_revive.py::Kind::test_x")
    assert guard_mutation._node_id("nowhere.test_x") is None
    module = "pipelines/outcomes.py"
    source = (PACKAGE / module).read_text().splitlines()
    start = next(i for i, text in enumerate(source, 1) if text.strip().startswith("row = tx.execute("))
    inner = start + 4  # the where clause's line: coverage maps the statement on its first line
    assert source[inner - 1].strip().startswith(".where(")
    mapped = {"lines": {module: {str(start): ["a::test_one", "b::test_two"], str(start + 7): ["c::other"]}}}
    assert guard_mutation._covering(module, inner, mapped) == ["a::test_one", "b::test_two"]


@pytest.mark.parametrize("page", guard_mutation.PAGES, ids=lambda page: page.name)
def test_the_published_report_is_what_the_stored_runs_say(page):
    """docs/verification.md's and INVARIANTS.md's table and survivor list are ``--report``'s
    over the committed results: a new run, a new argument or a changed guard module (its
    rows turn stale) fails here until ``python -m tests.guard_mutation --report --write``
    publishes it."""
    assert guard_mutation.published(page.read_text()) == guard_mutation.report()


def test_a_run_stores_each_mutant_as_it_goes_replacing_only_that_mutants_result(monkeypatch, tmp_path):
    """An interrupted nightly run keeps what it ran: each result is stored as it comes,
    replacing the same mutant's earlier result; an earlier source's results are dropped."""
    monkeypatch.setattr(guard_mutation, "RESULTS", tmp_path)
    module = "pipelines/prune.py"
    guard_mutation._store(module, "sqlite", 1.0, 4, _result(1, "survived"))
    guard_mutation._store(module, "sqlite", 1.0, 4, _result(2, "killed"))
    record = guard_mutation._store(module, "sqlite", 1.0, 4, _result(1, "killed"))
    assert [(r["number"], r["verdict"]) for r in record["results"]] == [(1, "killed"), (2, "killed")]
    stored = guard_mutation.json.loads(guard_mutation._path(module, "sqlite").read_text())
    stored["source"] = "an earlier source"
    guard_mutation._path(module, "sqlite").write_text(guard_mutation.json.dumps(stored))
    record = guard_mutation._store(module, "sqlite", 1.0, 4, _result(3, "survived"))
    assert [r["number"] for r in record["results"]] == [3]


def test_each_run_is_in_a_pid_namespace_of_its_own_and_a_run_killed_by_its_mutant_is_a_kill(monkeypatch, tmp_path):
    """A mutant of the process tree that kills every process it sees kills only its own
    run's (``unshare --pid``), and that run's death by a signal counts as a kill."""
    seen = {}

    def run(command, **_):
        seen["command"] = command
        return guard_mutation.subprocess.CompletedProcess(command, -9)

    monkeypatch.setattr(guard_mutation.subprocess, "run", run)
    assert guard_mutation._pytest(GUARD_TESTS["fleet/tree.py"], "sqlite", tmp_path, 60)[0] == "killed"
    assert seen["command"][:len(guard_mutation.ISOLATE)] == list(guard_mutation.ISOLATE)
    assert [guard_mutation._verdict(code) for code in (0, 1, 2, 4, 5, 137)] == [
        "survived", "killed", "broken", "broken", "broken", "killed"]
    # a conftest that no longer loads under the mutant (its clean run loaded it): a kill
    conftest = f"{guard_mutation.CONFTEST_FAILED} '/x/tests/conftest.py'.\nDefinitionError: ..."
    assert [guard_mutation._verdict(4, conftest), guard_mutation._verdict(1, conftest)] == ["killed", "killed"]
