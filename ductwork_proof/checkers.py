"""Independent history checkers: one pure function per invariant of INVARIANTS.md.

    >>> problems = check_all(read_history(engine, limits, witness_table="chaos_witnesses"))
    >>> assert not any(problems.values()), problems

Each ``check_…(history) -> list[str]`` returns one message per violation (empty:
the invariant holds on this history); every message starts with the invariant's
ID. They read only a :class:`~ductwork_proof.history.History` (committed rows, witness
rows written by the step bodies, the limits the fleet ran with). They share no
code with the engine's enforcement and do not import ``model/``; from ``ductwork``
they use only the snapshot reader (``Definition.from_json``), divert-key rendering
(``render_divert_key``) and the limit records. Arithmetic is exact (integers;
``Fraction`` only to print a level).

What each proves, and what it assumes, is in its docstring. Assumptions common to
all: the history is of a fresh database (every row of the round is present) and the
fleet ran with one config (``History.limits``) for the whole round. Liveness checks
(INV-LIM-3, INV-EXE-1) are meaningful only after the quiet phase; the others hold
at any moment.

Choices where INVARIANTS.md, docs/verification.md and docs/semantics.md leave room:

- INV-LIM-1 orders events only by the per-key sequence (never by timestamps); the
  witness sweep is a second, independent check that compares times of separate
  transactions, so it assumes the database server's clock does not run backwards,
  and counts an interval that ends at the very microsecond another starts as not
  overlapping.
- INV-LIM-2 has two checks. The window bound is the invariant's statement. The
  replay runs each bucket from EMPTY at the earliest ``eligible_at`` of the key's
  executions: a real bucket is created empty by the first claim attempt, which saw
  an eligible execution, so no earlier; starting earlier can only hold more tokens
  (refill is monotone and does not depend on when refills happen), so a claim that
  finds less than a token in the replay found less in the engine. It is stronger
  than the window bound (a window bound is a bucket replay started FULL) and catches
  a free first burst.
- A run stuck ``in_progress`` after the quiet phase is INV-EXE-1's; INV-RUN-1 checks
  that each run's state agrees with its branches (including ``in_progress`` ⇒ an
  active branch) and that ``completed``/``halted`` were final (their timestamps are
  set only on entering that state).
- A branch halted by the advancer in the middle of a batched expand keeps the
  children its committed batches created (semantics.md does not say; the engine's
  halt completes the step and leaves them): INV-ADV-1 expects exactly the indices
  below ``fanout_cursor`` there, not all N and not none.
- A missing or duplicated fan-in merge is reported by both INV-ADV-1 (as a
  successor) and INV-ADV-3 (as a barrier): each invariant stands on its own.
- Fan-in "after every sibling arrived" is checked by counts, not by timestamps: the
  firing sibling's transaction may read its time before another sibling's.
- A revived run's carried-over steps have no executions by design (INV-REV-2): INV-EXE-1
  does not count them as lost work, and INV-EXE-3 lets a re-run step share the key of
  the failed step it re-runs (and no other); the INV-REV checkers match a halted run's
  steps with its revived run's by node and input (the schema keeps no per-step link).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ductwork.limit_entries import US_PER_S, LimitEntry, RateEntry
from ductwork.pipelines.snapshot import Definition, EdgeSpec, render_divert_key
from ductwork_proof.history import BranchRow, Execution, History, StepRow, Witness

SETTLED_RUNS = ("completed", "halted", "dampened")
ACTIVE_BRANCHES = ("in_progress", "advancing")
FAN_IN = ("combine", "collapse")
INFINITY = float("inf")


def _ids(items: Iterable[Any], attr: str) -> str:
    return ", ".join(str(getattr(item, attr)) for item in items)


def _canon(value: Any) -> str:
    """JSON text for comparing values exactly (``1``, ``1.0`` and ``true`` differ)."""
    return json.dumps(value, sort_keys=True)


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _keyed_claims(history: History) -> dict[str, list[Execution]]:
    """Claimed keyed executions by key."""
    by_key: dict[str, list[Execution]] = defaultdict(list)
    for execution in history.executions:
        if execution.key is not None and execution.claimed_at_us is not None:
            by_key[execution.key].append(execution)
    return by_key


def _claimed_at(execution: Execution) -> int:
    """The claim time of one of :func:`_keyed_claims`'s executions (it keeps only claimed ones)."""
    assert execution.claimed_at_us is not None, f"execution {execution.execution_id} was never claimed"
    return execution.claimed_at_us


# --------------------------------------------------------------------------- INV-LIM-1


def check_inv_lim_1(history: History) -> list[str]:
    """INV-LIM-1: in-flight executions of a key never exceed its ``concurrency`` (and, from
    the witness rows, INV-EXE-5: step bodies still running count until their execution ended).

    First, exactly, by per-key sequence (docs/verification.md, concurrency (a)): every
    claim (+1 at ``claim_seq``) and release (−1 at ``release_seq``) of a key is
    swept in sequence order; after each claim the in-flight count must be at most
    the limit. The sweep's preconditions are checked too: a claimed keyed execution
    has a ``claim_seq``, a completed one a ``release_seq`` greater than it, and no
    sequence number is used twice in a key (a partition's row forgotten and created again
    numbers on above the old one's, INV-LIM-9, so this holds across a forget too). A
    completion without ``release_seq`` counts as never released (nothing orders it).

    Second, independently, over witness rows: at no instant do more step bodies of a
    key run than its limit. A witness without an end runs until its execution's
    ``completed_at`` (the latest execution of its step claimed at or before the
    witness started), else to the end of history. A body on a host the harness froze
    (SIGSTOP past ``reaper_timeout``) counts until the freeze began: from then it is
    stopped, and after the thaw a zombie whose commits the fence refuses until its
    lease watchdog kills it, the one case INV-EXE-5 states it cannot prevent.

    Does not prove: anything for keys without ``concurrency`` in ``History.limits``
    (unlimited), or for a config changed mid-round.
    """
    out: list[str] = []
    for key, claims in sorted(_keyed_claims(history).items()):
        out += _sweep_sequences(history, key, claims)
    out += _sweep_witnesses(history)
    return out


def _family_of(history: History, key: str) -> str | None:
    """The configured family ``key`` is a partition of: it begins with the family's name and
    ``[`` (docs/semantics.md §5.1; the rule ``Config.family_of`` applies, restated here so the
    checkers share no code with the engine); None: a static key."""
    family, bracket, _ = key.partition("[")
    return family if bracket and family in history.families else None


def _entry(history: History, key: str) -> LimitEntry | None:
    """The limits a decision on ``key`` applies: a static key's entry, or for a partition of a
    configured family the family's ``per_partition`` (each partition a key of its own,
    INV-LIM-8); None: unconfigured."""
    entry = history.limits.get(key)
    if entry is None and (family := _family_of(history, key)) is not None:
        return history.families[family].per_partition
    return entry


def _concurrency(history: History, key: str) -> int | None:
    entry = _entry(history, key)
    return None if entry is None else entry.concurrency


def _sweep_sequences(history: History, key: str, claims: list[Execution]) -> list[str]:
    out: list[str] = []
    events: list[tuple[int, int, str]] = []  # (seq, +1 claim | -1 release, execution id)
    for e in sorted(claims, key=lambda e: e.execution_id):
        if e.claim_seq is None:
            out.append(f"INV-LIM-1: execution {e.execution_id} of key {key!r} was claimed without a claim_seq")
        else:
            events.append((e.claim_seq, +1, e.execution_id))
        if e.completed_at_us is not None and e.release_seq is None:
            out.append(f"INV-LIM-1: execution {e.execution_id} of key {key!r} completed ({e.outcome}) "
                       "without a release_seq")
        if e.release_seq is not None:
            events.append((e.release_seq, -1, e.execution_id))
            if e.claim_seq is not None and e.release_seq <= e.claim_seq:
                out.append(f"INV-LIM-1: execution {e.execution_id} of key {key!r} has release_seq "
                           f"{e.release_seq}, not after its claim_seq {e.claim_seq}")
    users: dict[int, list[str]] = defaultdict(list)
    for seq, delta, execution_id in events:
        users[seq].append(f"{'claim' if delta > 0 else 'release'} of {execution_id}")
    for seq in sorted(users):
        if len(users[seq]) > 1:
            out.append(f"INV-LIM-1: key {key!r} used seq {seq} {_times(len(users[seq]))}: "
                       + ", ".join(users[seq]))
    limit = _concurrency(history, key)
    in_flight = 0
    for seq, delta, execution_id in sorted(events, key=lambda ev: (ev[0], -ev[1], ev[2])):
        in_flight += delta
        if delta > 0 and limit is not None and in_flight > limit:
            out.append(f"INV-LIM-1: key {key!r} had {in_flight} in flight (limit {limit}) after "
                       f"claim_seq {seq} (execution {execution_id})")
    return out


