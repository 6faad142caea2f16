"""INVARIANTS.md's Evidence and CONTRIBUTING.md's test times, regenerated from one ``.ci/run`` log.

    .ci/run 2>&1 | tee ci.log
    python -m tests.evidence ci.log            # prints the generated blocks
    python -m tests.evidence ci.log --write    # and replaces them in INVARIANTS.md and CONTRIBUTING.md

``.ci/run`` prints ``ci: commit …``, ``ci: versions …`` (:func:`versions`), and for each of its
test steps pytest's output (its summary line, its "chaos evidence", "engine mutants" and
"tier times" sections: tests/conftest.py) followed by ``ci: step NAME SECONDS s (COMMAND)``,
and at the end ``ci: total … s``. From these this module renders blocks, each between
``<!-- evidence:NAME -->`` and ``<!-- /evidence:NAME -->`` in its page (:data:`PAGES`). In
INVARIANTS.md: ``run`` (the commit, date, counts, duration, each tier's summed test durations
and tool versions), ``mutants`` (the engine-mutant table) and ``chaos`` (a row per chaos round,
with the total of process kills). In CONTRIBUTING.md: ``steps`` (each step's command, its
tests and its wall time: the lint step and the unit tier, the commands a contributor runs
first) and ``tiers`` (the whole suite's counts and time, and each tier's tests and summed
test durations). The prose around them (what each figure means, targeted runs) stays
hand-written.

Not done: a log without one of the sections leaves that block as it is (``--write``) and
says so; the whole-suite blocks (``run``, ``tiers``) need the ``ci: total`` line that only a
``.ci/run`` that got to its end prints, so a log of some steps alone renders ``steps`` only;
numbers from targeted runs outside ``.ci/run`` are not generated.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INVARIANTS = ROOT / "INVARIANTS.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
#: the generated blocks of each page, by name
PAGES = {INVARIANTS: ("run", "mutants", "chaos"), CONTRIBUTING: ("steps", "tiers")}
BLOCKS = tuple(name for names in PAGES.values() for name in names)
#: pytest's last line: ``=== 1 failed, 1875 passed, 12 skipped in 551.88s (0:09:11) ===``
SUMMARY = re.compile(r"^=+ .*\bin [\d.]+s\b.* =+$")
#: what .ci/run prints after each test step: ``ci: step unit 14 s (pytest tests/unit -n 2)``
STEP = re.compile(r"^ci: step (\w+) (\d+) s \((.+)\)$")
DATABASES = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mysql": "MariaDB"}
ROUNDS = {
    "test_chaos_round": "round (seed {seed})",
    "test_paused_database_longer_than_reaper_timeout": "database paused past `reaper_timeout`",
    "test_killed_database_container_recovers": "database container SIGKILLed",
}


def versions() -> str:
    """What ``ci: versions`` prints: the Python, library and database versions of the run."""
    import platform
    import sqlite3
    from importlib.metadata import version

    import sqlalchemy as sa

    parts = [f"Python {platform.python_version()}"]
    parts += [f"{name} {version(name)}" for name in ("pytest", "hypothesis", "SQLAlchemy", "crosshair-tool")
              if _installed(name)]
    parts.append(f"SQLite {sqlite3.sqlite_version}")
    for env, label in (("DUCTWORK_TEST_POSTGRES_URL", "PostgreSQL"), ("DUCTWORK_TEST_MYSQL_URL", "MariaDB")):
        url = os.environ.get(env)
        if not url:
            continue
        from ductwork.db import engines

        engine = engines.create_engine(url)
        try:
            with engine.connect() as conn:
                text = conn.execute(sa.text("SELECT version()")).scalar_one()
        except sa.exc.DBAPIError as error:
            text = f"unreachable ({type(error).__name__})"
        finally:
            engine.dispose()
        parts.append(f"{label} {_short_version(text)}")
    return ", ".join(parts)


def _installed(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def _short_version(text: str) -> str:
    """``PostgreSQL 15.19 (Debian …) on x86_64…`` -> ``15.19``; ``10.11.19-MariaDB-0+deb12u1`` -> ``10.11.19``."""
    found = re.search(r"\d+(\.\d+)+", text)
    return found.group(0) if found else text


def parse(log: str) -> dict:
    """The figures of one ``.ci/run`` log: ``commit``, ``date``, ``versions``, ``summary``
    (passed, skipped, failed, seconds: summed over the steps), ``total_s``, ``steps`` (one dict
    per step: name, wall seconds, command and its pytest summary), ``tiers`` (tier name ->
    summed test seconds) and ``tier_tests`` (tier name -> tests), both summed over the steps,
    in the printed order, ``mutants`` (table rows) and ``chaos`` (one dict per round). A log
    without step lines (before the lint and unit steps) is one pytest run: its last summary."""
    out: dict = {"mutants": [], "chaos": [], "steps": []}
    if found := re.search(r"^ci: commit (\S+) at (.+)$", log, re.MULTILINE):
        out["commit"], out["date"] = found.group(1), found.group(2).strip()
    if found := re.search(r"^ci: versions (.+)$", log, re.MULTILINE):
        out["versions"] = found.group(1).strip()
    if found := re.search(r"^ci: total (\d+) s$", log, re.MULTILINE):
        out["total_s"] = int(found.group(1))
    for key, line in (("tiers", r"tier times (.+) \(summed test durations\)"), ("tier_tests", r"tier tests (.+) \(")):
        for found in re.finditer(rf"^ci: {line}", log, re.MULTILINE):
            totals = out.setdefault(key, {})
            for name, n in re.findall(r"(\w+) (\d+)", found.group(1)):
                totals[name] = totals.get(name, 0) + int(n)
    last = None
    for line in log.splitlines():
        if SUMMARY.match(line):
            last = _summary(line)
        elif found := STEP.match(line):
            out["steps"].append({"name": found.group(1), "seconds": int(found.group(2)), "command": found.group(3),
                                 "summary": last})
            last = None
    summaries = [s for s in ([step["summary"] for step in out["steps"]] if out["steps"] else [last]) if s]
    if summaries:
        out["summary"] = {}
        for s in summaries:
            for key, value in s.items():
                out["summary"][key] = out["summary"].get(key, 0) + value
    out["mutants"] = _section(log, "engine mutants", r"^\| `")
    for line in _section(log, "chaos evidence", r"^(passed|failed) test_"):
        found = re.match(r"^(passed|failed) (\w+)\[([a-z]+)[^\]]*\]: \w+: chaos seed (\d+): (.*); violations (\d+)$",
                         line)
        if not found:
            continue
        outcome, test, backend, seed, counts, violations = found.groups()
        figures = {key.strip(): int(value) for key, value in
                   (item.rsplit(" ", 1) for item in counts.split(", "))}
        out["chaos"].append({"outcome": outcome, "test": test, "backend": backend, "seed": int(seed),
                             "violations": int(violations), **figures})
    return out


def _summary(line: str) -> dict:
    """pytest's summary line as counts by word, and ``seconds``."""
    out: dict = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|failed|errors?)", line)}
    out["seconds"] = float(re.search(r"in ([\d.]+)s", line).group(1))  # type: ignore[union-attr]
    return out


