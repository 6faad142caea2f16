"""Symbolic checks of the exact limit arithmetic with CrossHair (issue 17).

Each ``check_*`` function below is a contract in CrossHair's ``asserts`` kind: its
leading ``assert`` statements are preconditions, every later ``assert`` is a
postcondition, and CrossHair searches, by symbolic execution with the Z3 solver, for
arguments that meet the preconditions and break a postcondition. The contracts are the
ones the docstrings of ``ductwork/limits/buckets.py`` and ``model/limits.py`` state:

- a bucket never holds more than its capacity (burst) nor less than zero [INV-LIM-4];
- a refill adds exactly ``dt × limit`` integer units, capped (no rounding anywhere);
- refill is monotone in time and additive over split intervals (crediting up to ``t1``
  then up to ``t2`` is crediting up to ``t2``);
- the next-token instant is exact [INV-LIM-5]: a claim at it is admitted, a claim one
  microsecond earlier is refused (never a token early, never a microsecond late);
- a spend takes exactly one token from a bucket that held one, leaving it in bounds;
- the model's arithmetic and the engine's agree on every input;
- the duration grammar: rendering a period and parsing it back gives the period, and the
  model's and the engine's parsers agree on every string.

Run ``python -m tests.symbolic --report`` for one line per contract: ``proven`` (every
path explored, no counterexample: a proof for all integers, as CrossHair's integers are
unbounded), ``timed out`` (the CPU budget ran out, or CrossHair had to fall back to
concrete values, before every path was explored; none explored failed), or
``counterexample`` with the arguments. ``tests/properties/test_symbolic.py`` runs the
same checks in the suite and fails on a counterexample, and shows a deliberately broken
refill is caught. The contracts take plain ints, not buckets, so the search space is
the arithmetic's, not a dataclass's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ductwork.durations import parse_period as engine_parse_period
from ductwork.errors import DurationError
from ductwork.limit_entries import LimitEntry, RateEntry
from ductwork.limits import buckets as engine
from model import limits as model
from model.errors import ConfigError

# --------------------------------------------------------------------------- helpers


def _engine_admits(rate: RateEntry, bucket: engine.Bucket, now_us: int) -> bool:
    entry = LimitEntry("k", None, (rate,))
    return engine.decide(entry, {rate.per_s: bucket}, 0, now_us).admitted


# --------------------------------------------------------------------------- engine contracts


def check_engine_refill_within_capacity(
    limit: int, per_s: int, burst: int, level: int, refilled_at_us: int, now_us: int
) -> None:
    """A refill leaves the level in [0, capacity] and the refill time at max(old, now)."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert level >= 0
    rate = RateEntry(limit, per_s, burst)
    out = engine.refill(engine.Bucket(per_s, level, refilled_at_us), rate, now_us)
    assert 0 <= out.level_units <= rate.capacity_units
    assert out.refilled_at_us == max(refilled_at_us, now_us)


def check_engine_refill_is_exact(
    limit: int, per_s: int, burst: int, level: int, refilled_at_us: int, now_us: int
) -> None:
    """A refill adds exactly ``max(0, dt) × limit`` units to the clamped level, capped."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert level >= 0
    rate = RateEntry(limit, per_s, burst)
    cap = rate.capacity_units
    out = engine.refill(engine.Bucket(per_s, level, refilled_at_us), rate, now_us)
    gained = max(0, now_us - refilled_at_us) * limit
    assert out.level_units == min(min(level, cap) + gained, cap)


def check_engine_refill_monotone_and_additive(
    limit: int, per_s: int, burst: int, level: int, refilled_at_us: int, t1: int, t2: int
) -> None:
    """Later refills hold at least as much; refilling to t1 then t2 equals refilling to t2."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert 0 <= level <= burst * per_s * 1_000_000
    assert refilled_at_us <= t1 <= t2
    rate = RateEntry(limit, per_s, burst)
    bucket = engine.Bucket(per_s, level, refilled_at_us)
    at_t1 = engine.refill(bucket, rate, t1)
    at_t2 = engine.refill(bucket, rate, t2)
    assert level <= at_t1.level_units <= at_t2.level_units
    assert engine.refill(at_t1, rate, t2) == at_t2