def _witness_end(executions_by_step: dict[str, list[Execution]], witness: Witness) -> float:
    """When the body stopped: its recorded end, else its execution's completion, else never."""
    if witness.ended_at_us is not None:
        return witness.ended_at_us
    before = [e for e in executions_by_step.get(witness.step_id, ())
              if e.claimed_at_us is not None and e.claimed_at_us <= witness.started_at_us]
    if before:
        latest = max(before, key=lambda e: (e.claimed_at_us, e.execution_id))
        if latest.completed_at_us is not None:
            return latest.completed_at_us
    return INFINITY


def _open_at(executions_by_step: dict[str, list[Execution]], witness: Witness, at_us: int) -> bool:
    """Whether the witness's step had an execution claimed at or before ``at_us`` and not
    completed by then: the claim a frozen process held when the freeze began.

    A body of a frozen process whose witness row was written after the freeze began was
    admitted before it (a thawed process whose lease ran out starts no body, INV-EXE-5):
    the freeze fell between its lease question and its witness's round trip, the window
    INV-EXE-5 states. After the thaw it is a fenced zombie, like a body frozen mid-run,
    and is not counted as running.
    """
    return any(e.claimed_at_us is not None and e.claimed_at_us <= at_us
               and (e.completed_at_us is None or e.completed_at_us > at_us)
               for e in executions_by_step.get(witness.step_id, ()))


def _witness_intervals(history: History, keep: Callable[[str], bool]) -> dict[str, list[tuple[int, float, int]]]:
    """The keyed witnesses whose key ``keep`` accepts, as running intervals ``(start, end,
    witness index)`` by key: :func:`check_inv_lim_1`'s rules (an unended body runs until its
    execution completed; a frozen host's body until the freeze began); empty ones dropped."""
    by_step: dict[str, list[Execution]] = defaultdict(list)
    for e in history.executions:
        if e.step_id is not None:
            by_step[e.step_id].append(e)
    by_key: dict[str, list[tuple[int, float, int]]] = defaultdict(list)
    freezes = [(k["frozen_at_us"], set(k["pids"])) for k in history.kills
               if k.get("action") == "freeze_host" and k.get("frozen_at_us") is not None]
    for index, w in enumerate(history.witnesses):
        if w.key is not None and keep(w.key):
            end = _witness_end(by_step, w)
            for frozen_at_us, pids in freezes:
                if w.pid not in pids:
                    continue
                if w.started_at_us <= frozen_at_us < end:
                    end = frozen_at_us  # frozen from here, then a fenced zombie: not running
                elif frozen_at_us < w.started_at_us and _open_at(by_step, w, frozen_at_us):
                    end = w.started_at_us  # admitted before the freeze, recorded after the thaw
            if end > w.started_at_us:
                by_key[w.key].append((w.started_at_us, end, index))
    return by_key


def _peak(intervals: Iterable[tuple[int, float, int]]) -> tuple[float, list[int]]:
    """The first moment the most intervals overlap, and which (witness indexes, sorted). An
    interval ending at the very microsecond another starts does not overlap it."""
    events = sorted(ev for start, end, index in intervals for ev in ((start, +1, index), (end, -1, index)))
    running: set[int] = set()
    peak_at: float = 0.0
    peak: list[int] = []
    for at, delta, index in events:  # at equal times, ends (-1) before starts
        if delta < 0:
            running.discard(index)
        else:
            running.add(index)
            if len(running) > len(peak):
                peak_at, peak = at, sorted(running)
    return peak_at, peak


def _sweep_witnesses(history: History) -> list[str]:
    out = []
    intervals = _witness_intervals(history, lambda key: _concurrency(history, key) is not None)
    for key, running in sorted(intervals.items()):
        limit = _concurrency(history, key) or 0
        peak_at, peak = _peak(running)
        if len(peak) > limit:
            steps = ", ".join(history.witnesses[i].step_id for i in peak)
            out.append(f"INV-LIM-1: key {key!r} had {len(peak)} step bodies running at once at "
                       f"{peak_at} µs (limit {limit}): steps {steps}")
    return out


# --------------------------------------------------------------------------- INV-LIM-2


def _rate_label(rate: RateEntry) -> str:
    return f"limit {rate.limit} per {rate.per_s}s, burst {rate.burst}"


def check_inv_lim_2(history: History) -> list[str]:
    """INV-LIM-2: claims of a key in any interval of length T are at most B + L·T/P.
    Across a partition's removals too (INV-LIM-9: its buckets come back empty, so a
    removal that added tokens would put more claims in some window than the bound).

    Window bound, per key and kept rate entry (L per P s, burst B), all windows in one
    pass: with claim times t_1 ≤ … ≤ t_n (µs) and U = P·10⁶, the bound for every
    i ≤ j is ``(j·U − L·t_j) − min_{i≤j}(i·U − L·t_i) + U ≤ B·U`` (integers, exact).
    The worst window (largest excess) is reported, once per key and entry.

    Replay, per key and entry: an exact token bucket (units of 1/U token, refill
    ``dt·L`` capped at ``B·U``, no credit for ``dt ≤ 0``) starting EMPTY at the earliest
    ``eligible_at`` of the key's executions, fed the claims in ``claim_seq`` order (the
    order of the key lock), each spending one token. The first claim that finds less
    than a token is reported. Sound because the engine's bucket is created empty by
    the first claim attempt, and an attempt needs an eligible execution (module
    docstring). Proves also that the key got no free first burst. Skipped when no
    ``eligible_at`` is known.

    Does not prove: anything for keys without rate entries in ``History.limits``, or
    across a config change (re-basing discards or clamps buckets).
    """
    out: list[str] = []
    eligible: dict[str, int] = {}
    for e in history.executions:
        if e.key is not None and e.eligible_at_us is not None:
            eligible[e.key] = min(eligible.get(e.key, e.eligible_at_us), e.eligible_at_us)
    for key, claims in sorted(_keyed_claims(history).items()):
        entry = _entry(history, key)
        for rate in entry.rates if entry is not None else ():
            out += _worst_window(key, rate, claims)
            if key in eligible:
                out += _replay(key, rate, claims, eligible[key])
    return out


def _worst_window(key: str, rate: RateEntry, claims: list[Execution]) -> list[str]:
    unit, limit = rate.per_s * US_PER_S, rate.limit
    ordered = sorted(claims, key=lambda e: (e.claimed_at_us, e.claim_seq or 0, e.execution_id))
    times = [_claimed_at(e) for e in ordered]
    best_i, best_a = 0, -limit * times[0]  # a_i = i·U − L·t_i, 0-based
    worst = (-1, 0, 0)  # (excess units, i, j)
    for j, t in enumerate(times):
        a = j * unit - limit * t
        if a < best_a:
            best_i, best_a = j, a
        excess = a - best_a + unit - rate.burst * unit
        if excess > worst[0]:
            worst = (excess, best_i, j)
    excess, i, j = worst
    if excess <= 0:
        return []
    span = times[j] - times[i]
    allowed = (rate.burst * unit + limit * span) // unit
    return [f"INV-LIM-2: key {key!r} ({_rate_label(rate)}): {j - i + 1} claims in the {span} µs window "
            f"[{times[i]}, {times[j]}] (executions {ordered[i].execution_id} … {ordered[j].execution_id}), "
            f"B + L·T/P allows {allowed}"]


