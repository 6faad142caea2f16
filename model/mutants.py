"""Model variants with one guard removed: tests that must fail (docs/verification.md).

Example::

    from model.mutants import MUTANTS
    for mutant in MUTANTS:  # tests/properties/test_model_mutants.py runs each
        ...                 # the machine for mutant.machine must fail naming mutant.caught_by[0]

A guard that no test misses is a guard nobody has verified: each mutant here
overrides exactly one hook of ``LimitsModel`` or ``PipelinesModel`` and names
the invariants whose check must go red when hypothesis drives it (the first
is the one it targets; a neighbour that sees the damage first also counts).
Not API.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .limits import Bucket, LimitJob, LimitsModel, RateEntry, cap_units, next_token_us
from .pipelines import Branch, Definition, Execution, HaltHook, PipelinesModel, Run, Step

__all__ = ["MUTANTS", "Mutant"]


class RefillWithoutClamp(LimitsModel):
    """Refill adds elapsed × limit but never clamps to the burst."""

    def _refill(self, bucket: Bucket, entry: RateEntry, now_us: int) -> Bucket:
        gained = max(0, now_us - bucket.refilled_at_us) * entry.limit
        return Bucket(bucket.units + gained, now_us, cap_units(entry))


class NoConcurrencyCheck(LimitsModel):
    """Neither the lane filter nor the key decision looks at in-flight counts."""

    def _saturated(self, key: str) -> bool:
        return False


class SpendSkipped(LimitsModel):
    """An admitted claim spends no token."""

    def _spend(self, bucket: Bucket, entry: RateEntry) -> Bucket:
        return bucket


class StampOffByOne(LimitsModel):
    """``blocked_until`` is one µs later than the next token."""

    def _next_token_us(self, bucket: Bucket, entry: RateEntry) -> int:
        return next_token_us(bucket, entry) + 1


class FifoByCreationOnly(LimitsModel):
    """Lanes and jobs ordered by creation alone, ignoring ``eligible_at``."""

    def _lane_order(self, job: LimitJob) -> tuple[int, int]:
        return (job.created, 0)


class FamilyCeilingIgnored(LimitsModel):
    """A partition's claim is decided on its own limits alone: the family's ceiling over all
    its partitions is never checked (issue 34, model only)."""

    def _family_saturated(self, key: str) -> bool:
        return False


class ForgetRefills(LimitsModel):
    """Forgetting an idle partition leaves each of its buckets full instead of removing it
    (a removal that adds tokens; issue 34, model only)."""

    def _forget_bucket(self, bucket: Bucket, entry: RateEntry | None, now_us: int) -> Bucket | None:
        return None if entry is None else Bucket(cap_units(entry), now_us, cap_units(entry))


class FanInFiresOnEveryArrival(PipelinesModel):
    """Every arriving sibling creates a merge target, not only the last."""

    def _fires(self, barrier: Branch) -> bool:
        return True


class FanInFiresOnCreated(PipelinesModel):
    """A fan-in fires when its arrivals reach the children an expand created so far (its
    cursor), not the fan-out's width: the first batches merge while the expand is parked."""

    def _fires(self, barrier: Branch) -> bool:
        created = barrier.fanout_width if barrier.expand_cursor is None else barrier.expand_cursor
        return barrier.fanin_arrivals == created


class StaleTokenAccepted(PipelinesModel):
    """The fence checks only that the branch exists."""

    def _fence_ok(self, branch: Branch, token: int) -> bool:
        return True


class ExpandCursorLost(PipelinesModel):
    """An advancer crash forgets the expand cursor, so resumption starts over at item 0."""

    def advancer_crash(self, branch_id: str) -> None:
        super().advancer_crash(branch_id)
        self.branches[branch_id].expand_cursor = None


class CrashBudgetOffByOne(PipelinesModel):
    """A crash is retried while ``crash_count <= max_crash`` (one too many)."""

    def _may_retry(self, execution: Execution) -> bool:
        if execution.outcome == "process_crashed":
            return execution.crash_count <= self.config.max_crash
        return super()._may_retry(execution)


class InvalidRetried(PipelinesModel):
    """An ``invalid`` execution is retried within the retry budget, like a failure."""

    def _may_retry(self, execution: Execution) -> bool:
        if execution.outcome == "invalid":
            return execution.retry_count < self.config.max_retry
        return super()._may_retry(execution)


class ContextOverwriteAllowed(PipelinesModel):
    """``context_set`` without ``overwrite`` silently replaces an existing value."""

    @staticmethod
    def _context_accepts(existed: bool, overwrite: bool) -> bool:
        return True


class HookFenceDropped(PipelinesModel):
    """A hook attempt is recorded whatever claim token its recorder holds."""

    @staticmethod
    def _hook_fence_ok(hook: HaltHook, token: int) -> bool:
        return hook.status == "running"


