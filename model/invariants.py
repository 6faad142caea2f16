"""State invariants of INVARIANTS.md, one function per ID.

Example::

    from model.invariants import INVARIANT_FUNCTIONS, check_all
    check_all(limits_model)                       # every LIMITS_INVARIANTS ID
    INVARIANT_FUNCTIONS["INV-ADV-3"](pipelines)   # one of them

Each function takes a ``LimitsModel`` (``inv_lim_*``) or a ``PipelinesModel``
(the others), returns ``None`` when the invariant holds and raises
``AssertionError("[INV-…] …")`` naming the offending objects otherwise. They
re-derive what must be true from the model's records and event logs (claims,
completions, decisions, polls, commits, outcomes) rather than trusting the
model's own bookkeeping, so a model variant with a guard removed
(``model/mutants.py``) fails them. ``inv_lim_2_rate_window`` is also a pure
checker over any list of claim times, for chaos histories.

IDs without a model function: INV-LIM-7 (configuration, see
``model.limits.parse_key_limits`` and ``tests/properties/test_model_config.py``),
INV-EXE-5 and INV-CLK-1 (properties of the engine's processes and clock).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from itertools import pairwise
from typing import Any, NoReturn

from .limits import (
    CEILING_REFUSALS,
    Claimed,
    Completed,
    Decided,
    Enqueued,
    FamilyLimits,
    Forgotten,
    KeyLimits,
    LimitsModel,
    Polled,
    RateEntry,
    Restarted,
    family_of,
    limits_for,
    split_partition_key,
)
from .pipelines import (
    FAN_IN,
    PipelinesModel,
    Step,
    canonical_json,
    job_halt_reason,
    render_key,
    resolve_run_status,
)

__all__ = [
    "INVARIANT_FUNCTIONS",
    "LIMITS_INVARIANTS",
    "PIPELINE_INVARIANTS",
    "check_all",
    "inv_adv_1_successors_exactly_once",
    "inv_adv_2_stale_token_commits_nothing",
    "inv_adv_3_fan_in_once",
    "inv_adv_4_expand_children",
    "inv_ctx_1_set_once",
    "inv_exe_1_no_lost_work",
    "inv_exe_2_outcome_once",
    "inv_exe_3_idempotency_keys",
    "inv_exe_4_budgets",
    "inv_hlt_1_hook_outcome_once",
    "inv_hlt_2_halted_run_gets_its_hook",
    "inv_lim_1_in_flight_within_concurrency",
    "inv_lim_2_rate_window",
    "inv_lim_2_rate_windows_of",
    "inv_lim_3_no_leaked_slots",
    "inv_lim_4_levels_in_range",
    "inv_lim_5_stamp_exact",
    "inv_lim_6_fifo",
    "inv_lim_8_family_within_ceiling",
    "inv_lim_9_forget_adds_no_tokens",
    "inv_rev_1_one_run_per_revive",
    "inv_rev_2_no_succeeded_step_reexecuted",
    "inv_rev_3_revived_branch_resumes",
    "inv_run_1_terminal_final",
    "inv_trg_1_one_run_per_trigger_key",
    "inv_trg_2_rolled_back_trigger_leaves_nothing",
]

_MICROS = 1_000_000
#: halts that mark the halting step completed, whatever its job did (semantics §3)
_ADVANCER_HALTS = ("advancer_crashes_exhausted", "advancer_retries_exhausted", "transition_invalid")


def _fail(inv_id: str, message: str) -> NoReturn:
    raise AssertionError(f"[{inv_id}] {message}")


# =========================================================================== limits


Config = dict[str, KeyLimits | FamilyLimits]


def _sweep(model: LimitsModel) -> Iterable[tuple[Any, Config]]:
    """Yield ``(event, config in force)`` in order."""
    config: Config = {}
    for event in model.events:
        if isinstance(event, Restarted):
            config = dict(event.limits)
        yield event, config


def _units(entry: RateEntry) -> int:
    return entry.per_s * _MICROS


def _level_at(units: int, refilled_at_us: int, entry: RateEntry, at_us: int) -> int:
    """Checker's own refill: ``min(u + max(0, at − t)·L, B·P·10⁶)``."""
    return min(units + max(0, at_us - refilled_at_us) * entry.limit, entry.burst * _units(entry))


def inv_lim_1_in_flight_within_concurrency(model: LimitsModel) -> None:
    """In-flight executions of a key never exceed its ``concurrency``, fleet-wide.

    Sweeps claims and completions in event order (the per-key sequence the
    engine's checker sweeps), with the concurrency in force at each claim;
    a restart that lowers the ceiling does not evict holders, but no claim
    may be made while at or over it. A partition of a key family is a key: its
    ceiling is the family's ``per_partition`` concurrency (the family's own is INV-LIM-8).
    """
    holders: dict[Any, set[Any]] = defaultdict(set)
    for event, config in _sweep(model):
        if isinstance(event, Claimed):
            holders[event.key].add(event.job_id)
            limits = limits_for(config, event.key)
            if limits is not None and limits.concurrency is not None and len(holders[event.key]) > limits.concurrency:
                _fail("INV-LIM-1", f"key {event.key!r}: claim of job {event.job_id!r} by {event.worker!r} at "
                      f"{event.at_us} µs made {len(holders[event.key])} in flight > concurrency {limits.concurrency}")
        elif isinstance(event, Completed):
            holders[event.key].discard(event.job_id)


def inv_lim_2_rate_window(history: Iterable[Any], entries: Iterable[RateEntry]) -> None:
    """For each rate entry (L, P, B), claims in any window of length T are at most ``B + L·T/P``.

    ``history`` is claim times in µs (ints) or ``Claimed`` events of one key
    under one configuration. All windows in one pass: with sorted times
    ``t_1 ≤ … ≤ t_n`` and ``r = L / (P·10⁶)`` per µs, the bound for every
    ``i ≤ j`` is ``(j − r·t_j) − min_{i≤j}(i − r·t_i) + 1 ≤ B``, evaluated in
    integers scaled by ``P·10⁶`` (exact).
    """
    times = sorted(h if isinstance(h, int) else h.at_us for h in history)
    for entry in entries:
        unit = _units(entry)
        best, best_i = None, 0
        for j, t_j in enumerate(times):
            a_j = j * unit - entry.limit * t_j
            if best is None or a_j < best:
                best, best_i = a_j, j
            if a_j - best + unit > entry.burst * unit:
                count = j - best_i + 1
                _fail("INV-LIM-2", f"{count} claims in [{times[best_i]}, {t_j}] µs exceed burst {entry.burst} + "
                      f"{entry.limit}/{entry.per_s}s × {t_j - times[best_i]} µs for entry {entry}")


