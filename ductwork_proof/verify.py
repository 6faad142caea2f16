"""``ductwork verify``: the project's proof, run on the adopter's database, limits and shapes.

    ductwork verify --database-url URL [-c ductwork.yml] [--seed S] [--rounds N] [--quick] [--report DIR]

In a scratch database it creates and drops (:mod:`ductwork_proof.scratch`), it runs, in
order (docs/verify.md):

1. the **environment checks** the engine relies on (:mod:`ductwork_proof.environment`);
2. the **conformance machines**, engine against model, derandomized by the seed
   (:mod:`ductwork_proof.conformance`);
3. **chaos rounds**: two ``ductwork start`` hosts over the built-in workload plus one
   pipeline per key and per key family of the adopter's ``ductwork.yml`` (their concurrency
   and rate values on synthetic keys and families, ``verify:<key>``: no real vendor is
   called), under seeded process kills
   and server-side connection kills (:mod:`ductwork_proof.harness`);
4. the **history checkers** over each round (:mod:`ductwork_proof.checkers`).

Exit status 0 when every check held, 1 when one did not (each violated check is named,
with the command that replays its round), 2 when verify could not run (a refusal, a bad
option). ``--report DIR`` writes ``report.json`` and a self-contained ``report.html``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ductwork import Pipeline
from ductwork.limit_entries import FamilyEntry, LimitEntry
from ductwork.pipelines.snapshot import Definition
from ductwork_proof.invariants import STATEMENTS
from ductwork_proof.results import Check, Round, VerifyResult

#: the URL verify reads when ``--database-url`` is not given
URL_ENV = "DUCTWORK_VERIFY_URL"
#: conformance examples per machine: ``--quick`` and the default
QUICK_EXAMPLES, FULL_EXAMPLES = 8, 40
#: chaos rounds: ``--quick`` and the default
QUICK_ROUNDS, FULL_ROUNDS = 1, 3
#: what ductwork verify does not check, said in every report
NOT_CHECKED = [
    "power loss, torn writes and fsync settings: processes are killed, the server's storage is not",
    "replicas, failover and reads from a replica: one primary server is used",
    "clock skew between database servers, and a database clock stepping backwards",
    "isolation levels and server settings other than those read (listed above)",
    "the adopter's own step bodies and their side effects: their limits and transition kinds run "
    "on synthetic steps",
]


@dataclass
class Options:
    database_url: str
    config: str | None = None
    env: str | None = None
    seed: int | None = None
    rounds: int | None = None
    quick: bool = False
    report: Path | None = None
    in_place: bool = False
    force: bool = False
    keep: bool = False
    #: conformance examples per machine (default by ``quick``)
    examples: int | None = None
    which: tuple[str, ...] = field(default=("environment", "conformance", "chaos"))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ductwork verify",
        description="Run ductwork's proof on a database: environment checks, the conformance machines "
                    "(engine against model), chaos rounds with a real fleet and process kills over the "
                    "built-in workload and this project's limits, then the history checkers.")
    p.add_argument("--database-url", default=os.environ.get(URL_ENV),
                   help=f"the server to verify on (default ${URL_ENV}); a scratch database is created "
                        "there and dropped")
    p.add_argument("-c", "--config", help="ductwork.yml: its job_worker.limits and pipelines are verified "
                                          "(limits on synthetic keys)")
    p.add_argument("-e", "--env", help="the config file's environment (default: DUCTWORK_ENV, then default)")
    p.add_argument("--seed", type=int, help="derandomizes everything (default: a fresh one, printed)")
    p.add_argument("--rounds", type=int, help=f"chaos rounds (default {FULL_ROUNDS}; {QUICK_ROUNDS} with --quick)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_ROUNDS} round and {QUICK_EXAMPLES} conformance examples per machine "
                        "(under 3 minutes on 2 cores)")
    p.add_argument("--examples", type=int, help="conformance examples per machine "
                                                f"(default {FULL_EXAMPLES}; {QUICK_EXAMPLES} with --quick)")
    p.add_argument("--report", type=Path, help="write report.json and report.html to this directory")
    p.add_argument("--in-place", action="store_true",
                   help="use the database itself instead of a scratch one (refused when ductwork's tables "
                        "hold rows, unless --force)")
    p.add_argument("--force", action="store_true", help="with --in-place: go on although ductwork's tables "
                                                        "hold rows (they are dropped at the end)")
    p.add_argument("--keep", action="store_true", help="keep the scratch database and the round files")
    p.add_argument("--only", choices=("environment", "conformance", "chaos"), action="append",
                   help="run only these parts (repeatable; default all three)")
    return p


def options(argv: Sequence[str]) -> Options:
    args = parser().parse_args(list(argv))
    if not args.database_url:
        raise SystemExit(f"ductwork verify: --database-url (or ${URL_ENV}) is required")
    for name in ("rounds", "examples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"ductwork verify: --{name} {value}: must be at least 1")
    return Options(args.database_url, config=args.config, env=args.env, seed=args.seed, rounds=args.rounds,
                   quick=args.quick, report=args.report, in_place=args.in_place, force=args.force,
                   keep=args.keep, examples=args.examples,
                   which=tuple(args.only) if args.only else ("environment", "conformance", "chaos"))


def backend_of(url: str) -> str:
    from ductwork.db.engines import normalize_url

    name = normalize_url(url).get_backend_name()
    return "mysql" if name in ("mysql", "mariadb") else name


def replay(opts: Options, seed: int, *, part: str | None = None) -> str:
    """The command that runs the same checks again (the URL's password masked)."""
    from ductwork_proof.scratch import mask

    words = ["ductwork", "verify", "--database-url", mask(opts.database_url), "--seed", str(seed)]
    if opts.config:
        words += ["-c", opts.config]
    if part == "chaos":
        words += ["--rounds", "1", "--only", "chaos"]
    elif part == "conformance":
        words += ["--examples", str(opts.examples or (QUICK_EXAMPLES if opts.quick else FULL_EXAMPLES)),
                  "--only", "conformance"]
    return shlex.join(words)


def _definitions(pipelines: Sequence[type[Pipeline]]) -> list[Definition]:
    return [p.definition for p in pipelines if p.definition is not None]


def _adopter(opts: Options) -> tuple[dict[str, LimitEntry], dict[str, FamilyEntry], list[str], list[str]]:
    """The adopter's config: their limits (parsed, by key), their key families (by family),
    the names of their pipelines and the transition kinds those use."""
    if not opts.config:
        return {}, {}, [], []
    from ductwork.config_file import load_config
    from ductwork.fleet.boot import load_pipelines

    config = load_config(opts.config, opts.env)
    definitions = _definitions(load_pipelines(config) if config.pipelines else [])
    kinds = sorted({edge.type for d in definitions for edge in d.edges.values()})
    return config.limits, config.families, [d.pipeline for d in definitions], kinds


def _kinds_covered() -> set[str]:
    from ductwork_proof.workload import PIPELINES

    return {edge.type for d in _definitions(PIPELINES) for edge in d.edges.values()}


def invariant_checks(rounds: list[Round], conformance: list[Check]) -> list[Check]:
    """One check per invariant: its chaos checker's verdict over every round, and the
    conformance machine that checks it as a model invariant after each step."""
    from ductwork_proof.checkers import CHECKERS

    try:
        from ductwork_model.invariants import LIMITS_INVARIANTS, PIPELINE_INVARIANTS
    except ImportError:  # (the model ships with the package; a partial install lacks it)
        LIMITS_INVARIANTS, PIPELINE_INVARIANTS = (), ()
    machines = {"CONF-LIMITS": LIMITS_INVARIANTS, "CONF-PIPELINES": PIPELINE_INVARIANTS}
    checks = []
    for inv, statement in STATEMENTS.items():
        by, verdicts, findings, detail = [], [], [], []
        counts: dict[str, int] = {}
        if inv in CHECKERS and rounds:
            by.append(f"{CHECKERS[inv].__name__} (chaos histories)")
            violations = [f"seed {r.seed}: {v}" for r in rounds for v in r.violations.get(inv, [])]
            verdicts.append(not violations)
            findings += violations[:5]
            counts = {"rounds": len(rounds), "violations": len(violations),
                      "claims": sum(r.counts.get("claims", 0) for r in rounds),
                      "kills": sum(r.counts.get("kills", 0) for r in rounds)}
            if violations:
                seeds = sorted({r.seed for r in rounds if r.violations.get(inv)})
                detail.append("replay: " + "; ".join(r.replay for r in rounds if r.seed in seeds))
        for machine in conformance:
            if inv in machines.get(machine.id, ()) and machine.passed is not None:
                by.append(f"{machine.id} (a model invariant, after every step)")
                named = [f for f in machine.findings if inv in f]
                verdicts.append(not named)
                findings += named[:3]
        checks.append(Check(inv, statement, "; ".join(by) or "-",
                            all(verdicts) if verdicts else None,
                            "; ".join(detail) if verdicts else "not checked by ductwork verify: the "
                            "repository's tests check it (INVARIANTS.md)", counts, findings))
    return checks


def verify(opts: Options, out: Callable[[str], None] = print) -> VerifyResult:
    """Run the parts of ``opts.which``; the result (its ``ok`` is the verdict)."""
    from ductwork import __version__
    from ductwork_proof.scratch import mask, migrated

    seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1, 2**31)
    backend = backend_of(opts.database_url)
    started = time.monotonic()
    limits, families, pipelines, kinds = _adopter(opts)
    result = VerifyResult(ductwork_version=__version__, backend=backend, database_url=mask(opts.database_url),
                          server_version="", settings={}, seed=seed, quick=opts.quick,
                          started_at=datetime.now(UTC).isoformat(timespec="seconds"), pipelines=pipelines,
                          not_checked=list(NOT_CHECKED))
    out(f"ductwork verify: seed {seed} on {backend} ({mask(opts.database_url)})")
    missing = sorted(set(kinds) - _kinds_covered())
    if missing:
        result.not_checked.append(f"transition kinds of your pipelines that the workload lacks: {missing}")
    if kinds:
        out(f"  your pipelines' transition kinds, each run by the workload: {', '.join(kinds)}")

    workdir = Path(tempfile.mkdtemp(prefix="ductwork-verify-")) if opts.report is None else opts.report
    workdir.mkdir(parents=True, exist_ok=True)
    histories = []
    if "environment" in opts.which:
        from ductwork_proof.environment import check_environment

        with _database(opts, result, out) as url:
            result.environment, result.settings, result.server_version = check_environment(migrated(url))
        _print_checks(out, "environment", result.environment)
    if "conformance" in opts.which:
        from ductwork_proof.conformance import run_conformance

        examples = opts.examples or (QUICK_EXAMPLES if opts.quick else FULL_EXAMPLES)
        with _database(opts, result, out) as url:
            # --quick does not shrink a failing example (shrinking took minutes on a server):
            # the replay command, without --quick, shrinks it
            result.conformance = run_conformance(migrated(url), seed=seed, examples=examples,
                                                 shrink=not opts.quick)
        for check in result.conformance:
            if check.passed is False:
                check.detail = (check.detail + "; " if check.detail else "") + "replay: " + replay(
                    opts, seed, part="conformance")
        _print_checks(out, "conformance", result.conformance)
    if "chaos" in opts.which:
        from ductwork_proof.harness import ChaosRound
        from ductwork_proof.history import History
        from ductwork_proof.workload import LIMITS, AdopterShapes

        shapes = AdopterShapes.from_limits(limits, families)
        result.limits = {**LIMITS, **shapes.limits}
        result.not_checked += [f"your {'key family' if k in families else 'key'} {k!r}: its rate admits no claim "
                               "within a round (slower than one per 8 s from an empty bucket)" for k in shapes.skipped]
        run = [f"{k} (a key family)" if k in shapes.families else k for k in shapes.items]
        if run or shapes.skipped:
            out(f"  your limits, each on a synthetic key in every round: {', '.join(run) or 'none'}"
                + (f"; not run (listed under not checked): {', '.join(shapes.skipped)}" if shapes.skipped else ""))
        for i in range(opts.rounds or (QUICK_ROUNDS if opts.quick else FULL_ROUNDS)):
            round_seed = seed + i
            with _database(opts, result, out) as url:
                chaos = ChaosRound(seed=round_seed, url=migrated(url), backend=backend, workdir=workdir,
                                   adopter=shapes)
                outcome = chaos.run()
            histories.append(History.from_jsonl(outcome.history_path))
            result.rounds.append(Round(round_seed, outcome.counts, str(outcome.history_path),
                                       outcome.violations, replay(opts, round_seed, part="chaos")))
            out(f"chaos round {i + 1} (seed {round_seed}): " + ", ".join(
                f"{k} {v}" for k, v in outcome.counts.items() if k in ("runs", "claims", "kills",
                                                                        "connection kills", "witnesses")))
    result.invariants = invariant_checks(result.rounds, result.conformance)
    unchecked = [c.id for c in result.invariants if c.passed is None]
    if unchecked:
        result.not_checked.append(f"{', '.join(unchecked)}: no check of this run answers them (the "
                                  "repository's own tests do: INVARIANTS.md names them)")
    if "chaos" in opts.which or "conformance" in opts.which:
        _print_checks(out, "invariants", result.invariants, quiet=True)
    result.duration_s = round(time.monotonic() - started, 1)
    if opts.report is not None:
        from ductwork_proof.report import write_report

        written = write_report(result, opts.report, histories)
        out(f"report: {written.get('report.html', opts.report)}")
    return result


