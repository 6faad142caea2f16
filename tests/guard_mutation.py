"""Generated mutants of the engine's guard modules, against the integration tier: a nightly run.

    python -m tests.guard_mutation fleet/reaper.py              # one module, on SQLite
    python -m tests.guard_mutation --db postgresql fleet/reaper.py
    python -m tests.guard_mutation --all                        # every guard module (hours)
    python -m tests.guard_mutation --all --db postgresql        # the same on one server
    python -m tests.guard_mutation --list fleet/reaper.py       # the mutants, not run
    python -m tests.guard_mutation --map                        # which integration tests run each line
    python -m tests.guard_mutation --widen fleet/reaper.py      # its survivors against those tests
    python -m tests.guard_mutation --db postgresql --survivors fleet/reaper.py  # what SQLite left
    python -m tests.guard_mutation limits/claims.py --only 58 77 --against tests/integration/test_limits.py
    python -m tests.guard_mutation --report                     # the table of the last runs

``tests/mutation.py`` runs mutmut over the pure modules against the unit tier. The guard
modules (claims, outcomes, advancement, the reaper, revive, prune, hooks, the process
tree) decide in SQL and in transactions, which the unit tier does not reach, and
mutmut's operators (every constant, string and argument) would spend hours on
changes that do not matter there. This generator writes only the operators that do, one
change per mutant, from the module's syntax tree:

- ``comparison``: ``<`` for ``<=`` and back, ``>`` for ``>=`` and back, ``==`` for
  ``!=`` and back, ``is`` for ``is not``, ``in`` for ``not in`` (in Python and in SQL
  expressions alike: ``e.c.claimed_at <= threshold``);
- ``boolean``: ``and`` for ``or`` and back, a ``not`` dropped;
- ``where``: one argument of a ``.where(...)``, ``sa.and_(...)`` or ``sa.or_(...)``
  dropped (a ``.where`` of one argument dropped whole);
- ``column``: a time column of a table read as another time column of the same table
  (``claimed_at`` as ``created_at``), the class of bug issue 37 found.

Each mutant is the module's source with that one change (``ast.unparse``: comments are
lost, code is not), put in a scratch copy of the package that the tests' processes import
first (``tests/mutants.py``'s ``sitecustomize``). The module's tests (:data:`GUARD_TESTS`,
its part of the integration tier) run against it on one database (SQLite by default; the
tests of no database run too) and stop at the first failure: a failure kills the mutant, a run past 4x the
clean run's time (plus 30 s) times out (killed by a loop), a clean pass survives. A
module's selection is what catches most mutants fast; a survivor is then run again
(``--widen``) against every integration test that runs its line, which ``--map`` finds once
per database: the whole integration tier under coverage.py with a context per test
function. A survivor of that is a scenario no integration test has. Results
are kept per module and database in ``tests/guard-mutation-results/`` (committed: the
published scores are these files; ``--only`` re-runs some and keeps the others while the
module is unchanged), so ``--report`` prints the table and every survivor, to be killed by
a new test or argued equivalent (:data:`ARGUED`). A module run on several databases gets a
row ``all`` as well: a mutant is killed there when some database's run killed it (the
dialect seam puts some lines on one side only: the server routine's caller never runs on
SQLite, the Python lane path never on a server), and survives when every run left it.
A result of a module's earlier source (another numbering) is marked stale.
Not run by ``.ci/run``: a mutant costs one run of its module's tests.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.etree import ElementTree

import coverage

from tests import mutants

ROOT = mutants.REPO
PACKAGE = mutants.PACKAGE
RESULTS = ROOT / "tests" / "guard-mutation-results"
_I = "tests/integration/"

#: each guard module (relative to ductwork/) and the integration tests that guard it
GUARD_TESTS: dict[str, tuple[str, ...]] = {
    "fleet/reaper.py": (f"{_I}test_time_predicates.py", f"{_I}test_recovery_preconditions.py",
                        f"{_I}test_exactly_once.py", f"{_I}test_halt_hooks.py", f"{_I}test_same_host_recovery.py"),
    "fleet/tree.py": (f"{_I}test_process_trees.py", f"{_I}test_timeout_children.py"),
    "fleet/child.py": (f"{_I}test_timeout_children.py", f"{_I}test_process_trees.py"),
    "pipelines/prune.py": (f"{_I}test_time_predicates.py", f"{_I}test_recovery_preconditions.py",
                           f"{_I}test_inspection.py", f"{_I}test_triggers.py"),
    "pipelines/revive.py": (f"{_I}test_recovery_preconditions.py", f"{_I}test_revive.py"),
    "pipelines/hooks.py": (f"{_I}test_time_predicates.py", f"{_I}test_recovery_preconditions.py",
                           f"{_I}test_halt_hooks.py"),
    "pipelines/runs.py": (f"{_I}test_recovery_preconditions.py", f"{_I}test_pipelines.py",
                          f"{_I}test_halt_hooks.py", f"{_I}test_async_client.py"),
    "pipelines/advance.py": (f"{_I}test_partial_losses.py", f"{_I}test_exactly_once.py",
                             f"{_I}test_fan_in_while_expanding.py", f"{_I}test_pipelines.py",
                             f"{_I}test_advancer_arms.py", f"{_I}test_logs.py"),
    "pipelines/branches.py": (f"{_I}test_partial_losses.py", f"{_I}test_exactly_once.py",
                              f"{_I}test_advancer_arms.py", f"{_I}test_pipelines.py",
                              f"{_I}test_batches.py"),  # (set_status_if: a group's status and outputs)
    "limits/lanes.py": (f"{_I}test_time_predicates.py", f"{_I}test_batches.py", f"{_I}test_limits.py",
                        f"{_I}test_bounds.py", f"{_I}test_key_families.py"),
    "limits/claims.py": (f"{_I}test_time_predicates.py", f"{_I}test_partial_losses.py", f"{_I}test_bounds.py",
                         f"{_I}test_batches.py", f"{_I}test_limits.py", f"{_I}test_key_families.py"),
    "limits/executions.py": (f"{_I}test_partial_losses.py", f"{_I}test_batches.py", f"{_I}test_exactly_once.py",
                             f"{_I}test_bounds.py", "tests/unit/test_limits.py",
                             f"{_I}test_inspection.py",  # (forget: a prune keeps the other runs' executions)
                             f"{_I}test_key_families.py", f"{_I}test_partitions.py",
                             f"{_I}test_forget_partitions.py",
                             "tests/unit/test_column_widths.py"),  # (an error fitted to its columns)
    "pipelines/outcomes.py": (f"{_I}test_partial_losses.py", f"{_I}test_batches.py", f"{_I}test_exactly_once.py",
                              f"{_I}test_timeout_children.py", f"{_I}test_wakeups.py"),
    "fleet/worker.py": (f"{_I}test_worker_loop.py", f"{_I}test_batches.py", f"{_I}test_partial_losses.py",
                        f"{_I}test_async_steps.py", f"{_I}test_wakeups.py", f"{_I}test_halt_hooks.py",
                        f"{_I}test_testing.py"),  # (a batch's claims and group commits; run_once's outcomes)
    "pipelines/steps.py": (f"{_I}test_pipelines.py", f"{_I}test_partial_losses.py", f"{_I}test_exactly_once.py",
                           f"{_I}test_partitions.py", f"{_I}test_fan_in_while_expanding.py",
                           f"{_I}test_halt_hooks.py"),  # (steps' rows, INV-ADV-1; latest_step: a halt's node)
    "pipelines/trigger.py": (f"{_I}test_triggers.py", f"{_I}test_time_predicates.py", f"{_I}test_async_client.py",
                             f"{_I}test_exact_names.py"),  # (keyed and transactional triggers, INV-TRG-1/2)
    "fleet/processes.py": (f"{_I}test_process_rows.py", f"{_I}test_time_predicates.py",
                           f"{_I}test_same_host_recovery.py"),  # (registration, heartbeat, other supervisors)
    "db/hosts.py": (f"{_I}test_process_rows.py", f"{_I}test_same_host_recovery.py",
                    f"{_I}test_time_predicates.py"),  # (a proof of death, this OS process's rows, other workers)
    "fleet/supervisor.py": (f"{_I}test_fleet.py", f"{_I}test_time_predicates.py", f"{_I}test_forget_partitions.py",
                            f"{_I}test_key_families.py",  # (a heartbeat sent again without its counts)
                            f"{_I}test_column_widths.py"),  # (a label too long for its children's rows)
    "pipelines/context.py": (f"{_I}test_context.py", f"{_I}test_recovery_preconditions.py",
                             f"{_I}test_async_steps.py"),  # (a key set once per run, INV-CTX-1; a pruned run)
    "db/engines.py": ("tests/unit/test_dialects.py",  # (URLs: drivers, aliases, refusals, a missing file)
                      f"{_I}test_dialect_seams.py",  # (a server's session: isolation, sql_mode)
                      f"{_I}test_connections.py",  # (SQLite's BEGIN IMMEDIATE and busy_timeout)
                      f"{_I}test_verify_environment.py",  # (the pragmas and isolation a connection has)
                      f"{_I}test_async_client.py"),  # (create_async_engine)
    "db/database.py": ("tests/unit/test_dialects.py",  # (the default app, a missing file, a bare Database)
                       f"{_I}test_missing_tables.py", f"{_I}test_wakeups.py", f"{_I}test_connections.py",
                       f"{_I}test_async_client.py",  # (aread, the async engine made once)
                       "tests/unit/test_clocks_and_ids.py"),
    "fleet/batching.py": ("tests/unit/test_batching.py",),  # (pure rules: the worker asks, the unit tier checks)
    "fleet/boot.py": ("tests/unit/test_config.py", "tests/unit/test_limits.py",  # (load_pipelines, references)
                      f"{_I}test_cli.py",  # (ductwork check: a missing entry, missing tables, an old schema)
                      f"{_I}test_payloads.py"),  # (the packet warning)
    "fleet/execute.py": (f"{_I}test_async_steps.py",  # (awaited together on the step loop)
                         f"{_I}test_payloads.py",  # (a return value its edge cannot carry)
                         "tests/unit/test_payloads.py", f"{_I}test_step_checks.py", f"{_I}test_pipelines.py"),
    "fleet/shared.py": ("tests/unit/test_batching.py",  # (the token alarm on a clock the test sets)
                        f"{_I}test_limits.py", f"{_I}test_worker_loop.py", f"{_I}test_key_families.py"),
    "fleet/steploop.py": ("tests/unit/test_steploop.py", f"{_I}test_async_steps.py"),
    "db/clock.py": ("tests/unit/test_clocks_and_ids.py",
                    f"{_I}test_testing.py",  # (drain's skip_delays: an OffsetClock over the database's)
                    f"{_I}test_limits.py"),  # (a rated key's routine reading the test's clock: in_sql)
    "db/wakeup.py": (f"{_I}test_wakeups.py",  # (generations, one thread or all; PgListener on PostgreSQL)
                     f"{_I}test_worker_loop.py"),
    "db/dialects.py": (f"{_I}test_dialect_seams.py", "tests/unit/test_dialects.py",
                       f"{_I}test_batches.py",  # (a batch's id lists and rows inserted at once)
                       f"{_I}test_column_widths.py"),  # (a value longer than its column refused in an unnest insert)
    "db/schema.py": (f"{_I}test_dialect_seams.py", "tests/unit/test_dialects.py",
                     f"{_I}test_triggers.py",  # (a unique violation named through CONSTRAINT_COLUMNS)
                     f"{_I}test_exact_names.py"),  # (the binary NO PAD collation of the MySQL family)
    "db/migrate.py": (f"{_I}test_migrations.py", f"{_I}test_missing_tables.py"),
    "limits/outcomes.py": ("tests/unit/test_outcomes.py",  # (pure rules: every branch and boundary)
                           f"{_I}test_exactly_once.py"),  # (the budgets as the engine spends them)
    "fleet/hooks.py": (f"{_I}test_halt_hooks.py", f"{_I}test_halt_hook_faults.py"),  # (an abandoned attempt crashed)
    "pipelines/history.py": (f"{_I}test_inspection.py", f"{_I}test_revive.py",  # (runs and show; carried steps)
                             f"{_I}test_string_compare.py"),  # (a pipeline filter's exact names)
    "pipelines/snapshot.py": ("tests/unit/test_definition.py",  # (the snapshot's round trip and every shape refused)
                              "tests/unit/test_rules.py", "tests/unit/test_step_checks.py", f"{_I}test_pipelines.py",
                              f"{_I}test_partitions.py",
                              f"{_I}test_step_checks.py"),  # (a class of __main__ named in the definition)
    "pipelines/step.py": ("tests/unit/test_step_checks.py", "tests/unit/test_definition.py",
                          f"{_I}test_step_checks.py",  # (an input that cannot bind; execute's checks)
                          f"{_I}test_async_steps.py", f"{_I}test_context.py"),  # (async execute; a step's context)
    "pipelines/registry.py": ("tests/unit/test_definition.py", "tests/unit/test_step_checks.py",
                              f"{_I}test_configured_code.py",  # (stored names resolve without importing)
                              f"{_I}test_step_checks.py"),
    "pipelines/pipeline.py": ("tests/unit/test_definition.py", "tests/unit/test_step_checks.py",
                              f"{_I}test_step_checks.py",  # (a trigger's input and __main__ checks)
                              f"{_I}test_async_client.py",  # (atrigger, with and without a connection)
                              f"{_I}test_configured_code.py"),  # (import_pipeline of a configured name)
    "pipelines/payloads.py": ("tests/unit/test_payloads.py", f"{_I}test_payloads.py",  # (every value's JSON and size)
                              "tests/unit/test_verify_environment_judges.py"),  # (the max_allowed_packet warning)
    "db/driver_errors.py": ("tests/unit/test_dialects.py",  # (each driver's contention errors, the retries)
                            f"{_I}test_dialect_seams.py", f"{_I}test_triggers.py",  # (constraints named)
                            f"{_I}test_exactly_once.py", f"{_I}test_revive.py", f"{_I}test_batches.py"),
    "db/extras.py": ("tests/unit/test_dialects.py",),  # (a driver not installed names its extra)
    "db/ids.py": ("tests/unit/test_clocks_and_ids.py",),  # (time-ordered ids, tokens)
}
OPERATORS = ("comparison", "boolean", "where", "column")
DATABASES = ("sqlite", "postgresql", "mysql")

#: surviving mutants argued equivalent (no test can tell them from the original), by
#: ``module#number`` of the module's current source (a change to it renumbers them: re-argue)
#: why the key window's fence re-checks what cannot change (pipelines/trigger.py's argued mutants)
TERMINAL_ARGUMENT = (
    "a run is completed or halted for good (runs.TERMINAL: resolve_runs' UPDATE that sets the status and its "
    "finish time is guarded by `status NOT IN TERMINAL`; revive writes a new run and leaves the halted one as it "
    "is; resume moves only a dampened run), and it has a finish time only then, written once in that UPDATE; "
    "key_expired decided on this row's status and finish time, read in this transaction, so the fence's term "
    "re-decides a fact that cannot have changed since (a prune deleting the row meanwhile makes the id miss "
    "either way); the fence's time terms are killed where they can differ (#32, #34: the window's own instant; "
    "#40-#47: another time column)")
ARGUED: dict[str, tuple[str, str]] = {
    # -- fleet/reaper.py
    "fleet/reaper.py#3": (
        '`and_` without `_p.c.machine_identifier == machine_identifier()`',
        "reap_dead's read of this machine's rows without the machine: each row's proof (proven_dead) "
        'compares the machine again, and a row without proof is reaped only when stale'),
    "fleet/reaper.py#4": (
        '`and_` without `_p.c.os_start_ticks.is_not(None)`',
        "reap_dead's read of this machine's rows without the start time: proven_dead asks for it again"),
    "fleet/reaper.py#5": (
        '`.where(sa.or_(old, here))` dropped',
        'reap_dead reads every row: each is reaped only on proof (proven_dead) or when its own stale '
        'column says so (a cost, not an outcome)'),
    "fleet/reaper.py#38": (
        '`.where(_b.c.id == branch_id)` dropped',
        'the branch lock without its id: SQLite has no row locks, and on a server it locks more rows (a '
        'cost, a wider wait), not another outcome'),
    "fleet/reaper.py#41": (
        '`_b.c.id == branch_id`: NotEq for Eq',
        'the branch lock on the other branches: as #38'),
    "fleet/reaper.py#44": (
        '`where` without `whose(_e.c.process_id)`',
        "find reads every holder's executions: the guarded write that follows refuses what the wider "
        "read adds (crash_in's `process_id = owner`, or `IS NULL` for orphans)"),
    "fleet/reaper.py#45": (
        '`where` without `_e.c.claimed_at.is_not(None)`',
        "find without `claimed_at IS NOT NULL`: a pending execution has no owner (not the reap's), and "
        "the sweep's and reconciliation's `claimed_at <= before` implies it"),
    "fleet/reaper.py#46": (
        '`where` without `_e.c.completed_at.is_(None)`',
        'find reads closed executions too: the guarded write that follows refuses what the wider read '
        "adds (crash_in's `completed_at IS NULL`)"),
    "fleet/reaper.py#59": (
        "`where` without `_h.c.status == 'running'`",
        "find reads hooks of any status: crash_hooks_of asks `status = 'running'` again (and the "
        "record's fence a third time)"),
    "fleet/reaper.py#61": (
        '`_e.c.claimed_at` read as `eligible_at`',
        '`eligible_at IS NOT NULL` (always true) for `claimed_at IS NOT NULL`: as #45'),
    "fleet/reaper.py#63": (
        '`_e.c.claimed_at` read as `created_at`',
        '`created_at IS NOT NULL` (always true): as #45'),
    "fleet/reaper.py#64": (
        '`_e.c.claimed_at` read as `updated_at`',
        '`updated_at IS NOT NULL` (always true): as #45'),
    # -- fleet/tree.py
    # -- fleet/child.py
    "fleet/child.py#15": (
        "`time.monotonic() < deadline`: LtE for Lt",
        "the keeper's kill loop (_worker_died, in the keeper's own process, whose clock no test can set) "
        "differs only when a read of the nanosecond monotonic clock equals `start + KEEPER_KILL_S` exactly: "
        "then one more round kills what is below it, as the rounds before did, 10 ms before it exits"),
    "fleet/child.py#7": (
        "`(left := tree.descendants(os.getpid())) and time.monotonic() < deadline`: Or",
        "the keeper's kill loop goes on until KEEPER_KILL_S (5 s) after its tree is already gone, "
        "then exits: every process below it is killed as before, nothing is written, and only the "
        "keeper's own exit is later (a test would have to time the keeper under 5 s)"),
    # -- pipelines/prune.py
    "pipelines/prune.py#6": (
        "`and_` without `r.c.status.in_(PRUNABLE)`",
        "_prunable without the status: its next term `_finished(r) < cutoff` needs a finish time, and only a "
        "completed or halted run has one: trigger and revive insert a run with completed_at and halted_at NULL, "
        "and only resolve_runs sets them, in the UPDATE that makes the run completed (completed_at) or halted "
        "(halted_at); that UPDATE is guarded by `status NOT IN TERMINAL` and no other write changes a final "
        "run's status (resume moves a dampened run, which has neither time) [INV-RUN-1]; candidates also asks "
        "`status = :status` (one of PRUNABLE), and prune_batch re-checks may_prune"),
    "pipelines/prune.py#27": (
        "`len(found) >= limit`: Gt for GtE",
        "candidates without the early stop when `found` holds exactly `limit` ids: each query is limited to "
        "`limit - len(found)`, so `found` never holds more, and the next status's query then runs with LIMIT 0 "
        "(SQLAlchemy renders the 0), which returns no row on SQLite, PostgreSQL and MariaDB: one extra read, "
        "a cost, not an outcome"),
    "pipelines/prune.py#46": (
        "`r.c.triggered_at` read as `created_at`",
        "candidates ordered by created_at instead of triggered_at: both inserts of a run (trigger, revive) write "
        "created_at = triggered_at = tx.now, and no write changes either column (the run UPDATEs set status, "
        "completed_at, halted_at, trigger_key and updated_at; the server routines only read runs), so the two "
        "orders, then by id, are the same"),
    # -- pipelines/revive.py
    "pipelines/revive.py#39": (
        "`_s.c.started_at` read as `created_at`",
        "the steps read in created_at order instead of started_at: a step row's started_at is its created_at "
        "(as pipelines/runs.py#69: create_steps_across writes both as now, revive's re-enqueued step sets both "
        "to now and its history copies keep both, no UPDATE writes either), so the two orders, then by id, are "
        "the same"),
    "pipelines/revive.py#44": (
        "`.where(_c.c.run_id == run_id)` dropped",
        "the keys' read (with duplicate_context) reads every run's context keys instead of the revived run's: "
        "there is then a copy to make whenever any run has a key, and the CASE gets a new id per "
        "distinct key, so each key of the revived run (unique per run, uq_context_run_key) still maps to an id "
        "of its own, rising in key order as before; the copy's own where (line 124) selects only the revived "
        "run's rows, so the extra WHEN arms are never taken, and with no key of its own the copy inserts no "
        "row whichever id expression it gets. A cost (a wider read, a longer CASE), not an outcome"),
    # -- pipelines/hooks.py
    "pipelines/hooks.py#17": (
        "`where` without `_h.c.id == hook.hook_id`",
        "the record's fence by token alone: the token is never None here (record_hook passes the claim's "
        "new_id(); crash_hooks_of the token of a row it read as running, and only claim_hook sets running, "
        "always with a token) and is written by one claim to one row, the hook_id passed with it (a UUIDv7, "
        "unique); only _record_in writes a hook's token again, to NULL. So the rows with this token are that "
        "row or none, whichever way the id is asked"),
    "pipelines/hooks.py#18": (
        "`where` without `_h.c.status == 'running'`",
        "the record's fence without the status: a hook row carries a token only while it is running (owe_hooks "
        "writes it pending with NULL, claim_hook sets running with a fresh token in one UPDATE, and the only "
        "write off running, _record_in, sets the token NULL; no other code writes halt_hooks but prune's "
        "delete), and the token asked is never None (as #18): a row with this id and this token is running"),
    "pipelines/hooks.py#26": (
        "`where` without `_h.c.status == 'pending'`",
        "the claim's UPDATE without the status: the row was read `status = 'pending'` by this transaction's "
        "SELECT ... FOR UPDATE (the latest committed version, locked to the commit on a server; SQLite's "
        "BEGIN IMMEDIATE holds the write lock), so it is still pending when the UPDATE by its id runs"),
    "pipelines/hooks.py#37": (
        "`where` without `_h.c.status == 'running'`",
        "crash_hooks_of reads the named hooks of any status: each is then recorded by _record_in, whose UPDATE "
        "asks `status = 'running'` and the row's own token again; a row not running matches nothing there "
        "(rowcount 0: nothing written, no wake, no event to log). A wider read, a cost, not an outcome"),
    # -- pipelines/runs.py
    "pipelines/runs.py#21": (
        "`where` without `r.c.status.not_in(TERMINAL)`",
        "_complete_runs names only runs whose status resolve_runs was given as not final, and that status was "
        "read by this transaction under the run row's lock (lock_run, lock_runs: FOR UPDATE on a server, the "
        "write lock on SQLite), held to the commit; the only status writes in between are resolve_runs' own, "
        "once per run: every row the ids name still matches the guard"),
    "pipelines/runs.py#35": (
        "`.where(r.c.id.in_(dialects.ids_param()))` dropped",
        "lock_runs reads and locks every run row instead of the batch's: its one caller (branches.move_branches) "
        "looks the result up only at its own moves' run ids, so the statuses it uses are the same; a wider lock "
        "(taken in the same run-id order), a cost, not an outcome (SQLite holds the write lock anyway)"),
    "pipelines/runs.py#48": (
        "`where` without `r.c.status.not_in(TERMINAL)`",
        "the other statuses' UPDATE: as #27 (its ids are open runs read under the run lock this transaction holds)"),
    "pipelines/runs.py#55": (
        "`where` without `b.c.status == 'halted'`",
        "halt reasons of the run's branches in any status: a branch gets a halt reason only with the status "
        "halted (Move's halt_reason is set only on halting moves, _set_branch('halted', ...)), every other move "
        "writes it NULL, a halted branch is never claimed or moved again, and a revive clears it on the branches "
        "it resumes; the NULLs are dropped after the read"),
    "pipelines/runs.py#56": (
        "`where` without `b.c.halt_reason.is_not(None)`",
        "Run._read's halt reasons without the NULL test: every write of the status `halted` to a branch carries "
        "a reason (advance.py's four halts: a job's via job_halt_reason, which always names one, and the "
        "advancer's), so no halted branch has a NULL reason (as pipelines/history.py#39)"),
    "pipelines/runs.py#57": (
        "`e.c.created_at` read as `eligible_at`",
        "the order of a step's executions: one is open at a time (uq_execution_open_per_step), the next is "
        "enqueued by the transaction that ends the one before (outcomes' retry, a crash's re-run), eligible no "
        "earlier, and claimed and ended after that commit; an end needs a claim, and nothing writes an ended "
        "execution. So created_at, eligible_at, claimed_at, completed_at and updated_at rise together over a "
        "step's ended executions (equal only under a stopped test clock, then the id decides in both orders, "
        "rising within the one process); `claimed` (a count, a min) takes no order"),
    "pipelines/runs.py#58": (
        "`e.c.created_at` read as `claimed_at`",
        "as #54 (the pending execution's NULL claimed_at sorts differently per database, but `ended` leaves it "
        "out and `claimed` takes no order)"),
    "pipelines/runs.py#59": (
        "`e.c.created_at` read as `completed_at`",
        "as #54 (the open execution's NULL completed_at is left out of `ended`)"),
    "pipelines/runs.py#60": (
        "`e.c.created_at` read as `updated_at`",
        "as #54: an ended execution's updated_at is its completed_at (the end writes both, nothing writes it after)"),
    "pipelines/runs.py#69": (
        "`.where(s.c.run_id == self.id)` dropped",
        "steps() reads every run's executions: they are grouped by their step id and looked up only at this "
        "run's step ids (the rows of the first read), so each step gets the same list; a cost (a wider read), "
        "not an outcome"),
    "pipelines/runs.py#66": (
        "`s.c.started_at` read as `created_at`",
        "a step row's started_at is its created_at: create_steps_across writes both as now, revive's re-enqueued "
        "step sets both to now and its history copies keep both, and no UPDATE writes either"),
    "pipelines/runs.py#74": (
        "`where` without `b.c.status == 'dampened'`",
        "resume moves the branches it has just read as dampened, in this transaction under the run row's lock; "
        "only resume, under that lock, moves a dampened branch (advancers claim in-progress branches, a "
        "dampened run is neither revived nor pruned), so each row still is dampened and the update matches it "
        "alone either way"),
    # -- pipelines/advance.py
    "pipelines/advance.py#18": (
        "`len(ids) <= cfg.advance_batch`: Lt for LtE",
        "with exactly advance_batch candidates the mutant samples advance_batch of them: every id, in another "
        "order; claim_branches claims the set (sorted(set(branch_ids)), branch-id order) and returns the claims "
        "in that order, so the same branches are claimed and advanced in the same order; only the advancer's "
        "random generator is drawn from"),
    "pipelines/advance.py#46": (
        "`where` without `_b.c.claim_token == c.token`",
        "every _set_branch runs inside a _fence of the same claim, whose transaction has already locked the "
        "branch row and found its token equal to c.token (fence, or StaleClaim and nothing runs), and nothing "
        "in the block writes claim_token before this UPDATE; so the row matched by id still holds the token"),
    "pipelines/advance.py#50": (
        "`.where(s.c.id.in_(dialects.inline_ids([c.step.id for c in claims])))` dropped",
        "a cost, not an outcome: the read then takes every step's output, but the result is only looked up by "
        "the claims' step ids (outputs.get(c.step.id)), whose entries are the same; value_json_of maps any "
        "stored output (an envelope, an expand's count, None) without raising"),
    "pipelines/advance.py#59": (
        "`_b.c.fanin_arrived_at` read as `last_advanced_at`",
        "at the firing every branch of the barrier (barrier_id) with a step at a source node has arrived: each "
        "of the barrier's fanout_width children's lines (the child, or the merge of its own fan-out, which takes "
        "its barrier_id; a child that fanned out ran no source node) has one such branch, whose source step is "
        "its last, and the counter, bumped once in the fence that sets that branch's fanin_arrived_at and "
        "completed_at, fires only when all width of them arrived (a sibling that halted instead keeps it below "
        "the width for good); last_advanced_at, started_at, created_at and updated_at are set when a branch is "
        "created (create_branches), so each column is non-null on exactly the rows selected"),
    "pipelines/advance.py#60": (
        "`_b.c.fanin_arrived_at` read as `started_at`",
        "as #59: at the firing every branch the join selects has arrived, and started_at is set at creation "
        "(create_branches), so it is non-null on exactly the rows fanin_arrived_at is"),
    "pipelines/advance.py#61": (
        "`_b.c.fanin_arrived_at` read as `completed_at`",
        "as #59: at the firing every branch the join selects has arrived, and the arrival fence writes completed_at "
        "with fanin_arrived_at (one _set_branch), so it is non-null on exactly the rows fanin_arrived_at is"),
    "pipelines/advance.py#62": (
        "`_b.c.fanin_arrived_at` read as `created_at`",
        "as #59: at the firing every branch the join selects has arrived, and created_at is set at creation "
        "(create_branches), so it is non-null on exactly the rows fanin_arrived_at is"),
    "pipelines/advance.py#63": (
        "`_b.c.fanin_arrived_at` read as `updated_at`",
        "as #59: at the firing every branch the join selects has arrived, and updated_at is set at creation "
        "(create_branches), so it is non-null on exactly the rows fanin_arrived_at is"),
    "pipelines/advance.py#65": (
        "`stored or 0`: And",
        "a cost, not an outcome: stored is a positive integer here (the arriving branch's own succeeded output "
        "is among the rows summed), so the mutant measures 0 and the first check passes; the outputs are then "
        "loaded and the second check_size, on len(value_json), raises the same PayloadTooLargeError with the same "
        "size and text, since fan_in_size(stored, n) is exactly that length (each stored envelope is "
        "'{\"payload\": ' + the value's json.dumps text + '}', ASCII, which payload_json re-dumps unchanged); "
        "the merge branch inserted before it is rolled back with the fence"),
    "pipelines/advance.py#67": (
        "`where` without `_a.c.error_klass.is_not(None)`",
        "`error_klass NOT IN (CRASH_CLASSES)` is NULL, not true, for a NULL error_klass (SQL's three-valued "
        "logic, on every database), so the remaining condition already leaves out the advancements without an "
        "error"),
    "pipelines/advance.py#73": (
        "`where` without `_b.c.fanin_arrivals < _b.c.fanout_width`",
        "the counter is below the width before every bump: a barrier's width is written in the fence that "
        "creates its first children (divide: all of them; expand: the first batch, with the total), there are "
        "exactly fanout_width children (uq_branch_child_index), and each child's line (the child, or the merge "
        "of its own fan-out) arrives once, in the fence that completes the arriving branch (never claimed "
        "again); so the UPDATE matches the barrier row either way"),
    "pipelines/advance.py#81": (
        "`_b.c.fanin_arrivals < _b.c.fanout_width`: LtE for Lt",
        "as #73: the counter is below the width before every bump, where < and <= both hold"),
    "pipelines/advance.py#86": (
        "`where` without `e.c.completed_at.is_not(None)`",
        "_job_halt_reason reads a failed step's executions, and a failed step has no open execution: it fails "
        "when its last execution ends with no retry or re-run left (one open execution per step at most, "
        "uq_execution_open_per_step), and none is created for it after; so every row has completed_at set"),
    "pipelines/advance.py#89": (
        "`e.c.completed_at` read as `eligible_at`",
        "a step's executions follow one another: the next is created only once the one before ended (at most one "
        "open, uq_execution_open_per_step), eligible at or after its creation, so a later execution's "
        "eligible_at is at or after an earlier one's completed_at, itself at or after its eligible_at (claimed "
        "only once eligible); so eligible_at orders them as completed_at does, and where either ties, both fall "
        "to id desc (UUIDv7, increasing in creation order)"),
    "pipelines/advance.py#90": (
        "`e.c.completed_at` read as `claimed_at`",
        "as #89: a later execution of the step is claimed after it was created, after the earlier one ended, "
        "itself after that one's claim; claimed_at orders them as completed_at does, ties falling to id desc"),
    "pipelines/advance.py#91": (
        "`e.c.completed_at` read as `created_at`",
        "as #89: a later execution of the step is created once the earlier one ended, after that one's creation; "
        "created_at orders them as completed_at does, ties falling to id desc"),
    "pipelines/advance.py#92": (
        "`e.c.completed_at` read as `updated_at`",
        "an ended execution's updated_at is its completed_at: the one statement that ends executions "
        "(claims._end_statement) writes both from one now, and no statement writes an ended execution after "
        "(every UPDATE of executions requires completed_at IS NULL or claimed_at IS NULL)"),
    "pipelines/advance.py#97": (
        "`e.c.completed_at` read as `eligible_at`",
        "as #86: a failed step's executions have all ended, and eligible_at is never NULL, so the filter keeps "
        "the same rows"),
    "pipelines/advance.py#98": (
        "`e.c.completed_at` read as `claimed_at`",
        "as #86: a failed step's executions have all ended, and an execution ends only once claimed "
        "(claims._end_statement requires claimed_at IS NOT NULL), so the filter keeps the same rows"),
    "pipelines/advance.py#99": (
        "`e.c.completed_at` read as `created_at`",
        "as #86: a failed step's executions have all ended, and created_at is never NULL, so the filter keeps "
        "the same rows"),
    "pipelines/advance.py#100": (
        "`e.c.completed_at` read as `updated_at`",
        "as #86: a failed step's executions have all ended, and updated_at is never NULL, so the filter keeps "
        "the same rows"),
    "pipelines/advance.py#49": (
        "`e.type == kind and list(e.to) == list(edge.to)`: Or",
        "the fan-in's sources widened to every edge of its kind or into its target: the rows are "
        "still those of `arrived` (this barrier's children that arrived, by `barrier_id`), and every "
        "child of one barrier arrives through an edge of this kind into this target in any "
        "definition the builder accepts (only a hand-edited snapshot could name another node)"),
    # -- pipelines/branches.py
    # -- pipelines/steps.py
    "pipelines/steps.py#2": (
        "`sum((len(row['input_args']) for row in step_rows)) <= payloads.MAX_PAYLOAD_BYTES`: Lt for LtE",
        'with inputs of exactly MAX_PAYLOAD_BYTES in all, create_steps_across inserts the rows with one '
        'statement per row (the executemany) instead of dialects.insert_rows: the same rows, each with its '
        'own values, under the same uq_step_branch_node (a cost, the statements, not an outcome)'),
    "pipelines/steps.py#12": (
        '`where` without `schema.steps.c.status == \'advancing\'`',
        "step_complete's callers (the advancer's divide, expand and fan-in, and _record_error only for an "
        "advancing step) hold the branch's fence, and the branch's claim re-asserted an advanceable step; a "
        "failed one is halted by a simple move and never reaches them, so the step is advancing and the "
        "guard matches the same one row (its only other effect, the AssertionError, is unreachable)"),
    "pipelines/steps.py#19": (
        '`s.c.started_at` read as `created_at`',
        "latest_step ordered by created_at: a step's created_at and started_at are written together and "
        "equal in every row (create_steps_across sets both to tx.now, a revive copies both or sets both to "
        "now for a re-enqueued step, and nothing else writes either), so the order is the same"),
    "pipelines/steps.py#20": (
        '`s.c.started_at` read as `updated_at`',
        "latest_step ordered by updated_at: a completed step is never written again, and its successor is "
        "created in the transaction that completes it (at that updated_at), so along a branch updated_at "
        "follows start order, ties broken by the time-ordered id as in the original; a revive writes one "
        "`now` into every history copy's updated_at (copied in start order, so their new ids keep it) and an "
        "advancing copy's, and keeps a re-enqueued step's older one, but that step is the branch's latest and "
        "every caller asks only for a branch whose latest step was written since (a halted branch's failed "
        "step, a dampened branch's completed dampen, a fan-out's completed step: halt_of, resume, _fan_in), "
        "which puts its updated_at above the rest. The same step comes first"),
    "pipelines/branches.py#2": (
        '`len(by_output) <= DISTINCT_OUTPUTS`: Lt for LtE',
        'with exactly DISTINCT_OUTPUTS distinct outputs set_status_if writes with one UPDATE per step (the '
        'executemany) instead of one per distinct output: both move the same rows, each guarded by its '
        'status, with its own output_payload and updated_at = tx.now, and the row counts are summed either '
        'way (a cost, the number of statements, not an outcome)'),
    "pipelines/branches.py#10": (
        "`row.claim_token is None and row.status == 'in_progress'`: Or",
        "the free fence also keeps an unclaimed branch that is not in progress: a claim writes 'advancing' "
        "with its token and every other write drops both together, so such a branch has ended (completed, "
        "halted, dampened), which happens only once its latest step is completed or failed; the success's "
        "step is then not in progress, `set_status_if`'s status guard (the completion) raises StepMovedOn and "
        "the success is refused as taken, as it is when the fence drops the branch (its `advancing` write "
        "finds the step moved on)"),
    "pipelines/branches.py#17": (
        "`.where(_b.c.claim_token.is_(None))` dropped",
        "the free move without `claim_token IS NULL`: the fence read each of these rows under its lock "
        "(FOR UPDATE; SQLite: the write lock of BEGIN IMMEDIATE) in this transaction and kept only the "
        "unclaimed ones, and nothing else can write them before it commits"),
    "pipelines/branches.py#26": (
        "`.where(_b.c.id.in_(dialects.ids_param()))` dropped",
        "the fence's lock read of every branch row: it keeps only the rows named in `held` "
        "(`row.id in held`); SQLite has no row locks, and on a server it locks more rows (a cost, a wider "
        "wait), not another outcome"),
    "pipelines/branches.py#68": (
        "`.where(s.c.branch_id.in_(dialects.inline_ids(won)))` dropped",
        "_claims_of reads every branch's steps: `latest` is keyed by branch id and only the branches won "
        "are looked up in it, each with its own rows in the same order (a cost, a wider read)"),
    "pipelines/branches.py#69": (
        "`.where(_a.c.step_id.in_(dialects.inline_ids([latest[b].id for b in )` dropped",
        "_claims_of reads every advancement: `crashes` is keyed by step id and only the won branches' "
        "latest steps are looked up in it, each with its own rows in the same order (a cost, a wider read)"),
    "pipelines/branches.py#39": (
        "`.where(r.c.id.in_(dialects.inline_ids(run_ids)))` dropped",
        "_claims_of reads every run's definition digest: `sha1s` is keyed by run id and only the won "
        "branches' runs are looked up in it (a cost, a wider read)"),
    "pipelines/branches.py#47": (
        "`.where(_b.c.claim_token.in_(tokens))` dropped",
        "the held move without its tokens: the fence read each of these rows under its lock (FOR UPDATE; "
        "SQLite: the write lock of BEGIN IMMEDIATE) in this transaction and kept only those carrying their "
        "claim's token, and nothing else can write them before it commits"),
    "pipelines/branches.py#53": (
        "`where` without `_b.c.claim_token == token`",
        "the release runs only when close_advancement has just closed this claim's advancement, so it was "
        "open; an advancement is open exactly while its claim holds the branch (a claim sets its token only "
        "on an unclaimed branch and opens its advancement in the same transaction; every write that drops "
        "a token, a fence's close and move, move_branches, this release, closes that claim's advancement "
        "in the same transaction), so a branch still 'advancing' carries `token`"),
    "pipelines/branches.py#54": (
        "`where` without `_b.c.status == 'advancing'`",
        "a branch carries a claim token exactly while it is 'advancing': a claim writes both, and every "
        "write that moves a branch off 'advancing' drops the token in the same statement; `claim_token = "
        "token` (never NULL) implies the status"),
    "pipelines/branches.py#66": (
        "`where` without `_b.c.claim_token.is_(None)`",
        "the claim without `claim_token IS NULL`: a branch 'in_progress' carries no token (a claim writes "
        "'advancing' with its token and every write back to 'in_progress', a release, a move, a resume, a "
        "revive, drops or has none), so `status = 'in_progress'` implies it"),
    "pipelines/branches.py#72": (
        "`where` without `_a.c.completed_at.is_(None)`",
        "the close of an advancer's advancements without `completed_at IS NULL`: the fence kept only "
        "branches that still carry each claim's token, under their locks, and a claim's advancement is "
        "open while its token holds the branch (as #52), so every row named is open"),
    "pipelines/branches.py#79": (
        "`where` without `_b.c.id.in_(dialects.inline_ids(ids))`",
        "the read of the branches won without their ids: `token` is a fresh UUIDv4 of this call, written "
        "only by this transaction's UPDATE, which names `ids`"),
    "pipelines/branches.py#92": (
        "`where` without `_b.c.claim_token.is_(None)`",
        "candidates without `claim_token IS NULL`: a branch 'in_progress' carries no token (as #65), so "
        "`status = 'in_progress'` implies it"),
    # -- limits/lanes.py
    "limits/lanes.py#5": (
        "`len(lanes) < want`: LtE for Lt",
        "the walk reads one page more once it has `want` lanes (if the last page was full) and returns "
        "`lanes[:want]`: the same lanes, a statement more"),
    "limits/lanes.py#53": (
        "`_e.c.eligible_at` read as `claimed_at`",
        "not equivalent, and invisible on the three databases: a lane's upcoming probe (`upcoming`, "
        "`pending_lane = lane AND eligible_at > now`) is a range of `ix_execution_pending_lane`, read "
        "in eligible-time order, and the order by `claimed_at` (NULL on every pending row) keeps that "
        "order (SQLite's sorter is stable; PostgreSQL's top-1 keeps the first of equals; MariaDB serves "
        "it from the index): `test_an_idle_worker_waits_for_the_next_eligible_time_or_stamp_to_come` "
        "writes the later execution first and passes under it on each database (2026-12-06)"),
    "limits/lanes.py#49": (
        "`where` without `_e.c.eligible_at <= sa.bindparam('w_upto', type_=schema.Time`",
        "executions eligible later than `w_upto` come after every eligible one in poll order (they are "
        "later by eligible time), so they only add lanes after the eligible lanes: a poll's claim in such "
        "a lane is 'gone' (nothing eligible: no claim, no refusal counted), and a bound later than the "
        "candidates decides nothing (a hand-off or batch is cut only by a bound before a candidate)"),
    # -- limits/claims.py
    "limits/claims.py#6": (
        "`take <= 0`: Lt for LtE",
        "take 0 (the endings only) goes on to the read, the plan and the writes: the candidates' read "
        "is LIMIT 0 (none), plan() returns NOTHING for take <= 0 (its first test), and writing NOTHING "
        "is write_header for a key and no statement for the unkeyed lane, which is what the early "
        "return does; Taken(True, [], None) either way. The extra reads (candidates, buckets) are a cost"),
    "limits/claims.py#10": (
        "`key is None or header is None`: And",
        "in _write the header is None exactly when the key is None: _in_python sets it from lock_key "
        "for a key and returns before _read/_write when a key has no row, so `and` and `or` agree"),
    "limits/claims.py#36": (
        "`header is None or key is None`: And",
        "in _read the header is None exactly when the key is None: as #10"),
    "limits/claims.py#42": (
        "`len(endings) > 1`: GtE for Gt",
        "one keyed ending also gets the CASE of release_seq: CASE id WHEN its id THEN seq + 1, on an "
        "UPDATE of that id alone, the same seq + 1 that b_seq already writes"),
    "limits/claims.py#65": (
        "`take > 1`: GtE for Gt",
        "a poll of one reads the bound too: it uses none (only a hand-off compares its first "
        "candidate with the bound, and _batch compares only the candidates after the first). An "
        "extra read: a cost"),
    "limits/claims.py#97": (
        "`where` without `_e.c.claimed_at.is_(None)`",
        "_claim_rows runs only on the Python path (SQLite: a server runs the routine), on ids the "
        "plan took from candidates read in this transaction by in_lane (`pending_lane = lane`, a "
        "column computed non-null only while claimed_at IS NULL), under the database write lock that "
        "BEGIN IMMEDIATE took: no other transaction writes between that read and this UPDATE, so "
        "every id is still unclaimed and the condition always holds"),
    "limits/claims.py#127": (
        "`_e.c.claimed_at` read as `completed_at`",
        "`completed_at IS NULL` for `claimed_at IS NULL` on the ids of #97: pending executions read "
        "under the same lock, and a pending execution's completed_at is always NULL (an execution "
        "is inserted open, and the only write of executions.completed_at, _end_statement, requires "
        "claimed_at IS NOT NULL), so the condition always holds"),
    # -- limits/executions.py
    "limits/executions.py#34": (
        "`header.seq > family.seq`: GtE for Gt",
        "at equal numbers the family's row is written with the seq it holds already: the same row, "
        "a statement more"),
    "limits/executions.py#46": (
        '`.where(_k.c.key.in_(sorted(keys)))` dropped',
        "ensure_keys reads every key's header row instead of those of `keys`: the rows it inserts are "
        "`keys - existing`, the same set whether `existing` holds only the asked keys that exist or every "
        "key that exists (a cost, a wider read, not an outcome)"),
    # -- fleet/worker.py
    "fleet/worker.py#8": (
        "`not self._queue and (not self._group) and (time.monotonic() >= self._next_hook_p`: Or",
        "run_once polls for a due hook on every call with nothing queued or grouped, not at most once a second "
        "while busy: each poll is run_due_hook's guarded claim of a hook that is due, so what runs is still a due "
        "hook, once; only the order (a busy worker's next claim waits behind the hooks due) and the polls' cost "
        "differ"),
    "fleet/worker.py#18": (
        "`time.monotonic() >= self._next_hook_poll`: Gt for GtE",
        "the hook poll's second has passed or is exactly now: equal only at one instant of a float clock, and "
        "the next call polls (a hook waits one call longer, never more)"),
    "fleet/worker.py#23": (
        "`not together`: `not` dropped",
        "_run's fault checkpoint AFTER_JOB_CLAIM (faults.hit, which does nothing unless a chaos round or a test "
        "arms it) is passed for awaited batches instead of plain steps: where a chaos kill may land, not what "
        "the engine does"),
    # -- fleet/supervisor.py
    "fleet/supervisor.py#28": (
        "`time.monotonic() - self._last_heartbeat_sent <= self.lease_s`: Lt for LtE",
        "holds_lease, asked by the watchdog every 50 ms and by each worker before a body starts, reads the "
        "monotonic clock afresh at each call (in the runner's own process; no clock of the engine's a test can "
        "set): `<` ends the lease at the one float instant `_last_heartbeat_sent + lease_s` where `<=` still "
        "holds it, and every read before or after that instant decides as the original; the lease already stops "
        "lease_margin short of reaper_timeout, so losing it one instant sooner hands no claim on earlier "
        "[INV-EXE-5]; its two sides are pinned (held just after a heartbeat, lost 0.5 s past the lease: "
        "test_fleet)"),
    "fleet/supervisor.py#34": (
        "`age < threshold`: LtE for Lt",
        "_stale's pre-check from the child's start (age: a fresh time.monotonic() less child.started): `<=` also "
        "takes a child exactly `threshold` old for young, without reading its heartbeat; equal only when the "
        "monotonic read lands on the float instant `started + threshold`, which no test can place it on without a "
        "clock of its own in the module; the next tick (polling_timeout later) reads the heartbeat as the original "
        "would, a stale child killed at most one tick later; its two sides are pinned (a child an hour old is "
        "judged by its heartbeat, one just started is never stale: test_time_predicates)"),
    "fleet/supervisor.py#35": (
        "`age > max(STARTUP_GRACE_S, cfg.reaper_timeout)`: GtE for Gt",
        "_stale of a child with no heartbeat row yet (still starting): `>=` takes it for stale at exactly the "
        "start-up grace where `>` waits on; the age is a fresh monotonic read less child.started, equal to the "
        "grace only at one float instant, and at the tick after it both kill the child: a SIGKILL one instant "
        "sooner to a process that had the whole grace (60 s or reaper_timeout) to register"),
    "fleet/supervisor.py#41": (
        "`time.monotonic() < end`: LtE for Lt",
        "_sleep's wait between ticks polls the monotonic clock every 10 ms until `end`: `<=` sleeps once more "
        "when a read lands exactly on the float `end` (probability zero, and no test can place it there), and then "
        "only 10 ms longer, within the loop's own 10 ms granularity; it lasts the tick, and a child's exit (or a "
        "stop signal) ends it at once, either way (both pinned: test_fleet's sleep test)"),
    "fleet/supervisor.py#54": (
        "`now - child.started < 5.0`: LtE for Lt",
        "check_children's count of a short-lived child (failures and the restart back-off): `<=` counts one that "
        "the tick found exited exactly 5.0 s after its start as short-lived; `now` is the monotonic clock read once "
        "at the tick's start, up to a tick after the exit itself, so the line is fuzzy by a tick already and the "
        "mutant moves it by one float instant that no test can set `now` on; a child that exited a minute after "
        "its start is replaced in the same tick, not backed off (pinned: test_fleet)"),
    # -- pipelines/outcomes.py
    # -- pipelines/trigger.py
    "pipelines/trigger.py#21": (
        "`and_` without `_r.c.status == 'completed'`",
        "release_key's fence on a completed_at alone: only a completed run has one: " + TERMINAL_ARGUMENT),
    "pipelines/trigger.py#22": (
        "`and_` without `_r.c.completed_at <= cutoff`",
        "release_key's fence on the completed status alone: " + TERMINAL_ARGUMENT),
    "pipelines/trigger.py#23": (
        "`and_` without `_r.c.status == 'halted'`",
        "release_key's fence on a halted_at alone: only a halted run has one: " + TERMINAL_ARGUMENT),
    "pipelines/trigger.py#24": (
        "`and_` without `_r.c.halted_at <= cutoff`",
        "release_key's fence on the halted status alone: " + TERMINAL_ARGUMENT),
    "pipelines/trigger.py#48": (
        "`where` without `_r.c.id == holder.run_id`",
        "release_key's fence without the holder's id: at most one run holds a pipeline's key "
        "(uq_run_trigger_key), so the fence meets the holder key_holder read or, if another trigger took the key "
        "since, the run that trigger wrote; the fence's finish terms then decide of that run what they decide of "
        "any holder (unfinished: refused, as the id would; finished a window ago: released, which is what this "
        "trigger, deciding now, would do with it as the holder read)"),
    "pipelines/trigger.py#49": (
        "`where` without `_r.c.pipeline_klass == pipeline`",
        "release_key's fence without the pipeline: the holder's id names one row, and key_holder read it with "
        "the pipeline (#38's look-up is killed)"),
    "pipelines/trigger.py#50": (
        "`where` without `_r.c.trigger_key == key`",
        "release_key's fence without the key: if another trigger took the key since key_holder's read (the "
        "holder's trigger_key set NULL, and that trigger's run written with the key, committed), the fence "
        "still meets the holder's row and sets NULL again, so the trigger goes on to insert its run with the "
        "key; uq_run_trigger_key refuses that insert (translated to TriggeredConcurrently under a savepoint), "
        "and the trigger answers with the run that took the key, or raises TriggeredConcurrently when its "
        "snapshot cannot see it: what the fence's refusal leads to (keyed_run, then the same two answers); "
        "SQLite's write lock makes the race impossible there, and the PostgreSQL and MariaDB runs leave it"),
    "pipelines/trigger.py#51": (
        "`where` without `finished`",
        "release_key's fence without its finish terms: " + TERMINAL_ARGUMENT),
    # -- db/clock.py
    "db/clock.py#2": (
        "`moment > now`: GtE for Gt",
        "OffsetClock.skip_to at `moment == now` adds `moment - now`, a zero timedelta, to the offset: the offset, "
        "and every reading and in_sql after it, are the same as without the addition"),
    # -- db/database.py
    "db/database.py#13": (
        "`readonly or one_statement`: And",
        "no caller passes both, so every block runs in a transaction block, as before the change that added "
        "it: the same statements with the same outcomes (under READ COMMITTED each statement reads its own "
        "snapshot in a transaction block or out of one, and the lane routine's one call is atomic either way), "
        "two round trips more per block (BEGIN, COMMIT): a cost, measured in bench/RESULTS.md, not an outcome"),
    # -- pipelines/history.py
    "pipelines/history.py#37": (
        "`where` without `b.c.run_id.in_(ids)`",
        "_run_records reading every run's halted branches: grouped by run_id and looked up only by each listed "
        "row's id (`halted.get(row.id, [])`), so another run's rows are read and dropped; a completed row, left "
        "out of ids, has no halted branch either way (a completed run's branches all completed: INV-RUN-1)"),
    "pipelines/history.py#38": (
        "`where` without `b.c.status == 'halted'`",
        "_run_records without the status: a branch's halt_reason is written only with the status `halted` (the "
        "four halts of advance.py, through _end_branches' Move and _set_branch), every other branch write sets a "
        "Move's reason, None, or leaves it NULL, a halted branch never moves again, and a revive's copy of a "
        "halted branch is in_progress with the reason NULL: a reason is never on a branch not halted"),
    "pipelines/history.py#39": (
        "`where` without `b.c.halt_reason.is_not(None)`",
        "_run_records without the NULL test: every write of the status `halted` to a branch carries a reason "
        "(advance.py's four halts: a job's via job_halt_reason, which always names one, and the advancer's), so "
        "no halted branch has a NULL reason"),
    "pipelines/history.py#40": (
        "`.where(r.c.revived_from.in_(ids))` dropped",
        "_run_records' revivals over every run: keyed by revived_from and looked up only by each listed row's id "
        "(`revivals.get(row.id)`), completed rows too, but only a halted run is revived (revive_run refuses any "
        "other) and a halted run stays halted, so a completed row has no revival either way; a revived_from NULL "
        "becomes the key None, which no run id is"),
    "pipelines/history.py#55": (
        "`r.c.triggered_at` read as `created_at`",
        "a run's created_at is its triggered_at: both written `now` in its one insert (trigger.py and revive.py, "
        "the only inserts into runs) and never updated"),
    "pipelines/history.py#58": (
        "`e.c.created_at` read as `eligible_at`",
        "a step's executions by eligible_at: a step has one open execution at a time, and the next is created "
        "when (or after) the previous ends, eligible at or after its own creation, while the previous was "
        "eligible before its claim; so eligible_at never falls in creation order, and where it ties (an "
        "immediate re-run at the instant the previous became eligible) both orders fall back to the id, "
        "generated after the previous row was committed, claimed and ended (a UUIDv7, the same millisecond only "
        "across processes within one millisecond of all that)"),
    "pipelines/history.py#61": (
        "`e.c.created_at` read as `updated_at`",
        "a step's executions by updated_at: an execution's last write is its end (completed_at, updated_at "
        "together), and the next is created at or after that end, then written only later; so updated_at never "
        "falls in creation order, and ties fall back to the id as #58's do"),
    "pipelines/history.py#62": (
        "`a.c.started_at` read as `completed_at`",
        "a branch's failed advancements by completed_at: one open advancement per branch "
        "(uq_advancement_open_per_branch), so each is closed (close_advancement: completed_at, updated_at and the "
        "error in one write) before the next is inserted; completed_at rises with started_at, and a tie is "
        "ordered by neither (the original has no tie-breaker either: the database's order, which no test can "
        "pin)"),
    "pipelines/history.py#63": (
        "`a.c.started_at` read as `created_at`",
        "an advancement's created_at is its started_at: both tx.now in its one insert (claim_branches), never "
        "updated"),
    "pipelines/history.py#64": (
        "`a.c.started_at` read as `updated_at`",
        "a failed advancement's updated_at is its completed_at (close_advancement writes both; nothing writes "
        "the row after it: the process row's removal sets process_id NULL by ON DELETE SET NULL, without "
        "updated_at): #62's argument"),
    "pipelines/history.py#67": (
        "`.where(k.c.key.in_(keys))` dropped",
        "_Waits.read's blocked_until of every key instead of the run's open ones: looked up only by an open "
        "execution's limit_key, which is in `keys`"),
    "pipelines/history.py#70": (
        "`r.c.triggered_at` read as `created_at`",
        "list_runs' page bound on created_at: equal to triggered_at in every run (#55)"),
    "pipelines/history.py#77": (
        "`b.c.started_at` read as `created_at`",
        "a run's branches by created_at: create_branches writes started_at and created_at `now` together; a "
        "revive's copies keep their started_at and are all created at the revive's instant, with ids "
        "(new_id, one process, rising) assigned in the halted run's (started_at, id) order, so the tie on "
        "created_at falls back to the id, which is that order; branches created after it start and are created "
        "later, with later ids"),
    "pipelines/history.py#80": (
        "`s.c.started_at` read as `created_at`",
        "a step's created_at is its started_at: create_steps writes both `now`, a revive's re-enqueued step both "
        "`now` again and its other copies keep both (pipelines/steps.py's argued #17 rests on the same)"),
    "pipelines/history.py#82": (
        "`.where(s.c.run_id == run_id)` dropped",
        "run_history's executions of every run: grouped by step id and read only for this run's steps; "
        "_Waits.read then also counts the other runs' open keys' rows, looked up only by this run's open "
        "executions' keys (#67's argument)"),
    "pipelines/history.py#83": (
        "`where` without `b.c.run_id == run_id`",
        "run_history's failed advancements of every run: grouped by branch id and read only for this run's "
        "branches"),
    "pipelines/history.py#94": (
        "`.where(e.c.inflight_key.in_(keys))` dropped",
        "_Waits.read's in-flight count of every key: still counted per key (group_by inflight_key) and looked up "
        "only by an open execution's limit_key"),
    "pipelines/history.py#104": (
        "`r.c.triggered_at` read as `created_at`",
        "list_runs ordered by created_at: equal to triggered_at in every run (#55), the id breaking ties as "
        "before"),
    # -- pipelines/step.py
    "pipelines/step.py#1": (
        "`inspect.isfunction(init) or init is object.__init__`: And",
        "_init_signature never remembering a signature (no function is object.__init__): every call reads it "
        "with _read_signature, which _cached_signature wraps, so the same Signature (inspect.signature of one "
        "unchanged function) or None comes back; only the cost of a read per bind differs"),
    "pipelines/step.py#2": (
        "`signature is None`: IsNot for Is",
        "_positional_counts answering None for every readable signature (it is called only for a Python "
        "function, whose signature _read_signature always reads): _ductwork_bind loses its fast path and binds "
        "through the signature, which accepts exactly the argument counts the fast path would have (all "
        "parameters plain positional, between the required and the total)"),
}
_SWAP: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                           ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
                           ast.NotIn: ast.In}
_CONNECTIVES = ("where", "and_", "or_")


@dataclass(frozen=True)
class Generated:
    module: str
    number: int
    operator: str
    line: int
    what: str


def _time_columns() -> dict[str, list[str]]:
    """Each table's timestamp columns, by the table's name in ``schema``."""
    from ductwork.db import schema

    return {name: [c.name for c in table.c if isinstance(c.type, schema.sa.DateTime)]
            for name, table in vars(schema).items() if isinstance(table, schema.sa.Table)}


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names the module binds to a table (``_e = schema.executions``, ``e, a = schema.x, schema.y``)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = (zip(target.elts, node.value.elts, strict=False)
                     if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                     else [(target, node.value)])
            for name, value in pairs:
                if (isinstance(name, ast.Name) and isinstance(value, ast.Attribute)
                        and isinstance(value.value, ast.Name) and value.value.id == "schema"):
                    found[name.id] = value.attr
    return found


def _table_of(node: ast.Attribute, aliases: dict[str, str]) -> str | None:
    """The table of a column reference ``<table>.c.<column>``, when the module names it."""
    owner = node.value
    if not (isinstance(owner, ast.Attribute) and owner.attr == "c"):
        return None
    base = owner.value
    if isinstance(base, ast.Name):
        return aliases.get(base.id)
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "schema":
        return base.attr
    return None


Change = tuple[str, str, Callable[[ast.AST], ast.AST | None]]


def _changes(node: ast.AST, aliases: dict[str, str], columns: dict[str, list[str]]) -> Iterator[Change]:
    """(operator, description, edit) for each mutant of ``node``; an edit changes the node in
    place and returns None, or returns the node that replaces it."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _SWAP:
        new = _SWAP[type(node.ops[0])]
        yield ("comparison", f"`{ast.unparse(node)}`: {new.__name__} for {type(node.ops[0]).__name__}",
               lambda n: setattr(n, "ops", [new()]))
    if isinstance(node, ast.BoolOp):
        new_op = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield ("boolean", f"`{ast.unparse(node)[:80]}`: {new_op.__name__}", lambda n: setattr(n, "op", new_op()))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield ("boolean", f"`{ast.unparse(node)[:80]}`: `not` dropped", lambda n: n.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CONNECTIVES:
        if len(node.args) == 1 and node.func.attr == "where" and not node.keywords:
            yield "where", f"`.where({ast.unparse(node.args[0])[:60]})` dropped", lambda n: n.func.value
        for i, arg in enumerate(node.args if len(node.args) > 1 else []):
            yield ("where", f"`{node.func.attr}` without `{ast.unparse(arg)[:60]}`",
                   lambda n, i=i: setattr(n, "args", n.args[:i] + n.args[i + 1:]))
    if isinstance(node, ast.Attribute) and (table := _table_of(node, aliases)) in columns:
        for other in columns[table]:
            if node.attr in columns[table] and other != node.attr:
                yield "column", f"`{ast.unparse(node)}` read as `{other}`", lambda n, o=other: setattr(n, "attr", o)


def _sites(module: str) -> list[tuple[int, Change]]:
    tree = ast.parse((PACKAGE / module).read_text())
    aliases, columns = _aliases(tree), _time_columns()
    return [(index, change) for index, node in enumerate(ast.walk(tree))
            for change in _changes(node, aliases, columns)]


def generate(module: str) -> list[Generated]:
    """The module's mutants, numbered in syntax-tree order (a change to the module renumbers them)."""
    tree = ast.parse((PACKAGE / module).read_text())
    nodes = list(ast.walk(tree))
    return [Generated(module, number, operator, getattr(nodes[index], "lineno", 0), what)
            for number, (index, (operator, what, _)) in enumerate(_sites(module), start=1)]


def mutated_source(module: str, number: int) -> str:
    """The module's source with mutant ``number`` applied."""
    index, (_, _, edit) = _sites(module)[number - 1]
    tree = ast.parse((PACKAGE / module).read_text())
    nodes = list(ast.walk(tree))
    target = nodes[index]
    replacement = edit(target)
    if replacement is not None:
        for parent in nodes:
            for field, value in ast.iter_fields(parent):
                if value is target:
                    setattr(parent, field, replacement)
                elif isinstance(value, list) and any(v is target for v in value):
                    setattr(parent, field, [replacement if v is target else v for v in value])
    return ast.unparse(ast.fix_missing_locations(tree))


def _others(db: str) -> str:
    return " and ".join(f"not {other}" for other in DATABASES if other != db)  # (and the tests of no database)


#: each run of a module's tests in a PID namespace of its own: a mutant of the process tree
#: (``fleet/tree.py``'s orphan scan with ``or`` for ``and``) SIGKILLs every process it can
#: see; here that is the run's own, not the machine's (the 2026-12-06 run lost its database
#: servers and shells to one before this). ``--kill-child``: a timed-out run's processes go too
#: Its first process is a small init (:data:`_INIT`) that reaps orphans, as on the machine,
#: so pytest is not PID 1 (whose orphans and ignored signals some tests would see).
_INIT = ("import os, subprocess, sys\n"
         "child = subprocess.Popen(sys.argv[1:])\n"
         "while True:\n"
         "    pid, status = os.wait()\n"
         "    if pid == child.pid:\n"
         "        code = os.waitstatus_to_exitcode(status)\n"
         "        sys.exit(code if code >= 0 else 128 - code)\n")
ISOLATE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c", _INIT)


def _pytest(tests: tuple[str, ...], db: str, scratch: Path, timeout_s: float) -> tuple[str, float]:
    # a server that cannot be reached fails the tests instead of skipping them: skipped, the
    # clean run and every mutant would pass, and all would count as survivors
    server = {} if db == "sqlite" else {"DUCTWORK_REQUIRE_CONTAINERS": "1"}
    command = [*ISOLATE, sys.executable, "-m", "pytest", *tests, "-k", _others(db), "-x", "-q", "-p", "no:randomly",
               "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, env={**mutants.environ(scratch), "HYPOTHESIS_PROFILE": "ci", **server},
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started
    return _verdict(done.returncode, f"{done.stdout}{done.stderr}"), time.monotonic() - started


#: what pytest prints when a conftest raises as it is imported (its exit status is then 4)
CONFTEST_FAILED = "ImportError while loading conftest"


def _verdict(returncode: int, output: str = "") -> str:
    """pytest's exit status as a verdict: 0 passed (survived), 1 a test failed (killed), a
    signal (the test run itself killed, by a mutant that kills the wrong processes: killed
    too), 4 with the conftest failing to load (killed: the clean run loaded it, so the
    mutant made the engine refuse what the conftest imports, ``ductwork_proof``'s own
    pipelines, at their definition), anything else (no tests, usage, an internal error)
    broken."""
    if returncode < 0 or returncode >= 128 or (returncode == 4 and CONFTEST_FAILED in output):
        return "killed"
    return {0: "survived", 1: "killed"}.get(returncode, "broken")


@contextlib.contextmanager
def _scratch(module: str) -> Iterator[tuple[Path, Path]]:
    """A scratch copy of the package (the scratch and the module's file in it)."""
    with tempfile.TemporaryDirectory(prefix="guard-mutation-") as tmp:
        scratch = Path(tmp)
        shutil.copytree(PACKAGE, scratch / "ductwork", ignore=shutil.ignore_patterns("__pycache__"))
        (scratch / "sitecustomize.py").write_text(mutants._SITECUSTOMIZE)
        target = scratch / "ductwork" / module
        target.write_text(ast.unparse(ast.parse((PACKAGE / module).read_text())))  # the clean run's source form
        yield scratch, target


def _source(module: str) -> str:
    return hashlib.sha1((PACKAGE / module).read_bytes()).hexdigest()


def _path(module: str, db: str) -> Path:
    return RESULTS / f"{module.replace('/', '.')}.{db}.json"


def run(module: str, db: str, numbers: list[int] | None = None) -> dict:
    """Run the module's mutants (``numbers``: only these) against its tests on ``db``;
    returns the results, stored after each mutant (an interrupted run keeps what it ran)."""
    generated = generate(module)
    chosen = [g for g in generated if numbers is None or g.number in numbers]
    record: dict = {}
    with _scratch(module) as (scratch, target):
        clean, clean_s = _pytest(GUARD_TESTS[module], db, scratch, 3600)
        if clean != "survived":
            raise SystemExit(f"{module}: its tests do not pass on {db} unmutated ({clean}); nothing run")
        for g in chosen:
            target.write_text(mutated_source(module, g.number))
            verdict, seconds = _pytest(GUARD_TESTS[module], db, scratch, 4 * clean_s + 30)
            record = _store(module, db, clean_s, len(generated),
                            {**asdict(g), "verdict": verdict, "seconds": round(seconds, 1)})
            print(f"{module} #{g.number} {g.operator} line {g.line}: {verdict} in {seconds:.1f} s  {g.what}",
                  flush=True)
    return record


def _store(module: str, db: str, clean_s: float, generated: int, result: dict) -> dict:
    """Add ``result`` to the module's stored run on ``db`` (replacing an earlier result of
    the same mutant; an earlier source's results, numbered otherwise, are dropped)."""
    source, path = _source(module), _path(module, db)
    earlier = json.loads(path.read_text()) if path.exists() else {}
    kept = [r for r in earlier.get("results", []) if r["number"] != result["number"]] \
        if earlier.get("source") == source else []
    record = {"module": module, "db": db, "source": source, "clean_s": round(clean_s, 1),
              "generated": generated, "results": sorted([*kept, result], key=lambda r: r["number"])}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return record


def survivors_elsewhere(module: str, db: str) -> list[int]:
    """The mutants of ``module`` that the stored runs on the other databases (of its current
    source) all left alive and that are not argued equivalent: a server's run of a module
    need not repeat what SQLite killed."""
    records = [json.loads(_path(module, other).read_text()) for other in DATABASES
               if other != db and _path(module, other).exists()]
    current = [r for r in records if r["source"] == _source(module)]
    if not current:
        raise SystemExit(f"{module}: no stored run on another database of its current source")
    return [r["number"] for r in _combined(current) if r["verdict"] == "survived" and not _argued(r)]


def against(module: str, db: str, numbers: list[int], tests: list[str]) -> dict[int, str]:
    """Each of the mutants ``numbers`` of ``module`` against ``tests`` only (node ids) on
    ``db``: the verdicts, printed and returned. A kill by tests of the module's selection
    (:data:`GUARD_TESTS`: the files a full run would run too) is stored, with the tests that
    made it (``by``); a survivor is not (a narrower run than the module's)."""
    verdicts = {}
    path = _path(module, db)
    stored = json.loads(path.read_text()) if path.exists() else None
    ours = all(test.split("::")[0] in GUARD_TESTS[module] for test in tests)
    with _scratch(module) as (scratch, target):
        for number in numbers:
            target.write_text(mutated_source(module, number))
            verdicts[number], seconds = _pytest(tuple(tests), db, scratch, 600)
            print(f"{module} #{number}: {verdicts[number]} in {seconds:.1f} s  {generate(module)[number - 1].what}",
                  flush=True)
            if verdicts[number] == "killed" and ours and stored is not None and stored["source"] == _source(module):
                result = next((r for r in stored["results"] if r["number"] == number), None)
                if result is not None:  # (a mutant the stored run has not reached yet stays unstored)
                    _store(module, db, stored["clean_s"], stored["generated"],
                           {**result, "verdict": "killed", "by": sorted(tests)})
    return verdicts


def _map_path(db: str) -> Path:
    return RESULTS / f"coverage-map.{db}.json"


def _node_id(context: str) -> str | None:
    """``tests/integration/test_x.py::test_y`` for coverage's context
    ``tests.integration.test_x.test_y`` (``…test_x.TestK.test_y``: ``::TestK::test_y``)."""
    parts = context.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (ROOT / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:]])
    return None