class HookNotOwed(PipelinesModel):
    """The halting transaction owes no on_halt hook."""

    def _owe_hook(self, run: Run) -> None:
        return None
class PruneLiveRun(PipelinesModel):
    """A prune batch deletes every run it is asked about, live or not."""

    def _may_prune(self, run: Run, cutoff_us: int) -> bool:
        return True
class ReviveTwice(PipelinesModel):
    """A second revive of a halted run creates another run (no unique ``revived_from``)."""

    def _existing_revival(self, run_id: str) -> str | None:
        return None


class ReviveRerunsEverything(PipelinesModel):
    """A revive re-enqueues every step of a halted branch, the succeeded ones too."""

    def _carry_step(self, run: Run, branch: Branch, old: Step, step_ids: Mapping[str, str], resume: bool) -> None:
        if self.branches[old.branch_id].status == "halted" and old.status == "completed":
            old = copy.copy(old)
            old.status = "failed"
            resume = True
        super()._carry_step(run, branch, old, step_ids, resume)


class TriggerKeyIgnored(PipelinesModel):
    """A keyed trigger never finds the key's run: every trigger starts a new run."""

    def _keyed_run(self, pipeline: str, key: str) -> str | None:
        return None


class KeyWindowIgnoresFinish(PipelinesModel):
    """A trigger with a key window takes the key from its run whether or not that run
    finished, and however recently."""

    def _key_expired(self, run_id: str, window_us: int) -> bool:
        return True


class RollbackKeepsTrigger(PipelinesModel):
    """A trigger the caller rolled back is written anyway."""

    def _rolled_back(self, definition: Mapping[str, Any] | Definition, args: Sequence[Any],
                     key: str | None) -> None:
        self.trigger(definition, args, key)


@dataclass(frozen=True)
class Mutant:
    """One guard removed: ``model_class`` replaces the model of the ``machine`` noun."""

    name: str
    machine: str  # "limits" | "partitioned" (the limits machine with key families) | "pipelines" | "hooks"
    model_class: type
    #: invariant IDs allowed to report it, the one it targets first (others may see it earlier)
    caught_by: tuple[str, ...]


MUTANTS = (
    Mutant("refill_without_clamp", "limits", RefillWithoutClamp, ("INV-LIM-4", "INV-LIM-2")),
    Mutant("no_concurrency_check", "limits", NoConcurrencyCheck, ("INV-LIM-1", "INV-LIM-6")),
    Mutant("spend_skipped", "limits", SpendSkipped, ("INV-LIM-2",)),
    Mutant("stamp_off_by_one", "limits", StampOffByOne, ("INV-LIM-5",)),
    Mutant("fifo_by_creation_only", "limits", FifoByCreationOnly, ("INV-LIM-6",)),
    Mutant("family_ceiling_ignored", "partitioned", FamilyCeilingIgnored, ("INV-LIM-8", "INV-LIM-6")),
    Mutant("forget_refills", "partitioned", ForgetRefills, ("INV-LIM-9", "INV-LIM-2")),
    Mutant("fan_in_fires_on_every_arrival", "pipelines", FanInFiresOnEveryArrival, ("INV-ADV-3", "INV-ADV-1")),
    Mutant("fan_in_fires_on_created", "pipelines", FanInFiresOnCreated, ("INV-ADV-3", "INV-ADV-1")),
    Mutant("stale_token_accepted", "pipelines", StaleTokenAccepted, ("INV-ADV-2",)),
    Mutant("expand_cursor_lost", "pipelines", ExpandCursorLost, ("INV-ADV-4", "INV-ADV-1")),
    Mutant("crash_budget_off_by_one", "pipelines", CrashBudgetOffByOne, ("INV-EXE-4",)),
    Mutant("invalid_retried", "pipelines", InvalidRetried, ("INV-EXE-4",)),
    Mutant("context_overwrite_allowed", "pipelines", ContextOverwriteAllowed, ("INV-CTX-1",)),
    Mutant("hook_fence_dropped", "hooks", HookFenceDropped, ("INV-HLT-1",)),
    Mutant("hook_not_owed", "hooks", HookNotOwed, ("INV-HLT-2",)),
    Mutant("prune_live_run", "pipelines", PruneLiveRun, ("INV-PRN-1",)),
    Mutant("revive_twice", "pipelines", ReviveTwice, ("INV-REV-1",)),
    Mutant("trigger_key_ignored", "pipelines", TriggerKeyIgnored, ("INV-TRG-1",)),
    Mutant("key_window_ignores_finish", "pipelines", KeyWindowIgnoresFinish, ("INV-TRG-1",)),
    Mutant("rollback_keeps_trigger", "pipelines", RollbackKeepsTrigger, ("INV-TRG-2", "INV-TRG-1")),
    Mutant("revive_reruns_everything", "pipelines", ReviveRerunsEverything, ("INV-REV-2", "INV-EXE-3",
                                                                               "INV-REV-3", "INV-ADV-1")),
)