@contextlib.contextmanager
def _database(opts: Options, result: VerifyResult, out: Callable[[str], None]) -> Iterator[str]:
    """The database a part runs in (:func:`ductwork_proof.scratch.scratch_database`),
    recorded in ``result.databases`` and, when ``--keep`` leaves it, said."""
    from ductwork_proof.scratch import mask, scratch_database

    with scratch_database(opts.database_url, in_place=opts.in_place, force=opts.force, keep=opts.keep) as url:
        result.databases.append(mask(url))
        yield url
    if opts.keep and not opts.in_place:
        out(f"  kept: {mask(url)}")


def _print_checks(out: Callable[[str], None], part: str, checks: list[Check], *, quiet: bool = False) -> None:
    ran = [c for c in checks if c.passed is not None]
    failed = [c for c in ran if not c.passed]
    out(f"{part}: {len(ran)} checked, {len(failed)} failed" + (f", {len(checks) - len(ran)} not applicable"
                                                                if len(ran) < len(checks) else ""))
    for check in checks:
        if quiet and check.passed is not False:
            continue
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[check.passed]
        out(f"  {mark} {check.id}: {check.statement}" + (f" ({check.detail})" if check.detail else ""))
        for finding in check.findings[:5]:
            out(f"         {finding}")


def main(argv: Sequence[str] | None = None) -> int:
    from ductwork_proof.scratch import VerifyError

    opts = options(sys.argv[1:] if argv is None else argv)
    try:
        importlib.import_module("hypothesis")  # the conformance machines' (the verify extra's)
    except ImportError:
        print("ductwork verify: needs hypothesis: pip install 'ductwork[verify]'", file=sys.stderr)
        return 2
    try:
        result = verify(opts)
    except VerifyError as error:
        print(f"ductwork verify: {error}", file=sys.stderr)
        return 2
    verdict = "passed" if result.ok else "FAILED: " + ", ".join(c.id for c in result.failed)
    print(f"verdict: {verdict} ({result.duration_s} s, seed {result.seed})")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