def check_engine_next_token_is_exact(
    limit: int, per_s: int, burst: int, level: int, refilled_at_us: int, now_us: int
) -> None:
    """The next-token instant is the first µs at which a claim is admitted [INV-LIM-5]."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert 0 <= level <= burst * per_s * 1_000_000
    assert refilled_at_us <= now_us
    rate = RateEntry(limit, per_s, burst)
    bucket = engine.Bucket(per_s, level, refilled_at_us)
    at = engine.next_token_us(bucket, rate, now_us)
    if at is None:
        assert _engine_admits(rate, bucket, now_us)
    else:
        assert at > now_us
        assert not _engine_admits(rate, bucket, at - 1)  # never a token early
        assert _engine_admits(rate, bucket, at)  # never a microsecond late


def check_engine_next_token_is_exact_on_refill(
    limit: int, per_s: int, burst: int, level: int, refilled_at_us: int, now_us: int
) -> None:
    """The same instant, read off ``refill``: a whole token there, none one µs before."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert 0 <= level <= burst * per_s * 1_000_000
    assert refilled_at_us <= now_us
    rate = RateEntry(limit, per_s, burst)
    bucket = engine.Bucket(per_s, level, refilled_at_us)
    at = engine.next_token_us(bucket, rate, now_us)
    if at is None:
        assert engine.refill(bucket, rate, now_us).level_units >= rate.units_per_token
    else:
        assert at > now_us
        assert engine.refill(bucket, rate, at - 1).level_units < rate.units_per_token
        assert engine.refill(bucket, rate, at).level_units >= rate.units_per_token


def check_engine_spend(
    limit: int, per_s: int, burst: int, level: int, refilled_at_us: int, now_us: int
) -> None:
    """An admitted claim spends exactly one token; its stamp is the exact next-token time."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert 0 <= level <= burst * per_s * 1_000_000
    assert refilled_at_us <= now_us
    rate = RateEntry(limit, per_s, burst)
    bucket = engine.Bucket(per_s, level, refilled_at_us)
    decision = engine.decide(LimitEntry("k", None, (rate,)), {per_s: bucket}, 0, now_us)
    refilled = engine.refill(bucket, rate, now_us)
    if decision.admitted:
        (spent,) = decision.buckets
        assert spent.level_units == refilled.level_units - rate.units_per_token
        assert 0 <= spent.level_units <= rate.capacity_units - rate.units_per_token
        if decision.blocked_until_us is not None:
            assert not _engine_admits(rate, spent, decision.blocked_until_us - 1)
            assert _engine_admits(rate, spent, decision.blocked_until_us)
    else:
        assert refilled.level_units < rate.units_per_token
        assert decision.blocked_until_us == engine.next_token_us(bucket, rate, now_us)


# --------------------------------------------------------------------------- model contracts


def check_model_refill_within_capacity(
    limit: int, per_s: int, burst: int, units: int, refilled_at_us: int, now_us: int
) -> None:
    """The model's refill leaves the level in [0, burst] [INV-LIM-4]."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert units >= 0
    rate = model.RateEntry(limit, per_s, burst)
    out = model.refill(model.Bucket(units, refilled_at_us, 0), rate, now_us)
    assert 0 <= out.units <= model.cap_units(rate)
    assert out.refilled_at_us == max(refilled_at_us, now_us)


def check_model_next_token_is_exact(
    limit: int, per_s: int, burst: int, units: int, refilled_at_us: int
) -> None:
    """The model's next-token time: a token there, none one µs before [INV-LIM-5]."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert 0 <= units < per_s * 1_000_000
    rate = model.RateEntry(limit, per_s, burst)
    bucket = model.Bucket(units, refilled_at_us, model.cap_units(rate))
    at = model.next_token_us(bucket, rate)
    assert at > refilled_at_us
    assert model.refill(bucket, rate, at - 1).units < model.token_units(rate)
    assert model.refill(bucket, rate, at).units >= model.token_units(rate)


def check_model_spend(limit: int, per_s: int, burst: int, units: int, refilled_at_us: int) -> None:
    """The model's spend takes one token from a bucket holding one and stays in bounds."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert per_s * 1_000_000 <= units <= burst * per_s * 1_000_000
    rate = model.RateEntry(limit, per_s, burst)
    out = model.spend(model.Bucket(units, refilled_at_us, model.cap_units(rate)), rate)
    assert out.units == units - model.token_units(rate)
    assert 0 <= out.units < model.cap_units(rate)