def build_map(db: str) -> dict:
    """Which integration tests run each line of each guard module on ``db``: the whole
    integration tier once under coverage.py with a context per test function (lines that
    run only in a process a test starts, a fleet's, have no context and are not mapped).
    A test function that failed any of its cases is left out of the map."""
    with tempfile.TemporaryDirectory(prefix="guard-map-") as tmp:
        rc, data, junit = Path(tmp) / "coveragerc", Path(tmp) / "coverage", Path(tmp) / "junit.xml"
        rc.write_text(f"[run]\ndata_file = {data}\ndynamic_context = test_function\nsource = {PACKAGE}\n")
        env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_START"}
        server = {} if db == "sqlite" else {"DUCTWORK_REQUIRE_CONTAINERS": "1"}
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", "tests/integration",
                        "-k", _others(db), "-q", "-p", "no:randomly", "-p", "no:cacheprovider", f"--junitxml={junit}",
                        "-W", "ignore::pytest.PytestAssertRewriteWarning"],
                       cwd=ROOT, env={**env, "HYPOTHESIS_PROFILE": "ci", **server}, check=False)
        seconds = time.monotonic() - started
        failed, durations = set(), {}
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            function = f"{case.get('classname')}.{case.get('name', '').split('[')[0]}"
            durations[function] = durations.get(function, 0.0) + float(case.get("time") or 0)
            if case.find("failure") is not None or case.find("error") is not None:
                failed.add(function)
        covered = coverage.Coverage(data_file=str(data), config_file=str(rc))
        covered.load()
        found = covered.get_data()
        lines: dict[str, dict[str, list[str]]] = {}
        for module in GUARD_TESTS:
            by_line = found.contexts_by_lineno(str(PACKAGE / module))
            lines[module] = {str(n): sorted({node for c in contexts if c and c not in failed
                                             if (node := _node_id(c)) is not None})
                             for n, contexts in by_line.items()}
    record = {"db": db, "seconds": round(seconds, 1), "sources": {m: _source(m) for m in GUARD_TESTS},
              "durations": {(_node_id(f) or f): round(t, 2) for f, t in durations.items()}, "lines": lines,
              "failed": sorted(failed)}
    RESULTS.mkdir(exist_ok=True)
    _map_path(db).write_text(json.dumps(record, indent=1))
    return record


