"""Deliberately broken variants of the engine, each missing one guard, as source patches.

A guard that no test misses is a guard nobody has verified, so each mutant below
removes exactly one guard, and ``tests/properties/test_mutants.py`` (and the chaos
suite's opt-in mutant rounds) expect a property machine, a race test or a history
checker to go red with it. The engine itself knows nothing of them: a mutant is a
list of ``(old, new)`` edits applied to a scratch copy of the ``ductwork`` package
(:func:`apply`), and the code under test imports that copy (:func:`environ`).

Each ``old`` snippet is found by searching every ``.py`` file of the package and the lane
routine's SQL (``limits/sql/``), not by path, so the engine's modules may move; it must occur exactly once in the whole
package, or applying the mutant fails naming the mutant and the snippet
(``tests/unit/test_mutants_apply.py`` checks every mutant against the current
source). A ``new`` text of several lines is indented like the line ``old`` starts on.

The scratch directory also gets a ``sitecustomize.py``: every Python process started
with :func:`environ` (the detector's pytest, a fleet's supervisor and workers, a
timeout child) imports ``ductwork`` from the copy before anything can put the real
package ahead of it on ``sys.path`` (pytest's ``pythonpath = ["."]`` does), and
records in ``imports.log`` the file of every ``ductwork`` module it loaded, at start
and at exit; :func:`imported_files` reads it back so a test can check that the
mutant really ran. Not done: a process killed with SIGKILL records only its start.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ductwork"


@dataclass(frozen=True)
class Mutant:
    #: what the mutant does instead, with the IDs of the invariants it breaks
    description: str
    #: the guard it removes, as INVARIANTS.md's engine-mutant table names it
    guard: str
    #: ``(old, new)`` source edits, applied in order
    edits: tuple[tuple[str, str], ...]


def _bucket_refill(body: str) -> str:
    """``new`` for an edit at ``rates = entry.rates`` in ``buckets.decide``: a local
    ``refill`` that shadows the real one for the decision only (as the mutant's
    refill function used to be passed to it)."""
    return "rates = entry.rates\n\ndef refill(bucket, entry, now_us):\n" + body


def _lane_order_reversed(indent: str) -> tuple[str, str]:
    """The edit that orders the lane routine's pending executions newest first: its
    ``WHERE … ORDER BY`` at the routine's ``indent`` (each server's routine has its own),
    with ``DESC`` added to both sort keys."""
    where = (f"{indent}WHERE e.pending_lane = p_key  -- pending in this key's lane\n"
             f"{indent}  AND e.eligible_at <= v_now  -- eligible: delays and back-off have passed\n"
             f"{indent}ORDER BY ")
    return where + "e.eligible_at, e.id", where + "e.eligible_at DESC, e.id DESC"


_GROUP_GUARD = "return bool(tx.execute(statement, params).rowcount == len(endings))  # [INV-EXE-2] fewer: one was taken"

MUTANTS: dict[str, Mutant] = {
    # -- the lane routine's SQL (issue 32): each server's refinement of plan() and decide(), one
    # guard each; the locks and the clock by the race tests, the decisions by the refinement
    # test (tests/properties/test_refinement.py; every other broken variant: tests/sql_mutation.py)
    "no_key_lock": Mutant(
        "the lane routine reads the key's header row without locking it (PostgreSQL) [INV-LIM-1]",
        "the key's row lock, the routine's first statement [INV-LIM-1]",
        (("FROM ductwork_limit_keys k WHERE k.key = p_key FOR UPDATE;",
          "FROM ductwork_limit_keys k WHERE k.key = p_key;  -- mutant: no lock"),),
    ),
    "no_key_lock_mysql": Mutant(
        "the lane routine reads the key's header row without locking it (MySQL-family) [INV-LIM-1]",
        "the key's row lock, the routine's first statement [INV-LIM-1]",
        (("FROM ductwork_limit_keys k WHERE k.`key` = p_key FOR UPDATE;",
          "FROM ductwork_limit_keys k WHERE k.`key` = p_key;  -- mutant: no lock"),),
    ),
    "count_outside_lock": Mutant(
        "the lane routine counts the key's in-flight executions before taking its lock (PostgreSQL) "
        "[INV-LIM-1]",
        "in-flight counted under the lock [INV-LIM-1]",
        (("    IF p_key IS NOT NULL THEN  -- [INV-LIM-1] the key's lock, before any other read\n"
          "        SELECT k.seq, k.config_digest INTO v_seq, v_digest\n"
          "          FROM ductwork_limit_keys k WHERE k.key = p_key",
          "    SELECT count(*) INTO v_in_flight FROM ductwork_executions e WHERE e.inflight_key = p_key;  -- mutant\n"
          "    IF p_key IS NOT NULL THEN  -- [INV-LIM-1] the key's lock, before any other read\n"
          "        SELECT k.seq, k.config_digest INTO v_seq, v_digest\n"
          "          FROM ductwork_limit_keys k WHERE k.key = p_key"),
         ("            SELECT count(*) INTO v_in_flight FROM ductwork_executions e WHERE e.inflight_key = p_key;  "
          "-- [INV-LIM-1]", "            NULL;  -- mutant: the count read before the lock")),
    ),
    "clock_before_lock": Mutant(
        "the lane routine reads the clock before taking the key's lock: claims and releases are "
        "timed out of the key's sequence (PostgreSQL) [INV-CLK-1]",
        "the routine reads the clock once it holds the key's lock [INV-CLK-1]",
        (("    IF p_key IS NOT NULL THEN  -- [INV-LIM-1] the key's lock, before any other read\n"
          "        SELECT k.seq, k.config_digest INTO v_seq, v_digest\n"
          "          FROM ductwork_limit_keys k WHERE k.key = p_key",
          "    v_now := coalesce(p_now, (clock_timestamp() AT TIME ZONE 'UTC') + p_offset_us * interval "
          "'1 microsecond');  -- mutant\n"
          "    IF p_key IS NOT NULL THEN  -- [INV-LIM-1] the key's lock, before any other read\n"
          "        SELECT k.seq, k.config_digest INTO v_seq, v_digest\n"
          "          FROM ductwork_limit_keys k WHERE k.key = p_key"),
         ("    -- [INV-CLK-1] the clock, read once the key's lock is held\n"
          "    v_now := coalesce(p_now, (clock_timestamp() AT TIME ZONE 'UTC') + p_offset_us * interval "
          "'1 microsecond');",
          "    -- mutant: the clock was read before the lock")),
    ),
    "clock_before_lock_mysql": Mutant(
        "the lane routine reads the clock before taking the key's lock: claims and releases are "
        "timed out of the key's sequence (MySQL-family) [INV-CLK-1]",
        "the routine reads the clock once it holds the key's lock [INV-CLK-1]",
        (("    IF p_key IS NOT NULL THEN  -- [INV-LIM-1] the key's lock, before any other read\n"
          "        SELECT k.seq, k.config_digest INTO v_seq, v_digest\n"
          "          FROM ductwork_limit_keys k WHERE k.`key` = p_key",
          "    SET v_now = COALESCE(p_now, TIMESTAMPADD(MICROSECOND, p_offset_us, UTC_TIMESTAMP(6)));  -- mutant\n"
          "    IF p_key IS NOT NULL THEN  -- [INV-LIM-1] the key's lock, before any other read\n"
          "        SELECT k.seq, k.config_digest INTO v_seq, v_digest\n"
          "          FROM ductwork_limit_keys k WHERE k.`key` = p_key"),
         ("    -- [INV-CLK-1] the clock, read once the key's lock is held\n"
          "    SET v_now = COALESCE(p_now, TIMESTAMPADD(MICROSECOND, p_offset_us, UTC_TIMESTAMP(6)));",
          "    -- mutant: the clock was read before the lock")),
    ),
    "routine_ceiling_off_by_one": Mutant(
        "the routine's key decision admits a claim with the key's concurrency in flight (PostgreSQL) "
        "[INV-LIM-1]",
        "the routine refuses a claim at the key's concurrency [INV-LIM-1]",
        (("    IF p_concurrency IS NOT NULL AND p_in_flight >= p_concurrency THEN",
          "    IF p_concurrency IS NOT NULL AND p_in_flight > p_concurrency THEN  -- mutant"),),
    ),
    "routine_ceiling_off_by_one_mysql": Mutant(
        "the routine's key decision admits a claim with the key's concurrency in flight (MySQL-family) "
        "[INV-LIM-1]",
        "the routine refuses a claim at the key's concurrency [INV-LIM-1]",
        (("    ELSEIF p_concurrency IS NOT NULL AND p_in_flight >= p_concurrency THEN",
          "    ELSEIF p_concurrency IS NOT NULL AND p_in_flight > p_concurrency THEN  -- mutant"),),
    ),
    "routine_spend_twice": Mutant(
        "the routine spends two tokens of every bucket for a claim (PostgreSQL) [INV-LIM-2]",
        "one token per claim [INV-LIM-2]",
        (("        level[i] := level[i] - p_per[i] * 1000000;",
          "        level[i] := level[i] - 2 * p_per[i] * 1000000;  -- mutant"),),
    ),
    "routine_spend_twice_mysql": Mutant(
        "the routine spends two tokens of every bucket for a claim (MySQL-family) [INV-LIM-2]",
        "one token per claim [INV-LIM-2]",
        (("                    - CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][1]')) AS SIGNED) * 1000000);",
          "                    - 2 * CAST(JSON_VALUE(p_rates, CONCAT('$[', i, '][1]')) AS SIGNED) * 1000000);"),),
    ),
    "routine_lane_order_reversed": Mutant(
        "the routine takes a key's newest eligible execution first (PostgreSQL) [INV-LIM-6]",
        "a lane's oldest first [INV-LIM-6]",
        (_lane_order_reversed(" " * 21),),
    ),
    "routine_lane_order_reversed_mysql": Mutant(
        "the routine takes a key's newest eligible execution first (MySQL-family) [INV-LIM-6]",
        "a lane's oldest first [INV-LIM-6]",
        (_lane_order_reversed(" " * 9),),
    ),
    "routine_walk_passes_no_lane": Mutant(
        "the routine's bound walk takes any other lane's oldest, a saturated or rate-blocked one's "
        "too, so a hand-off yields to a lane no poll would try (PostgreSQL) [INV-LIM-6]",
        "the bound is a lane a poll would try [INV-LIM-6]",
        (("                         OR (v_walk_at, v_walk_id) > (v_ats[cardinality(v_ats)], v_ids[cardinality(v_ids)]);"
          "  -- none older\n"
          "                    IF v_walk_lane = '' OR EXISTS (  -- the unkeyed lane, or a key that may admit now",
          "                         OR (v_walk_at, v_walk_id) > (v_ats[cardinality(v_ats)], "
          "v_ids[cardinality(v_ids)]);\n"
          "                    IF TRUE OR EXISTS (  -- mutant: every lane may admit"),),
    ),
    "routine_walk_passes_no_lane_mysql": Mutant(
        "the routine's bound walk takes any other lane's oldest, a saturated or rate-blocked one's "
        "too, so a hand-off yields to a lane no poll would try (MySQL-family) [INV-LIM-6]",
        "the bound is a lane a poll would try [INV-LIM-6]",
        (("                    END IF;\n"
          "                    IF v_walk_lane = '' OR EXISTS (  -- the unkeyed lane, or a key that may admit now",
          "                    END IF;\n"
          "                    IF TRUE OR EXISTS (  -- mutant: every lane may admit"),),
    ),
    "walk_stops_at_the_first_page": Mutant(
        "the lane scan reads one page of the pending executions and stops, so a lane whose oldest "
        "is behind a page of another lane's is never tried [INV-LIM-6]",
        "the lane scan walks on until it has its lanes [INV-LIM-6]",
        (("        if len(rows) < WALK_PAGE:", "        if True:  # mutant: one page only"),),
    ),
    "routine_state_guard_dropped": Mutant(
        "the routine ends an execution that already ended (PostgreSQL) [INV-EXE-2]",
        "the routine's guard: still open [INV-EXE-2]",
        (("           AND e.completed_at IS NULL  -- [INV-EXE-2] still open: not already ended",
          "           AND TRUE"),),
    ),
    "routine_state_guard_dropped_mysql": Mutant(
        "the routine ends an execution that already ended (MySQL-family) [INV-EXE-2]",
        "the routine's guard: still open [INV-EXE-2]",
        (("         WHERE e.completed_at IS NULL  -- [INV-EXE-2] still open: not already ended",
          "         WHERE TRUE"),),
    ),
    "routine_family_ceiling_ignored": Mutant(
        "the routine admits a partition's claims and tries a partition's lane with its family at its ceiling "
        "(PostgreSQL) [INV-LIM-8]",
        "the routine refuses a partition's claim at its family's ceiling [INV-LIM-8]",
        (("                ELSIF p_family_ceiling IS NOT NULL AND v_family_in_flight >= p_family_ceiling THEN",
          "                ELSIF FALSE THEN  -- mutant: the family's ceiling ignored"),
         ("                            EXIT WHEN p_family_ceiling IS NOT NULL  -- [INV-LIM-8]",
          "                            EXIT WHEN FALSE  -- mutant"),
         ("c.family || '[') < c.f)", "c.family || '[') < c.f OR TRUE)")),  # (the bound's walk: a mutant)
    ),
    "routine_family_ceiling_off_by_one": Mutant(
        "the routine admits a partition's claim with its family's ceiling in flight (PostgreSQL) [INV-LIM-8]",
        "the routine refuses a partition's claim at its family's ceiling [INV-LIM-8]",
        (("                ELSIF p_family_ceiling IS NOT NULL AND v_family_in_flight >= p_family_ceiling THEN",
          "                ELSIF p_family_ceiling IS NOT NULL AND v_family_in_flight > p_family_ceiling THEN"
          "  -- mutant"),),
    ),
    "routine_family_ceiling_ignored_mysql": Mutant(
        "the routine admits a partition's claims and tries a partition's lane with its family at its ceiling "
        "(MySQL-family) [INV-LIM-8]",
        "the routine refuses a partition's claim at its family's ceiling [INV-LIM-8]",
        (("                ELSEIF p_family_ceiling IS NOT NULL AND v_family_in_flight >= p_family_ceiling THEN"
          "  -- [INV-LIM-8]\n"
          "                    SET v_rebase = FALSE;  -- the family at its ceiling",
          "                ELSEIF FALSE THEN  -- mutant: the family's ceiling ignored\n"
          "                    SET v_rebase = FALSE;  -- the family at its ceiling"),
         ("                            IF p_family_ceiling IS NOT NULL\n"
          "                               AND v_family_in_flight + JSON_LENGTH(v_claims) >= p_family_ceiling THEN",
          "                            IF FALSE THEN  -- mutant: the family's ceiling ignored"),
         ("CONCAT(c.k, '[')) < c.f)", "CONCAT(c.k, '[')) < c.f OR TRUE)")),  # (the bound's walk: a mutant)
    ),
    # -- forgetting idle partitions (issue 34): the idleness re-check, the row a claim creates
    # again, the sequence a new row numbers on from [INV-LIM-9, INV-CLK-1]
    "forget_without_recheck": Mutant(
        "forget_partition deletes a partition's rows without re-checking under its lock that it is idle: "
        "a busy partition's buckets go, and with them tokens it spent [INV-LIM-9]",
        "a partition is forgotten only while idle, re-checked under its lock [INV-LIM-9]",
        (("        if tx.execute(sa.select(_busy(key))).scalar_one():  # [INV-LIM-9] idle, re-checked",
          "        if False:  # mutant: no re-check"),),
    ),
    "forget_in_flight": Mutant(
        "forget_partition counts only pending work as busy: a partition with an execution in flight is "
        "forgotten [INV-LIM-9]",
        "a partition is forgotten only while idle, re-checked under its lock [INV-LIM-9]",
        (("sa.exists().where(_e.c.inflight_key == key))", "sa.false())  # mutant: in flight is idle"),),
    ),
    "forget_restarts_seq": Mutant(
        "a partition's row created again after a forget numbers its claims from 0 again, below the "
        "sequence numbers its executions hold (SQLite) [INV-CLK-1, INV-LIM-9]",
        "a new partition row numbers on from its family's seq [INV-CLK-1]",
        (("    if header.seq == 0 and \"[\" in key:  # [INV-CLK-1] a new partition row numbers on from its family's",
          "    if False:  # mutant: numbered from 0"),),
    ),
    "forget_restarts_seq_routine": Mutant(
        "a partition's row created again after a forget numbers its claims from 0 again (PostgreSQL) "
        "[INV-CLK-1, INV-LIM-9]",
        "a new partition row numbers on from its family's seq [INV-CLK-1]",
        (("        IF v_seq = 0 AND strpos(p_key, '[') > 0 THEN",
          "        IF false THEN  -- mutant: numbered from 0"),),
    ),
    "forget_restarts_seq_mysql": Mutant(
        "a partition's row created again after a forget numbers its claims from 0 again (MySQL-family) "
        "[INV-CLK-1, INV-LIM-9]",
        "a new partition row numbers on from its family's seq [INV-CLK-1]",
        (("        IF v_seq = 0 AND LOCATE('[', p_key) > 0 THEN",
          "        IF FALSE THEN  -- mutant: numbered from 0"),),
    ),
    "forgotten_row_not_created_sqlite": Mutant(
        "a claim of a key whose row was forgotten finds no row and claims nothing (SQLite) [INV-LIM-9]",
        "a keyed claim creates a forgotten key's row [INV-LIM-9]",
        (("    if row is None and create and \"[\" in key:  # [INV-LIM-9]", "    if False:  # mutant: [INV-LIM-9]"),),
    ),
    "forgotten_row_not_created": Mutant(
        "a claim of a key whose row a sweep forgot under an uncommitted enqueue finds no row and claims "
        "nothing: the execution waits forever (PostgreSQL) [INV-LIM-9]",
        "a keyed claim creates a forgotten key's row [INV-LIM-9]",
        (("        IF NOT FOUND AND p_take > 0 AND strpos(p_key, '[') > 0 THEN",
          "        IF false THEN  -- mutant: [INV-LIM-9]"),),
    ),
    "forgotten_row_not_created_mysql": Mutant(
        "a claim of a key whose row a sweep forgot under an uncommitted enqueue finds no row and claims "
        "nothing: the execution waits forever (MySQL-family) [INV-LIM-9]",
        "a keyed claim creates a forgotten key's row [INV-LIM-9]",
        (("        IF v_done AND p_take > 0 AND LOCATE('[', p_key) > 0 THEN",
          "        IF FALSE THEN  -- mutant: [INV-LIM-9]"),),
    ),
    # -- the lane routine on SQLite (Python, limits/claims.py::_in_python and limits/plan.py)
    "no_family_lock": Mutant(
        "the lane routine reads a partition's family's header row without locking it (PostgreSQL) [INV-LIM-8]",
        "the family's row lock, before the partition's [INV-LIM-8]",
        (("PERFORM 1 FROM ductwork_limit_keys k WHERE k.key = p_family FOR UPDATE;",
          "PERFORM 1 FROM ductwork_limit_keys k WHERE k.key = p_family;  -- mutant: no lock"),),
    ),
    "no_family_lock_mysql": Mutant(
        "the lane routine reads a partition's family's header row without locking it (MySQL-family) [INV-LIM-8]",
        "the family's row lock, before the partition's [INV-LIM-8]",
        (("FROM ductwork_limit_keys k WHERE k.`key` = p_family FOR UPDATE;",
          "FROM ductwork_limit_keys k WHERE k.`key` = p_family;  -- mutant: no lock"),),
    ),
    "family_ceiling_ignored": Mutant(
        "a partition's claims are admitted, and its lane tried, with its family at its ceiling (the Python "
        "path: the plan's decision and batch, the lane scan) [INV-LIM-8]",
        "a partition's claim is refused at its family's ceiling [INV-LIM-8]",
        (("    return request.family_ceiling is None or state.family_in_flight + claimed < request.family_ceiling",
          "    return True  # mutant: the family's ceiling ignored"),
         ("    return {family for (family, ceiling), count in zip(ceilings.items(), counts, strict=True) "
          "if count >= ceiling}",
          "    return set()  # mutant: no family is ever at its ceiling")),
    ),
    "family_ceiling_off_by_one": Mutant(
        "a partition's claim is admitted, and its lane tried, with its family's ceiling in flight (the Python "
        "path) [INV-LIM-8]",
        "a partition's claim is refused at its family's ceiling [INV-LIM-8]",
        (("state.family_in_flight + claimed < request.family_ceiling",
          "state.family_in_flight + claimed <= request.family_ceiling  # mutant"),
         ("strict=True) if count >= ceiling}", "strict=True) if count > ceiling}  # mutant")),
    ),
    "no_clamp": Mutant(
        "a claim's buckets refill without capping at the burst [INV-LIM-4]",
        "refill capped at the burst [INV-LIM-4]",
        (("rates = entry.rates", _bucket_refill(
            "    dt = max(0, now_us - bucket.refilled_at_us)  # mutant: no cap\n"
            "    return Bucket(bucket.period_s, bucket.level_units + dt * entry.limit,\n"
            "                  max(bucket.refilled_at_us, now_us))")),),
    ),
    "claim_rebase_fills": Mutant(
        "a claim that finds its key stored under other values (a rolling deploy) re-bases it with "
        "the kept buckets full [INV-LIM-2, INV-LIM-4]",
        "a claim's re-base keeps the kept buckets' levels, never adds tokens [INV-LIM-4]",
        (("kept = carry_over(request.entry, key.buckets) if rebase else dict(key.buckets)",
          "kept = carry_over(request.entry, key.buckets) if rebase else dict(key.buckets)\n"
          "if rebase:  # mutant: a claim's re-base fills the kept buckets\n"
          "    rates = {rate.per_s: rate for rate in request.entry.rates} if request.entry is not None else {}\n"
          "    kept = {p: Bucket(p, rates[p].capacity_units, b.refilled_at_us) for p, b in kept.items()}"),),
    ),
    "float_refill": Mutant(
        "a claim's buckets refill through float tokens, rounding [INV-LIM-2, INV-LIM-4]",
        "exact integer refill [INV-LIM-2, INV-LIM-4]",
        (("rates = entry.rates", _bucket_refill(
            "    dt = max(0, now_us - bucket.refilled_at_us)  # mutant: float tokens\n"
            "    tokens = bucket.level_units / entry.units_per_token + dt / 1e6 * entry.limit / entry.per_s\n"
            "    level = min(int(tokens * entry.units_per_token), entry.capacity_units)\n"
            "    return Bucket(bucket.period_s, level, max(bucket.refilled_at_us, now_us))")),),
    ),
    "no_spend_on_retry": Mutant(
        "a retried execution's claim spends no token [INV-LIM-2]",
        "a retry's claim spends a token [INV-LIM-2]",
        (("_write_buckets(tx, key, decided.buckets, stored)",
          ("if not (claimed and tx.execute(  # mutant: a retry spends nothing\n"
           "        sa.select(sa.func.max(schema.executions.c.retry_count))\n"
           "        .where(schema.executions.c.claim_seq > header.seq, schema.executions.c.limit_key == key))"
           ".scalar() > 0):\n"
           "    _write_buckets(tx, key, decided.buckets, stored)")),),
    ),
    "no_stamp": Mutant(
        "a rate refusal leaves blocked_until unstamped [INV-LIM-5]",
        "a rate refusal stamps `blocked_until` [INV-LIM-5]",
        (("if decided.stamp:", "if decided.stamp and decided.refused is None:  # mutant: a refusal stamps nothing"),),
    ),
    "unkeyed_first": Mutant(
        "the lane scan puts the unkeyed lane before older keyed lanes [INV-LIM-6]",
        "oldest lane first [INV-LIM-6]",
        ((".order_by(page.c.eligible_at, page.c.id))  # [INV-LIM-6] oldest lane first, unkeyed among them",
          ".order_by(page.c.lane != UNKEYED, page.c.eligible_at, page.c.id))  # mutant: unkeyed first"),),
    ),
    "hand_off_any_lane": Mutant(
        "a hand-off (keyed or unkeyed) claims its lane's next execution even when an older lane "
        "comes first [INV-LIM-6]",
        "a hand-off only takes what a poll would [INV-LIM-6]",
        (("if not request.poll and state.bound is not None and state.bound < state.candidates[0]:",
          "if False:  # mutant: any lane"),),
    ),
    "batch_past_lane": Mutant(
        "a batch (unkeyed or keyed, a poll's or a hand-off's) takes executions younger than another "
        "lane's oldest [INV-LIM-6]",
        "a batch stops before another lane's oldest [INV-LIM-6]",
        (("if state.bound is not None and position >= state.bound:",
          "if False:  # mutant: a batch ignores the other lanes"),),
    ),
    "batch_past_unfilled_key": Mutant(
        "a batch goes on to another lane after a key's run that left the key able to admit, "
        "claiming a younger lane's execution before the key's next [INV-LIM-6]",
        "a batch goes on past a key only when its run filled the key [INV-LIM-6]",
        (("if len(claimed) >= most or (run and not full):\n",
          "if len(claimed) >= most or (run and False):\n"),),
    ),
    "batch_no_guard": Mutant(
        "a release (a group commit's successes, a failure, a crash: every outcome) ends its "
        "executions without the open-and-ours guard [INV-EXE-2]",
        "a release's open-and-ours guard, shared by every outcome [INV-EXE-2]",
        (("_e.c.completed_at.is_(None),  # [INV-EXE-2] still open: not already ended\n", ""),
         ("owner)  # [INV-EXE-2] still the owner's: the reaper did not take it", ")  # mutant: no guard")),
    ),
    "keyed_group_one_seq": Mutant(
        "a keyed group commit releases all its executions with one sequence number [INV-LIM-1, INV-CLK-1]",
        "a keyed group commit releases each execution with its own sequence number, in order [INV-CLK-1]",
        (("{e.execution_id: header.seq + i for i, e in enumerate(endings, start=1)}",
          "{e.execution_id: header.seq + 1 for i, e in enumerate(endings, start=1)}"),),
    ),
    "keyed_batch_past_refusal": Mutant(
        "a keyed batch decided in memory claims on past a decision that refuses [INV-LIM-1, INV-LIM-2]",
        "a keyed batch ends at the first decision that refuses [INV-LIM-1, INV-LIM-2]",
        (("        return further.admitted", "        return True  # mutant: a refusal does not end the batch"),),
    ),
    "hand_off_before_releases": Mutant(
        "a keyed group commit's hand-off numbers its claims from the key's seq before the releases "
        "[INV-LIM-1, INV-CLK-1]",
        "a hand-off's claims follow the group's releases in the key's sequence [INV-CLK-1]",
        (("header.set(seq=header.seq + len(endings))",
          "header.changed['seq'] = header.seq + len(endings)  # mutant: the held header's seq stays"),),
    ),
    "releases_seq_unwritten": Mutant(
        "a keyed group commit that hands nothing on leaves the key's seq behind its releases "
        "[INV-LIM-1, INV-CLK-1]",
        "a keyed group commit writes the key's seq past its releases [INV-CLK-1]",
        (("    if claimed:\n        header.set(seq=header.seq + claimed)\n    write_header(tx, key)",
          "    if claimed:\n        header.set(seq=header.seq + claimed)\n    if claimed:  # mutant: the releases' seq "
          "is not written\n        write_header(tx, key)"),),
    ),
    # -- bounds per path (issue 17): the per-path places a keyed batch or hand-off applies a bound
    "keyed_batch_stale_count": Mutant(
        "each further claim of a keyed batch (or of a hand-off of several) is decided on the in-flight "
        "count before the batch's own claims: the batch fills past the ceiling [INV-LIM-1]",
        "each further claim of a keyed batch or hand-off counts the batch's claims in flight [INV-LIM-1]",
        (("state.in_flight + claimed,", "state.in_flight,  # mutant: the batch's own claims not counted"),),
    ),
    "keyed_batch_stale_buckets": Mutant(
        "each further claim of a keyed batch (or of a hand-off of several) is decided on the buckets as "
        "they were before the batch's spends: one token admits the whole batch [INV-LIM-2]",
        "each further claim of a keyed batch or hand-off decides on the buckets the previous one left "
        "[INV-LIM-2]",
        (("{b.period_s: b for b in decided[-1].buckets}", "kept"),),
    ),
    "keyed_batch_one_seq": Mutant(
        "a keyed batch (or a hand-off of several) claims all its executions with one sequence number "
        "[INV-CLK-1]",
        "each claim of a keyed batch or hand-off takes its own sequence number, in order [INV-CLK-1]",
        (("seq + i for i, execution_id in enumerate(execution_ids, start=1)},\n",
          "seq + 1 for i, execution_id in enumerate(execution_ids, start=1)},  # mutant: one seq for the batch\n"),),
    ),
    "stale_fence_commits": Mutant(
        "the branch fence does not compare the claim token: a stale advancer's claim, or a worker's "
        "success on a branch an advancer holds, commits [INV-ADV-2, INV-ADV-1]",
        "the one branch fence compares the claim token (an advancer's, or none: free) [INV-ADV-2]",
        (("if row.id in held and _held_as(row, held[row.id])}  # [INV-ADV-2] the fence",
          "if row.id in held}  # mutant: any claim passes the fence"),
         ("if not closed:", "if False:  # mutant: a closed advancement is not noticed"),
         ("if closed != len(made):", "if False:  # mutant: a closed advancement is not noticed"),
         ("_b.c.claim_token == c.token)  # [INV-ADV-2] only the holder may move it",
          "sa.true())  # mutant: anyone may move it"),
         ("moved = tx.execute(_move_held(status in _ENDED).where(_b.c.claim_token.in_(tokens)), params)",
          "moved = tx.execute(_move_held(status in _ENDED), params)  # mutant: anyone may move them"),
         ("_move_held(ends).where(_b.c.claim_token.is_(None)) for ends in (False, True)}",
          "_move_held(ends) for ends in (False, True)}  # mutant: held or not")),
    ),
    "fanin_outside_fence": Mutant(
        "the fan-in counter is bumped in its own transaction before the fence [INV-ADV-3]",
        "the fan-in bump inside the fence [INV-ADV-3]",
        (("edge = definition.edges[c.step.node]",
          ("edge = definition.edges[c.step.node]\n"
           "with self.app.begin() as own:  # mutant: the bump commits on its own, before the fence\n"
           "    own_barrier = own.execute(sa.select(schema.branches.c.barrier_id)\n"
           "                              .where(schema.branches.c.id == c.branch_id)).scalar_one()\n"
           "    if own_barrier is not None:\n"
           "        own.execute(schema.branches.update().where(schema.branches.c.id == own_barrier)\n"
           "                    .values(fanin_arrivals=schema.branches.c.fanin_arrivals + 1))\n"
           "        own_arrivals = own.execute(sa.select(schema.branches.c.fanin_arrivals)\n"
           "                                   .where(schema.branches.c.id == own_barrier)).scalar_one()")),
         ("bumped = tx.execute(", "bumped = 1 or tx.execute(  # mutant: no bump inside the fence"),
         ("arrivals = tx.execute(sa.select(_b.c.fanin_arrivals).where(_b.c.id == barrier_id)).scalar_one()",
          "arrivals = own_arrivals  # mutant: the count its own bump read")),
    ),
    "fanin_fires_on_created": Mutant(
        "a fan-in fires when its arrivals reach the children an expand created so far, not its width: "
        "children of the first batches merge while later batches are not created [INV-ADV-3]",
        "the last of the fan-out's full width fires the merge [INV-ADV-3]",
        (("fired = arrivals == barrier.fanout_width  # [INV-ADV-3] the last arrival fires",
          "fired = arrivals == (tx.execute(sa.select(_b.c.fanout_cursor).where(_b.c.id == barrier_id)).scalar_one()\n"
          "                     or barrier.fanout_width)  # mutant: the children created so far"),
         ("if len(outputs) != barrier.fanout_width:", "if False:  # mutant: fewer inputs than the width pass")),
    ),
    "expand_cursor_not_resumed": Mutant(
        "an expand's advancer counts its batches in memory: a resumed expand (after a crash, a reap or an "
        "error between batches) starts again at item 0, not at the branch's cursor [INV-ADV-4]",
        "a resumed expand reads its cursor from the branch [INV-ADV-4]",
        (("cursor = tx.execute(sa.select(_b.c.fanout_cursor).where(_b.c.id == c.branch_id)).scalar_one() or 0",
          "cursor = getattr(c, \"expand_cursor\", 0)  # mutant: this claim's own count, not the branch's"),
         ("cursor += len(items)", "cursor += len(items)\nc.expand_cursor = cursor  # type: ignore[attr-defined]")),
    ),
    "claim_held_branch": Mutant(
        "a batch claim does not re-assert that the branch is unheld: racing advancers all win it [INV-ADV-2]",
        "a claim re-asserts that the branch is in progress and unclaimed [INV-ADV-2]",
        (('_b.c.status == "in_progress",  # [INV-ADV-2] not ended, not held', "sa.true(),  # mutant: held or not"),
         ("_b.c.claim_token.is_(None),  # [INV-ADV-2] unclaimed: one winner per branch",
          "sa.true(),  # mutant: claimed or not")),
    ),
    # --- on_halt hooks (issue 16) ---
    "hook_not_owed": Mutant(
        "the halting transaction owes no on_halt hook: a halted run's handler never runs [INV-HLT-2]",
        "the halt's own transaction writes the hook row [INV-HLT-2]",
        (("owe_hooks(tx, ids)  # [INV-HLT-2] the halt's own transaction owes the on_halt hook",
          "pass  # mutant: no hook owed"),),
    ),
    "hook_fence_dropped": Mutant(
        "a hook attempt's record is not fenced by its claim token: a reaped claimer records over the "
        "live attempt [INV-HLT-1]",
        "a hook's record matches only its current claim token [INV-HLT-1]",
        (("_h.c.claim_token == hook.claim_token)  # [INV-HLT-1] the claim's fence",
          "sa.true())  # mutant: any claim"),),
    ),
    "hook_claims_running": Mutant(
        "a claim takes a hook that is running (or final) again: two attempts at once [INV-HLT-1]",
        "a hook claim takes only a pending hook, and re-asserts it in its UPDATE [INV-HLT-1]",
        (('.where(_h.c.status == "pending",  # [INV-HLT-1] a running or final hook is not claimable',
          ".where(_h.c.status.is_not(None),  # mutant: any status"),
         ('_h.c.status == "pending")  # [INV-HLT-1]', "sa.true())  # mutant")),
    ),
    "hook_retries_forever": Mutant(
        "a failing on_halt handler is retried whatever its budget: its hook never ends [INV-HLT-2]",
        "a hook's retry budget (`max_retry` for its pipeline and handler) [INV-HLT-2]",
        (("retry_count < max_retry:  # [INV-HLT-2] budget",
          "True:  # mutant: no budget"),),
    ),
    "hook_crashes_forever": Mutant(
        "a crashing on_halt handler is re-run whatever its crash budget: its hook never ends [INV-HLT-2]",
        "a hook's crash budget (`max_crash` for its pipeline and handler) [INV-HLT-2]",
        (("crash_count < max_crash:  # [INV-HLT-2] budget", "True:  # mutant: no budget"),),
    ),
    "hook_not_reaped": Mutant(
        "the reaper (and every recovery) leaves a dead worker's on_halt hook running: it is never re-run "
        "[INV-HLT-2]",
        "the reaper crashes the hooks a dead process held [INV-HLT-2]",
        (("recovered.hooks = crash_hooks_of(app, tx, found.hooks)",
          "recovered.hooks = []  # mutant: hooks left running"),),
    ),
    "prune_without_recheck": Mutant(
        "a prune batch deletes its candidate runs without re-reading their status under the lock: "
        "a live run among them goes [INV-PRN-1]",
        "a prune batch re-checks each run's status and finish time under its lock [INV-PRN-1]",
        (("bool(row.hook_open)))  # [INV-PRN-1] re-checked under the lock",
          "bool(row.hook_open)) or True)  # mutant: not re-checked"),),
    ),
    # -- process trees -------------------------------------------------------------------
    "timeout_kills_group_only": Mutant(
        "a timed-out step's process group is killed, but a subprocess that left the group "
        "(setsid) keeps running beside the retry [INV-EXE-5]",
        "a timeout kills every descendant of the step's child, not only its group [INV-EXE-5]",
        (("tree.kill(below)", "pass  # mutant: only the group"),),
    ),
    "dead_runner_tree_left": Mutant(
        "a supervisor reaps a dead runner's claims while what its steps started still runs "
        "(re-parented to the supervisor, never killed) [INV-EXE-5]",
        "the supervisor kills the orphans a dead runner's steps left before reaping it [INV-EXE-5]",
        (("adopted = tree.kill_adopted({c.proc.pid for c in self.children if c.proc is not None})",
          "adopted = []  # mutant: orphans left running"),),
    ),
    "runner_outlives_supervisor": Mutant(
        "a runner keeps working, unsupervised, after its supervisor was killed [INV-EXE-5]",
        "a runner asks for SIGTERM when its supervisor dies [INV-EXE-5]",
        (("tree.die_with_parent(signal.SIGTERM)", "pass  # mutant: outlives its supervisor"),),
    ),
    "zombie_starts_body": Mutant(
        "a worker thawed after its process lost its lease starts the body of an execution it "
        "claimed before the freeze, beside the re-run the reaper enqueued [INV-EXE-5, INV-LIM-1]",
        "a worker asks its process's lease before a body starts [INV-EXE-5]",
        (("self._may_start_code()  # [INV-EXE-5] no body starts once the lease is lost",
          "pass  # mutant: no lease asked"),),
    ),
    # -- same-host recovery (issue 36) -------------------------------------------------------
    "same_host_not_reaped": Mutant(
        "a supervisor reaps a process of its own machine only once its heartbeat is stale, "
        "though its OS process is provably gone: a crashed fleet's slots wait reaper_timeout "
        "after a restart [INV-EXE-1, INV-LIM-3]",
        "a supervisor reaps the provably dead processes of its machine at once [INV-EXE-1]",
        (("here = sa.and_(_p.c.machine_identifier == machine_identifier(), _p.c.os_start_ticks.is_not(None))",
          "here = sa.false()  # mutant: only stale rows"),),
    ),
    "reap_by_host_name": Mutant(
        "a process of another pid namespace (a container with the same host name) whose pid "
        "names another process here is taken for dead and reaped while it runs [INV-EXE-5, INV-LIM-1]",
        "the proof of death compares the machine, boot and pid namespace, not the host name [INV-EXE-5]",
        (("and identifier == machine_identifier()  # [INV-EXE-5] this machine, boot and pid namespace only",
          "and identifier.split('/')[0] == machine_identifier().split('/')[0]  # mutant: host name only"),),
    ),
    "reap_by_pid_only": Mutant(
        "a row whose pid a later process reuses is taken for alive: its claims wait "
        "reaper_timeout [INV-EXE-1]",
        "the proof of death compares the process's start time, not only its pid [INV-EXE-5]",
        (("    if int(fields[19]) != start_ticks:  # [INV-EXE-5] by start time: a reused pid is not the row's process\n"
           "        return True  # the pid was reused by a later process",
          "    pass  # mutant: a live pid is the row's process"),),
    ),
    "dead_fleet_leftovers_kept": Mutant(
        "a supervisor reaps a dead fleet's claims on its machine while a subprocess its steps "
        "started (out of the process group) still runs [INV-EXE-5]",
        "what a provably dead process's steps started is killed, by its mark, before its claims move on "
        "[INV-EXE-5]",
        (("killed = tree.kill_marked(mark)", "killed = []  # mutant: leftovers left running"),),
    ),
    # -- revive (issue 16) ---------------------------------------------------------------
    "revive_twice": Mutant(
        "a revive neither finds the run that revived the halted run nor names it, so a second "
        "revive creates another run [INV-REV-1]",
        "a revived run names the halted run in `revived_from` (unique) and a revive returns it [INV-REV-1]",
        (("revived_from=run_id,  # [INV-REV-1] uq_run_revived_from: one new run per halted run",
          "revived_from=None,  # mutant: the new run does not name the halted run"),
         ("if existing is not None:  # [INV-REV-1] revived already: that run, nothing written",
          "if False:  # mutant: never revived already")),
    ),
    "revive_reruns_history": Mutant(
        "a revive gives every carried-over step a pending execution, so succeeded steps run again [INV-REV-2]",
        "carried-over steps get no execution [INV-REV-2]",
        (("else:  # [INV-REV-2] history: no execution, its status stays, never advanced again",
          "else:  # mutant: history is executed again\n"
          "    rerun = Pending(sid, step[\"limit_key\"], now)"),),
    ),
    "revive_nil_input": Mutant(
        "a revive re-enqueues a failed step with a null input (the original engine's gap) [INV-REV-3]",
        "a re-enqueued step keeps its input [INV-REV-3]",
        (("created_at=now)  # [INV-REV-3] input_args kept",
          'created_at=now, input_args="[null]")  # mutant'),),
    ),
    "revive_new_key": Mutant(
        "a re-enqueued step gets a fresh idempotency key (its own id) [INV-REV-3, INV-EXE-3]",
        "a re-enqueued step keeps the failed step's idempotency key [INV-REV-3]",
        (('"idempotency_key": step["idempotency_key"] or step["id"]}',
          '"idempotency_key": None}  # mutant: the step\'s own id'),),
    ),
    # -- triggers (issue 18) ---------------------------------------------------------------
    "trigger_key_not_stored": Mutant(
        "a keyed trigger's run is written without its key, so the index never sees it and a "
        "second trigger with the key starts a second run [INV-TRG-1]",
        "a keyed trigger writes its key into the run, where `uq_run_trigger_key` holds it [INV-TRG-1]",
        (("trigger_key=key,  # [INV-TRG-1] uq_run_trigger_key: one run per pipeline and key",
          "trigger_key=None,  # mutant: the key is not stored"),),
    ),
    "trigger_key_unmapped": Mutant(
        "the violation of `uq_run_trigger_key` is not mapped by name: a trigger that loses a race "
        "for its key raises the driver's IntegrityError instead of returning the winner's run "
        "(or TriggeredConcurrently) [INV-TRG-1]",
        "the index's violation is mapped by name to TriggeredConcurrently and answered with the "
        "winner's run [INV-TRG-1]",
        (('{"uq_run_trigger_key": lambda _: TriggeredConcurrently(definition.pipeline, key)}  # [INV-TRG-1]',
          "{}  # mutant: the violation is not mapped"),),
    ),
    "key_window_ignores_finish_time": Mutant(
        "a trigger with a key window takes the key from any finished run, however recently it "
        "finished (the decision and the UPDATE's fence both drop the finish time) [INV-TRG-1]",
        "a key window releases a key only from a run finished at least the window before the "
        "trigger, in the decision and in the UPDATE's fence [INV-TRG-1]",
        (("return finished is not None and finished + timedelta(microseconds=window_us) <= now  # [INV-TRG-1]",
          "return finished is not None  # mutant: the finish time is not compared"),
         ("finished,  # [INV-TRG-1] fenced on the finish time, not only on the Python decision",
          "_r.c.status.in_(('completed', 'halted')),  # mutant: no finish time in the fence")),
    ),
    "trigger_outside_callers_transaction": Mutant(
        "a trigger given the caller's connection writes in ductwork's own transaction, committed "
        "at once, so the caller's rollback leaves the run behind [INV-TRG-2]",
        "a trigger with `connection=` writes through the caller's transaction and never ends it [INV-TRG-2]",
        (("triggered = trigger(app, tx, pipeline, args, key, key_window)  # [INV-TRG-2]",
          "with app.begin() as own: triggered = trigger(app, own, pipeline, args, key, key_window)  # mutant"),),
    ),
    # async steps (issue 18)
    "async_cancel_escapes": Mutant(
        "an async step that cancels itself raises CancelledError out of the worker: the thread "
        "leaves and the execution is crashed, not failed [INV-EXE-4]",
        "an async step's unrequested cancellation is its failure, not the worker thread's exit [INV-EXE-4]",
        (("if isinstance(awaited, asyncio.CancelledError):", "if False:  # mutant: cancellation escapes"),),
    ),
    # --- partial losses inside a batch (issue 37): a guard that notices "nothing ended"
    # instead of "fewer ended than I hold"
    "group_guard_counts_none": Mutant(
        "a group commit whose guard ended fewer executions than it holds goes on when any ended: "
        "the lost one's output, expand items, step and successor are written beside its re-run "
        "[INV-EXE-2]",
        "a group commit is written only when its guard ended every execution it holds [INV-EXE-2]",
        ((_GROUP_GUARD,
          "return bool(tx.execute(statement, params).rowcount > 0)  # mutant: notices only that nothing ended"),),
    ),
    "keyed_group_guard_counts_none": Mutant(
        "a keyed group commit whose guard ended fewer executions than it holds releases the others "
        "and keeps the lost one's output and step, with the key's seq moved past a release that "
        "never happened [INV-EXE-2, INV-CLK-1]",
        "a keyed group commit is written only when its guard ended every execution it holds "
        "[INV-EXE-2]",
        ((_GROUP_GUARD, "return bool((lambda ended: ended > 0 if header is not None else ended == len(endings))("
                        "tx.execute(statement, params).rowcount))  # mutant: a keyed release notices only that "
                        "nothing ended"),),
    ),
    "batch_fence_counts_none": Mutant(
        "the branch fence asks whether each branch is held, not held by this claim, and an "
        "advancer's batch counts only that none was closed: a branch released and re-claimed under "
        "the batch is moved by the stale claim [INV-ADV-1, INV-ADV-2]",
        "an advancer's batch moves only the branches its own token still holds, and every one it "
        "closes [INV-ADV-2]",
        (("return bool(row.claim_token == token)", "return row.claim_token is not None  # mutant: held by anyone"),
         ("if closed != len(made):", "if closed == 0:  # mutant: notices only that none was closed"),
         ("if moved.rowcount != len(ids):", "if moved.rowcount == 0:  # mutant: notices only that none moved")),
    ),
    # --- time predicates measured from the wrong column (issue 37)
    "recovery_measures_creation": Mutant(
        "the recovery of orphaned claims and of claims a live process's threads do not hold measures "
        "a claim from its creation time, not its claim time: a claim made just now under a process "
        "reaped long ago is crashed while its body may still run, and a claim its thread has not "
        "registered yet is crashed [INV-EXE-1, INV-EXE-5]",
        "the orphan sweep and reconciliation measure a claim from its claim time [INV-EXE-1]",
        (("old(_e.c.claimed_at))  # (a claim made since may not be registered by its thread yet)",
          "old(_e.c.created_at))  # mutant: the creation time"),
         ("old(_a.c.started_at))", "old(_a.c.created_at))  # mutant: the creation time")),
    ),
    "hook_recovery_measures_creation": Mutant(
        "the orphan sweep and reconciliation measure a running on_halt hook from its creation time, "
        "not its claim time [INV-HLT-2]",
        "the orphan sweep measures a hook from its claim time [INV-HLT-2]",
        (("old(_h.c.claimed_at)).order_by(_h.c.id)", "old(_h.c.created_at)).order_by(_h.c.id)"),),
    ),
    "reap_measures_registration": Mutant(
        "the reaper measures a process from its registration, not its last heartbeat: a live process "
        "registered long ago is reaped [INV-EXE-1]",
        "the reaper measures a process from its last heartbeat [INV-EXE-1]",
        (("old = _p.c.last_heartbeat_at <= _stale_before(app, tx) if stale else sa.false()",
          "old = _p.c.created_at <= _stale_before(app, tx) if stale else sa.false()  # mutant: registration"),
         ("stmt = stmt.where(_p.c.last_heartbeat_at <= _stale_before(app, tx))",
          "stmt = stmt.where(_p.c.created_at <= _stale_before(app, tx))  # mutant: registration")),
    ),
    "prune_measures_trigger_time": Mutant(
        "a prune measures a run from its trigger time, not its finish time: a run triggered long ago "
        "that finished a minute ago is deleted [INV-PRN-1]",
        "a prune measures a run from its finish time [INV-PRN-1]",
        (("return sa.func.coalesce(r.c.completed_at, r.c.halted_at)",
          "return r.c.triggered_at  # mutant: the trigger time"),),
    ),
    "key_window_measures_trigger_time": Mutant(
        "a key window measures the key's run from its trigger time, not its finish time, in the "
        "decision and in the UPDATE's fence [INV-TRG-1]",
        "a key window measures its holder from its finish time [INV-TRG-1]",
        (("sa.select(_r.c.id.label(\"run_id\"), _r.c.status, _r.c.completed_at, _r.c.halted_at)",
          "sa.select(_r.c.id.label('run_id'), _r.c.status, _r.c.triggered_at.label('completed_at'), "
          "_r.c.triggered_at.label('halted_at'))"),
         ("_r.c.completed_at <= cutoff),", "_r.c.triggered_at <= cutoff),  # mutant: the trigger time"),
         ("_r.c.halted_at <= cutoff))", "_r.c.triggered_at <= cutoff))  # mutant: the trigger time")),
    ),
    "claim_measures_creation": Mutant(
        "a claim measures an execution's eligibility from its creation time, not its eligible time: a "
        "retry is claimed before its back-off has passed [INV-CLK-1]",
        "a claim takes only an execution whose eligible time has passed [INV-CLK-1]",
        (("_e.c.eligible_at <= now)  # eligible: delays and back-off have passed",
          "_e.c.created_at <= now)  # mutant: the creation time"),),
    ),
    "hook_claim_measures_creation": Mutant(
        "a hook claim measures a pending hook from its creation time, not its eligible time: a "
        "backed-off hook is run again before its back-off has passed [INV-HLT-2]",
        "a hook claim takes only a hook whose eligible time has passed [INV-HLT-2]",
        (("_h.c.eligible_at <= tx.now)", "_h.c.created_at <= tx.now)  # mutant: the creation time"),),
    ),
    # --- recovery preconditions over every state (issue 37): one state accepted too many
    "resume_accepts_in_progress": Mutant(
        "resume of a live run with no dampened branch is accepted (and rewrites its status) instead "
        "of refused [INV-RUN-1]",
        "resume refuses a run with no dampened branch [INV-RUN-1]",
        (("if run.status in TERMINAL or not dampened:",
          "if run.status in TERMINAL:  # mutant: a run with nothing dampened is resumed"),),
    ),
    "revive_accepts_completed": Mutant(
        "revive continues a completed run as a new run, as if it had halted [INV-REV-1]",
        "revive refuses every run that is not halted [INV-REV-1]",
        (('if run.status != "halted":\n        raise ReviveError(run_id, run.status)',
          'if run.status not in ("halted", "completed"):  # mutant: a completed run revives too\n'
          '        raise ReviveError(run_id, run.status)'),),
    ),
    "hook_sweep_takes_any_status": Mutant(
        "the reaper and the orphan sweep crash a dead claimer's on_halt hook whatever its status (the "
        "status asked nowhere: the recovery's read, crash_hooks_of's and the record's fence): a pending "
        "hook's crash budget is spent and a final hook's recorded outcome reopened [INV-HLT-1, INV-HLT-2] "
        "(each of the three alone is masked by the others)",
        "the reaper and the orphan sweep crash only a running hook [INV-HLT-2]",
        (('whose(_h.c.process_id), _h.c.status == "running", old(_h.c.claimed_at))',
          'whose(_h.c.process_id), old(_h.c.claimed_at))'),
         ('.where(_h.c.status == "running", _h.c.id.in_(dialects.inline_ids(sorted(hook_ids))))',
          '.where(_h.c.id.in_(dialects.inline_ids(sorted(hook_ids))))  # mutant: any status'),
         ('result = tx.execute(_h.update().where(_h.c.id == hook.hook_id, _h.c.status == "running",',
          'result = tx.execute(_h.update().where(_h.c.id == hook.hook_id,  # mutant: any status')),
    ),
    # --- process trees outside a supervisor (issue 37)
    "keeper_kills_nothing": Mutant(
        "a timeout= child's keeper dies with the worker's process without killing what is below it: "
        "in an adopter's process (drain, run_once) SIGKILLed mid-step, the step's subprocesses and "
        "theirs outlive it [INV-EXE-5]",
        "a timeout= child's keeper kills every process below it when the worker's process dies "
        "[INV-EXE-5]",
        (("signal.signal(KEEPER_SIGNAL, _worker_died)",
          "signal.signal(KEEPER_SIGNAL, signal.SIG_DFL)  # mutant: the keeper just dies"),),
    ),
    "adopted_orphans_only": Mutant(
        "a supervisor kills the orphans a dead runner left but not what they started: a step's "
        '`sh -c "sleep 600 & wait"` dies and its sleep, re-parented to the supervisor in turn, runs on '
        "[INV-EXE-5]",
        "the supervisor kills each adopted orphan with every process below it [INV-EXE-5]",
        (("kill([pid, *descendants(pid, parents)])", "kill([pid])  # mutant: the orphan, not its descendants"),),
    ),
    # --- the invariants that had no engine mutant
    "context_set_overwrites": Mutant(
        "Context.set without overwrite= replaces a key already set instead of refusing: of racing "
        "setters every one wins, the last writer's value stays [INV-CTX-1]",
        "Context.set inserts, and uq_context_run_key refuses a key already set [INV-CTX-1]",
        (("if overwrite:", "if True:  # mutant: set always upserts"),),
    ),
    "idempotency_key_of_the_run": Mutant(
        "a step's idempotency key is its run's id, not its step's: every step of a run shares one "
        "[INV-EXE-3]",
        "a step's idempotency key is its step row's id (or a revived step's carried-over key) [INV-EXE-3]",
        (("return cls._ductwork_build(args, idempotency_key, run_id, Context(app, run_id))",
          "return cls._ductwork_build(args, run_id, run_id, Context(app, run_id))  # mutant: the run's id"),),
    ),
    "prune_leaves_context": Mutant(
        "a prune deletes a run without its context rows (RUN_TABLES without the context) [INV-PRN-2]",
        "a prune deletes a run's rows from every table that references it (RUN_TABLES) [INV-PRN-2]",
        (('    RunTable(schema.context, "run"),\n', ""),),
    ),
    "dominance_ignores_burst": Mutant(
        "an entry with a lower rate but a larger burst is dropped as dominated: a burst the "
        "configuration allows is refused, or one it refuses admitted [INV-LIM-7]",
        "an entry dominates another only with a rate and a burst each at most the other's [INV-LIM-7]",
        (("return a.limit * b.per_s <= b.limit * a.per_s and a.burst <= b.burst",
          "return a.limit * b.per_s <= b.limit * a.per_s  # mutant: the burst ignored"),),
    ),
}


class MutantError(Exception):
    """A mutant that does not apply to the current source (a snippet missing or repeated)."""


def _sources(package: Path) -> dict[Path, str]:
    """Every ``.py`` file of the package, and the lane routine's SQL (``limits/sql/*.sql``; not
    the older versions a migration keeps as history)."""
    return {path.relative_to(package): path.read_text()
            for path in sorted([*package.rglob("*.py"), *(package / "limits" / "sql").glob("*.sql")])
            if "__pycache__" not in path.parts}


def _replace(text: str, at: int, old: str, new: str) -> str:
    line_start = text.rfind("\n", 0, at) + 1
    line = text[line_start:at]
    indent = line[:len(line) - len(line.lstrip())]  # of the line ``old`` starts on
    new = new.replace("\n", "\n" + indent)
    return text[:at] + new + text[at + len(old):]


def locate(name: str, old: str, sources: dict[Path, str]) -> tuple[Path, int]:
    """The file (relative to the package) and offset of ``old``, which must occur
    exactly once in all of ``sources``; :class:`MutantError` otherwise."""
    hits = [(path, text.find(old)) for path, text in sources.items() for _ in range(text.count(old))]
    if len(hits) != 1:
        where = ", ".join(sorted({str(path) for path, _ in hits})) or "nowhere"
        raise MutantError(f"mutant {name}: snippet {old!r} occurs {len(hits)} times in the package "
                          f"({where}), not exactly once")
    return hits[0]


def patched(name: str, package: Path = PACKAGE) -> dict[Path, str]:
    """The package's files that mutant ``name`` changes, with its edits applied
    (paths relative to the package). Every ``old`` snippet is located in the original
    sources, and again, exactly once, as the edits before it leave them."""
    mutant = MUTANTS[name]
    original = _sources(package)
    current = dict(original)
    for old, new in mutant.edits:
        locate(name, old, original)
        path, at = locate(name, old, current)
        current[path] = _replace(current[path], at, old, new)
    return {path: text for path, text in current.items() if text != original[path]}


_SITECUSTOMIZE = '''\
"""Written by tests/mutants.py: import ductwork from this directory (a mutant's patched
copy) before anything else can, and record where each ductwork module came from."""
import atexit
import os
import sys

import ductwork  # noqa: F401

_LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "imports.log")


def _record():
    files = sorted({getattr(module, "__file__", None) or "" for name, module in list(sys.modules.items())
                    if name == "ductwork" or name.startswith("ductwork.")} - {""})
    with open(_LOG, "a") as log:
        log.writelines(f"{os.getpid()} {path}\\n" for path in files)


_record()
atexit.register(_record)
'''


def apply(name: str, scratch: Path, package: Path = PACKAGE) -> Path:
    """Copy the package into ``scratch`` with mutant ``name``'s edits, and the
    ``sitecustomize.py`` described above; returns ``scratch``."""
    changed = patched(name, package)
    scratch.mkdir(parents=True, exist_ok=True)
    shutil.copytree(package, scratch / "ductwork", ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in changed.items():
        (scratch / "ductwork" / path).write_text(text)
    (scratch / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    (scratch / "MUTANT").write_text(name + "\n")
    return scratch


def environ(scratch: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``scratch`` first on
    ``PYTHONPATH``: processes started with it, and their children, run the copy."""
    env = dict(os.environ if base is None else base)
    env.pop("COVERAGE_PROCESS_START", None)  # a mutated copy's lines are not the package's coverage
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(scratch), env.get("PYTHONPATH")) if p)
    return env