def check_model_and_engine_agree(
    limit: int, per_s: int, burst: int, level: int, refilled_at_us: int, now_us: int
) -> None:
    """Model and engine give the same refilled level and the same next-token time."""
    assert limit >= 1
    assert per_s >= 1
    assert burst >= 1
    assert 0 <= level <= burst * per_s * 1_000_000
    assert refilled_at_us <= now_us
    m_rate = model.RateEntry(limit, per_s, burst)
    e_rate = RateEntry(limit, per_s, burst)
    m_out = model.refill(model.Bucket(level, refilled_at_us, 0), m_rate, now_us)
    e_out = engine.refill(engine.Bucket(per_s, level, refilled_at_us), e_rate, now_us)
    assert m_out.units == e_out.level_units
    assert m_out.refilled_at_us == e_out.refilled_at_us
    e_next = engine.next_token_us(engine.Bucket(per_s, level, refilled_at_us), e_rate, now_us)
    m_next = model.next_token_us(m_out, m_rate)
    if e_next is None:
        assert m_next == now_us  # the model says "now" where the engine says "holds one now"
    else:
        assert m_next == e_next


# --------------------------------------------------------------------------- duration grammar


def check_period_round_trip(seconds: int) -> None:
    """render_period then parse (model's and engine's parser) gives the period back."""
    assert 1 <= seconds <= 10**9
    text = model.render_period(seconds)
    assert model.parse_period(text) == seconds
    assert engine_parse_period(text) == seconds


def check_period_parsers_agree(text: str) -> None:
    """The model's and the engine's period parsers accept the same strings, with one value."""
    assert len(text) <= 8
    try:
        m: int | None = model.parse_period(text)
    except ConfigError:
        m = None
    try:
        e: int | None = engine_parse_period(text)
    except DurationError:
        e = None
    assert m == e


CHECKS: tuple[Callable[..., None], ...] = (
    check_engine_refill_within_capacity,
    check_engine_refill_is_exact,
    check_engine_refill_monotone_and_additive,
    check_engine_next_token_is_exact,
    check_engine_next_token_is_exact_on_refill,
    check_engine_spend,
    check_model_refill_within_capacity,
    check_model_next_token_is_exact,
    check_model_spend,
    check_model_and_engine_agree,
    check_period_round_trip,
    check_period_parsers_agree,
)


# --------------------------------------------------------------------------- runner


@dataclass(frozen=True)
class Result:
    """One contract's outcome: ``proven``, ``timed out`` or ``counterexample``; CPU seconds spent."""

    name: str
    outcome: str
    seconds: float
    #: execution paths CrossHair explored
    paths: int = 0
    detail: str = ""


def run_check(fn: Callable[..., None], per_condition_timeout: float) -> Result:
    """Run CrossHair on one contract; ``per_condition_timeout`` is CPU seconds for the search."""
    from crosshair.core_and_libs import AnalysisKind, analyze_function, run_checkables
    from crosshair.options import AnalysisOptionSet
    from crosshair.statespace import MessageType

    stats: Counter[str] = Counter()
    options = AnalysisOptionSet(
        analysis_kind=[AnalysisKind.asserts],
        per_condition_timeout=per_condition_timeout,
        report_all=True,
        stats=stats,
    )
    started = time.process_time()
    messages = run_checkables(analyze_function(fn, options))
    elapsed = time.process_time() - started
    if not messages:
        raise AssertionError(f"CrossHair found no contract in {fn.__name__} (no leading asserts?)")
    failures = [m for m in messages if m.state > MessageType.PRE_UNSAT]
    if failures:
        detail = "; ".join(f"{m.message} (line {m.line})" for m in failures)
        return Result(fn.__name__, "counterexample", elapsed, stats["num_paths"], detail)
    if all(m.state == MessageType.CONFIRMED for m in messages):
        return Result(fn.__name__, "proven", elapsed, stats["num_paths"])
    return Result(fn.__name__, "timed out", elapsed, stats["num_paths"])