def _replay(key: str, rate: RateEntry, claims: list[Execution], start_us: int) -> list[str]:
    unit = rate.per_s * US_PER_S
    capacity = rate.burst * unit
    if all(e.claim_seq is not None for e in claims):
        ordered = sorted(claims, key=lambda e: (e.claim_seq, e.execution_id))
    else:
        ordered = sorted(claims, key=lambda e: (e.claimed_at_us, e.execution_id))
    level, refilled = 0, start_us
    for e in ordered:
        now = _claimed_at(e)
        if now > refilled:
            level = min(capacity, level + (now - refilled) * rate.limit)
            refilled = now
        if level < unit:
            return [f"INV-LIM-2: key {key!r} ({_rate_label(rate)}): claim_seq {e.claim_seq} (execution "
                    f"{e.execution_id}) at {now} µs found {Fraction(level, unit)} of a token in a bucket "
                    f"started empty at {start_us} µs (the key's earliest eligible_at); a claim needs 1"]
        level -= unit
    return []


# --------------------------------------------------------------------------- INV-LIM-3


def check_inv_lim_3(history: History) -> list[str]:
    """INV-LIM-3: after quiescence no slot is held: every claimed execution is completed.

    Per key (and the unkeyed lane), the executions claimed and never completed are
    the key's in-flight count as the engine derives it; it must be 0. Run only after
    the quiet phase. Does not prove that the engine *counts* a completed execution as
    released (the schema derives it, ``inflight_key``); release ordering is INV-LIM-1's.
    """
    open_by_key: dict[str, list[Execution]] = defaultdict(list)
    for e in history.executions:
        if e.claimed_at_us is not None and e.completed_at_us is None:
            open_by_key["" if e.key is None else e.key].append(e)
    out = []
    for key, held in sorted(open_by_key.items()):
        lane = "unkeyed lane" if key == "" else f"key {key!r}"
        held.sort(key=lambda e: (e.claim_seq or 0, e.execution_id))
        out.append(f"INV-LIM-3: {lane} has {len(held)} in flight after quiescence (claimed, never "
                   f"completed: {_ids(held, 'execution_id')})")
    return out


def check_inv_lim_8(history: History) -> list[str]:
    """INV-LIM-8: the executions of a key family's partitions in flight never exceed the
    family's ``concurrency`` (its ceiling), counted over all its partitions together.

    The per-partition half of INV-LIM-8 (each partition within ``per_partition``) is
    INV-LIM-1's and INV-LIM-2's, which resolve a partition to its family's entry. Here, per
    family with a ceiling, two lower bounds on the family's in-flight count, each compared
    with the ceiling at single instants:

    1. **At each claim, from claim and release times.** Every claim of a partition locks
       its family's header row first and reads database time under it (semantics §5.1,
       INV-CLK-1), so the family's claims are totally ordered by that lock and their times
       follow the order: a claim ``e`` timed strictly before a claim ``c`` held the lock
       first and had committed when ``c`` read its clock. A release reads its time before it
       commits, so an execution released at a time strictly after ``c``'s (or never) was not
       yet released then. At the instant ``c`` read its clock, then, every execution of the
       family claimed strictly before it and released strictly after it was in flight at
       once; their number must not exceed the ceiling. (``c`` itself is not counted: it is
       in flight only from its commit, whose time nobody records. Claims of one batch share
       a time and do not count each other.)
    2. **From the witness rows.** A step body runs strictly inside its execution's claim:
       its witness start is read after the claim committed (the worker got it from the
       commit) and its end before the release's transaction (its completion) began; a body
       with no end counts until its execution's ``completed_at``, and a frozen host's body
       until the freeze began, as in INV-LIM-1. So bodies whose witness intervals overlap
       had their executions in flight at once (intervals on a line that overlap pairwise
       share a point), and at no instant may more of the family's bodies run than its
       ceiling.

    Also checked: a witness of a partition names its step's key (the workload renders its
    key itself; a mismatch would make the per-partition sweeps count the wrong partition).

    Sound: every reported count is of executions provably in flight at one instant, assuming
    only that the database clock never runs backwards during the round (and, for 1., that
    claims take the family's lock before reading their time, which the engine's lock order
    promises and INV-CLK-1's per-key order corroborates). Cannot see: a release of one
    partition and a claim of another are ordered by no lock (a release takes only its
    partition's), so neither bound counts an execution between its claim's commit and the
    next family event, nor the claim being decided: the engine's own check (in flight before
    the claim + 1 ≤ ceiling) is stronger than anything the history shows, and an excess of
    one that lasts only until the next release may go unseen. Nothing is checked for a
    family without ``concurrency`` or for a config changed mid-round.
    """
    out: list[str] = []
    step_keys = {s.step_id: s.limit_key for s in history.steps}
    for w in history.witnesses:
        if w.key is not None and _family_of(history, w.key) is not None and w.step_id in step_keys \
                and step_keys[w.step_id] != w.key:
            out.append(f"INV-LIM-8: a body of step {w.step_id} named partition {w.key!r}, but the step's key "
                       f"is {step_keys[w.step_id]!r}")
    claims_of: dict[str, list[Execution]] = defaultdict(list)
    for key, claims in _keyed_claims(history).items():
        if (family := _family_of(history, key)) is not None:
            claims_of[family] += claims
    ceilings = {name: f.concurrency for name, f in history.families.items() if f.concurrency is not None}
    for family, ceiling in sorted(ceilings.items()):
        out += _family_at_claims(family, ceiling, claims_of.get(family, []))
    intervals = _witness_intervals(history, lambda key: _family_of(history, key) in ceilings)
    by_family: dict[str, list[tuple[int, float, int]]] = defaultdict(list)
    for key, running in intervals.items():
        by_family[key.partition("[")[0]] += running
    for family, running in sorted(by_family.items()):
        peak_at, peak = _peak(running)
        if len(peak) > ceilings[family]:
            bodies = ", ".join(f"{history.witnesses[i].step_id} ({history.witnesses[i].key})" for i in peak)
            out.append(f"INV-LIM-8: family {family!r} had {len(peak)} step bodies running at once at {peak_at} µs "
                       f"(ceiling {ceilings[family]}): {bodies}")
    return out


def _family_at_claims(family: str, ceiling: int, claims: list[Execution]) -> list[str]:
    """Bound 1 of :func:`check_inv_lim_8`: the first claim at whose time more than
    ``ceiling`` executions of ``family`` were provably in flight."""
    ordered = sorted(claims, key=lambda e: (_claimed_at(e), e.execution_id))
    for c in ordered:
        at = _claimed_at(c)
        held = [e for e in ordered if _claimed_at(e) < at
                and (e.completed_at_us is None or e.completed_at_us > at)]
        if len(held) > ceiling:
            listed = ", ".join(f"{e.execution_id} ({e.key})" for e in held)
            return [f"INV-LIM-8: family {family!r} had {len(held)} executions in flight (ceiling {ceiling}) when "
                    f"execution {c.execution_id} ({c.key}) was claimed at {at} µs: {listed}"]
    return []


def check_inv_clk_1(history: History) -> list[str]:
    """INV-CLK-1: a key's events are timed by the database clock read under its lock.

    Every claim and every release of a keyed execution takes the key's next sequence
    number under the key's lock and stamps the event with database time read after
    that lock; so, per key, times in sequence order never go backwards. A claim that
    read its clock before the lock (and waited for it) carries an earlier time than
    the claim that held the lock before it; a partition's row forgotten and created again
    (INV-LIM-9) numbers on above the old one's, so this holds across a forget. Proves the
    ordering only; assumes the database clock itself never steps back during a round.
    """
    out = []
    events: dict[str, list[tuple[int, int, str, str]]] = defaultdict(list)
    for e in history.executions:
        if e.key is None:
            continue
        if e.claim_seq is not None and e.claimed_at_us is not None:
            events[e.key].append((e.claim_seq, e.claimed_at_us, "claim", e.execution_id))
        if e.release_seq is not None and e.completed_at_us is not None:
            events[e.key].append((e.release_seq, e.completed_at_us, "release", e.execution_id))
    for key, seq in sorted(events.items()):
        seq.sort()
        for (s1, t1, k1, id1), (s2, t2, k2, id2) in itertools.pairwise(seq):
            if t2 < t1:
                out.append(f"INV-CLK-1: key {key!r}: {k2} seq {s2} of {id2} at {t2} us is earlier than "
                           f"{k1} seq {s1} of {id1} at {t1} us")
    return out


