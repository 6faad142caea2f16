"""Generated mutants of the pure modules, with mutmut: run them and report the score.

    python -m tests.mutation                      # every configured module (hours on 2 cores)
    python -m tests.mutation ductwork.durations ductwork.limits.buckets
    python -m tests.mutation --report             # the table of the last run, as markdown
    python -m tests.mutation --survivors          # each surviving mutant not argued below

mutmut (configured in pyproject.toml, ``[tool.mutmut]``) copies ``ductwork/`` and
``model/`` into ``mutants/``, rewrites each function of the configured modules into
variants (an operator, a constant, a comparison, an argument changed) behind a switch,
and runs the tests of the selection (``tests/unit``) that call the function against each variant. A
mutant is *killed* when a test fails, *timed out* when the tests run past 4× their
clean time, and *survives* when they all pass. This runs it with the ``ci`` hypothesis
profile (derandomized, so a rerun gives the same verdicts) and without the database
URLs (SQLite only), then reads mutmut's result files.

A survivor is either a gap in the tests, closed by a new test, or an *equivalent*
mutant: no input tells it from the original. The equivalent ones are listed in
:data:`EQUIVALENT` with the argument; the score is reported with and without them.
Mutant names number a function's variants in order, so they hold for the source they
were argued on: a change to the function renumbers them, and a name that no longer
survives is reported as stale.

Not run by ``.ci/run``: it is slow (each surviving mutant costs a full run of the tests
that reach its function). The hand-written engine mutants (tests/mutants.py) are a
different thing: guards in SQL and transaction order that a token-level tool cannot
write.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"

#: the modules mutated, in report order (pyproject.toml's ``only_mutate``)
MODULES = (
    "ductwork.durations",
    "ductwork.limits.buckets",
    "ductwork.limit_entries",
    "ductwork.pipelines.definition",
    "ductwork.pipelines.registry",
    "ductwork.pipelines.snapshot",
    "ductwork.limits.outcomes",
    "ductwork.limits.plan",
    "ductwork.fleet.batching",
    "ductwork.pipelines.rules",
    "model.limits",
    "model.pipelines",
)

_P = "model.pipelines.xǁPipelinesModelǁ"
#: model.pipelines' equivalent mutants (kept apart from the other modules' arguments)
PIPELINES_EQUIVALENT: dict[str, str] = {
    f"{_P}_drive_batched__mutmut_4":
        "`progressed = None` for False: it is only read for truth",
    f"{_P}_end_attempt__mutmut_35":
        "`crash_count <= max_crash / 3` for `// 3`: for an integer c, c <= n // 3 exactly when c <= n / 3",
    **{f"{_P}{name}":
       "a copy for a deep copy of a halted run's own record (args, context, a step's input or output): "
       "no operation writes a stored value in place, so sharing it is never seen"
       for name in ("revive__mutmut_28", "revive__mutmut_97", "_carry_step__mutmut_25", "_carry_step__mutmut_27")},
    **{f"{_P}revive__mutmut_{n}":
       "`old.link or 'XXXX'` for `or ''`: ids are a kind and a number, so neither is a key of the id maps"
       for n in (70, 77, 80)},
    **{f"{_P}resume__mutmut_{n}":
       "the message of `assert edge is not None`: a branch is dampened only by advancing past its "
       "step's dampen edge, so it never fails" for n in (22, 23)},
    f"{_P}_fan_in__mutmut_3":
        "`if branch.barrier or True`: branches.get(None) is None, as the else branch gives",
    f"{_P}_fan_in__mutmut_10":
        "`fanout_step or 'XXXX'`: a barrier is a branch that fanned out, so its fanout_step is set",
    **{f"{_P}_fan_in__mutmut_{n}":
       "the message of `assert branch.fanout_index is not None`: a branch with a barrier was made by a "
       "fan-out with its index, so it never fails" for n in (28, 29)},
    **{f"{_P}_claim_or_hold__mutmut_{n}":
       "the message of `assert branch.claim_token is not None`: a branch is advancing only with its "
       "claim's token set, so it never fails" for n in (9, 10)},
    f"{_P}_move__mutmut_23":
        "`step_completed=None` for False: _halt only reads it for truth",
    f"{_P}_move__mutmut_32":
        "`step_completed=True` on the failed-step branch: _halt completes only an advancing step, and "
        "this one is failed",
    **{f"{_P}advance__mutmut_{n}":
       "the message of `assert edge is not None` after the simple moves: a step without an edge (a leaf) "
       "advances inline, so advance returned through _move the line before and it never fails"
       for n in (31, 32)},
    f"{_P}run_execution__mutmut_78":
        "`crash + 1 <= max_crash / 3` for `// 3`: for an integer c, c <= n // 3 exactly when c <= n / 3",
    f"{_P}advance__mutmut_120":
        "the message of the unknown-edge AssertionError: Definition.parse rejects every other edge type, "
        "so it is never raised",
    f"{_P}resume__mutmut_33":
        "a copy for a deep copy of the resume input: _new_step deep-copies the input it is given",
    f"{_P}drive__mutmut_15":
        "`progressed = None` for False: it is only read for truth",
    f"{_P}drive__mutmut_19":
        "`break` for `continue` where a branch listed at the round's start is no longer advanceable: an "
        "advance changes no other listed branch (only its barrier, completed, and a new merge branch), so "
        "it never happens",
}

#: surviving mutants no input can tell from the original, each with the argument
EQUIVALENT: dict[str, str] = {
    # zip(..., strict=True) → strict=False / None / left out: strict only acts when the
    # lengths differ, and here they never do
    **{f"ductwork.durations.x__parse_string_seconds__mutmut_{n}":
       "_COMPOUND has exactly five groups and _UNITS five entries" for n in (31, 34, 35)},
    **{f"ductwork.limits.buckets.x__latest_next_token__mutmut_{n}":
       "both callers pass buckets built one per rate of the same tuple" for n in (4, 7, 8)},
    **{f"ductwork.limits.buckets.x_decide__mutmut_{n}":
       "`refilled` is built one per rate of `rates`" for n in (86, 89, 90)},
    "ductwork.limits.buckets.x_refill__mutmut_13":
        "`dt >= 0` for `dt > 0`: at dt = 0 the level is capacity only if it already was "
        "(ceil_div(0, limit) = 0), else level + 0·limit, the level unchanged either way",
    **{f"ductwork.durations.x_parse_interval_us__mutmut_{n}":
       "on the branch value <= 0 the chosen rounding is only compared with 0: ceil or floor of "
       "value·10⁶ (or ·1,000,001) is <= 0 too, so 'must be positive' is raised either way"
       for n in (27, 31, 35)},
    "ductwork.limit_entries.x_drop_dominated__mutmut_8":
        "`<=` for `<` between (per_s, i) and (per_s, j): called only with i != j, so the tuples "
        "are never equal",
    "ductwork.limit_entries.x__parse_rate__mutmut_95":
        "`capacity >= INT64_MAX` for `>`: capacity is burst × per × 10⁶, a multiple of 10⁶, "
        "and INT64_MAX is not, so they are never equal",
    # partition_key's json.dumps and encode arguments: the value is a str or an int there
    # (every other type was refused the line before)
    "ductwork.limit_entries.x_partition_key__mutmut_8":
        "`ensure_ascii=None` for False: json reads it only for truth (dumps' cached-encoder test, "
        "then JSONEncoder.encode's choice of encode_basestring), so None keeps non-ASCII characters "
        "as False does",
    **{f"ductwork.limit_entries.x_partition_key__mutmut_{n}":
       "json.dumps' separators None, left out (both the defaults ', ' and ': '), or 'XX,XX' / 'XX:XX': "
       "they are written only between a list's items and a dict's keys and values, and the JSON of a "
       "str or an int has neither" for n in (9, 12, 14, 15)},
    "ductwork.limit_entries.x_partition_key__mutmut_18":
        "`encode('UTF-8')` for 'utf-8': codec names are looked up case-insensitively, so it is the "
        "same strict UTF-8 codec, refusing the same lone surrogates",
    # model.limits.decide(): the synthetic in-flight job that holds an admission's slot
    # until complete(decision.job_id); only that it is in flight on the key is observed
    **{f"model.limits.xǁLimitsModelǁdecide__mutmut_{n}":
       "the synthetic job's id is still unique (counter stepped by −1 or 2, or another label)"
       for n in (8, 9, 11, 12)},
    "model.limits.xǁLimitsModelǁdecide__mutmut_15":
        "eligible_at None for the synthetic job: it is started in the same call, and eligible_at "
        "only orders pending jobs",
    **{f"model.limits.xǁLimitsModelǁdecide__mutmut_{n}":
       "the synthetic job's worker label: decide() is never mixed with a worker's claims or crash"
       for n in (20, 25, 26)},
    # model.limits, the rest (the unit tier, tests/unit/test_model_limits_ops.py)
    **{f"model.limits.x_parse_period__mutmut_{n}":
       "zip strict: _COMPOUND has exactly five groups and _UNITS five entries" for n in (51, 54, 55)},
    "model.limits.x__beats__mutmut_8":
        "`<=` for `<` between the periods of two entries equal in rate and burst: equal periods "
        "only in two entries of one period, which parse_rate_entries refuses, and "
        "drop_dominated's caller passes its entries",
    # (claim_batch's runs are _claim_run since a batch takes runs of several lanes: the same
    # code, one mutant fewer before these, a default argument it no longer has)
    **{f"model.limits.xǁLimitsModelǁ_claim_run__mutmut_{n}":
       "the stop before a refusal never fires: after the run's last admission at now_us a key "
       "short of a token is stamped after now_us, so _lanes skips it (blocked), and a full key "
       "(saturated); _would_admit is then True, for None too (no config)" for n in (22, 24, 28)},
    **{f"model.limits.xǁLimitsModelǁ_claim_run__mutmut_{n}":
       "the message of an assertion that never fails: the first lane of _lanes admits (see the "
       "stop before it), so the poll claims its job" for n in (35, 36, 38, 39)},
    "model.limits.xǁLimitsModelǁ_would_admit__mutmut_17":
        "cap_units None in a missing bucket: refill replaces it with cap_units(entry), and only "
        "the refilled level is read",
    "model.limits.xǁLimitsModelǁ_would_admit__mutmut_21":
        "a missing bucket taken as 1 unit, not 0: refilled at now_us it holds 1, short of a "
        "token (per_s·10⁶ >= 10⁶ units) either way",
    "model.limits.xǁLimitsModelǁ_decide__mutmut_59":
        "cap_units None in a new bucket: refill replaces it with cap_units(entry) before the "
        "bucket is stored",
    # model.limits' key families (partition_key and forget_partition)
    "model.limits.x_partition_key__mutmut_16":
        "`ensure_ascii=None` for False: json reads it only for truth (dumps' cached-encoder test, "
        "then JSONEncoder.encode's choice of encode_basestring), so None keeps non-ASCII characters "
        "as False does",
    **{f"model.limits.x_partition_key__mutmut_{n}":
       "json.dumps' separators None, left out (both the defaults ', ' and ': '), or 'XX,XX' / 'XX:XX': "
       "they are written only between a list's items and a dict's keys and values, and the JSON of a "
       "str or an int (every other type was refused the line before) has neither" for n in (17, 20, 22, 23)},
    "model.limits.x_partition_key__mutmut_26":
        "`encode('UTF-8')` for 'utf-8': codec names are looked up case-insensitively, so it is the "
        "same strict UTF-8 codec, refusing the same lone surrogates",
    "model.limits.xǁLimitsModelǁforget_partition__mutmut_22":
        "`limits or True`: the loop runs only over the partition's buckets, and a key has buckets only "
        "while limits_for gives it an entry (_decide creates them under one, restart_with drops those "
        "of a key without), so limits is never None there",
    "model.limits.xǁLimitsModelǁforget_partition__mutmut_25":
        "next() without its default None: a key's buckets are only of periods its entry keeps "
        "(_decide creates one per kept rate, restart_with drops the others), so the entry of the "
        "bucket's period is always found and StopIteration is never raised",
    # ductwork.pipelines.registry, ductwork.pipelines.definition, ductwork.pipelines.snapshot
    "ductwork.pipelines.registry.x_in_main_module__mutmut_2":
        "rpartition for partition: a ref is step_ref's 'module:qualname', one ':' (module names "
        "and qualnames are dotted identifiers)",
    "ductwork.pipelines.registry.x__resolve__mutmut_6":
        "rpartition for partition: a ref with a second ':' names no class either way (no "
        "module name and no attribute holds a ':'), and one with one ':' splits alike",
    **{f"ductwork.pipelines.definition.xǁPipelineBuilderǁ_extend__mutmut_{n}":
       "zip strict=None, False or left out: divert passes one rendered key per target of `to` "
       "(two keys rendering alike raised before), so keys and nodes are as long" for n in (20, 23, 24)},
    **{f"ductwork.pipelines.definition.xǁ_Graphǁadd_nodes__mutmut_{n}":
       "zip strict=None, False or left out: `partitions` gets one entry per class in the loop "
       "before, so the two are as long" for n in (77, 80, 81)},
    "ductwork.limits.plan.x__keyed__mutmut_22":
        "carry_over(entry, buckets) also when the key's digest is the entry's: a key's buckets are "
        "written under its digest, and a re-base drops every period its entry does not keep in the "
        "transaction that writes the new digest, so with the digests equal every stored period is "
        "the entry's and carry_over keeps each bucket as it is",
    "ductwork.pipelines.definition.xǁ_Graphǁlimit_option__mutmut_35":
        "check_name's default limit for MAX_KEY_CHARS: NAME_LIMIT and MAX_KEY_CHARS are both 255 "
        "(tests/unit/test_column_widths.py holds each to its columns, which are both 255 wide)",
    "ductwork.pipelines.definition.xǁ_Graphǁ__init____mutmut_8":
        "`frozen = None` for False: it is only tested for truth",
    "ductwork.pipelines.definition.xǁPipelineBuilderǁ__init____mutmut_10":
        "`_closed = None` for False: it is only tested for truth",
    "ductwork.pipelines.definition.xǁPipelineBuilderǁ__init____mutmut_1":
        "default index 1: only the root builder takes the default, and only branches (built with "
        "their index) report theirs",
    "ductwork.pipelines.snapshot.xǁEdgeSpecǁdivert_target__mutmut_3":
        "`to.get(None)` for None: a divert's `to` has only str keys, so it is None too",
    "ductwork.pipelines.definition.xǁPipelineBuilderǁcollapse__mutmut_2":
        "None for () as `others`: _fan_in only tests it for truth, and a collapse never joins "
        "branches",
    "ductwork.pipelines.definition.xǁPipelineBuilderǁ_join_branches__mutmut_19":
        "`parent is None and siblings is None`: a branch whose parent has no unpacked children "
        "was closed by the parent's _settle, so _check_usable raised before",
    # ductwork.limits.outcomes and ductwork.pipelines.rules: the crash back-off's immediate third
    "ductwork.limits.outcomes.x_rerun_at__mutmut_8":
        "`count <= max_crash / 3` for `// 3`: count is an int, and an int is <= x exactly when "
        "it is <= floor(x)",
    "ductwork.limits.plan.x__keyed__mutmut_9":
        "carry_over without a re-base: the stored values are this entry's, and carry_over only drops "
        "buckets of periods the entry does not keep, which decide ignores and leaves as they are",
    "ductwork.limits.plan.x__batch__mutmut_7":
        "`position > bound` for `>=`: positions are never equal, the bound being another lane's "
        "execution, whose id no candidate of this lane has (the SQL's same survivor is argued alike)",
    "ductwork.pipelines.rules.x_decide_hook__mutmut_51":
        "`count <= max_crash / 3` for `// 3`: count is an int, and an int is <= x exactly when "
        "it is <= floor(x)",
    "ductwork.pipelines.rules.x_job_halt_reason__mutmut_14":
        "`error_klass or 'XXXX'` for `or ''`: neither '' nor 'XXXX' is a key of INVALID_HALTS "
        "(error class names), so both give job_invalid",
    "ductwork.durations.x_parse_interval_us__mutmut_34":
        "floor(value / 10⁶) for floor(value · 10⁶) on the branch value <= 0: both are <= 0, "
        "so 'must be positive' is raised either way and the value is never returned",
    # model.pipelines (PipelinesModel)
    **PIPELINES_EQUIVALENT,
}

KILLED = {1, 3}  # a test failed (3: pytest's internal error, counted a kill by mutmut)
TIMEOUT = {36, -24, 24, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DUCTWORK_TEST_POSTGRES_URL", "DUCTWORK_TEST_MYSQL_URL", "PYTHONPATH",
                        "COVERAGE_PROCESS_START")}
    env["HYPOTHESIS_PROFILE"] = "ci"
    return env


def run(modules: list[str], max_children: int) -> int:
    patterns = [f"{m}.*" for m in modules]
    return subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *patterns],
                          cwd=ROOT, env=_env(), check=False).returncode


def results() -> dict[str, dict[str, int | None]]:
    """Mutant name → mutmut's exit code (None: not run yet), per module."""
    out: dict[str, dict[str, int | None]] = {}
    for module in MODULES:
        meta = MUTANTS / (module.replace(".", "/") + ".py.meta")
        if meta.exists():
            out[module] = json.loads(meta.read_text())["exit_code_by_key"]
    return out