def inv_lim_2_rate_windows_of(model: LimitsModel) -> None:
    """INV-LIM-2 over a model's history: per key, per stretch between restarts, per kept entry.

    Within one configuration a bucket starts at most full (a carried level is
    clamped at its first refill), so the window bound holds there exactly. A
    partition of a key family is a key with its family's ``per_partition`` rates; its
    claims are *not* cut at a ``forget_partition``: removing a bucket never adds a
    token (the next one starts empty), so the bound holds across it [INV-LIM-9].
    """
    segment: dict[str, list[int]] = defaultdict(list)
    config: Config = {}
    for event in [*model.events, None]:
        if event is None or isinstance(event, Restarted):
            for key, times in segment.items():
                if (limits := limits_for(config, key)) is not None:
                    inv_lim_2_rate_window(times, limits.rates)
            segment = defaultdict(list)
            config = dict(event.limits) if event is not None else {}
        elif isinstance(event, Claimed) and event.key is not None:
            segment[event.key].append(event.at_us)


def inv_lim_3_no_leaked_slots(model: LimitsModel) -> None:
    """Slots never leak: a key's in-flight count is its claims minus its completions.

    Every completion (success, failure, timeout, reap) ends exactly one claimed,
    not yet completed execution, and ``model.in_flight(key)`` — derived, never
    stored — equals the count the history gives; so when every execution of a
    key is completed the count is 0.
    """
    open_jobs: dict[Any, set[Any]] = defaultdict(set)
    for event in model.events:
        if isinstance(event, Claimed):
            if event.job_id in open_jobs[event.key]:
                _fail("INV-LIM-3", f"job {event.job_id!r} claimed twice without completing")
            open_jobs[event.key].add(event.job_id)
        elif isinstance(event, Completed):
            if event.job_id not in open_jobs[event.key]:
                _fail("INV-LIM-3", f"job {event.job_id!r} completed ({event.outcome}) while not in flight")
            open_jobs[event.key].discard(event.job_id)
    keys = set(open_jobs) | {job.key for job in model.jobs.values()}
    for key in keys:
        if model.in_flight(key) != len(open_jobs[key]):
            _fail("INV-LIM-3", f"key {key!r}: in_flight() = {model.in_flight(key)} but the history holds "
                  f"{sorted(map(repr, open_jobs[key]))}")


def _refilled_since_restart(model: LimitsModel) -> set[str]:
    """Keys whose buckets a decision refilled after the last restart."""
    keys: set[str] = set()
    for event in model.events:
        if isinstance(event, Restarted):
            keys -= event.rebased
        elif isinstance(event, Forgotten):
            keys.discard(event.key)
        elif isinstance(event, Decided) and event.refused_for not in CEILING_REFUSALS and not event.unconfigured:
            keys.add(event.key)
    return keys


def inv_lim_4_levels_in_range(model: LimitsModel) -> None:
    """Every bucket level stays in ``[0, burst]`` and a lowered burst clamps it on the next refill.

    Buckets exist only for periods the current config keeps. A bucket refilled
    since the last restart is within the current burst; one not yet refilled
    may still hold up to the burst it was last clamped to.
    """
    fresh = _refilled_since_restart(model)
    for (key, per_s), bucket in model.buckets.items():
        limits = limits_for(model.config, key)
        entry = next((e for e in limits.rates if e.per_s == per_s), None) if limits else None
        if entry is None:
            _fail("INV-LIM-4", f"bucket ({key!r}, {per_s}s) survives but config keeps no such period")
        cap = entry.burst * _units(entry) if key in fresh else bucket.cap_units
        if not 0 <= bucket.units <= cap:
            _fail("INV-LIM-4", f"bucket ({key!r}, {per_s}s) holds {bucket.units} units, outside [0, {cap}] "
                  f"(entry {entry})")