def check_inv_lim_4(history: History) -> list[str]:
    """INV-LIM-4: every stored bucket level lies in [0, burst] of the round's config.

    A bucket whose period the config no longer keeps is ignored (it is never
    consulted). Proves the stored state only at the end of the round, not at
    every instant (the conformance machine compares levels after every step).
    """
    out = []
    for bucket in history.buckets:
        entry = _entry(history, bucket.key)
        rate = next((r for r in (entry.rates if entry else ()) if r.per_s == bucket.period_s), None)
        if rate is None:
            continue
        if not 0 <= bucket.level_units <= rate.capacity_units:
            out.append(f"INV-LIM-4: key {bucket.key!r} bucket per {bucket.period_s}s holds "
                       f"{bucket.level_units} units, outside [0, {rate.capacity_units}]")
    return out


def check_inv_exe_2(history: History) -> list[str]:
    """INV-EXE-2: a step's outcome is recorded once: no step has two successes, no
    execution was completed without having been claimed, and a step has at most one
    open execution. (A step's *code* may run more than once; its recorded completion
    may not.)"""
    out = []
    successes: dict[str, list[str]] = defaultdict(list)
    open_: dict[str, list[str]] = defaultdict(list)
    for e in history.executions:
        if e.outcome == "success":
            successes[e.step_id].append(e.execution_id)
        if e.completed_at_us is not None and e.claimed_at_us is None:
            out.append(f"INV-EXE-2: execution {e.execution_id} has an outcome but was never claimed")
        if e.completed_at_us is None:
            open_[e.step_id].append(e.execution_id)
    for step, ids in sorted(successes.items()):
        if len(ids) > 1:
            out.append(f"INV-EXE-2: step {step} succeeded {len(ids)} times: {', '.join(ids)}")
    for step, ids in sorted(open_.items()):
        if len(ids) > 1:
            out.append(f"INV-EXE-2: step {step} has {len(ids)} open executions: {', '.join(ids)}")
    return out


def check_inv_exe_4(history: History) -> list[str]:
    """INV-EXE-4: no step ran past its budgets: retry_count <= max_retry and
    crash_count <= max_crash on every execution (budgets from ``history.meta``,
    which the harness records; skipped when absent)."""
    max_retry, max_crash = history.meta.get("max_retry"), history.meta.get("max_crash")
    if max_retry is None or max_crash is None:
        return []
    return [f"INV-EXE-4: execution {e.execution_id} of step {e.step_id} has retry_count {e.retry_count} "
            f"(max {max_retry}) and crash_count {e.crash_count} (max {max_crash})"
            for e in history.executions if e.retry_count > max_retry or e.crash_count > max_crash]


# --------------------------------------------------------------------------- pipeline index


