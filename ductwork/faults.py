"""Named fault checkpoints at every crash window.

    DUCTWORK_FAULT=after_job_claim:kill ductwork start
    DUCTWORK_FAULT=between_expand_batches:exit:2      # the second time it is reached

Each name below appears at exactly one call site in ``ductwork/`` (a unit test
checks it). A checkpoint is a no-op unless armed, by the ``DUCTWORK_FAULT``
environment variable (read when this module is imported, so only fresh
processes see it) or by :func:`arm` (tests in the same process). Several
checkpoints may be armed at once, separated by commas.

Actions, and whether ``finally`` blocks run:

========  ==========================================================  =========
``kill``  SIGKILL this process                                        no
``exit``  ``os._exit(1)``: immediate exit, no cleanup                 no
``raise`` raise :class:`FaultInjection`                               yes
``sleep`` pause ``DUCTWORK_FAULT_SLEEP`` seconds (default 1)          n/a
``wait``  block until the file ``DUCTWORK_FAULT_RELEASE`` exists      n/a
========  ==========================================================  =========

Every firing first writes ``FAULT FIRING <name>:<action>`` to stderr and
flushes, so a parent process can wait for that line before acting (``wait`` is
how a test holds a process inside a window, e.g. with a lock held, and releases
it by creating the file). In production no variable is set and :func:`hit` costs
one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from ductwork.errors import FaultInjection

# Advancer
AFTER_BRANCH_CANDIDATE_SELECT = "after_branch_candidate_select"
BEFORE_ADVANCEMENT_CREATE = "before_advancement_create"
AFTER_BRANCH_CLAIM = "after_branch_claim"
BEFORE_FENCE_COMMIT = "before_fence_commit"
AFTER_BRANCH_ADVANCEMENT = "after_branch_advancement"
BETWEEN_EXPAND_BATCHES = "between_expand_batches"
BEFORE_FANIN_BUMP = "before_fanin_bump"
AFTER_FANIN_BUMP = "after_fanin_bump"
INSIDE_ADVANCE_BATCH = "inside_advance_batch"
# Worker
BEFORE_KEY_LOCK = "before_key_lock"
#: a keyed group commit's transaction: what follows its steps written, the key's lock not yet taken
BEFORE_RELEASE_KEY_LOCK = "before_release_key_lock"
IN_KEYED_GROUP_COMMIT = "in_keyed_group_commit"
AFTER_JOB_CLAIM = "after_job_claim"
DURING_JOB_EXECUTION = "during_job_execution"
AFTER_JOB_COMMIT = "after_job_commit"
# Async steps: in the worker thread, once the claimed async steps were handed to the step
# loop and before their outcomes are read (a long-awaiting step is awaiting then)
WHILE_ASYNC_STEPS_AWAIT = "while_async_steps_await"
# Reaper
DURING_REAP = "during_reap"
# on_halt hooks (issue 16)
BETWEEN_HALT_AND_HOOK = "between_halt_and_hook"
AFTER_HOOK_CLAIM = "after_hook_claim"
IN_HOOK_COMMIT = "in_hook_commit"
#: the checkpoints only a halting run with an on_halt handler passes
HOOK_CHECKPOINTS = (BETWEEN_HALT_AND_HOOK, AFTER_HOOK_CLAIM, IN_HOOK_COMMIT)
# Prune (ductwork prune): inside a batch's transaction, its runs' rows deleted but the runs' own
INSIDE_PRUNE_BATCH = "inside_prune_batch"
# Revive (Run.revive): after every row of the new run is written, before the commit
INSIDE_REVIVE = "inside_revive"

CHECKPOINTS = (
    AFTER_BRANCH_CANDIDATE_SELECT,
    BEFORE_ADVANCEMENT_CREATE,
    AFTER_BRANCH_CLAIM,
    BEFORE_FENCE_COMMIT,
    AFTER_BRANCH_ADVANCEMENT,
    BETWEEN_EXPAND_BATCHES,
    BEFORE_FANIN_BUMP,
    AFTER_FANIN_BUMP,
    INSIDE_ADVANCE_BATCH,
    BEFORE_KEY_LOCK,
    BEFORE_RELEASE_KEY_LOCK,
    IN_KEYED_GROUP_COMMIT,
    AFTER_JOB_CLAIM,
    DURING_JOB_EXECUTION,
    AFTER_JOB_COMMIT,
    WHILE_ASYNC_STEPS_AWAIT,
    DURING_REAP,
    *HOOK_CHECKPOINTS,
    INSIDE_PRUNE_BATCH,
    INSIDE_REVIVE,
)
ACTIONS = ("kill", "exit", "raise", "sleep", "wait")


@dataclass
class _Armed:
    action: str
    nth: int  # fire on this hit (1-based); 0 = every hit
    hits: int = 0
    fired: int = 0


_lock = threading.Lock()
_armed: dict[str, _Armed] = {}


def parse(spec: str) -> dict[str, _Armed]:
    """Parse ``name:action[:nth][,name:action[:nth]…]``; raises ValueError naming the bad part."""
    armed: dict[str, _Armed] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        pieces = part.split(":")
        if len(pieces) not in (2, 3):
            raise ValueError(f"DUCTWORK_FAULT={spec!r}: {part!r} is not name:action[:nth]")
        name, action = pieces[0], pieces[1]
        if name not in CHECKPOINTS:
            raise ValueError(f"DUCTWORK_FAULT={spec!r}: unknown checkpoint {name!r}")
        if action not in ACTIONS:
            raise ValueError(f"DUCTWORK_FAULT={spec!r}: unknown action {action!r} {ACTIONS}")
        nth = int(pieces[2]) if len(pieces) == 3 else 0
        armed[name] = _Armed(action, nth)
    return armed


def arm(name: str, action: str, nth: int = 0) -> None:
    """Arm one checkpoint in this process (tests)."""
    with _lock:
        _armed.update(parse(f"{name}:{action}" + (f":{nth}" if nth else "")))


def disarm(name: str | None = None) -> None:
    """Disarm one checkpoint, or all of them."""
    with _lock:
        if name is None:
            _armed.clear()
        else:
            _armed.pop(name, None)


def fired(name: str) -> int:
    """How many times the armed checkpoint ``name`` has fired in this process (tests)."""
    with _lock:
        armed = _armed.get(name)
        return 0 if armed is None else armed.fired


def hit(name: str) -> None:
    """Pass a checkpoint: does nothing unless ``name`` is armed."""
    if not _armed:
        return
    with _lock:
        armed = _armed.get(name)
        if armed is None:
            return
        armed.hits += 1
        if armed.nth and armed.hits != armed.nth:
            return
        armed.fired += 1
        action = armed.action
    sys.stderr.write(f"FAULT FIRING {name}:{action}\n")
    sys.stderr.flush()
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # pragma: no cover - runs (kill checkpoints), but nothing saves
    elif action == "exit":
        os._exit(1)
    elif action == "raise":
        raise FaultInjection(name)
    elif action == "sleep":
        time.sleep(float(os.environ.get("DUCTWORK_FAULT_SLEEP", "1")))
    elif action == "wait":  # pragma: no branch  parse() admits only ACTIONS: this is the last
        release = os.environ.get("DUCTWORK_FAULT_RELEASE")
        if not release:
            raise FaultInjection(f"{name} (wait armed without DUCTWORK_FAULT_RELEASE)")
        deadline = time.monotonic() + float(os.environ.get("DUCTWORK_FAULT_WAIT_MAX", "60"))
        while not os.path.exists(release):
            if time.monotonic() > deadline:
                raise FaultInjection(f"{name} (released file {release} never appeared)")
            time.sleep(0.01)


if os.environ.get("DUCTWORK_FAULT"):
    _armed.update(parse(os.environ["DUCTWORK_FAULT"]))