def _verdict(code: int | None) -> str:
    if code is None:
        return "not run"
    if code in KILLED:
        return "killed"
    if code in TIMEOUT:
        return "timeout"
    if code in SURVIVED:
        return "survived"
    if code in NO_TESTS:
        return "no tests"
    return "suspicious"


def report() -> str:
    lines = ["| module | mutants | killed | timed out | survived | equivalent (argued) | no tests | not run "
             "| score | score without the equivalent |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for module, codes in results().items():
        verdicts = Counter(_verdict(c) for c in codes.values())
        equivalent = sum(1 for name, c in codes.items() if name in EQUIVALENT and _verdict(c) == "survived")
        caught = verdicts["killed"] + verdicts["timeout"]
        run_ = caught + verdicts["survived"] + verdicts["no tests"] + verdicts["suspicious"]
        score = f"{100 * caught / run_:.1f} %" if run_ else "–"
        strict = f"{100 * caught / (run_ - equivalent):.1f} %" if run_ - equivalent else "–"
        lines.append(f"| `{module}` | {len(codes)} | {verdicts['killed']} | {verdicts['timeout']} "
                     f"| {verdicts['survived']} | {equivalent} | {verdicts['no tests']} | {verdicts['not run']} "
                     f"| {score} | {strict} |")
    return "\n".join(lines)


def survivors() -> list[str]:
    return [name for codes in results().values() for name, c in codes.items()
            if _verdict(c) in ("survived", "no tests", "suspicious")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"modules to mutate (default: all of {', '.join(MODULES)})")
    parser.add_argument("--max-children", type=int, default=2, help="mutants checked at once (default 2)")
    parser.add_argument("--report", action="store_true", help="print the last run's table and stop")
    parser.add_argument("--survivors", action="store_true",
                        help="show each surviving mutant not argued equivalent (mutmut show), and stale arguments")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"not a mutated module: {', '.join(unknown)}")
    if args.survivors:
        left = [name for name in survivors() if name not in EQUIVALENT]
        for name in left:
            subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=ROOT, env=_env(), check=False)
        stale = sorted(set(EQUIVALENT) - set(survivors()))
        for name in stale:
            print(f"stale: {name} is argued equivalent but did not survive (or was not run)")
        print(f"{len(left)} surviving mutants not argued equivalent")
        return 1 if left else 0
    status = 0 if args.report else run(args.modules or list(MODULES), args.max_children)
    print(report())
    return status


if __name__ == "__main__":
    raise SystemExit(main())