def _covering(module: str, line: int, record: dict) -> list[str]:
    """The mapped tests that run the statement holding ``line`` (coverage records a
    statement of several lines on one of them), and those that run a line naming the
    function around it: a statement builder runs once per process (``dialects.prepared``,
    ``lru_cache``), so its own lines carry only the first test's context."""
    tree = ast.parse((PACKAGE / module).read_text())
    around = [n for n in ast.walk(tree) if getattr(n, "lineno", 0) <= line <= (getattr(n, "end_lineno", 0) or 0)]
    statements = [n for n in around if isinstance(n, ast.stmt) and not isinstance(n, _BLOCKS)]
    innermost = max(statements, key=lambda n: n.lineno, default=None)
    spans = [range(line, line + 1) if innermost is None else range(innermost.lineno, (innermost.end_lineno or 0) + 1)]
    function = max((n for n in around if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
                   key=lambda n: n.lineno, default=None)
    if function is not None:
        spans += [range(n.lineno, (n.end_lineno or n.lineno) + 1) for n in ast.walk(tree)
                  if isinstance(n, ast.stmt) and not isinstance(n, _BLOCKS)
                  and not function.lineno <= n.lineno <= (function.end_lineno or 0)
                  and any(isinstance(m, ast.Name) and m.id == function.name for m in ast.walk(n))]
    by_line = record["lines"].get(module, {})
    return sorted({node for span in spans for n in span for node in by_line.get(str(n), [])})


_BLOCKS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While, ast.With, ast.Try)