def inv_lim_5_stamp_exact(model: LimitsModel) -> None:
    """A rate-blocked key is stamped with the exact µs of its next token; no claim happens earlier.

    Three checks: the stamp equals the latest next-token time
    ``t + ceil((P·10⁶ − u) / L)`` of the key's short buckets (none short: no
    stamp); at the stamp every bucket holds a token and one µs earlier some
    bucket does not; and no admission in the history came before the stamp
    in force.
    """
    fresh = _refilled_since_restart(model)
    for key, stamped in model.stamps.items():
        if key not in fresh:
            _fail("INV-LIM-5", f"key {key!r} stamped {stamped} without a refill since the last restart")
    for key in fresh:
        limits = limits_for(model.config, key)
        rates = limits.rates if limits else ()
        found = [(e, model.buckets.get((key, e.per_s))) for e in rates]
        buckets = [(e, b) for e, b in found if b is not None]
        if len(buckets) != len(found):
            _fail("INV-LIM-5", f"key {key!r} decided but missing a bucket: {found}")
        short = [(e, b) for e, b in buckets if b.units < _units(e)]
        expected = max((b.refilled_at_us - (b.units - _units(e)) // e.limit for e, b in short), default=None)
        stamp = model.stamps.get(key)
        if stamp != expected:
            _fail("INV-LIM-5", f"key {key!r} stamped {stamp}, next token at {expected} (buckets {buckets})")
        if stamp is not None:
            late = [e for e, b in buckets if _level_at(b.units, b.refilled_at_us, e, stamp) < _units(e)]
            early = [e for e, b in buckets if _level_at(b.units, b.refilled_at_us, e, stamp - 1) < _units(e)]
            if late or not early:
                _fail("INV-LIM-5", f"key {key!r} stamp {stamp} is not the first µs with a token in every "
                      f"bucket (short at stamp: {late}; short one µs before: {early})")
    stamps: dict[str, int] = {}
    for event in model.events:
        before = stamps.get(event.key) if isinstance(event, Decided) else None
        if isinstance(event, Decided) and event.admitted and before is not None and event.at_us < before:
            _fail("INV-LIM-5", f"key {event.key!r} admitted at {event.at_us} before its stamp {before}")
        _track_stamps(stamps, event)


def _track_stamps(stamps: dict[str, int], event: Any) -> None:
    """Apply an event to the stamps in force: a restart clears the re-based keys' stamps, a
    decision sets or clears one."""
    if isinstance(event, Restarted):
        for key in event.rebased:
            stamps.pop(key, None)
    elif isinstance(event, Forgotten):
        stamps.pop(event.key, None)
    elif isinstance(event, Decided):
        if event.blocked_until_us is None:
            stamps.pop(event.key, None)
        else:
            stamps[event.key] = event.blocked_until_us


def inv_lim_6_fifo(model: LimitsModel) -> None:
    """Claims follow FIFO: lanes are tried by their oldest eligible job; the oldest permitted lane wins.

    Replays the history: at each poll, the lanes must be exactly the keys with
    an eligible job, each represented by its oldest ``(eligible_at, creation
    order)`` job; a lane is skipped only if really blocked (stamp in the future)
    or saturated; the rest are tried in FIFO order and the first not refused
    is claimed (the unkeyed lane never refuses). With nothing saturated this
    is global FIFO.
    """
    pending: dict[Any, Enqueued] = {}
    in_flight: Counter[Any] = Counter()
    stamps: dict[str, int] = {}
    before_poll: dict[str, int] = {}
    poll_starts = {event.first_seq for event in model.events if isinstance(event, Polled)}
    for event, config in _sweep(model):
        if event.seq in poll_starts:
            before_poll = dict(stamps)
        if isinstance(event, Enqueued):
            pending[event.job_id] = event
        elif isinstance(event, Claimed):
            pending.pop(event.job_id, None)
            in_flight[event.key] += 1
        elif isinstance(event, Completed):
            in_flight[event.key] -= 1
        elif isinstance(event, Polled):
            _check_poll(event, pending, in_flight, before_poll, config)
        _track_stamps(stamps, event)


def _family_saturated(config: Mapping[str, Any], key: Any, in_flight: Counter[Any]) -> bool:
    """Whether ``key``'s family (if it is a partition) is at its ceiling, from the counts."""
    family = family_of(config, key)
    if family is None or family[1].concurrency is None:
        return False
    held = sum(n for k, n in in_flight.items() if (s := split_partition_key(k)) and s[0] == family[0]
               and k not in config)
    return held >= family[1].concurrency


def _check_poll(poll: Polled, pending: Mapping[Any, Enqueued], in_flight: Counter[Any],
                stamps: Mapping[str, int], config: Mapping[str, Any]) -> None:
    oldest: dict[Any, Enqueued] = {}
    for job in sorted(pending.values(), key=lambda j: (j.eligible_at_us, j.created)):
        if job.eligible_at_us <= poll.at_us:
            oldest.setdefault(job.key, job)
    seen = {lane.key: lane.job_id for lane in poll.lanes}
    wanted = {key: job.job_id for key, job in oldest.items()}
    if seen != wanted:
        _fail("INV-LIM-6", f"poll by {poll.worker!r} at {poll.at_us}: lanes {seen} but oldest eligible jobs {wanted}")
    tried = []
    for lane in poll.lanes:
        blocked = lane.key is not None and stamps.get(lane.key, poll.at_us) > poll.at_us
        limits = limits_for(config, lane.key)
        saturated = _family_saturated(config, lane.key, in_flight) or (
            limits is not None and limits.concurrency is not None and in_flight[lane.key] >= limits.concurrency)
        if (lane.verdict == "blocked") != blocked or (lane.verdict == "saturated") != (saturated and not blocked):
            _fail("INV-LIM-6", f"poll at {poll.at_us}: lane {lane.key!r} marked {lane.verdict} but "
                  f"blocked={blocked} saturated={saturated}")
        if lane.verdict not in ("blocked", "saturated"):
            tried.append(lane)
    orders = [(lane.eligible_at_us, lane.created) for lane in tried]
    if orders != sorted(orders):
        order = [(lane.key, o) for lane, o in zip(tried, orders, strict=True)]
        _fail("INV-LIM-6", f"poll at {poll.at_us}: lanes tried out of FIFO order {order}")
    verdicts = [lane.verdict for lane in tried]
    first = next((i for i, v in enumerate(verdicts) if not v.startswith("refused")), len(verdicts))
    if any(v.startswith("refused") and lane.key is None for v, lane in zip(verdicts, tried, strict=True)):
        _fail("INV-LIM-6", f"poll at {poll.at_us}: the unkeyed lane was refused")
    if verdicts[first:first + 1] not in ([], ["claimed"]) or any(v != "untried" for v in verdicts[first + 1:]):
        _fail("INV-LIM-6", f"poll at {poll.at_us}: verdicts {verdicts} skip a permitted older lane")
    claimed = tried[first].job_id if first < len(tried) else None
    if poll.job_id != claimed:
        _fail("INV-LIM-6", f"poll at {poll.at_us} claimed {poll.job_id!r}, FIFO says {claimed!r}")


def inv_lim_8_family_within_ceiling(model: LimitsModel) -> None:
    """In-flight executions of a key family, over all its partitions, never exceed the
    family's ``concurrency``, fleet-wide (semantics §5, "Partitioned keys"; model only,
    issue 34).

    Sweeps claims and completions in event order with the configuration in force at
    each claim, as INV-LIM-1 does per key: a claim of a partition (a key that renders
    as ``family[<JSON>]`` of a family the configuration declares) may not make the
    family's holders exceed its ceiling. Each partition's own ceiling is INV-LIM-1's.
    """
    holders: dict[str, set[Any]] = defaultdict(set)
    for event, config in _sweep(model):
        if not isinstance(event, (Claimed, Completed)):
            continue
        split = split_partition_key(event.key)
        if split is None:
            continue
        if isinstance(event, Completed):
            holders[split[0]].discard(event.job_id)
            continue
        holders[split[0]].add(event.job_id)
        family = family_of(config, event.key)
        if family is not None and family[1].concurrency is not None and len(holders[split[0]]) > family[1].concurrency:
            _fail("INV-LIM-8", f"family {split[0]!r}: claim of job {event.job_id!r} on {event.key!r} by "
                  f"{event.worker!r} at {event.at_us} µs made {len(holders[split[0]])} in flight > family "
                  f"concurrency {family[1].concurrency}")


def inv_lim_9_forget_adds_no_tokens(model: LimitsModel) -> None:
    """Forgetting an idle partition removes its rows and adds no token (semantics §5,
    "Partitioned keys"; model only, issue 34).

    From the history: a partition was forgotten only while idle (no execution of it
    pending or in flight); and a partition forgotten and not decided since has no bucket
    and no stamp left, so its next decision creates its buckets empty. (That the claims
    fit every rate entry across a forget is INV-LIM-2, whose windows are not cut there.)
    """
    pending: dict[Any, set[Any]] = defaultdict(set)
    open_jobs: dict[Any, set[Any]] = defaultdict(set)
    forgotten: set[str] = set()
    for event in model.events:
        if isinstance(event, Enqueued):
            pending[event.key].add(event.job_id)
        elif isinstance(event, Claimed):
            pending[event.key].discard(event.job_id)
            open_jobs[event.key].add(event.job_id)
        elif isinstance(event, Completed):
            open_jobs[event.key].discard(event.job_id)
        elif isinstance(event, Forgotten):
            busy = sorted(map(repr, pending[event.key] | open_jobs[event.key]))
            if busy:
                _fail("INV-LIM-9", f"partition {event.key!r} forgotten at {event.at_us} µs with work {busy}")
            forgotten.add(event.key)
        elif isinstance(event, Decided) and event.refused_for not in CEILING_REFUSALS:
            forgotten.discard(event.key)
    for key in sorted(forgotten):
        left = {where: bucket for where, bucket in model.buckets.items() if where[0] == key}
        if left or key in model.stamps:
            _fail("INV-LIM-9", f"partition {key!r} forgotten, not decided since, still has buckets {left} "
                  f"and stamp {model.stamps.get(key)}")


# =========================================================================== pipelines


def _successors(model: PipelinesModel) -> dict[str, list[Step]]:
    found: dict[str, list[Step]] = defaultdict(list)
    for step in model.steps.values():
        for pred in step.predecessors:
            found[pred].append(step)
    return found


def _edge(model: PipelinesModel, step: Step) -> Mapping[str, Any] | None:
    return model.runs[step.run_id].definition.edge(step.node)


def inv_adv_1_successors_exactly_once(model: PipelinesModel) -> None:
    """Each completed step's transition created its successors exactly once: none lost, none extra.

    The expected successors are re-derived from the run's snapshot and the
    step's output — chain/converge/divert: one step on the same branch;
    divide: one child per target with fanout_index i; expand: one child per
    item (the committed prefix while batches are pending or after a halt);
    dampen: one step after resume;
    leaf, halted or unfinished steps: none — and compared as a multiset of
    ``(node, input, branch relation)`` with what exists. Fan-in targets are
    INV-ADV-3's.
    """
    successors = _successors(model)
    triggers = Counter(s.run_id for s in model.steps.values() if s.origin == "trigger")
    for run_id in model.runs:
        if triggers[run_id] != 1:
            _fail("INV-ADV-1", f"run {run_id} has {triggers[run_id]} trigger steps")
    for step in model.steps.values():
        if step.origin != "trigger" and not step.predecessors:
            _fail("INV-ADV-1", f"step {step.id} ({step.node}) has no predecessor")
        branch = model.branches[step.branch_id]
        edge = _edge(model, step)
        kind = edge["type"] if edge else None
        actual = successors.get(step.id, [])
        if kind in FAN_IN:
            if len(actual) > 1:
                _fail("INV-ADV-1", f"fan-in step {step.id} has {len(actual)} successors")
            continue
        is_latest_halted = branch.status == "halted" and branch.latest_step == step.id
        expected: list[tuple[str, str, int | str | None]] = []
        if edge is not None and kind == "expand" and step.status in ("advancing", "completed") and (
                is_latest_halted or step.status == "advancing"):
            # batches committed before a halt (or before the last batch) stay
            expected = [(edge["to"][0], canonical_json([item]), i)
                        for i, item in enumerate(step.output[: branch.expand_cursor or 0])]
        elif step.status == "completed" and not is_latest_halted and edge is not None:
            out = step.output
            if kind in ("chain", "converge"):
                expected = [(edge["to"][0], canonical_json([out]), "same")]
            elif kind == "divert":
                target = edge["to"].get(render_key(out), edge["to"]["otherwise"])
                expected = [(target, canonical_json([out]), "same")]
            elif kind == "divide":
                expected = [(node, canonical_json([out]), i) for i, node in enumerate(edge["to"])]
            elif kind == "expand":
                expected = [(edge["to"][0], canonical_json([item]), i) for i, item in enumerate(out)]
            elif kind == "dampen" and not (branch.status == "dampened" and branch.latest_step == step.id):
                expected = [(edge["to"][0], "*", "same")]
        got: list[tuple[str, str, int | str | None]] = []
        for succ in actual:
            child = model.branches[succ.branch_id]
            relation: int | str | None
            if succ.branch_id == step.branch_id:
                relation = "same"
            elif child.barrier == step.branch_id:
                relation = child.fanout_index
            else:
                relation = f"stray branch {child.id}"
            got.append((succ.node, "*" if succ.origin == "resume" else canonical_json(succ.input), relation))
        if Counter(got) != Counter(expected):
            missing = Counter(expected) - Counter(got)
            extra = Counter(got) - Counter(expected)
            _fail("INV-ADV-1", f"step {step.id} ({step.node}, {kind}, {step.status}): missing successors "
                  f"{sorted(missing.elements(), key=repr)}, unexpected {sorted(extra.elements(), key=repr)}")


def inv_adv_2_stale_token_commits_nothing(model: PipelinesModel) -> None:
    """A stale claim token commits nothing: every commit carries the branch's current token.

    Replays the fence log: a claim takes an unclaimed branch and issues a new
    token; a commit or release must present the holder's token.
    """
    holder: dict[str, int | None] = {}
    issued: set[int] = set()
    for kind, branch_id, token in model.fence_log:
        current = holder.get(branch_id)
        if kind == "claim":
            if current is not None or token in issued:
                _fail("INV-ADV-2", f"branch {branch_id} claimed with token {token} while held by {current}")
            holder[branch_id] = token
            issued.add(token)
        elif token != current:
            _fail("INV-ADV-2", f"branch {branch_id}: {kind} with token {token}, current token {current}")
        elif kind == "release":
            holder[branch_id] = None


def inv_adv_3_fan_in_once(model: PipelinesModel) -> None:
    """Fan-in fires exactly once, after every expected sibling arrived, with all their outputs.

    For every branch that fanned out: the arrival counter equals the children
    that completed through a combine/collapse edge; at most one merge step
    exists; it exists iff all ``fanout_width`` indices arrived; its input is
    ``[[outputs by fanout_index]]`` and its branch takes the barrier's place.
    """
    merges: dict[str | None, list[Step]] = defaultdict(list)
    for step in model.steps.values():
        if step.origin in FAN_IN:
            barriers = {model.branches[model.steps[p].branch_id].barrier for p in step.predecessors}
            if len(barriers) != 1:
                _fail("INV-ADV-3", f"merge step {step.id} joins siblings of several barriers {barriers}")
            merges[barriers.pop()].append(step)
    for barrier in model.branches.values():
        if barrier.fanout_width is None:
            if merges.get(barrier.id):
                _fail("INV-ADV-3", f"branch {barrier.id} never fanned out but has merges {merges[barrier.id]}")
            continue
        arrived: dict[int | None, Step] = {}
        for child in model.branches.values():
            step = model.steps[child.latest_step]
            edge = _edge(model, step)
            if (child.barrier == barrier.id and child.status == "completed" and edge is not None
                    and edge["type"] in FAN_IN):
                if child.fanout_index in arrived:
                    _fail("INV-ADV-3", f"barrier {barrier.id}: index {child.fanout_index} arrived twice "
                          f"({arrived[child.fanout_index].id}, {step.id})")
                arrived[child.fanout_index] = step
        if barrier.fanin_arrivals != len(arrived):
            _fail("INV-ADV-3", f"barrier {barrier.id}: counter {barrier.fanin_arrivals} but {len(arrived)} arrived")
        fired = merges.get(barrier.id, [])
        complete = set(arrived) == set(range(barrier.fanout_width))  # (keys are distinct)
        if len(fired) > 1 or (fired and not complete) or (complete and not fired):
            _fail("INV-ADV-3", f"barrier {barrier.id} ({barrier.fanin_arrivals}/{barrier.fanout_width} arrived) "
                  f"has {len(fired)} merge steps {[s.id for s in fired]}")
        if fired:
            merge = fired[0]
            want = [[arrived[i].output for i in range(barrier.fanout_width)]]  # complete: the indices arrived
            merge_branch = model.branches[merge.branch_id]
            if canonical_json(merge.input) != canonical_json(want):
                _fail("INV-ADV-3", f"merge step {merge.id} input {merge.input} != sibling outputs {want}")
            if (merge_branch.barrier, merge_branch.fanout_index) != (barrier.barrier, barrier.fanout_index):
                _fail("INV-ADV-3", f"merge branch {merge_branch.id} does not stand in {barrier.id}'s place")


def inv_adv_4_expand_children(model: PipelinesModel) -> None:
    """Batched expand of N items yields exactly N children, resumes at its cursor, batches bounded.

    Children of an expand are indices ``0..cursor-1`` exactly once each, child
    ``i`` with input ``[items[i]]``; a completed expand step has cursor N; no
    transaction created more than ``expand_batch`` children.
    """
    for commit in model.commits:
        if commit.action == "expand" and len(commit.created_steps) > model.config.expand_batch:
            _fail("INV-ADV-4", f"one transaction on {commit.branch_id} created {len(commit.created_steps)} children "
                  f"> expand_batch {model.config.expand_batch}")
    successors = _successors(model)
    for step in model.steps.values():
        edge = _edge(model, step)
        if edge is None or edge["type"] != "expand" or step.status not in ("advancing", "completed"):
            continue
        branch = model.branches[step.branch_id]
        if step.status == "completed" and not step.output:
            continue
        if branch.status == "halted" and branch.latest_step == step.id and branch.expand_cursor is None:
            continue
        cursor = branch.expand_cursor or 0
        children = Counter(model.branches[s.branch_id].fanout_index for s in successors.get(step.id, []))
        if children != Counter(range(cursor)):
            _fail("INV-ADV-4", f"expand step {step.id}: cursor {cursor} but children at indices "
                  f"{sorted(children.elements(), key=lambda i: -1 if i is None else i)}")
        if step.status == "completed" and branch.status != "halted" and cursor != len(step.output):
            _fail("INV-ADV-4", f"expand step {step.id} completed with {cursor} of {len(step.output)} children")
        for succ in successors.get(step.id, []):
            i = model.branches[succ.branch_id].fanout_index
            if canonical_json(succ.input) != canonical_json([step.output[i]]):
                _fail("INV-ADV-4", f"expand child {succ.id} (index {i}) input {succ.input} != [{step.output[i]}]")


def inv_exe_1_no_lost_work(model: PipelinesModel) -> None:
    """No work is lost: every unfinished step or branch has a way forward.

    A step is ``in_progress`` iff it has exactly one pending execution; a
    branch in progress has a latest step that is running or advanceable; a
    quiescent model has no pending execution and nothing to advance.
    """
    for step in model.steps.values():
        open_ = [e for e in step.executions if model.executions[e].state == "pending"]
        if (step.status == "in_progress") != (len(open_) == 1) or len(open_) > 1:
            _fail("INV-EXE-1", f"step {step.id} ({step.status}) has pending executions {open_}")
    advanceable = set(model.advanceable_branches())
    for branch in model.branches.values():
        if branch.status in ("in_progress", "advancing"):
            latest = model.steps[branch.latest_step]
            if latest.status != "in_progress" and branch.id not in advanceable:
                _fail("INV-EXE-1", f"branch {branch.id} is stranded: latest step {latest.id} is {latest.status}")


def inv_exe_2_outcome_once(model: PipelinesModel) -> None:
    """An execution's outcome is recorded at most once; completed executions have exactly one."""
    recorded = Counter(exec_id for exec_id, _ in model.outcomes)
    for exec_id, count in recorded.items():
        if count > 1:
            _fail("INV-EXE-2", f"execution {exec_id} has {count} recorded outcomes")
    last = dict(model.outcomes)
    for execution in model.executions.values():
        if (execution.state == "completed") != (execution.id in recorded):
            _fail("INV-EXE-2", f"execution {execution.id} is {execution.state} with {recorded[execution.id]} outcomes")
        if execution.state == "completed" and last[execution.id] != execution.outcome:
            _fail("INV-EXE-2", f"execution {execution.id} outcome {execution.outcome} != recorded {last[execution.id]}")


def _key_root(model: PipelinesModel, step: Step) -> str:
    """The id of the first step of ``step``'s revive chain (itself when no revive re-ran it)."""
    while step.revives is not None:
        step = model.steps[step.revives]
    return step.id


def inv_exe_3_idempotency_keys(model: PipelinesModel) -> None:
    """``idempotency_key`` is equal across a step's executions and distinct across steps and
    runs, except that a step a revive re-enqueued carries the key of the failed step it re-runs
    (the first of its revive chain), and no other step does.

    Steps a revive carried over as history have no executions here (they are checked in
    the run they came from).
    """
    owner: dict[tuple[str, str], str] = {}
    for step in model.steps.values():
        if step.copied_from is not None and not step.executions:
            continue
        keys = {model.executions[e].idempotency_key for e in step.executions}
        if len(keys) != 1:
            _fail("INV-EXE-3", f"step {step.id} executions carry keys {sorted(keys)}")
        key = keys.pop()
        if key != _key_root(model, step):
            _fail("INV-EXE-3", f"step {step.id} carries key {key!r}, not {_key_root(model, step)!r}")
        if (step.run_id, key) in owner:
            _fail("INV-EXE-3", f"key {key!r} shared by steps {owner[step.run_id, key]} and {step.id} of one run")
        owner[step.run_id, key] = step.id


def inv_exe_4_budgets(model: PipelinesModel) -> None:
    """Retries ≤ ``max_retry``, crashes ≤ ``max_crash``; then the step fails and the branch halts
    with the matching reason. An ``invalid`` execution (the step cannot run as stored, or its
    return value cannot be stored) is the step's last: it fails at once.

    Re-derives each execution's counters and eligibility from its predecessor's
    outcome (retry: ``+retry_delay``; crash: at once while ``crash_count ≤
    max_crash // 3``, else ``+crash_count × crash_delay``).
    """
    cfg = model.config
    for step in model.steps.values():
        executions = [model.executions[e] for e in step.executions]
        if not executions and step.copied_from is not None:  # history a revive carried over
            continue
        first = executions[0]
        if (first.retry_count, first.crash_count) != (0, 0):
            _fail("INV-EXE-4", f"step {step.id}: first execution starts at {first.retry_count}/{first.crash_count}")
        for prev, nxt in pairwise(executions):
            if prev.outcome == "process_crashed":
                want = (prev.retry_count, prev.crash_count + 1)
                delay = 0 if want[1] <= cfg.max_crash // 3 else want[1] * cfg.crash_delay_us
            elif prev.outcome in ("failure", "timed_out"):  # (after "invalid" nothing may follow)
                want, delay = (prev.retry_count + 1, prev.crash_count), cfg.retry_delay_us
            else:
                _fail("INV-EXE-4", f"step {step.id}: execution {nxt.id} follows {prev.outcome} {prev.id}")
            if prev.completed_at_us is None:
                _fail("INV-EXE-4", f"step {step.id}: execution {nxt.id} follows {prev.id}, which never completed")
            got = (nxt.retry_count, nxt.crash_count, nxt.eligible_at_us)
            if got != (*want, prev.completed_at_us + delay):
                _fail("INV-EXE-4", f"step {step.id}: execution {nxt.id} has retry/crash/eligible {got}, "
                      f"expected {(*want, prev.completed_at_us + delay)}")
        for execution in executions:
            if execution.retry_count > cfg.max_retry or execution.crash_count > cfg.max_crash:
                _fail("INV-EXE-4", f"execution {execution.id} of {step.id} exceeds budgets "
                      f"{execution.retry_count}/{cfg.max_retry} {execution.crash_count}/{cfg.max_crash}")
        last = executions[-1]
        spent = last.state == "completed" and last.outcome != "success"
        branch = model.branches[step.branch_id]
        if spent != (step.status == "failed"):
            _fail("INV-EXE-4", f"step {step.id} is {step.status} after last execution {last.id} {last.outcome}")
        if spent and branch.status == "halted":
            reason = job_halt_reason(last.outcome, last.return_rejected)
            if branch.halt_reason != reason and branch.halt_reason not in _ADVANCER_HALTS:
                _fail("INV-EXE-4", f"branch {branch.id} halted {branch.halt_reason}, expected {reason}")


def inv_run_1_terminal_final(model: PipelinesModel) -> None:
    """Terminal run states are final, a run's state is its branches' resolution, and a quiescent
    model leaves every run completed, halted or dampened."""
    quiescent = model.is_quiescent()
    for run in model.runs.values():
        final = [i for i, s in enumerate(run.status_history) if s in ("completed", "halted")]
        if final and final[0] != len(run.status_history) - 1:
            _fail("INV-RUN-1", f"run {run.id} left a terminal state: {run.status_history}")
        resolved = resolve_run_status([model.branches[b].status for b in run.branches])
        if run.status != resolved:
            _fail("INV-RUN-1", f"run {run.id} is {run.status} but its branches resolve to {resolved}")
        if quiescent and run.status not in ("completed", "halted", "dampened"):
            _fail("INV-RUN-1", f"run {run.id} is {run.status} at quiescence")


def inv_ctx_1_set_once(model: PipelinesModel) -> None:
    """A context key is set once per run: a plain set on an existing key is refused (OverwriteError)."""
    present: set[tuple[str, str]] = set()
    for write in model.context_writes:
        where = (write.run_id, write.key)
        if write.existed != (where in present) or write.accepted != (write.overwrite or where not in present):
            _fail("INV-CTX-1", f"run {write.run_id} key {write.key!r}: write {write} with key "
                  f"{'present' if where in present else 'absent'}")
        if write.accepted:
            present.add(where)
    for run in model.runs.values():
        keys = {(run.id, k) for k in run.context}
        if keys != {w for w in present if w[0] == run.id}:
            _fail("INV-CTX-1", f"run {run.id} context keys {sorted(run.context)} disagree with accepted writes")


def inv_hlt_1_hook_outcome_once(model: PipelinesModel) -> None:
    """A halted run's ``on_halt`` outcome is recorded exactly once: at most one hook per run,
    only for a halted run whose definition names a handler; a final hook (``succeeded`` or
    ``failed``) has exactly one recorded outcome, equal to its status, and an open one none;
    and every recorded attempt was fenced by the hook's current claim token (a record with
    a token that is not the latest claim's, or a second record with one token, is a
    stale claimer writing)."""
    per_run = Counter(hook.run_id for hook in model.hooks.values())
    for run_id, count in per_run.items():
        if count > 1:
            _fail("INV-HLT-1", f"run {run_id} has {count} hooks")
    for hook in model.hooks.values():
        run = model.runs[hook.run_id]
        if run.status != "halted" or run.definition.on_halt != hook.klass:
            _fail("INV-HLT-1", f"hook {hook.id} of run {run.id} ({run.status}, on_halt "
                  f"{run.definition.on_halt!r}) names {hook.klass!r}")
    recorded = Counter(hook_id for hook_id, _ in model.hook_outcomes)
    last = dict(model.hook_outcomes)
    for hook in model.hooks.values():
        final = hook.status in ("succeeded", "failed")
        if recorded[hook.id] != (1 if final else 0):
            _fail("INV-HLT-1", f"hook {hook.id} is {hook.status} with {recorded[hook.id]} recorded outcomes")
        if final and last[hook.id] != hook.status:
            _fail("INV-HLT-1", f"hook {hook.id} is {hook.status} but recorded {last[hook.id]}")
    claimed: dict[str, int | None] = {}
    for kind, hook_id, token in model.hook_log:
        if kind == "claim":
            claimed[hook_id] = token
        elif claimed.get(hook_id) != token:
            _fail("INV-HLT-1", f"hook {hook_id}: an attempt recorded with token {token}, "
                  f"not its claim {claimed.get(hook_id)}")
        else:
            claimed[hook_id] = None  # one record per claim


def inv_hlt_2_halted_run_gets_its_hook(model: PipelinesModel) -> None:
    """Every halted run whose definition names an ``on_halt`` handler owes its hook from the
    halt on, and the hook is delivered within its budgets: each attempt follows from the
    last (a failure retries after ``retry_delay`` while ``retry_count < max_retry``, a crash
    re-runs, at once for the first ``max_crash // 3``, while ``crash_count < max_crash``),
    it ends ``succeeded`` after a success and ``failed`` only when the budget is spent or
    the handler cannot be built (``invalid``); a quiescent model has no hook left open."""
    cfg = model.config
    for run in model.runs.values():
        if run.status == "halted" and run.definition.on_halt is not None and model.hook_of(run.id) is None:
            _fail("INV-HLT-2", f"halted run {run.id} owes no hook to {run.definition.on_halt!r}")
    for hook in model.hooks.values():
        retry = crash = 0
        for i, kind in enumerate(hook.attempts):
            last = i == len(hook.attempts) - 1
            if kind == "success":
                if not last or hook.status != "succeeded":
                    _fail("INV-HLT-2", f"hook {hook.id}: attempt {i} succeeded, then {hook.attempts[i + 1:]} "
                          f"({hook.status})")
                continue
            spent = (kind == "invalid" or (kind in ("failure", "timed_out") and retry >= cfg.max_retry)
                     or (kind == "process_crashed" and crash >= cfg.max_crash))
            if spent and (not last or hook.status != "failed"):
                _fail("INV-HLT-2", f"hook {hook.id}: attempt {i} ({kind}) spent its budget "
                      f"{retry}/{crash}, yet it is {hook.status} after {len(hook.attempts)} attempts")
            if not spent and last and hook.status == "failed":
                _fail("INV-HLT-2", f"hook {hook.id} failed with budget left ({retry}/{crash}) after {kind}")
            if spent:
                continue
            if kind == "process_crashed":
                crash += 1
                delay = 0 if crash <= cfg.max_crash // 3 else crash * cfg.crash_delay_us
            else:
                retry += 1
                delay = cfg.retry_delay_us
            if last and hook.status == "pending" and hook.eligible_at_us != hook.attempt_times[i] + delay:
                _fail("INV-HLT-2", f"hook {hook.id} eligible at {hook.eligible_at_us}, expected "
                      f"{hook.attempt_times[i] + delay}")
        if (retry, crash) != (hook.retry_count, hook.crash_count):
            _fail("INV-HLT-2", f"hook {hook.id} counts {hook.retry_count}/{hook.crash_count}, "
                  f"attempts give {retry}/{crash}")
    if model.is_quiescent() and model.open_hooks():
        _fail("INV-HLT-2", f"hooks {model.open_hooks()} are open at quiescence")


def inv_prn_1_prune_never_touches_a_live_run(model: PipelinesModel) -> None:
    """A prune deletes only runs that were completed or halted, finished before its cutoff
    and owed no on_halt hook still to run, when it decided; and it deletes each such run it
    was asked about."""
    for prune in model.prunes:
        pruned = set(prune.pruned)
        for run_id, status, finished_at_us, hook_open in prune.considered:
            allowed = (status in ("completed", "halted") and finished_at_us is not None
                       and finished_at_us < prune.cutoff_us and not hook_open)
            if (run_id in pruned) != allowed:
                _fail("INV-PRN-1", f"prune at cutoff {prune.cutoff_us} µs {'deleted' if run_id in pruned else 'kept'}"
                      f" run {run_id}, {status} finished at {finished_at_us}"
                      f"{', its on_halt hook still to run' if hook_open else ''}")


def inv_prn_2_pruned_run_leaves_nothing(model: PipelinesModel) -> None:
    """A pruned run is gone whole: nothing of it changes after the prune (no step, execution,
    branch or context write; the engine checks that no row is left), and it is pruned once."""
    seen: set[str] = set()
    for prune in model.prunes:
        for run_id, digest in prune.digests:
            if run_id in seen:
                _fail("INV-PRN-2", f"run {run_id} pruned twice")
            seen.add(run_id)
            if model.run_digest(run_id) != digest:
                _fail("INV-PRN-2", f"run {run_id} changed after it was pruned")
    flagged = {run_id for run_id, run in model.runs.items() if run.pruned}
    if flagged != seen:
        _fail("INV-PRN-2", f"runs marked pruned {sorted(flagged)} disagree with the prunes {sorted(seen)}")
# =========================================================================== revive


def _revived(model: PipelinesModel) -> Iterable[tuple[Any, Any]]:
    """``(halted run, run that revives it)`` for every revived run."""
    for run in model.runs.values():
        if run.revived_from is not None:
            yield model.runs[run.revived_from], run


def inv_rev_1_one_run_per_revive(model: PipelinesModel) -> None:
    """A halted run is revived at most once: one run at most names it in ``revived_from``,
    that run is what every ``revive`` of it returned, and only a halted run is revived."""
    revived = Counter(run.revived_from for run in model.runs.values() if run.revived_from is not None)
    for source, count in revived.items():
        if count > 1:
            _fail("INV-REV-1", f"run {source} was revived {count} times")
        if model.runs[source].status != "halted":
            _fail("INV-REV-1", f"run {source} was revived but is {model.runs[source].status}")
    by_source = {run.revived_from: run.id for run in model.runs.values() if run.revived_from is not None}
    for source, returned in model.revivals:
        if by_source.get(source) != returned:
            _fail("INV-REV-1", f"revive of {source} returned {returned}, but {by_source.get(source)} revives it")


def inv_rev_2_no_succeeded_step_reexecuted(model: PipelinesModel) -> None:
    """A revive re-executes and re-advances no succeeded step: every step of the halted run
    but a halted branch's failed latest step has one copy in the revived run, with its node,
    input and output, no execution, and (unless an advancement halt stopped at it) the
    status ``completed`` and successors that are themselves copies (or a re-run step, or the
    merge a re-run sibling's arrival fired)."""
    successors = _successors(model)
    for source, run in _revived(model):
        copies: dict[str, list[Step]] = defaultdict(list)
        for branch_id in run.branches:
            for step_id in model.branches[branch_id].steps:
                step = model.steps[step_id]
                if step.copied_from is not None:
                    copies[step.copied_from].append(step)
        stopped = {model.branches[b].latest_step for b in source.branches if model.branches[b].status == "halted"}
        for branch_id in source.branches:
            for step_id in model.branches[branch_id].steps:
                old = model.steps[step_id]
                if old.id in stopped and old.status == "failed":
                    if copies.get(old.id):
                        _fail("INV-REV-2", f"failed step {old.id} carried over as history into {run.id}")
                    continue
                if len(copies.get(old.id, [])) != 1:
                    _fail("INV-REV-2", f"step {old.id} of {source.id} has {len(copies.get(old.id, []))} copies "
                          f"in {run.id}")
                new = copies[old.id][0]
                if new.executions:
                    _fail("INV-REV-2", f"step {new.id} (copy of succeeded {old.id}) was executed again")
                if (new.node, canonical_json(new.input), canonical_json(new.output)) != (
                        old.node, canonical_json(old.input), canonical_json(old.output)):
                    _fail("INV-REV-2", f"step {new.id} is not a copy of {old.id}")
                if old.id in stopped:
                    continue
                if new.status != "completed":
                    _fail("INV-REV-2", f"step {new.id} (copy of completed {old.id}) is {new.status}")
                # new work after it is allowed only where a revived step made it: a re-run step, or
                # a merge that a re-run sibling's arrival fired (the copy's own arrival was
                # counted before the halt and carried over in the barrier's counter, INV-ADV-3)
                fresh = [s.id for s in successors.get(new.id, [])
                         if s.copied_from is None and s.revives is None and s.origin not in FAN_IN]
                if fresh:
                    _fail("INV-REV-2", f"step {new.id} (copy of completed {old.id}) was advanced again: {fresh}")


def inv_rev_3_revived_branch_resumes(model: PipelinesModel) -> None:
    """Each halted branch of a revived run resumes where it stopped: a failed step is re-run
    on the same node with the same input, a fresh budget and the failed step's idempotency key;
    a step an advancement halt stopped at is carried over with its output, to be advanced."""
    for source, run in _revived(model):
        mapped = {model.branches[b].copied_from: model.branches[b] for b in run.branches}
        for branch_id in source.branches:
            old = model.branches[branch_id]
            if old.status != "halted":
                continue
            stopped = model.steps[old.latest_step]
            branch = mapped.get(old.id)
            if branch is None:
                _fail("INV-REV-3", f"halted branch {old.id} of {source.id} is missing from {run.id}")
            if stopped.status == "failed":
                again = [model.steps[s] for s in branch.steps if model.steps[s].revives == stopped.id]
                if len(again) != 1:
                    _fail("INV-REV-3", f"failed step {stopped.id} re-run {len(again)} times in {run.id}")
                step = again[0]
                first = model.executions[step.executions[0]] if step.executions else None
                if (step.node, canonical_json(step.input)) != (stopped.node, canonical_json(stopped.input)):
                    _fail("INV-REV-3", f"step {step.id} re-runs {stopped.id} with {step.node} {step.input}, "
                          f"not {stopped.node} {stopped.input}")
                if first is None or (first.retry_count, first.crash_count) != (0, 0):
                    _fail("INV-REV-3", f"step {step.id} re-runs {stopped.id} without a fresh budget")
                if step.key != (stopped.key or stopped.id):
                    _fail("INV-REV-3", f"step {step.id} has key {step.key!r}, not {stopped.key!r}")
            else:
                again = [model.steps[s] for s in branch.steps if model.steps[s].copied_from == stopped.id]
                if len(again) != 1 or again[0].status not in ("advancing", "completed"):
                    _fail("INV-REV-3", f"step {stopped.id} (advancement halt) is not resumed advancing in {run.id}")


def inv_trg_1_one_run_per_trigger_key(model: PipelinesModel) -> None:
    """At most one run not pruned holds a pipeline's trigger key, and every trigger with a
    key returned the run holding it then: a trigger that created a run found the key free
    (its run pruned, or released by this trigger because it finished at least the trigger's
    window before it), one that created none returned a run triggered with that key, and a
    key is released only by a trigger with a window."""
    holders: Counter[tuple[str, str]] = Counter(
        (run.definition.pipeline, run.trigger_key) for run in model.runs.values()
        if run.trigger_key is not None and not run.pruned and run.key_released_at_us is None)
    for (pipeline, key), count in holders.items():
        if count > 1:
            _fail("INV-TRG-1", f"{count} runs of {pipeline!r} hold trigger key {key!r}")
    latest: dict[tuple[str, str], str] = {}
    released: set[str] = set()
    for trigger in model.triggers:
        if trigger.key is None:
            continue
        run = model.runs.get(trigger.run_id)
        if run is None or run.trigger_key != trigger.key or run.definition.pipeline != trigger.pipeline:
            _fail("INV-TRG-1", f"trigger of {trigger.pipeline!r} with key {trigger.key!r} returned "
                  f"{trigger.run_id}, which was not triggered with it")
        before = latest.get((trigger.pipeline, trigger.key))
        old = None if before is None else model.runs[before]
        if trigger.created and old is not None and (old.key_released_at_us is not None or not old.pruned):
            if (trigger.window_us is None or old.key_released_at_us != trigger.at_us
                    or old.finished_at_us is None or old.finished_at_us + trigger.window_us > trigger.at_us):
                _fail("INV-TRG-1", f"trigger key {trigger.key!r} started {trigger.run_id} while {before} "
                      f"held it (finished at {old.finished_at_us}, window {trigger.window_us}, "
                      f"trigger at {trigger.at_us})")
            released.add(old.id)
        if not trigger.created and before != trigger.run_id:
            _fail("INV-TRG-1", f"trigger key {trigger.key!r} returned {trigger.run_id}, not its run {before}")
        latest[(trigger.pipeline, trigger.key)] = trigger.run_id
    for run in model.runs.values():
        if run.key_released_at_us is not None and run.id not in released:
            _fail("INV-TRG-1", f"run {run.id} released key {run.trigger_key!r} without a windowed trigger taking it")


def inv_trg_2_rolled_back_trigger_leaves_nothing(model: PipelinesModel) -> None:
    """A trigger whose caller rolled its transaction back changed nothing: no run, branch,
    step or execution of it, and the state is what it was before."""
    for index, (before, after) in enumerate(model.rollbacks):
        if before != after:
            _fail("INV-TRG-2", f"rolled-back trigger #{index + 1} left state behind")


# =========================================================================== catalogue

INVARIANT_FUNCTIONS: dict[str, Callable[[Any], None]] = {
    "INV-LIM-1": inv_lim_1_in_flight_within_concurrency,
    "INV-LIM-2": inv_lim_2_rate_windows_of,
    "INV-LIM-3": inv_lim_3_no_leaked_slots,
    "INV-LIM-4": inv_lim_4_levels_in_range,
    "INV-LIM-5": inv_lim_5_stamp_exact,
    "INV-LIM-6": inv_lim_6_fifo,
    "INV-LIM-8": inv_lim_8_family_within_ceiling,
    "INV-LIM-9": inv_lim_9_forget_adds_no_tokens,
    "INV-ADV-1": inv_adv_1_successors_exactly_once,
    "INV-ADV-2": inv_adv_2_stale_token_commits_nothing,
    "INV-ADV-3": inv_adv_3_fan_in_once,
    "INV-ADV-4": inv_adv_4_expand_children,
    "INV-EXE-1": inv_exe_1_no_lost_work,
    "INV-EXE-2": inv_exe_2_outcome_once,
    "INV-EXE-3": inv_exe_3_idempotency_keys,
    "INV-EXE-4": inv_exe_4_budgets,
    "INV-RUN-1": inv_run_1_terminal_final,
    "INV-CTX-1": inv_ctx_1_set_once,
    "INV-HLT-1": inv_hlt_1_hook_outcome_once,
    "INV-HLT-2": inv_hlt_2_halted_run_gets_its_hook,
    "INV-PRN-1": inv_prn_1_prune_never_touches_a_live_run,
    "INV-PRN-2": inv_prn_2_pruned_run_leaves_nothing,
    "INV-REV-1": inv_rev_1_one_run_per_revive,
    "INV-REV-2": inv_rev_2_no_succeeded_step_reexecuted,
    "INV-REV-3": inv_rev_3_revived_branch_resumes,
    "INV-TRG-1": inv_trg_1_one_run_per_trigger_key,
    "INV-TRG-2": inv_trg_2_rolled_back_trigger_leaves_nothing,
}
LIMITS_INVARIANTS = tuple(i for i in INVARIANT_FUNCTIONS if i.startswith("INV-LIM"))
PIPELINE_INVARIANTS = tuple(i for i in INVARIANT_FUNCTIONS if not i.startswith("INV-LIM"))


def check_all(model: LimitsModel | PipelinesModel) -> None:
    """Run every invariant that applies to ``model``'s type."""
    ids = LIMITS_INVARIANTS if isinstance(model, LimitsModel) else PIPELINE_INVARIANTS
    for inv_id in ids:
        INVARIANT_FUNCTIONS[inv_id](model)
