"""What ``ductwork runs`` and ``ductwork show`` print: the records of
:mod:`ductwork.pipelines.history` rendered as text or as ``--json`` documents, nothing read
besides them (the presentation, beside ``status.py``'s; the engine's layers hold none).

    >>> print(render_history(run_history(app, run_id)))
    >>> print(json.dumps(history_json(run_history(app, run_id))))

Text times are database time (UTC), to the millisecond; a wait is described relative to
the history's ``now``. JSON times are ISO 8601 UTC with microseconds and a ``Z``.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from ductwork.pipelines.history import BranchRecord, ErrorRecord, RunHistory, RunRecord, StepRecord, Wait
from ductwork.values import Json

#: version of the ``--json`` documents (docs/operating.md describes them); bumped on a
#: change that removes or renames a field (a new field does not bump it)
JSON_FORMAT = 1


def _at(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(sep=" ", timespec="milliseconds")


def _took(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    return f" ({(end - start).total_seconds():.3f}s)"


def describe_wait(wait: Wait, now: datetime) -> str:
    """One line for a wait, relative to ``now``."""
    key = f" key {wait.key!r}" if wait.key else ""
    until = "" if wait.until is None else f"{_at(wait.until)} ({(wait.until - now).total_seconds():.3f}s from now)"
    if wait.kind == "delay":
        return f"waits: not eligible until {until}"
    if wait.kind == "rate":
        return f"waits:{key} is rate-blocked until {until}"
    if wait.kind == "concurrency":
        return f"waits:{key} has {wait.in_flight} of {wait.concurrency} in flight (its concurrency)"
    if wait.kind == "running":
        assert wait.since is not None
        return f"running{key} since {_at(wait.since)} ({(now - wait.since).total_seconds():.3f}s)"
    if wait.kind == "advance":
        return "waits: an advancer to move its branch on"
    if wait.kind == "resume":
        return "waits: Run.resume() (dampened; nothing resumes it by itself)"
    return f"waits: a worker to claim it{key} (eligible, nothing holds it back)"


def render_runs(records: list[RunRecord]) -> str:
    """``ductwork runs``'s table."""
    if not records:
        return "(no runs)"
    rows = [("RUN", "STATUS", "PIPELINE", "TRIGGERED (UTC)", "FINISHED (UTC)", "HALT REASONS")]
    for record in records:
        notes = [", ".join(record.halt_reasons)] if record.halt_reasons else []
        if record.revived_from:
            notes.append(f"revived from {record.revived_from}")
        if record.revived_as:
            notes.append(f"revived as {record.revived_as}")
        rows.append((record.id, record.status, record.pipeline, _at(record.triggered_at),
                     _at(record.finished_at), "; ".join(notes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
                     for row in rows).rstrip()


def render_history(history: RunHistory) -> str:
    """``ductwork show``'s text: the run, then each branch with its steps and executions."""
    lines = _run_lines(history)
    by_branch: dict[str, list[StepRecord]] = {}
    for step in history.steps:
        by_branch.setdefault(step.branch_id, []).append(step)
    for branch in history.branches:
        lines += _branch_lines(branch, history.now)
        for step in by_branch.get(branch.id, []):
            lines += _step_lines(step, history)
    return "\n".join(lines)


def _run_lines(history: RunHistory) -> list[str]:
    """The run's header: status, times, where it was revived from and what it carried over."""
    run = history.run
    lines = [f"run {run.id}  {run.status}", f"  pipeline      {run.pipeline}",
             f"  triggered     {_at(run.triggered_at)} UTC"]
    if run.finished_at is not None:
        lines.append(f"  {run.status:<13} {_at(run.finished_at)} UTC{_took(run.triggered_at, run.finished_at)}")
    if run.revived_from:
        lines.append(f"  revived from  {run.revived_from} (that run may have been pruned since)")
    carried = sum(1 for step in history.steps if step.carried_from is not None)
    if carried:
        lines.append(f"  carried over  {carried} of {len(history.steps)} steps from {run.revived_from}, as history "
                     "(their executions stay with that run)")
    if run.halt_reasons:
        lines.append(f"  halt reasons  {', '.join(run.halt_reasons)}")
    if run.revived_as:
        lines.append(f"  revived as    {run.revived_as}")
    if history.context_keys:
        lines.append(f"  context keys  {', '.join(history.context_keys)}")
    if history.hook is not None:
        hook = history.hook
        lines.append(f"  on_halt hook  {hook.klass}  {hook.status}  retries {hook.retry_count} "
                     f"crashes {hook.crash_count}" + (f"  ended {_at(hook.completed_at)}" if hook.completed_at else
                                                      f"  eligible {_at(hook.eligible_at)}"))
        if hook.error is not None:
            lines.append(f"    last error {hook.error.klass}: {hook.error.message}")
            lines += _backtrace(hook.error, "    ")
    lines.append(f"  database time {_at(history.now)} UTC")
    return lines


def _branch_lines(branch: BranchRecord, now: datetime) -> list[str]:
    where = "" if branch.parent_id is None else f"  child {branch.barrier_index} of {branch.parent_id}"
    lines = ["", f"branch {branch.id}  {branch.status}"
             + (f" ({branch.halt_reason})" if branch.halt_reason else "") + where]
    if branch.wait is not None:
        lines.append(f"  {describe_wait(branch.wait, now)}")
    for advancement in branch.advancement_errors:
        lines.append(f"  advancer error on step {advancement.step_id} at {_at(advancement.started_at)}: "
                     f"{advancement.error.klass}: {advancement.error.message}")
        lines += _backtrace(advancement.error, "    ")
    return lines


def _step_lines(step: StepRecord, history: RunHistory) -> list[str]:
    key = f"  key {step.limit_key!r}" if step.limit_key else ""
    lines = [f"  step {step.node} ({step.klass})  {step.status}  via {step.to_transition}{key}",
             f"    id {step.id}  created {_at(step.created_at)}"
             + (f"  completed {_at(step.completed_at)}{_took(step.created_at, step.completed_at)}"
                if step.completed_at else "")]
    if step.carried_from is not None:
        lines.append(f"    carried over from run {step.carried_from} by its revive: no executions here "
                     "(they stay with that run)")
    elif history.run.revived_from and step.idempotency_key != step.id:
        lines.append(f"    re-runs the step that failed in run {history.run.revived_from}, with its idempotency "
                     f"key {step.idempotency_key}")
    if step.wait is not None:
        lines.append(f"    {describe_wait(step.wait, history.now)}")
    for number, execution in enumerate(step.executions, 1):
        outcome = execution.outcome or ("running" if execution.claimed_at else "pending")
        lines.append(f"    #{number} {outcome:<15} claimed {_at(execution.claimed_at)}  "
                     f"ended {_at(execution.completed_at)}{_took(execution.claimed_at, execution.completed_at)}"
                     f"  retries {execution.retry_count} crashes {execution.crash_count}")
        if execution.error is not None:
            lines.append(f"       {execution.error.klass}: {execution.error.message}")
            lines += _backtrace(execution.error, "       ")
    return lines


def _backtrace(error: ErrorRecord, indent: str) -> list[str]:
    if error.backtrace is None:
        return []
    return [indent + line for line in error.backtrace.rstrip().splitlines()]

# --------------------------------------------------------------------------- JSON


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(sep="T", timespec="microseconds") + "Z"
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    return value


def run_json(record: RunRecord) -> dict[str, Json]:
    """``ductwork runs --json``'s object for one run: the RunRecord's fields plus
    ``finished_at``; times are ISO 8601 UTC with microseconds and a ``Z``."""
    return _json_value({**asdict(record), "finished_at": record.finished_at})  # type: ignore[no-any-return]


def history_json(history: RunHistory) -> dict[str, Json]:
    """``ductwork show --json``'s document: ``{"format": 1, "now", "run", "branches",
    "steps", "context_keys", "hook"}``, each record's fields by name (docs/operating.md)."""
    document = {"format": JSON_FORMAT, "now": history.now, "run": run_json(history.run),
                "branches": [asdict(branch) for branch in history.branches],
                "steps": [asdict(step) for step in history.steps], "context_keys": list(history.context_keys),
                "hook": None if history.hook is None else asdict(history.hook)}
    return _json_value(document)  # type: ignore[no-any-return]
