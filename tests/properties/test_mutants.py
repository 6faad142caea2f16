"""Every engine mutant is killed by the test that is meant to catch it.

``tests/mutants.py`` lists variants of the engine each missing one guard, as source
edits. For each, this copies the ``ductwork`` package into a scratch directory with
the mutant's edits applied, runs its detector (a property machine, a race test, an
exactly-once test or a fault-checkpoint test) in a fresh pytest process that imports
that copy (scratch first on ``PYTHONPATH``, the ``ci`` profile and its budget,
hypothesis shrinking off), and expects it to fail. It also checks, from what every
process of the run recorded, that ``ductwork`` was imported from the scratch copy,
that no ``ductwork`` module came from anywhere else, and that a patched module was
loaded: a mutant never silently runs against the real source. A failure caused by the patch itself (a ``NameError``, a
``SyntaxError``) is not a kill. A mutant that survives is a guard nobody has
verified. Each run's time to the first counterexample is printed (``-s``) and, as a
row of INVARIANTS.md's engine-mutant table, in the "engine mutants" section at the
end of the run.

Checks the detectors of: INV-LIM-1, INV-LIM-2, INV-LIM-4, INV-LIM-5, INV-LIM-6, INV-LIM-8,
INV-CLK-1, INV-ADV-2, INV-ADV-3, INV-ADV-4, INV-EXE-2, INV-EXE-5, INV-HLT-1, INV-HLT-2, INV-PRN-1, INV-REV-1,
INV-REV-2, INV-REV-3.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import mutants
from tests.mutants import MUTANTS

CONFORMANCE = "tests/properties/test_conformance_limits.py::test_limits_engine_agrees_with_model[sqlite]"
RACE = "tests/integration/test_lock_races.py::test_racing_claims_on_a_key_serialise_on_its_lock[postgresql]"
#: the lane routine's statements in their order: the key's lock before the clock and the count
ROUTINE_ORDER = "tests/unit/test_routine_sql.py::test_the_routine_locks_the_key_before_it_reads_the_clock_or_counts"
#: the lane routine against its specification, state by state (a database each)
REFINEMENT = ("tests/properties/test_refinement.py::"
              "test_the_routine_does_what_the_plan_says_on_every_state_of_the_bounded_domain")
HOOK_STALE = ("tests/integration/test_halt_hooks.py::"
              "test_a_stale_claim_records_nothing_and_the_reaper_re_runs_the_hook[sqlite]")
#: children arriving while their expand is parked between batches
PARKED = ("tests/integration/test_fan_in_while_expanding.py::"
          "test_children_arriving_while_their_expand_is_parked_fire_the_merge_once")
LOSSES = "tests/integration/test_partial_losses.py::"
TIMES = "tests/integration/test_time_predicates.py::"
STATES = "tests/integration/test_recovery_preconditions.py::test_each_operation_over_every_status[sqlite]"
GRANDCHILDREN = ("tests/integration/test_process_trees.py::"
                 "test_a_killed_runners_grandchildren_are_killed_by_its_supervisor")
HOOK_CONFORMANCE = ("tests/properties/test_conformance_pipelines.py::"
                    "test_engine_hooks_end_where_the_model_hooks_end[sqlite]")
FAMILY_RACE = ("tests/integration/test_lock_races.py::"
               "test_racing_claims_in_the_partitions_of_a_family_serialise_on_its_lock")
FAMILY_CEILING = ("tests/integration/test_key_families.py::"
                  "test_a_familys_ceiling_bounds_polls_batches_and_hand_offs_over_all_its_partitions")
#: forgetting idle partitions, on each database
FORGET = "tests/integration/test_forget_partitions.py::"
DETECTORS = {
    "no_stamp": CONFORMANCE,
    "no_clamp": CONFORMANCE,
    "float_refill": CONFORMANCE,
    # (test_rolling_deploy.py's two fleets kill it too, in 48 s; this one prepares the rows)
    "claim_rebase_fills": "tests/integration/test_bounds.py::test_a_rebase_keeps_an_empty_buckets_level[sqlite-claim]",
    "no_spend_on_retry": CONFORMANCE,
    "family_ceiling_ignored": CONFORMANCE,
    "family_ceiling_off_by_one": CONFORMANCE,
    "unkeyed_first": CONFORMANCE,
    "walk_stops_at_the_first_page": ("tests/integration/test_limits.py::"
                                     "test_a_poll_walks_past_a_saturated_lanes_backlog_to_the_next_lane[sqlite]"),
    "hand_off_any_lane": "tests/integration/test_limits.py::test_a_hand_off_yields_to_an_older_lane[sqlite]",
    # forgetting idle partitions (issue 34)
    "forget_without_recheck": CONFORMANCE,
    "forget_in_flight": FORGET + "test_a_busy_partition_static_key_or_family_row_is_never_forgotten[sqlite-in_flight]",
    "forget_restarts_seq": FORGET + "test_an_idle_partition_is_forgotten_and_comes_back_empty_numbering_on[sqlite]",
    "forget_restarts_seq_routine": FORGET + "test_a_sweep_between_an_enqueues_read_and_its_commit[postgresql]",
    "forget_restarts_seq_mysql": FORGET + "test_a_sweep_between_an_enqueues_read_and_its_commit[mysql]",
    "forgotten_row_not_created_sqlite": FORGET + "test_a_pending_execution_whose_row_was_forgotten_is_claimed[sqlite]",
    "forgotten_row_not_created": FORGET + "test_a_sweep_between_an_enqueues_read_and_its_commit[postgresql]",
    "forgotten_row_not_created_mysql": FORGET + "test_a_sweep_between_an_enqueues_read_and_its_commit[mysql]",
    "count_outside_lock": RACE,
    "no_key_lock": RACE,
    "no_key_lock_mysql": RACE.replace("[postgresql]", "[mysql]"),
    "no_family_lock": FAMILY_RACE + "[postgresql]",
    "no_family_lock_mysql": FAMILY_RACE + "[mysql]",
    **dict.fromkeys(("clock_before_lock", "clock_before_lock_mysql"), ROUTINE_ORDER),
    **{name: REFINEMENT + ("[mysql]" if name.endswith("_mysql") else "[postgresql]") for name in (
        "routine_ceiling_off_by_one", "routine_ceiling_off_by_one_mysql", "routine_spend_twice",
        "routine_spend_twice_mysql", "routine_lane_order_reversed", "routine_lane_order_reversed_mysql",
        "routine_state_guard_dropped", "routine_state_guard_dropped_mysql", "routine_walk_passes_no_lane",
        "routine_walk_passes_no_lane_mysql")},
    # (the refinement test kills them too, in 29-67 s each; this one in a few seconds)
    **{name: FAMILY_CEILING + ("[mysql]" if name.endswith("_mysql") else "[postgresql]") for name in (
        "routine_family_ceiling_ignored", "routine_family_ceiling_off_by_one", "routine_family_ceiling_ignored_mysql")},
    "batch_past_lane": "tests/integration/test_batches.py::test_a_batch_stops_before_an_older_keyed_lane[sqlite]",
    "batch_past_unfilled_key":
        "tests/integration/test_batches.py::test_a_batch_goes_on_past_the_keys_its_runs_fill[sqlite]",
    "batch_no_guard":
        "tests/integration/test_batches.py::test_a_group_commit_leaves_a_reaped_execution_to_the_reaper[sqlite]",
    "keyed_group_one_seq": "tests/integration/test_batches.py::"
    "test_a_keyed_group_commit_releases_each_with_its_own_seq_and_hands_on_the_next[sqlite]",
    "keyed_batch_past_refusal": "tests/integration/test_batches.py::"
    "test_a_keyed_batch_claims_what_polls_in_a_row_would[sqlite]",
    "hand_off_before_releases": "tests/integration/test_batches.py::"
    "test_a_keyed_group_commit_releases_each_with_its_own_seq_and_hands_on_the_next[sqlite]",
    "releases_seq_unwritten": "tests/integration/test_batches.py::"
    "test_a_keyed_group_commit_with_nothing_to_hand_on_moves_the_keys_seq_past_its_releases[sqlite]",
    # bounds per path (issue 17)
    "keyed_batch_stale_count":
        "tests/integration/test_bounds.py::test_the_concurrency_ceiling_bounds_each_path[sqlite-group]",
    "keyed_batch_stale_buckets": "tests/integration/test_bounds.py::"
    "test_a_bucket_one_unit_short_of_two_tokens_admits_one_on_each_path[sqlite-batch]",
    "keyed_batch_one_seq":
        "tests/integration/test_bounds.py::test_each_path_numbers_its_claims_after_its_releases[sqlite-hand_off]",
    "stale_fence_commits": "tests/integration/test_exactly_once.py::test_stale_token_commits_nothing[sqlite]",
    "fanin_outside_fence":
        "tests/integration/test_fault_checkpoints.py::test_checkpoint[sqlite-before_fanin_bump-raise]",
    "fanin_fires_on_created": PARKED + "[sqlite-each_batch_arrives_at_once]",
    "expand_cursor_not_resumed": PARKED + "[sqlite-reaped_after_the_first_batch]",
    "claim_held_branch":
        "tests/integration/test_exactly_once.py::test_racing_claims_on_one_branch_have_one_winner[sqlite]",
    # --- process trees ---
    "timeout_kills_group_only":
        "tests/integration/test_process_trees.py::test_a_timed_out_steps_subprocesses_die_with_it[sqlite]",
    "dead_runner_tree_left": "tests/integration/test_process_trees.py::"
    "test_a_killed_runners_step_subprocesses_are_killed_by_its_supervisor[sqlite]",
    "runner_outlives_supervisor":
        "tests/integration/test_process_trees.py::test_a_killed_supervisors_runners_stop[sqlite]",
    "zombie_starts_body":
        "tests/integration/test_fleet.py::test_a_worker_whose_process_lost_its_lease_starts_no_step_code[sqlite]",
    # --- same-host recovery (issue 36) ---
    "same_host_not_reaped":
        "tests/integration/test_same_host_recovery.py::test_a_reused_pid_is_told_apart_by_its_start_time",
    "reap_by_host_name": "tests/integration/test_same_host_recovery.py::"
    "test_a_live_process_of_another_pid_namespace_with_a_pid_that_exists_here_is_never_reaped",
    "reap_by_pid_only":
        "tests/integration/test_same_host_recovery.py::test_a_reused_pid_is_told_apart_by_its_start_time",
    "dead_fleet_leftovers_kept": "tests/integration/test_same_host_recovery.py::"
    "test_what_a_dead_fleets_step_started_dies_before_its_claim_moves_on[sqlite]",
    # --- on_halt hooks (issue 16) ---
    "hook_not_owed": "tests/integration/test_halt_hooks.py::test_a_halted_run_gets_one_hook_with_its_halt[sqlite]",
    "hook_fence_dropped": HOOK_STALE,
    "hook_claims_running": HOOK_STALE,
    "hook_retries_forever": HOOK_CONFORMANCE,
    # (the hook conformance hunt found it only for some derandomized draws, and a change to
    # the hunt's code moved them: this test spends the crash budget outright)
    "hook_crashes_forever":
        "tests/integration/test_halt_hooks.py::test_a_handler_that_cannot_be_built_is_re_run_then_fails[sqlite]",
    "hook_not_reaped":
        "tests/integration/test_halt_hook_faults.py::test_hook_checkpoint[sqlite-after_hook_claim-kill]",
    "prune_without_recheck":
        "tests/integration/test_inspection.py::test_a_batch_rechecks_each_run_under_its_lock[sqlite]",
    # revive (issue 16)
    "revive_twice": "tests/integration/test_revive.py::test_concurrent_revives_from_threads_create_one_run[sqlite]",
    "revive_reruns_history": "tests/integration/test_revive.py::"
    "test_a_crashes_exhausted_halt_reruns_the_step_with_its_original_input[sqlite]",
    "revive_nil_input": "tests/integration/test_revive.py::"
    "test_a_crashes_exhausted_halt_reruns_the_step_with_its_original_input[sqlite]",
    "revive_new_key": "tests/integration/test_revive.py::"
    "test_a_revived_fan_out_reruns_only_the_failed_children_and_then_merges[sqlite]",
    # triggers (issue 18)
    "trigger_key_not_stored":
        "tests/integration/test_triggers.py::test_a_second_trigger_with_the_key_returns_the_first_run[sqlite]",
    "trigger_key_unmapped": "tests/integration/test_triggers.py::"
    "test_a_key_committed_after_the_callers_snapshot_raises_and_leaves_its_transaction_usable[postgresql]",
    "key_window_ignores_finish_time":
        "tests/integration/test_triggers.py::test_a_run_finished_within_the_window_keeps_its_key[sqlite]",
    "trigger_outside_callers_transaction":
        "tests/integration/test_triggers.py::test_a_rolled_back_trigger_leaves_nothing[postgresql]",
    # async steps (issue 18)
    "async_cancel_escapes": "tests/integration/test_async_steps.py::"
    "test_an_async_step_that_cancels_itself_or_raises_fails[sqlite-cancels_itself]",
    # partial losses inside a batch (issue 37)
    "group_guard_counts_none": LOSSES + "test_a_group_commit_that_lost_one_writes_nothing_for_it[sqlite]",
    "keyed_group_guard_counts_none":
        LOSSES + "test_a_keyed_group_commit_that_lost_one_writes_nothing_for_it[sqlite]",
    "batch_fence_counts_none":
        LOSSES + "test_an_advancers_batch_that_lost_one_branch_writes_nothing_for_it[sqlite-re-claimed]",
    # time predicates measured from the wrong column (issue 37)
    "recovery_measures_creation": TIMES + "test_the_orphan_sweep_measures_a_claim_from_its_claim_time[sqlite]",
    "hook_recovery_measures_creation": TIMES + "test_the_orphan_sweep_measures_a_claim_from_its_claim_time[sqlite]",
    "reap_measures_registration": TIMES + "test_the_reaper_measures_a_process_from_its_last_heartbeat[sqlite]",
    "prune_measures_trigger_time": TIMES + "test_a_prune_measures_a_run_from_its_finish_time[sqlite]",
    "key_window_measures_trigger_time": TIMES + "test_a_key_window_measures_its_holder_from_its_finish_time[sqlite]",
    "claim_measures_creation": TIMES + "test_a_claim_measures_an_execution_from_its_eligible_time[sqlite]",
    "hook_claim_measures_creation": TIMES + "test_a_hook_claim_measures_a_hook_from_its_eligible_time[sqlite]",
    # recovery preconditions over every state (issue 37)
    "resume_accepts_in_progress": STATES,
    "revive_accepts_completed": STATES,
    "keeper_kills_nothing": "tests/integration/test_process_trees.py::"
    "test_an_embedded_worker_killed_mid_step_leaves_no_grandchild_of_its_timeout_child[sqlite-drain]",
    "adopted_orphans_only": GRANDCHILDREN + "[sqlite-thread]",
    "hook_sweep_takes_any_status":
        "tests/integration/test_recovery_preconditions.py::test_the_hook_sweep_and_the_reaper_crash_only_a_running_hook"
        "[sqlite]",
    # the invariants that had no engine mutant
    "context_set_overwrites": "tests/integration/test_context.py::test_racing_setters_one_wins[sqlite]",
    "idempotency_key_of_the_run": ("tests/integration/test_context.py::"
                                   "test_a_steps_key_is_its_id_across_retries_and_distinct_across_steps[sqlite]"),
    "prune_leaves_context": ("tests/integration/test_inspection.py::"
                             "test_a_pruned_run_leaves_no_row_in_any_table_that_names_it[sqlite]"),
    "dominance_ignores_burst": "tests/unit/test_limits.py::test_drop_dominated_properties",
}
#: mutants with another detector that a conformance machine found only with the ``deep``
#: budget, and now finds within ``ci``'s (docs/verification.md, "Conformance budgets")
ALSO_CONFORMANCE = {"batch_past_lane": CONFORMANCE, "batch_past_unfilled_key": CONFORMANCE}
#: mutants of a guard that several paths share, killed on each path's own test too (the
#: unkeyed group guard ends the async batch's group commit and an expand's items; one
#: recovery routine serves the orphan sweep and reconciliation)
ALSO_PATHS = {
    # (the one batch rule of plan(): unkeyed and keyed, a poll's and a hand-off's)
    "batch_past_lane": ("tests/integration/test_batches.py::test_a_keyed_batch_stops_before_an_older_lane[sqlite]",
                        "tests/integration/test_bounds.py::"
                        "test_each_path_stops_before_an_older_lanes_oldest[sqlite-unkeyed_hand_off]"),

    # (the orphan sweep and reconciliation are one recovery routine since issue 31)
    "recovery_measures_creation": (TIMES + "test_reconciliation_measures_a_claim_from_its_claim_time[sqlite]",),
    "hook_recovery_measures_creation": (TIMES + "test_reconciliation_measures_a_claim_from_its_claim_time[sqlite]",),
    # (the thread's and the step loop's steps, and an on_halt handler, are all the runner's own descendants)
    "adopted_orphans_only": (GRANDCHILDREN + "[sqlite-step_loop]", GRANDCHILDREN + "[sqlite-on_halt]"),
    "group_guard_counts_none": (LOSSES + "test_an_async_batch_that_lost_one_writes_nothing_for_it[sqlite]",
                                LOSSES + "test_a_group_commit_that_lost_one_writes_no_expand_items_for_it[sqlite]"),
}
#: errors that mean the patch broke the code rather than the guard
BROKEN = ("NameError", "UnboundLocalError", "SyntaxError", "IndentationError", "ImportError")


def detector_label(mutant: str) -> str:
    """How INVARIANTS.md's table names the detector of ``mutant``."""
    detector = DETECTORS[mutant]
    if detector == CONFORMANCE:
        return "limits conformance, SQLite"
    if detector == RACE and mutant != "no_key_lock":
        return "the same race test"
    if detector.startswith(REFINEMENT):
        return f"the routine's refinement test, {'MySQL-family' if detector.endswith('[mysql]') else 'PostgreSQL'}"
    if detector == HOOK_STALE and mutant != "hook_fence_dropped":
        return "the same stale-claim test"
    if detector == HOOK_CONFORMANCE:
        return "pipeline hook conformance, SQLite"
    return f"`{detector.split('/')[-1]}`"