# Deliberately broken variants (``--mutant NAME``), each replacing one function in its
# module for this process only, to show the contracts notice: refill one unit too many, the
# cap applied one µs after the fill instant, and a next-token time rounded down instead of
# up (a token one µs early).


def _refill_one_unit_too_many(bucket: engine.Bucket, entry: RateEntry, now_us: int) -> engine.Bucket:
    out = _ENGINE_REFILL(bucket, entry, now_us)
    if now_us > bucket.refilled_at_us:
        return engine.Bucket(out.period_s, out.level_units + 1, out.refilled_at_us)
    return out


def _refill_fills_one_us_late(bucket: engine.Bucket, entry: RateEntry, now_us: int) -> engine.Bucket:
    # the cap taken only after the fill instant: at it, a fill that does not divide overshoots
    capacity = entry.capacity_units
    level = min(bucket.level_units, capacity)
    dt = now_us - bucket.refilled_at_us
    if dt > 0:
        level = capacity if dt > -(-(capacity - level) // entry.limit) else level + dt * entry.limit
    return engine.Bucket(bucket.period_s, level, max(bucket.refilled_at_us, now_us))


def _next_token_rounded_down(bucket: engine.Bucket, entry: RateEntry, now_us: int) -> int | None:
    current = engine.refill(bucket, entry, now_us)
    missing = entry.units_per_token - current.level_units
    return None if missing <= 0 else current.refilled_at_us + missing // entry.limit


def _model_next_token_rounded_down(bucket: model.Bucket, entry: model.RateEntry) -> int:
    return bucket.refilled_at_us + max(0, (model.token_units(entry) - bucket.units) // entry.limit)


_ENGINE_REFILL = engine.refill
MUTANTS: dict[str, tuple[object, str, Callable[..., object]]] = {
    "engine_refill_one_unit_too_many": (engine, "refill", _refill_one_unit_too_many),
    "engine_refill_fills_one_us_late": (engine, "refill", _refill_fills_one_us_late),
    "engine_next_token_rounded_down": (engine, "next_token_us", _next_token_rounded_down),
    "model_next_token_rounded_down": (model, "next_token_us", _model_next_token_rounded_down),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.symbolic", description=__doc__.splitlines()[0])
    parser.add_argument("checks", nargs="*", help="contract names to run (default: all)")
    parser.add_argument("--report", action="store_true", help="print a Markdown table of the results")
    parser.add_argument("--json", action="store_true", help="print one JSON object per contract")
    parser.add_argument("--timeout", type=float, default=4.0, help="CPU seconds per contract (default 4)")
    parser.add_argument("--mutant", choices=sorted(MUTANTS), help="check a deliberately broken variant")
    args = parser.parse_args(argv)
    import crosshair

    by_name = {fn.__name__: fn for fn in CHECKS}
    unknown = [name for name in args.checks if name not in by_name]
    if unknown:
        parser.error(f"unknown contracts {unknown}; known: {sorted(by_name)}")
    if args.mutant:
        module, attr, replacement = MUTANTS[args.mutant]
        setattr(module, attr, replacement)
    results = [run_check(by_name[name], args.timeout) for name in (args.checks or by_name)]
    if args.json:
        for r in results:
            print(json.dumps(asdict(r)))
    elif args.report:
        print(f"CrossHair {crosshair.__version__}, {args.timeout:g} CPU s per contract, analysis kind `asserts`\n")
        print("| contract | outcome | paths | CPU s |")
        print("|---|---|---|---|")
        for r in results:
            outcome = r.outcome if not r.detail else f"{r.outcome}: {r.detail}"
            print(f"| `{r.name}` | {outcome} | {r.paths} | {r.seconds:.1f} |")
    else:
        for r in results:
            print(f"{r.name}: {r.outcome} ({r.paths} paths, {r.seconds:.1f} CPU s) {r.detail}")
    return 1 if any(r.outcome == "counterexample" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