def _outcome(s: dict) -> str:
    """``3,086 passed, 27 skipped`` (failures, if any, in bold)."""
    failed = s.get("failed", 0) + s.get("error", 0) + s.get("errors", 0)
    return (f"{s.get('passed', 0):,} passed" + (f", {s['skipped']:,} skipped" if s.get("skipped") else "")
            + (f", **{failed} failed**" if failed else ""))


def _section(log: str, title: str, row: str) -> list[str]:
    """The lines matching ``row`` in the pytest summary section headed ``title``."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(rf"^=+ {re.escape(title)} =+$", line)]
    if not starts:
        return []
    out = []
    for line in lines[starts[-1] + 1:]:
        if re.match(r"^=+ .* =+$", line):
            break
        if re.match(row, line):
            out.append(line)
    return out


def render(figures: dict) -> dict[str, str]:
    """The generated blocks (only those the log had the figures for)."""
    blocks = {}
    if "summary" in figures and "commit" in figures and "total_s" in figures:
        s = figures["summary"]
        blocks["run"] = (f"Run of {figures['date']}, from a fresh clone at commit `{figures['commit']}`: "
                         f"**{_outcome(s)} in {s['seconds']:.0f} s** (the whole `.ci/run`, databases and "
                         f"containers included: {figures['total_s']} s).{_tiers(figures)} Versions: "
                         f"{figures.get('versions', 'not printed')}.")
        per_tier = "; ".join(
            (f"{name} {figures['tier_tests'][name]:,} tests, " if name in figures.get("tier_tests", {}) else f"{name} ")
            + f"{seconds:,} s" for name, seconds in figures.get("tiers", {}).items())
        blocks["tiers"] = (f"The whole suite, in the `.ci/run` of {figures['date']} from a fresh clone at "
                           f"`{figures['commit']}`: **{_outcome(s)} in {s['seconds']:,.0f} s** of pytest, "
                           f"{figures['total_s']:,} s for the whole `.ci/run` (databases and containers included)"
                           + (f". Per tier, the tests run and their durations summed across the xdist workers "
                              f"(so more than the wall time): {per_tier}." if per_tier else "."))
    steps = [step for step in figures["steps"] if step["summary"]]
    if steps and "commit" in figures:
        blocks["steps"] = (f"From a fresh clone at `{figures['commit']}` on {figures['date']}, each command's wall "
                           f"time: " + "; ".join(f"`{step['command']}`, {_outcome(step['summary'])} in "
                                                 f"**{step['seconds']:,} s**" for step in steps) + ".")
    if figures["mutants"]:
        blocks["mutants"] = "\n".join(["| mutant | guard removed | detector | killed in |", "|---|---|---|---:|",
                                       *figures["mutants"]])
    if figures["chaos"]:
        rows = ["| round | database | process kills | server-side connection kills | runs | steps "
                "| claims (keyed, batched) | witnesses | halted runs / on_halt hooks / revived runs (revive calls) "
                "| prunes / runs pruned | partitions forgotten | violations |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        order = list(ROUNDS)
        for r in sorted(figures["chaos"], key=lambda r: (order.index(r["test"]) if r["test"] in order else 99,
                                                         list(DATABASES).index(r["backend"]), r["seed"])):
            name = ROUNDS.get(r["test"], r["test"]).format(seed=r["seed"])
            rows.append(
                f"| {name} | {DATABASES.get(r['backend'], r['backend'])} | {r.get('kills', 0)} "
                f"| {r.get('connection kills', 0)} | {r.get('runs', 0)} | {r.get('steps', 0)} "
                f"| {r.get('claims', 0)} ({r.get('keyed claims', 0)}, {r.get('batched claims', 0)}) "
                f"| {r.get('witnesses', 0)} | {r.get('halted runs', 0)} / {r.get('on_halt hooks', 0)} / "
                f"{r.get('revived runs', 0)} ({r.get('concurrent revive calls', 0)}) "
                f"| {r.get('prunes', 0)} / {r.get('pruned runs', 0)} | {r.get('forgotten partitions', 0)} "
                f"| {r['violations']} |")
        kills = sum(r.get("kills", 0) for r in figures["chaos"])
        violations = sum(r["violations"] for r in figures["chaos"])
        rows.append(f"| **all {len(figures['chaos'])} rounds** | | **{kills}** "
                    f"| {sum(r.get('connection kills', 0) for r in figures['chaos'])} | | | | | | "
                    f"| {sum(r.get('forgotten partitions', 0) for r in figures['chaos'])} | **{violations}** |")
        blocks["chaos"] = "\n".join(rows)
    return blocks


def _tiers(figures: dict) -> str:
    """`` Tier times (…): unit 12 s, …, chaos 180 s.``, or nothing for a log without them."""
    if not figures.get("tiers"):
        return ""
    times = ", ".join(f"{name} {seconds:,} s" for name, seconds in figures["tiers"].items())
    return f" Tier times (test durations summed across the xdist workers, so more than the wall time): {times}."


def replace(text: str, blocks: dict[str, str], page: str = "INVARIANTS.md") -> str:
    """``text`` (of ``page``) with each block's content between its markers replaced."""
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- evidence:{name} -->\n).*?(\n<!-- /evidence:{name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"{page} has no <!-- evidence:{name} --> … <!-- /evidence:{name} --> block")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.evidence", description=__doc__.splitlines()[0])
    parser.add_argument("log", nargs="?", help="a .ci/run log")
    parser.add_argument("--write", action="store_true", help="replace the blocks in INVARIANTS.md and CONTRIBUTING.md")
    parser.add_argument("--versions", action="store_true", help="print what `ci: versions` prints, and stop")
    args = parser.parse_args(argv)
    if args.versions:
        print(versions())
        return 0
    if not args.log:
        parser.error("a .ci/run log is required (or --versions)")
    blocks = render(parse(Path(args.log).read_text(errors="replace")))
    for page, names in PAGES.items():
        for name in names:
            if name not in blocks:
                print(f"evidence: the log has no figures for {page.name}'s {name!r} block; left as it is",
                      file=sys.stderr)
        if args.write:
            mine = {name: blocks[name] for name in names if name in blocks}
            page.write_text(replace(page.read_text(), mine, page.name))
    if not args.write:
        for name, body in blocks.items():
            print(f"<!-- evidence:{name} -->\n{body}\n<!-- /evidence:{name} -->\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