def widen(module: str, db: str) -> dict:
    """Run the stored survivors of ``module`` on ``db`` again, each against every integration
    test the coverage map says runs its line (beyond the module's own selection); the
    verdict becomes the wider run's, and ``covering`` says how many test functions it had."""
    record = json.loads(_path(module, db).read_text())
    mapped = json.loads(_map_path(db).read_text())
    if record["source"] != _source(module) or mapped["sources"].get(module) != _source(module):
        raise SystemExit(f"{module}: the stored run or the coverage map is of an earlier source; run them again")
    with _scratch(module) as (scratch, target):
        for r in record["results"]:
            if r["verdict"] != "survived" or _argued(r):
                continue
            nodes = _covering(module, r["line"], mapped)
            if r.get("covering", -1) >= len(nodes):
                continue  # run against these already
            r["covering"] = len(nodes)
            if nodes:
                budget = sum(mapped["durations"].get(n, 30.0) for n in nodes)
                target.write_text(mutated_source(module, r["number"]))
                r["verdict"], seconds = _pytest(tuple(nodes), db, scratch, 4 * budget + 60)
                r["seconds"] = round(r["seconds"] + seconds, 1)
            print(f"{module} #{r['number']} line {r['line']}: {r['verdict']} against {len(nodes)} covering tests"
                  f"  {r['what']}", flush=True)
            _path(module, db).write_text(json.dumps(record, indent=1))
    return record