def test_every_mutant_has_a_detector():
    assert set(DETECTORS) == set(MUTANTS)


def test_conformance_hunts_have_the_ci_budget(monkeypatch):
    """A conformance detector hunts with the ``ci`` profile's budget (``DUCTWORK_NO_SHRINK``
    drops only the shrinking), so a mutant killed below is one CI's own conformance run
    catches, and a cut of that budget that hides one fails :func:`test_mutant_is_killed`.
    (The hunts once ran with the ``deep`` budget, which hid that ``no_spend_on_retry`` was
    found only there: docs/verification.md, "Conformance budgets".)"""
    from tests.properties import test_conformance_limits

    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
    monkeypatch.setenv("DUCTWORK_NO_SHRINK", "1")
    chosen = test_conformance_limits.conformance_settings()
    assert (chosen.max_examples, chosen.stateful_step_count) == test_conformance_limits.CONFORMANCE["ci"]


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_killed(mutant, tmp_path, record_property):
    detector = DETECTORS[mutant]
    if "[postgresql]" in detector and not os.environ.get("DUCTWORK_TEST_POSTGRES_URL"):
        pytest.skip("this detector needs PostgreSQL: set DUCTWORK_TEST_POSTGRES_URL")
    if "[mysql]" in detector and not os.environ.get("DUCTWORK_TEST_MYSQL_URL"):
        pytest.skip("this detector needs MySQL-family: set DUCTWORK_TEST_MYSQL_URL")
    took = hunt(mutant, detector, tmp_path)
    record_property("engine_mutant", f"| `{mutant}` | {MUTANTS[mutant].guard} | {detector_label(mutant)} "
                                     f"| {took:.1f} s |")


