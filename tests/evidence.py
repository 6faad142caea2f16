"""INVARIANTS.md's Evidence section, regenerated from one ``.ci/run`` log, not hand-edited.

    .ci/run 2>&1 | tee ci.log
    python -m tests.evidence ci.log            # prints the generated blocks
    python -m tests.evidence ci.log --write    # and replaces them in INVARIANTS.md

``.ci/run`` prints ``ci: commit …``, ``ci: versions …`` (:func:`versions`), pytest's
summary line, its "chaos evidence", "engine mutants" and "tier times" sections
(tests/conftest.py) and ``ci: total … s``. From these this module renders three blocks, each
between ``<!-- evidence:NAME -->`` and ``<!-- /evidence:NAME -->`` in INVARIANTS.md: ``run``
(the commit, date, counts, duration, each tier's summed test durations and tool versions),
``mutants`` (the engine-mutant table)
and ``chaos`` (a row per chaos round, with the total of process kills). The prose around
them (what each figure means, targeted runs) stays hand-written.

Not done: a log without one of the sections leaves that block as it is (``--write``) and
says so; numbers from targeted runs outside ``.ci/run`` are not generated.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INVARIANTS = ROOT / "INVARIANTS.md"
BLOCKS = ("run", "mutants", "chaos")
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
    (passed, skipped, failed, seconds), ``total_s``, ``tiers`` (tier name -> summed test
    seconds, in the printed order), ``mutants`` (table rows) and ``chaos`` (one dict per
    round)."""
    out: dict = {"mutants": [], "chaos": []}
    if found := re.search(r"^ci: commit (\S+) at (.+)$", log, re.MULTILINE):
        out["commit"], out["date"] = found.group(1), found.group(2).strip()
    if found := re.search(r"^ci: versions (.+)$", log, re.MULTILINE):
        out["versions"] = found.group(1).strip()
    if found := re.search(r"^ci: total (\d+) s$", log, re.MULTILINE):
        out["total_s"] = int(found.group(1))
    if found := re.search(r"^ci: tier times (.+) \(summed test durations\)$", log, re.MULTILINE):
        out["tiers"] = {name: int(seconds) for name, seconds in re.findall(r"(\w+) (\d+) s", found.group(1))}
    summary = [line for line in log.splitlines() if re.match(r"^=+ .*\bin [\d.]+s\b.* =+$", line)]
    if summary:
        line = summary[-1]
        out["summary"] = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|failed|errors?)", line)}
        out["summary"]["seconds"] = float(re.search(r"in ([\d.]+)s", line).group(1))  # type: ignore[union-attr]
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
    if "summary" in figures and "commit" in figures:
        s = figures["summary"]
        failed = s.get("failed", 0) + s.get("error", 0) + s.get("errors", 0)
        outcome = f"{s.get('passed', 0):,} passed, {s.get('skipped', 0)} skipped" + (
            f", **{failed} failed**" if failed else "")
        total = f" (the whole `.ci/run`, databases and containers included: {figures['total_s']} s)" \
            if "total_s" in figures else ""
        blocks["run"] = (f"Run of {figures['date']}, from a fresh clone at commit `{figures['commit']}`: "
                         f"**{outcome} in {s['seconds']:.0f} s**{total}.{_tiers(figures)} Versions: "
                         f"{figures.get('versions', 'not printed')}.")
    if figures["mutants"]:
        blocks["mutants"] = "\n".join(["| mutant | guard removed | detector | killed in |", "|---|---|---|---:|",
                                       *figures["mutants"]])
    if figures["chaos"]:
        rows = ["| round | database | process kills | server-side connection kills | runs | steps "
                "| claims (keyed, batched) | witnesses | halted runs / on_halt hooks / revived runs (revive calls) "
                "| prunes / runs pruned | violations |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
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
                f"| {r.get('prunes', 0)} / {r.get('pruned runs', 0)} | {r['violations']} |")
        kills = sum(r.get("kills", 0) for r in figures["chaos"])
        violations = sum(r["violations"] for r in figures["chaos"])
        rows.append(f"| **all {len(figures['chaos'])} rounds** | | **{kills}** "
                    f"| {sum(r.get('connection kills', 0) for r in figures['chaos'])} | | | | | | | **{violations}** |")
        blocks["chaos"] = "\n".join(rows)
    return blocks


def _tiers(figures: dict) -> str:
    """`` Tier times (…): unit 12 s, …, chaos 180 s.``, or nothing for a log without them."""
    if not figures.get("tiers"):
        return ""
    times = ", ".join(f"{name} {seconds:,} s" for name, seconds in figures["tiers"].items())
    return f" Tier times (test durations summed across the xdist workers, so more than the wall time): {times}."


def replace(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each block's content between its markers replaced."""
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- evidence:{name} -->\n).*?(\n<!-- /evidence:{name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"INVARIANTS.md has no <!-- evidence:{name} --> … <!-- /evidence:{name} --> block")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.evidence", description=__doc__.splitlines()[0])
    parser.add_argument("log", nargs="?", help="a .ci/run log")
    parser.add_argument("--write", action="store_true", help="replace the blocks in INVARIANTS.md")
    parser.add_argument("--versions", action="store_true", help="print what `ci: versions` prints, and stop")
    args = parser.parse_args(argv)
    if args.versions:
        print(versions())
        return 0
    if not args.log:
        parser.error("a .ci/run log is required (or --versions)")
    blocks = render(parse(Path(args.log).read_text(errors="replace")))
    for name in BLOCKS:
        if name not in blocks:
            print(f"evidence: the log has no figures for the {name!r} block; left as it is", file=sys.stderr)
    if args.write:
        INVARIANTS.write_text(replace(INVARIANTS.read_text(), blocks))
    else:
        for name, body in blocks.items():
            print(f"<!-- evidence:{name} -->\n{body}\n<!-- /evidence:{name} -->\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