def _argued(result: dict) -> bool:
    """Whether a stored result is a mutant argued equivalent (the same number and change)."""
    argued = ARGUED.get(f"{result['module']}#{result['number']}")
    return argued is not None and argued[0] == result["what"]


def _row(module: str, db: str, generated: int, clean: str, results: list[dict], stale: bool) -> str:
    count = {v: sum(r["verdict"] == v for r in results) for v in ("killed", "timeout", "survived", "broken")}
    argued = sum(r["verdict"] == "survived" and _argued(r) for r in results)
    caught, scored = count["killed"] + count["timeout"], count["killed"] + count["timeout"] + count["survived"]
    score = f"{100 * caught / scored:.1f} %" if scored else "–"
    strict = f"{100 * caught / (scored - argued):.1f} %" if scored - argued else "–"
    timed = [r["seconds"] for r in results if "seconds" in r]
    per = f"{sum(timed) / len(timed):.1f}" if timed else "–"
    minutes = f"{sum(timed) / 60:.0f}" if timed else "–"
    return (f"| `{module}`{' (stale)' if stale else ''} | {db} | {generated} | {len(results)} "
            f"| {count['killed']} | {count['timeout']} | {count['survived']} | {argued} | {count['broken']} "
            f"| {score} | {strict} | {per} | {minutes} | {clean} |")