def imported_files(scratch: Path) -> set[Path]:
    """The files of every ``ductwork`` module that processes run with
    :func:`environ` loaded so far (recorded by the scratch's ``sitecustomize.py``)."""
    log = scratch / "imports.log"
    if not log.exists():
        return set()
    return {Path(line.split(" ", 1)[1]).resolve() for line in log.read_text().splitlines() if " " in line}


def check_ran_patched(name: str, scratch: Path) -> set[Path]:
    """Assert that processes ran mutant ``name``'s copy in ``scratch``: they loaded
    ``ductwork`` from it, every ``ductwork`` module they loaded is inside it, and they
    loaded at least one of the patched files. Returns the files loaded."""
    files = imported_files(scratch)
    root = (scratch / "ductwork").resolve()
    assert root / "__init__.py" in files, (
        f"mutant {name}: no process imported ductwork from the scratch copy {root} (loaded: {sorted(files)})")
    outside = sorted(str(path) for path in files if not path.is_relative_to(root))
    assert not outside, f"mutant {name}: ductwork modules loaded from outside the scratch copy: {outside}"
    changed = {(root / path).resolve() for path in patched(name)}
    if all(path.suffix == ".sql" for path in changed):  # the routine's SQL: read by the copy's migrations
        changed = {(root / "db" / "migrate.py").resolve(), (root / "limits" / "__init__.py").resolve()}
    assert files & changed, f"mutant {name}: none of its patched modules {sorted(map(str, changed))} was loaded"
    return files