@dataclass
class _Index:
    """Lookups over a history's runs, branches and steps that ADV/RUN checks share."""

    history: History
    definitions: dict[str, Definition] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    branches: dict[str, BranchRow] = field(default_factory=dict)
    #: steps of each branch in creation order (started_at, then the time-ordered id)
    steps_of: dict[str, list[StepRow]] = field(default_factory=lambda: defaultdict(list))
    #: branches standing at each barrier's level (barrier_id), fan-out children and merges
    level_of: dict[str, list[BranchRow]] = field(default_factory=lambda: defaultdict(list))
    merges_of: dict[str, list[BranchRow]] = field(default_factory=lambda: defaultdict(list))
    branches_of_run: dict[str, list[BranchRow]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        for run in self.history.runs:
            try:
                self.definitions[run.run_id] = Definition.from_json(run.definition)
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                self.errors.append(f"run {run.run_id} has an unreadable definition snapshot: {error}")
        for b in self.history.branches:
            self.branches[b.branch_id] = b
            self.branches_of_run[b.run_id].append(b)
            if b.barrier_id is not None:
                self.level_of[b.barrier_id].append(b)
            if b.merged_barrier_id is not None:
                self.merges_of[b.merged_barrier_id].append(b)
        for s in self.history.steps:
            self.steps_of[s.branch_id].append(s)
        for steps in self.steps_of.values():
            steps.sort(key=lambda s: (s.started_at_us, s.step_id))

    def last_step(self, branch_id: str) -> StepRow | None:
        steps = self.steps_of.get(branch_id)
        return steps[-1] if steps else None

    def first_step(self, branch_id: str) -> StepRow | None:
        steps = self.steps_of.get(branch_id)
        return steps[0] if steps else None

    def edge(self, step: StepRow) -> EdgeSpec | None:
        definition = self.definitions.get(step.run_id)
        return None if definition is None else definition.edges.get(step.node)

    def arrivals(self, barrier: BranchRow) -> list[BranchRow]:
        return sorted((b for b in self.level_of.get(barrier.branch_id, ()) if b.fanin_arrived_at_us is not None),
                      key=lambda b: (b.barrier_index if b.barrier_index is not None else -1, b.branch_id))

    def fan_in_complete(self, barrier: BranchRow) -> bool:
        """Every index of the barrier's fan-out arrived, each once."""
        indices = [b.barrier_index for b in self.arrivals(barrier)]
        width = barrier.fanout_width
        if width is None or None in indices:
            return False
        return sorted(indices) == list(range(width))  # type: ignore[type-var]

    def fan_in_target(self, barrier: BranchRow) -> tuple[str, str] | None:
        """(kind, node) of the fan-in edge the barrier's arrived siblings completed, if any."""
        for arrived in self.arrivals(barrier):
            last = self.last_step(arrived.branch_id)
            edge = None if last is None else self.edge(last)
            if edge is not None and edge.type in FAN_IN:
                return edge.type, edge.to[0]  # type: ignore[index]
        return None


# --------------------------------------------------------------------------- INV-ADV-1

Slot = tuple  # ("root", run) | ("child", parent, index) | ("merge", barrier) | ("step", branch, node)


def _slot_name(slot: Slot) -> str:
    kind = slot[0]
    if kind == "root":
        return f"root branch of run {slot[1]}"
    if kind == "child":
        return f"child branch {slot[2]} of branch {slot[1]}"
    if kind == "merge":
        return f"merge branch of barrier {slot[1]}"
    return f"step {slot[2]} on branch {slot[1]}"


def _branch_slot(b: BranchRow) -> Slot:
    if b.parent_id is not None:
        return ("child", b.parent_id, b.barrier_index)
    if b.merged_barrier_id is not None:
        return ("merge", b.merged_barrier_id)
    return ("root", b.run_id)


@dataclass
class _Expected:
    """What the history's completed transitions should have created."""

    ix: _Index
    actual: dict[Slot, list[str]]
    slots: dict[Slot, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: (step slot, expected input, transition, predecessor) for the input checks
    inputs: list[tuple[Slot, Any, str, str]] = field(default_factory=list)
    out: list[str] = field(default_factory=list)

    def step(self, branch_id: str, node: str, pred: str, transition: str, value: Any = ...) -> None:
        slot = ("step", branch_id, node)
        self.slots[slot].append(pred)
        self.inputs.append((slot, value, transition, pred))

    def children(self, parent: str, nodes: list[str], pred: str, transition: str, values: list) -> None:
        for index, node in enumerate(nodes):
            slot = ("child", parent, index)
            self.slots[slot].append(pred)
            for child in self.actual.get(slot, ()):
                self.step(child, node, pred, transition, values[index])


def check_inv_adv_1(history: History) -> list[str]:
    """INV-ADV-1: every completed step's transition created its successors exactly once
    (and INV-ADV-4: an expand created exactly one child per item).

    From each run's definition snapshot, each ``completed`` step S on branch b with
    edge E must have created: chain/converge → a step for ``E.to[0]`` on b; divert →
    on b, a step for ``E.to[render_divert_key(output)]`` else ``E.to["otherwise"]``;
    divide → child branch i of b (``parent_id`` b, ``barrier_index`` i) with a step
    for ``E.to[i]``; expand of N items → N such children with a step for ``E.to[0]``
    (N = 0: nothing); dampen → a step for ``E.to[0]`` on b once resumed (b not
    dampened at S), else nothing; combine/collapse → b's arrival at its barrier; leaf
    → nothing. Each barrier whose every index arrived → one merge branch with a step
    for the fan-in target. The trigger → one root branch with the start step. Not
    completed steps (and the halting step of a halted branch, whose halt reason must
    match its status) → nothing, except that an expand halted between batches keeps
    the children its committed batches created (indices below ``fanout_cursor``).
    These expectations are compared as a multiset with every branch and step
    present: none lost, none duplicated, none unexpected (steps on an unexpected
    branch are not listed again). Successor inputs must be
    ``[output(S)]`` (divide, chain, converge, divert), ``[items[i]]`` (expand, when
    the items were recorded), with the matching ``to_transition``; a fan-out branch's
    ``fanout_width`` must be its number of children.

    Does not prove: the resumed input of a dampen (the caller's), merge inputs
    (INV-ADV-3), or that a step ran at all (INV-EXE-1).
    """
    ix = _Index(history)
    actual: dict[Slot, list[str]] = defaultdict(list)
    for b in history.branches:
        actual[_branch_slot(b)].append(b.branch_id)
    for s in history.steps:
        actual[("step", s.branch_id, s.node)].append(s.step_id)
    exp = _Expected(ix, actual, out=[f"INV-ADV-1: {error}" for error in ix.errors])
    for run in history.runs:
        exp.slots[("root", run.run_id)].append(f"the trigger of run {run.run_id}")
        definition = ix.definitions.get(run.run_id)
        for root in actual.get(("root", run.run_id), ()):
            if definition is not None:
                exp.step(root, definition.start, f"the trigger of run {run.run_id}", "start")
    for branch in history.branches:
        steps = ix.steps_of.get(branch.branch_id, [])
        for position, step in enumerate(steps):
            _expect_from_step(exp, branch, step, last=position == len(steps) - 1)
        if ix.fan_in_complete(branch):
            target = ix.fan_in_target(branch)
            pred = f"barrier {branch.branch_id} (all {branch.fanout_width} arrived)"
            exp.slots[("merge", branch.branch_id)].append(pred)
            for merge in actual.get(("merge", branch.branch_id), ()):
                if target is not None:
                    exp.step(merge, target[1], pred, target[0])
    return exp.out + _compare(exp, history)


#: halt reason → the statuses its halting step may have: a job's spent budget leaves the step
#: failed; a routing error completes it; the advancer's budgets can run out on either
_HALTED_AT = {"job_retries_exhausted": ("failed",), "job_crashes_exhausted": ("failed",),
              "job_invalid": ("failed",), "unknown_step_class": ("failed",),
              "transition_invalid": ("completed",)}


def _expect_from_step(exp: _Expected, branch: BranchRow, step: StepRow, *, last: bool) -> None:
    ix, out = exp.ix, exp.out
    edge = ix.edge(step)
    kind, b = (edge.type if edge else "leaf"), branch.branch_id
    pred = f"step {step.step_id} ({step.node} --{kind}-->)"
    if branch.status == "halted" and last:
        allowed = _HALTED_AT.get(branch.halt_reason or "", ("completed", "failed"))
        if step.status not in allowed:
            out.append(f"INV-ADV-1: branch {b} halted ({branch.halt_reason}) at step {step.step_id}, "
                       f"which is {step.status}, not {' or '.join(allowed)}")
        elif kind == "expand" and branch.fanout_cursor:
            # halted between expand batches: the batches committed before the halt stand
            _expect_expand(exp, branch, step, edge, pred, branch.fanout_cursor)  # type: ignore[arg-type]
        return
    if step.status != "completed" or edge is None:
        return
    if kind == "dampen":
        if not (branch.status == "dampened" and last):
            exp.step(b, edge.to[0], pred, kind)  # type: ignore[index]
    elif kind in FAN_IN:
        if branch.fanin_arrived_at_us is None:
            out.append(f"INV-ADV-1: lost successor: {pred} completed but branch {b} never arrived at "
                       f"its barrier {branch.barrier_id}")
    elif kind == "expand":
        _expect_expand(exp, branch, step, edge, pred, None)
    elif not step.has_output:
        out.append(f"INV-ADV-1: {pred} completed without an output")
    elif kind == "divide":
        _check_width(out, branch, pred, len(edge.to))
        exp.children(b, list(edge.to), pred, kind, [[step.output]] * len(edge.to))
    elif kind == "divert":
        rendered = render_divert_key(step.output)
        target = edge.to.get(rendered) if rendered is not None else None  # type: ignore[union-attr]
        exp.step(b, target or edge.to["otherwise"], pred, kind, [step.output])  # type: ignore[call-overload]
    else:  # chain, converge
        exp.step(b, edge.to[0], pred, kind, [step.output])  # type: ignore[index]


def _expect_expand(exp: _Expected, branch: BranchRow, step: StepRow, edge: EdgeSpec, pred: str,
                   prefix: int | None) -> None:
    """Children 0..N-1 of an expand (only the first ``prefix`` when it halted part-way)."""
    count = step.expand_count
    if count is None:
        exp.out.append(f"INV-ADV-1: {pred} completed without an expand_items count")
        return
    items = step.expand_items if step.expand_items is not None and len(step.expand_items) == count else None
    values = [[v] for v in items] if items is not None else [...] * count
    if prefix is None:
        _check_width(exp.out, branch, pred, count)
    else:
        count = min(prefix, count)
    exp.children(branch.branch_id, [edge.to[0]] * count, pred, "expand", values[:count])  # type: ignore[index]


def _check_width(out: list[str], branch: BranchRow, pred: str, width: int) -> None:
    if width and branch.fanout_width != width:
        out.append(f"INV-ADV-1: {pred} fanned out {width} children but branch {branch.branch_id} "
                   f"records fanout_width {branch.fanout_width}")


def _compare(exp: _Expected, history: History) -> list[str]:
    out: list[str] = []
    unexpected_branches: set[str] = set()
    slots = list(exp.slots) + [slot for slot in exp.actual if slot not in exp.slots]
    slots.sort(key=lambda slot: slot[0] == "step")  # branches first, so their steps can be skipped
    for slot in slots:
        preds, found = exp.slots.get(slot, []), exp.actual.get(slot, [])
        wanted, name = len(preds), _slot_name(slot)
        if not wanted:
            if slot[0] == "step" and slot[1] in unexpected_branches:
                continue
            if slot[0] != "step":
                unexpected_branches.update(found)
            out.append(f"INV-ADV-1: unexpected {name} ({', '.join(found)}): no completed transition explains it")
        elif len(found) < wanted:
            out.append(f"INV-ADV-1: lost successor: {'; '.join(preds)} should have created {name} "
                       f"{_times(wanted)}; found {len(found) or 'none'}")
        elif len(found) > wanted:
            out.append(f"INV-ADV-1: duplicated successor: {'; '.join(preds)} should have created {name} "
                       f"{_times(wanted)}; found {len(found)} ({', '.join(found)})")
    steps = {s.step_id: s for s in history.steps}
    for slot, value, transition, pred in exp.inputs:
        for step_id in exp.actual.get(slot, ()):
            step = steps[step_id]
            if value is not ... and _canon(step.input) != _canon(value):
                out.append(f"INV-ADV-1: step {step_id} ({step.node} on branch {step.branch_id}) has input "
                           f"{_canon(step.input)}, expected {_canon(value)} from {pred}")
            if step.to_transition != transition:
                out.append(f"INV-ADV-1: step {step_id} ({step.node} on branch {step.branch_id}) has "
                           f"to_transition {step.to_transition!r}, expected {transition!r} from {pred}")
    return out


# --------------------------------------------------------------------------- INV-ADV-3


def check_inv_adv_3(history: History) -> list[str]:
    """INV-ADV-3: each fan-in fires exactly once, after every sibling arrived, with all outputs.

    For each barrier (a branch with ``fanout_width`` w) and the branches standing at
    its level (``barrier_id`` = it; fan-out children and merges standing in for
    them): each index arrives at most once and within [0, w); every arrived branch's
    latest step is a completed combine/collapse step; ``fanin_arrivals`` equals the
    number arrived; at most one merge branch (``merged_barrier_id``), only when all w
    indices arrived, and one if they did; the merge stands in the barrier's place
    (its ``barrier_id``/``barrier_index``) and its first step's input is
    ``[[output of each arrived branch's latest step, by barrier_index]]``. Arrivals
    at a branch that never fanned out are reported too.

    Does not prove: that the merge fired after the last arrival in time (the
    timestamps of separate transactions cannot order them; counts do).
    """
    ix = _Index(history)
    out: list[str] = []
    for barrier_id, level in sorted(ix.level_of.items()):
        barrier = ix.branches.get(barrier_id)
        if barrier is None or barrier.fanout_width is None:
            for b in level:
                if b.fanin_arrived_at_us is not None:
                    out.append(f"INV-ADV-3: branch {b.branch_id} arrived at {barrier_id}, which never fanned out")
    for barrier in history.branches:
        width = barrier.fanout_width
        if width is None:
            continue
        bid = barrier.branch_id
        arrived = ix.arrivals(barrier)
        per_index = Counter(b.barrier_index for b in arrived)
        for index, count in sorted(per_index.items(), key=lambda item: (item[0] is None, item[0] or 0)):
            if index is None or not 0 <= index < width:
                out.append(f"INV-ADV-3: barrier {bid} (width {width}): a branch arrived at index {index}")
            elif count > 1:
                twins = [b for b in arrived if b.barrier_index == index]
                out.append(f"INV-ADV-3: barrier {bid}: index {index} arrived {_times(count)} "
                           f"(branches {_ids(twins, 'branch_id')})")
        if barrier.fanin_arrivals != len(arrived):
            out.append(f"INV-ADV-3: barrier {bid} counts {barrier.fanin_arrivals} arrivals but "
                       f"{len(arrived)} siblings arrived")
        outputs = []
        for b in arrived:
            last = ix.last_step(b.branch_id)
            edge = None if last is None else ix.edge(last)
            if last is None or last.status != "completed" or edge is None or edge.type not in FAN_IN:
                what = "none" if last is None else f"{last.step_id} ({last.node}, {last.status})"
                out.append(f"INV-ADV-3: branch {b.branch_id} arrived at barrier {bid} without completing "
                           f"a fan-in step (latest step: {what})")
            outputs.append(last.output if last is not None and last.has_output else None)
        merges = sorted(ix.merges_of.get(bid, []), key=lambda b: b.branch_id)
        complete = ix.fan_in_complete(barrier)
        if len(merges) > 1:
            out.append(f"INV-ADV-3: barrier {bid} merged {len(merges)} times (branches {_ids(merges, 'branch_id')})")
        if merges and not complete:
            indices = sorted(per_index.elements(), key=lambda i: (i is None, i or 0))
            out.append(f"INV-ADV-3: barrier {bid} merged before each of its {width} indices arrived once: "
                       f"arrived {indices} (merge {_ids(merges, 'branch_id')})")
        if not merges and complete:
            out.append(f"INV-ADV-3: barrier {bid}: all {width} siblings arrived but it never merged")
        for merge in merges:
            out += _check_merge(ix, barrier, merge, [outputs] if complete else None)
    return out


def _check_merge(ix: _Index, barrier: BranchRow, merge: BranchRow, expected: list | None) -> list[str]:
    out = []
    bid, mid = barrier.branch_id, merge.branch_id
    if (merge.barrier_id, merge.barrier_index) != (barrier.barrier_id, barrier.barrier_index):
        out.append(f"INV-ADV-3: merge {mid} of barrier {bid} stands at barrier {merge.barrier_id} index "
                   f"{merge.barrier_index}, expected barrier {barrier.barrier_id} index {barrier.barrier_index}")
    first = ix.first_step(mid)
    if expected is not None and first is not None and _canon(first.input) != _canon(expected):
        hint = " (the same outputs, out of order)" if _same_items(first.input, expected) else ""
        out.append(f"INV-ADV-3: barrier {bid} merge step {first.step_id} has input {_canon(first.input)}, "
                   f"expected the arrived outputs by barrier_index {_canon(expected)}{hint}")
    return out


def _same_items(actual: Any, expected: list) -> bool:
    """``[[…]]`` holding the expected outputs in another order."""
    if not (isinstance(actual, list) and len(actual) == 1 and isinstance(actual[0], list)):
        return False
    return sorted(map(_canon, actual[0])) == sorted(map(_canon, expected[0]))


# --------------------------------------------------------------------------- INV-EXE-1


def check_inv_exe_1(history: History) -> list[str]:
    """INV-EXE-1: after the quiet phase, no work is lost or stuck.

    Every execution is completed (none pending, none in flight); every step has an
    execution; every run is completed, halted or dampened; no branch is
    ``advancing`` or holds a claim token. Run only after the quiet phase (faults off,
    live workers, delays waited out). Does not prove that the outcomes are right.
    """
    out = []
    executed = {e.step_id for e in history.executions}
    revived = {r.run_id for r in history.runs if r.revived_from is not None}
    for e in history.executions:
        if e.completed_at_us is None:
            state = "pending" if e.claimed_at_us is None else f"in flight (claimed at {e.claimed_at_us} µs)"
            out.append(f"INV-EXE-1: execution {e.execution_id} (step {e.step_id}, run {e.run_id}) is still "
                       f"{state} after the quiet phase")
    for s in history.steps:
        if s.step_id not in executed and not (s.run_id in revived and s.status == "completed"):
            # (a completed step of a revived run without execution is carried-over history)
            out.append(f"INV-EXE-1: step {s.step_id} ({s.node}, run {s.run_id}) has no execution")
    for r in history.runs:
        if r.status not in SETTLED_RUNS:
            out.append(f"INV-EXE-1: run {r.run_id} is still {r.status} after the quiet phase")
    for b in history.branches:
        if b.status == "advancing" or b.claim_token is not None:
            state = "advancing" if b.status == "advancing" else f"{b.status} with a claim token"
            out.append(f"INV-EXE-1: branch {b.branch_id} (run {b.run_id}) is still {state} after the quiet phase")
    return out


# --------------------------------------------------------------------------- INV-EXE-3


def check_inv_exe_3(history: History) -> list[str]:
    """INV-EXE-3: ``idempotency_key`` is the step's id, equal across its executions, unique.

    Over witness rows (what the step bodies saw as ``self.idempotency_key``): all
    witnesses of one step carry one key, equal to the step id, or for a step a revive
    re-enqueued to the key it records (the failed step's); no two steps share a key but a
    re-run step and the steps it re-runs; every witnessed step exists. Does not prove
    anything for steps whose bodies wrote no witness.
    """
    out = []
    known = {s.step_id for s in history.steps}
    own_key = {s.step_id: s.key for s in history.steps}
    keys_of: dict[str, list[str]] = defaultdict(list)
    steps_of: dict[str, list[str]] = defaultdict(list)
    for w in history.witnesses:
        if w.idempotency_key not in keys_of[w.step_id]:
            keys_of[w.step_id].append(w.idempotency_key)
        if w.step_id not in steps_of[w.idempotency_key]:
            steps_of[w.idempotency_key].append(w.step_id)
    for step_id, keys in keys_of.items():
        if history.steps and step_id not in known:
            out.append(f"INV-EXE-3: witnesses name step {step_id}, which does not exist")
        if len(keys) > 1:
            out.append(f"INV-EXE-3: step {step_id} ran with {len(keys)} idempotency keys: "
                       + ", ".join(map(repr, keys)))
        for key in keys:
            if key != own_key.get(step_id, step_id):
                out.append(f"INV-EXE-3: step {step_id} ran with idempotency key {key!r}, not its step id")
    for key, step_ids in steps_of.items():
        if len(step_ids) > 1 and any(own_key.get(s, s) != key for s in step_ids):
            out.append(f"INV-EXE-3: idempotency key {key!r} shared by steps {', '.join(step_ids)}")
    return out


# --------------------------------------------------------------------------- INV-RUN-1


def check_inv_run_1(history: History) -> list[str]:
    """INV-RUN-1: each run's state agrees with its branches, and terminal states were final.

    completed ⇒ every branch completed; halted ⇒ some branch halted, none active
    (``in_progress``/``advancing``), none dampened; dampened ⇒ some branch dampened,
    none active; in_progress ⇒ some branch active (holds at any moment: resolution
    runs in the transaction that ends a branch). ``completed_at`` is set only by
    becoming completed and ``halted_at`` only by halting, so a run carrying one with
    another status left a terminal state. Does not prove finality of a run whose
    timestamps were never written, nor that runs settle (INV-EXE-1).
    """
    ix = _Index(history)
    out = []
    for run in history.runs:
        rid, status = run.run_id, run.status
        branches = ix.branches_of_run.get(rid, [])
        by_status: dict[str, list[BranchRow]] = defaultdict(list)
        for b in branches:
            by_status[b.status].append(b)
        active = [b for b in branches if b.status in ACTIVE_BRANCHES]

        def listed(bs: list[BranchRow]) -> str:
            return ", ".join(f"{b.branch_id} ({b.status})" for b in bs)

        if not branches:
            out.append(f"INV-RUN-1: run {rid} ({status}) has no branch")
        elif status == "completed":
            others = [b for b in branches if b.status != "completed"]
            if others:
                out.append(f"INV-RUN-1: run {rid} is completed but has branches not completed: {listed(others)}")
        elif status in ("halted", "dampened"):
            if not by_status[status]:
                out.append(f"INV-RUN-1: run {rid} is {status} but no branch is {status}")
            if active:
                out.append(f"INV-RUN-1: run {rid} is {status} but has active branches: {listed(active)}")
            if status == "halted" and by_status["dampened"]:
                out.append(f"INV-RUN-1: run {rid} is halted but has dampened branches: "
                           f"{listed(by_status['dampened'])}")
        elif status == "in_progress" and not active:
            out.append(f"INV-RUN-1: run {rid} is in_progress but no branch is active")
        for stamp, terminal in ((run.completed_at_us, "completed"), (run.halted_at_us, "halted")):
            if stamp is not None and status != terminal:
                out.append(f"INV-RUN-1: run {rid} was {terminal} at {stamp} µs but is now {status}")
    return out


# --------------------------------------------------------------------------- INV-HLT (issue 16)


def check_inv_hlt_1(history: History) -> list[str]:
    """INV-HLT-1: one hook per run, only for a halted run whose snapshot names the handler,
    its outcome recorded once: a hook has a ``completed_at`` exactly when it is final
    (``succeeded``/``failed``), a final hook holds no claim token, and a ``succeeded`` one
    ended with a success. Does not see attempts a kill erased."""
    out = []
    runs = {r.run_id: r for r in history.runs}
    per_run: dict[str, list[str]] = defaultdict(list)
    for hook in history.hooks:
        per_run[hook.run_id].append(hook.hook_id)
        run = runs.get(hook.run_id)
        on_halt = run.definition.get("on_halt") if run is not None and isinstance(run.definition, dict) else None
        if run is None or run.status != "halted" or on_halt != hook.klass:
            out.append(f"INV-HLT-1: hook {hook.hook_id} names {hook.klass!r} for run {hook.run_id} "
                       f"({'missing' if run is None else run.status}, on_halt {on_halt!r})")
        final = hook.status in ("succeeded", "failed")
        if final != (hook.completed_at_us is not None):
            out.append(f"INV-HLT-1: hook {hook.hook_id} is {hook.status} with completed_at {hook.completed_at_us}")
        if final and hook.claim_token is not None:
            out.append(f"INV-HLT-1: hook {hook.hook_id} is {hook.status} but still holds claim {hook.claim_token}")
        if hook.status == "succeeded" and hook.last_outcome != "success":
            out.append(f"INV-HLT-1: hook {hook.hook_id} succeeded with last outcome {hook.last_outcome}")
    for run_id, hooks in per_run.items():
        if len(hooks) > 1:
            out.append(f"INV-HLT-1: run {run_id} has {len(hooks)} hooks: {', '.join(hooks)}")
    return out


def check_inv_hlt_2(history: History) -> list[str]:
    """INV-HLT-2: every halted run whose snapshot names an ``on_halt`` handler has its hook,
    and (the history is read after the quiet phase) the hook ended within its budgets:
    counters at most ``max_retry``/``max_crash`` (``meta``), ``failed`` only with a
    budget spent or a handler that cannot be built. Does not prove the handler ran (it
    writes no witness): that is the fault-checkpoint tests'."""
    out = []
    hooked = {hook.run_id for hook in history.hooks}
    max_retry, max_crash = history.meta.get("max_retry"), history.meta.get("max_crash")
    for run in history.runs:
        on_halt = run.definition.get("on_halt") if isinstance(run.definition, dict) else None
        if run.status == "halted" and on_halt is not None and run.run_id not in hooked:
            out.append(f"INV-HLT-2: halted run {run.run_id} owes no hook to {on_halt!r}")
    for hook in history.hooks:
        if hook.status not in ("succeeded", "failed"):
            out.append(f"INV-HLT-2: hook {hook.hook_id} of run {hook.run_id} is {hook.status} after the quiet phase")
        if max_retry is not None and hook.retry_count > max_retry:
            out.append(f"INV-HLT-2: hook {hook.hook_id} retried {hook.retry_count} times (max_retry {max_retry})")
        if max_crash is not None and hook.crash_count > max_crash:
            out.append(f"INV-HLT-2: hook {hook.hook_id} re-run {hook.crash_count} times (max_crash {max_crash})")
        if hook.status == "failed" and max_retry is not None and max_crash is not None:
            spent = (hook.last_outcome == "invalid"
                     or (hook.last_outcome == "failure" and hook.retry_count == max_retry)
                     or (hook.last_outcome == "process_crashed" and hook.crash_count == max_crash))
            if not spent:
                out.append(f"INV-HLT-2: hook {hook.hook_id} failed after {hook.last_outcome} with budget left "
                           f"({hook.retry_count}/{max_retry} retries, {hook.crash_count}/{max_crash} crashes)")
    return out


# --------------------------------------------------------------------------- retention


def _prunes(history: History) -> list[dict]:
    """The harness's prune records (``kills`` with ``action == "prune"`` that ran)."""
    return [k for k in history.kills if k.get("action") == "prune" and "before" in k]


def _cutoff_us(prune: dict) -> int | None:
    from ductwork_proof.history import to_us

    return to_us(prune["cutoff"]) if prune.get("cutoff") else None


def check_inv_prn_1(history: History) -> list[str]:
    """INV-PRN-1: a prune deleted only runs that were completed or halted, and finished
    before its cutoff.

    For each prune the harness read every run of the pruned pipeline (status, finish
    time) just before it, and which still existed just after. A run that went in between
    must have been completed or halted before the prune, finished before its cutoff (the
    line ``ductwork prune`` prints before its first batch). Assumes nothing else deletes
    runs. A run that was live in the read before and finished before a cutoff later than
    that read (a prune slow to start) cannot be judged and is not reported; a prune
    killed before printing its cutoff is judged by status alone.

    Independently of timing: a run seen ``dampened`` by any read stays dampened (the
    harness resumes none of the pruned pipeline's runs), so it must still be there at
    the end.
    """
    out = []
    runs = {run.run_id for run in history.runs}
    dampened = {run_id for prune in _prunes(history) for run_id, (status, _) in prune["before"].items()
                if status == "dampened"}
    for run_id in sorted(dampened - runs):
        out.append(f"INV-PRN-1: run {run_id} was dampened (live) and is gone")
    for prune in _prunes(history):
        cutoff = _cutoff_us(prune)
        gone = set(prune["before"]) - set(prune["after"])
        for run_id in sorted(gone):
            status, finished = prune["before"][run_id]
            if status not in ("completed", "halted"):
                if cutoff is None or cutoff <= prune["before_us"]:
                    out.append(f"INV-PRN-1: prune at {prune.get('at_s')} s deleted run {run_id}, which was {status}")
            elif cutoff is not None and (finished is None or finished >= cutoff):
                out.append(f"INV-PRN-1: prune at {prune.get('at_s')} s deleted run {run_id}, finished at "
                           f"{finished} µs, not before its cutoff {cutoff} µs")
    return out


def check_inv_prn_2(history: History) -> list[str]:
    """INV-PRN-2: a pruned run left no row, and every run is whole.

    No branch, step or execution names a run that is not in the history (a prune killed
    inside a batch must not leave part of a run); every run has a branch and a step; no
    run a prune deleted is present at the end; after the round's last prune (no fault),
    no run of the pruned pipeline that finished before its cutoff is left (a killed
    prune's work was finished). Assumes the harness's last record is that last prune.
    """
    out = []
    runs = {run.run_id for run in history.runs}
    for kind, rows in (("branch", history.branches), ("step", history.steps), ("execution", history.executions)):
        for row in rows:
            if row.run_id is not None and row.run_id not in runs:
                ident = getattr(row, f"{kind}_id")
                out.append(f"INV-PRN-2: {kind} {ident} belongs to run {row.run_id}, which has no run row")
    with_branch = {b.run_id for b in history.branches}
    with_step = {s.run_id for s in history.steps}
    for run_id in sorted(runs - (with_branch & with_step)):
        out.append(f"INV-PRN-2: run {run_id} has {'no branch' if run_id not in with_branch else 'no step'}")
    prunes = _prunes(history)
    for prune in prunes:
        for run_id in sorted((set(prune["before"]) - set(prune["after"])) & runs):
            out.append(f"INV-PRN-2: run {run_id}, deleted by the prune at {prune.get('at_s')} s, is back")
    last = [p for p in prunes if p.get("last")]
    if last and last[-1].get("cutoff"):
        cutoff = _cutoff_us(last[-1])
        assert cutoff is not None
        for run_id, (status, finished) in sorted(last[-1]["before"].items()):
            if (run_id in runs and status in ("completed", "halted") and finished is not None
                    and finished < cutoff):
                out.append(f"INV-PRN-2: run {run_id} ({status}, finished before the last prune's cutoff) is left")
    return out


# --------------------------------------------------------------------------- all

# --------------------------------------------------------------------------- INV-REV (revive)


def _revivals(history: History) -> list[tuple[Any, Any]]:
    """``(halted run, run that revives it)`` rows; a source missing from the history is None."""
    runs = {r.run_id: r for r in history.runs}
    return [(runs.get(r.revived_from), r) for r in history.runs if r.revived_from is not None]


def _carried(steps: list[StepRow]) -> Counter[tuple[str, str]]:
    return Counter((s.node, _canon(s.input)) for s in steps)


def check_inv_rev_1(history: History) -> list[str]:
    """INV-REV-1: one new run per revive. At most one run names a halted run in
    ``revived_from``, the run it names was halted, and every revive call the harness
    made (``meta["revives"]``, two threads at once per halted run) got that run back.
    Does not prove anything about calls whose transaction the faults broke (recorded as
    errors)."""
    out = []
    by_source: dict[str, list[str]] = defaultdict(list)
    for source, run in _revivals(history):
        by_source[run.revived_from].append(run.run_id)
        if source is None or source.status != "halted":
            out.append(f"INV-REV-1: run {run.run_id} revives {run.revived_from}, which is "
                       f"{'missing' if source is None else source.status}, not halted")
    for source_id, runs in by_source.items():
        if len(runs) > 1:
            out.append(f"INV-REV-1: run {source_id} was revived {len(runs)} times: {', '.join(runs)}")
    for call in history.meta.get("revives", []):
        existing = by_source.get(call["run"], [])
        for got in call["got"]:
            if existing[:1] != [got]:
                out.append(f"INV-REV-1: a revive of {call['run']} returned {got}, but the run that revives it "
                           f"is {existing or 'none'}")
    return out


def check_inv_rev_2(history: History) -> list[str]:
    """INV-REV-2: a revive re-executes and re-advances no succeeded step. For each revived
    run: its steps without an execution (carried over) are, as a multiset of (node, input),
    exactly the halted run's steps that had not failed; each is completed; no witness names
    one (its body never ran again). Steps are matched by node and input, not by link."""
    out = []
    executed = {e.step_id for e in history.executions}
    witnessed = {w.step_id for w in history.witnesses}
    steps_of: dict[str, list[StepRow]] = defaultdict(list)
    for s in history.steps:
        steps_of[s.run_id].append(s)
    for source, run in _revivals(history):
        if source is None:
            continue
        kept = [s for s in steps_of[source.run_id] if s.status != "failed"]
        carried = [s for s in steps_of[run.run_id] if s.step_id not in executed]
        if _carried(kept) != _carried(carried):
            out.append(f"INV-REV-2: run {run.run_id} carried over {sorted(_carried(carried).items())} from "
                       f"{source.run_id}, whose succeeded steps are {sorted(_carried(kept).items())}")
        for s in carried:
            if s.status != "completed":
                out.append(f"INV-REV-2: carried-over step {s.step_id} ({s.node}) of {run.run_id} is {s.status}")
            if s.step_id in witnessed:
                out.append(f"INV-REV-2: carried-over step {s.step_id} ({s.node}) of {run.run_id} ran again")
    return out


def check_inv_rev_3(history: History) -> list[str]:
    """INV-REV-3: a revived branch resumes where it stopped. Each failed step of a revived
    run's source has, in the revived run, one re-run step on its node with its input whose
    recorded key is the failed step's, whose first execution starts a fresh budget (0
    retries, 0 crashes) and whose witnesses saw that key."""
    out = []
    executions: dict[str, list[Execution]] = defaultdict(list)
    for e in history.executions:
        if e.step_id is not None:
            executions[e.step_id].append(e)
    witness_keys: dict[str, set[str]] = defaultdict(set)
    for w in history.witnesses:
        witness_keys[w.step_id].add(w.idempotency_key)
    steps_of: dict[str, list[StepRow]] = defaultdict(list)
    for s in history.steps:
        steps_of[s.run_id].append(s)
    for source, run in _revivals(history):
        if source is None:
            continue
        for failed in (s for s in steps_of[source.run_id] if s.status == "failed"):
            again = [s for s in steps_of[run.run_id]
                     if (s.node, _canon(s.input)) == (failed.node, _canon(failed.input)) and s.key == failed.key
                     and s.step_id in executions]
            if len(again) != 1:
                out.append(f"INV-REV-3: failed step {failed.step_id} ({failed.node} {failed.input}) of "
                           f"{source.run_id} is re-run {len(again)} times in {run.run_id}")
                continue
            first = min(executions[again[0].step_id], key=lambda e: e.execution_id)
            if (first.retry_count, first.crash_count) != (0, 0):
                out.append(f"INV-REV-3: step {again[0].step_id} re-runs {failed.step_id} without a fresh budget")
            if witness_keys[again[0].step_id] - {failed.key}:
                out.append(f"INV-REV-3: step {again[0].step_id} ran with keys {sorted(witness_keys[again[0].step_id])}"
                           f", not {failed.key!r}")
    return out


CHECKERS: dict[str, Callable[[History], list[str]]] = {
    "INV-CLK-1": check_inv_clk_1,
    "INV-LIM-1": check_inv_lim_1,
    "INV-LIM-2": check_inv_lim_2,
    "INV-LIM-3": check_inv_lim_3,
    "INV-LIM-4": check_inv_lim_4,
    "INV-LIM-8": check_inv_lim_8,
    "INV-ADV-1": check_inv_adv_1,
    "INV-ADV-3": check_inv_adv_3,
    "INV-EXE-1": check_inv_exe_1,
    "INV-EXE-2": check_inv_exe_2,
    "INV-EXE-3": check_inv_exe_3,
    "INV-EXE-4": check_inv_exe_4,
    "INV-RUN-1": check_inv_run_1,
    "INV-HLT-1": check_inv_hlt_1,
    "INV-HLT-2": check_inv_hlt_2,
    "INV-PRN-1": check_inv_prn_1,
    "INV-PRN-2": check_inv_prn_2,
    "INV-REV-1": check_inv_rev_1,
    "INV-REV-2": check_inv_rev_2,
    "INV-REV-3": check_inv_rev_3,
}


def check_all(history: History) -> dict[str, list[str]]:
    """Every checker's violations by invariant ID (all present; empty lists = all hold)."""
    return {inv: check(history) for inv, check in CHECKERS.items()}