def _combined(records: list[dict]) -> list[dict]:
    """A module's results over its databases: killed (or timed out) where some run caught it,
    survived where every run left it, broken where no run scored it."""
    by_number: dict[int, list[dict]] = {}
    for record in records:
        for r in record["results"]:
            by_number.setdefault(r["number"], []).append(r)
    combined = []
    for _number, runs in sorted(by_number.items()):
        verdicts = {r["verdict"] for r in runs}
        verdict = next((v for v in ("killed", "timeout", "survived") if v in verdicts), "broken")
        combined.append({**{k: v for k, v in runs[0].items() if k != "seconds"}, "verdict": verdict})
    return combined


def report() -> str:
    """The table of the stored runs (a row per module and database, and per module run on
    more than one a row ``all``) and the survivors not argued equivalent (of ``all`` where
    there is one)."""
    lines = ["| module | database | generated | run | killed | timed out | survived | argued equivalent "
             "| broken | score | score without the argued | s per mutant | minutes | clean run |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    survivors = []
    totals: list[list[dict]] = []
    records: dict[str, list[dict]] = {}
    for path in sorted(RESULTS.glob("*.py.*.json")):
        record = json.loads(path.read_text())
        records.setdefault(record["module"], []).append(record)
    for module, runs in records.items():
        source = _source(module)
        current = [r for r in runs if r["source"] == source]
        for record in runs:
            lines.append(_row(module, record["db"], record["generated"], f"{record['clean_s']} s",
                              record["results"], record["source"] != source))
        if len(current) > 1:
            lines.append(_row(module, "all", current[0]["generated"], "–", _combined(current), False))
        left = _combined(current) if current else []
        totals.append(left)
        survivors += [f"- `{module}` #{r['number']} ({r['operator']}, line {r['line']}): {r['what']}"
                      for r in left if r["verdict"] == "survived" and not _argued(r)]
    every = [r for left in totals for r in left]
    caught = sum(r["verdict"] in ("killed", "timeout") for r in every)
    argued = sum(r["verdict"] == "survived" and _argued(r) for r in every)
    unrun = [m for m in GUARD_TESTS if not any(r["source"] == _source(m) for r in records.get(m, []))]
    summary = (f"In all, over the databases: {len(every)} mutants of {len(records)} modules run, {caught} killed "
               f"(or timed out), {argued} argued equivalent, {len(survivors)} survivors not argued, "
               f"{sum(r['verdict'] == 'broken' for r in every)} broken; "
               + (f"not run yet: {', '.join(f'`{m}`' for m in unrun)}." if unrun else "every guard module run."))
    tail = ["", "Survivors not argued equivalent:", *survivors] if survivors else []
    return "\n".join([*lines, "", summary, *tail])


#: where docs/verification.md publishes :func:`report`'s text (``--report --write`` puts it there)
MARKERS = ("<!-- guard-mutation report: python -m tests.guard_mutation --report --write -->",
           "<!-- /guard-mutation report -->")


def published(text: str) -> str:
    """The report between :data:`MARKERS` in ``text`` (docs/verification.md)."""
    return text.split(MARKERS[0], 1)[1].split(MARKERS[1], 1)[0].strip()


#: the pages that publish :func:`report` between :data:`MARKERS`
PAGES = (ROOT / "docs" / "verification.md", ROOT / "INVARIANTS.md")


def write_report() -> None:
    """Put :func:`report` into each of :data:`PAGES` between its markers."""
    for doc in PAGES:
        text = doc.read_text()
        head, rest = text.split(MARKERS[0], 1)
        doc.write_text(f"{head}{MARKERS[0]}\n\n{report()}\n\n{MARKERS[1]}{rest.split(MARKERS[1], 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.guard_mutation", description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"guard modules (of {', '.join(GUARD_TESTS)})")
    parser.add_argument("--all", action="store_true", help="every guard module")
    parser.add_argument("--db", default="sqlite", choices=DATABASES)
    parser.add_argument("--only", type=int, nargs="*", help="only these mutant numbers")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--report", action="store_true", help="print the table of the stored runs")
    parser.add_argument("--write", action="store_true", help="with --report: put it into docs/verification.md")
    parser.add_argument("--survivors", action="store_true",
                        help="only the mutants every stored run of the module on another database left alive")
    parser.add_argument("--against", nargs="+", metavar="TEST",
                        help="run --only's mutants against these tests only; store a kill by the module's own tests")
    parser.add_argument("--map", action="store_true",
                        help="map which integration tests run each guard module's lines on --db (coverage.py)")
    parser.add_argument("--widen", action="store_true",
                        help="run the stored survivors again against every integration test that runs their line")
    args = parser.parse_args(argv)
    modules = list(GUARD_TESTS) if args.all else args.modules
    unknown = [m for m in modules if m not in GUARD_TESTS]
    if unknown:
        parser.error(f"not a guard module: {', '.join(unknown)}")
    if args.report:
        if args.write:
            write_report()
        print(report())
        return 0
    if args.against:
        for module in modules:
            against(module, args.db, args.only or [g.number for g in generate(module)], args.against)
        return 0
    if args.map:
        build_map(args.db)
        return 0
    if args.widen:
        for module in modules:
            widen(module, args.db)
        print(report())
        return 0
    for module in modules:
        if args.list:
            for g in generate(module):
                print(f"{module} #{g.number} {g.operator} line {g.line}: {g.what}")
            continue
        run(module, args.db, survivors_elsewhere(module, args.db) if args.survivors else args.only)
    if not args.list:
        print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