@pytest.mark.nightly
@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(ALSO_CONFORMANCE))
def test_mutant_is_killed_by_conformance_too(mutant, tmp_path):
    """The mutants a conformance machine once found only with the ``deep`` budget, though
    another test is their detector, are killed by it within the ``ci`` budget too."""
    hunt(mutant, ALSO_CONFORMANCE[mutant], tmp_path)


@pytest.mark.nightly
@pytest.mark.slow
@pytest.mark.parametrize(("mutant", "detector"),
                         [(mutant, detector) for mutant, detectors in sorted(ALSO_PATHS.items())
                          for detector in detectors])
def test_mutant_is_killed_on_each_path_it_breaks(mutant, detector, tmp_path):
    """A mutant of a guard that several batch paths share is killed by each path's test."""
    hunt(mutant, detector, tmp_path)


def hunt(mutant: str, detector: str, tmp_path) -> float:
    """Run ``detector`` against ``mutant``'s copy (the ``ci`` profile, no shrinking);
    assert that it failed, not because the patch broke the code; the seconds it took."""
    scratch = mutants.apply(mutant, tmp_path / "scratch")
    env = {**mutants.environ(scratch), "DUCTWORK_NO_SHRINK": "1", "HYPOTHESIS_PROFILE": "ci"}
    started = time.monotonic()
    # The copy's sitecustomize imports ductwork before pytest starts, so pytest cannot
    # assertion-rewrite the installed pytest11 plugin's package and warns; that warning is
    # about the harness, not the mutant (the detector's own asserts are in tests/, rewritten).
    done = subprocess.run([sys.executable, "-m", "pytest", detector, "-x", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-W", "ignore::pytest.PytestAssertRewriteWarning"],
                          env=env, capture_output=True, text=True, timeout=600, check=False,
                          cwd=mutants.REPO)
    took = time.monotonic() - started
    print(f"mutant {mutant}: {'killed' if done.returncode == 1 else 'SURVIVED'} by {detector} in {took:.1f} s")
    mutants.check_ran_patched(mutant, scratch)
    broken = [error for error in BROKEN if error in done.stdout]
    assert not broken, f"mutant {mutant}: the patch broke the code ({broken}):\n{done.stdout[-3000:]}"
    assert done.returncode == 1, f"mutant {mutant} survived {detector}:\n{done.stdout[-3000:]}"
    return took
