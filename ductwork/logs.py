"""What ductwork logs, and the two formats the ``ductwork`` command writes it in.

    >>> restore = configure("INFO", "json")     # what `ductwork start --log-format json` does
    >>> restore()

The library never configures logging (no handler, no ``basicConfig``): it logs to
loggers named per module under ``ductwork.`` and the application decides where
they go. The ``ductwork`` command owns its process's logging (:func:`configure`).

One record per event, logged only after the transaction that records the event
has committed (an outcome that rolled back is never logged):

- WARNING: every step failure, timeout and crash (:func:`step_ended`), every
  branch halt (:func:`branch_halted`) and every other advancement error
  (:func:`advancement_failed`), with what happens next and, for an error that was
  raised, its traceback;
- INFO: ``ductwork start`` starting (what it runs, against which database, with
  which limit keys) and stopping, processes started and reaped;
- DEBUG: each success (thousands per second: too many for INFO).

The context is in the message (``run_id=… pipeline=…``, for the text format) and
on the record as attributes (``extra=``), which :class:`JsonFormatter` emits as
keys: ``run_id``, ``pipeline``, ``step``, ``node``, ``step_id``, ``execution_id``,
``attempt``, ``outcome``, ``error``, ``next``, ``next_at``, ``branch_id``,
``halt_reason``, ``run_status``. A traceback travels as the record's exception
text, so every stdlib formatter prints it under the message.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from ductwork.config import FORMATS, LEVELS, Config
from ductwork.limit_entries import LimitEntry

TEXT_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
#: third-party loggers held at WARNING unless the level is DEBUG (Alembic logs its
#: plugins and migration context at INFO on every schema check)
QUIET = ("alembic",)
#: the most traceback text one record carries (the end is kept: the innermost frames)
TRACEBACK_LIMIT = 20_000

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``process``, ``message``, every ``extra=`` field, and ``exc_info`` (the traceback
    text) when the record has one. A value JSON cannot hold is written as its ``str``.
    Uses only the stdlib: a log line must not need a dependency to be written.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.process,
            "message": record.getMessage(),
        }
        out.update((k, v) for k, v in vars(record).items() if k not in _STANDARD and k not in out)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = record.stack_info
        return json.dumps(out, default=str)


def configure(level: str = "WARNING", fmt: str = "text", stream: IO[str] | None = None) -> Callable[[], None]:
    """Send every logger's records at ``level`` and above to ``stream`` (stderr) in
    ``fmt`` (``text`` or ``json``), replacing what an earlier call installed. The
    :data:`QUIET` loggers stay at WARNING unless ``level`` is DEBUG.

    Returns a function that undoes it, and any later call that replaced it (the
    handler removed, the levels as they were before the first call).
    """
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    quiet = [logging.getLogger(name) for name in QUIET]
    before = (root.level, [q.level for q in quiet])
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        before = old.before  # a reconfiguration: undoing it undoes the first call too
        root.removeHandler(old)
    handler = _Handler(stream or sys.stderr)
    handler.before = before
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
    for logger in quiet:
        logger.setLevel(logging.NOTSET if level == "DEBUG" else logging.WARNING)

    def restore() -> None:
        for installed in [h for h in root.handlers if isinstance(h, _Handler)]:
            root.removeHandler(installed)  # this call's, or a later call's that replaced it
        root.setLevel(before[0])
        for logger, previous in zip(quiet, before[1], strict=True):
            logger.setLevel(previous)

    return restore


class _Handler(logging.StreamHandler[IO[str]]):
    """The handler :func:`configure` installs (so a second call replaces it)."""

    #: the root and quiet loggers' levels before the first :func:`configure`
    before: tuple[int, list[int]]


def start_lines(config: Config, database: str, pipelines: list[str], role: str, version: str = "") -> list[str]:
    """What ``ductwork start`` says at INFO before it starts anything: the database
    (``database`` with its password masked), config, role and ``version`` (which ductwork,
    from which commit: ``version.describe()``), pipelines, processes and limits.

    >>> start_lines(Config(), "sqlite:///ductwork.sqlite3", [], "all")[2]
    'processes: 1 advancer process with 3 threads, 1 worker process with 5 threads each'
    """
    source = config.source if config.source.startswith("<") else os.path.abspath(config.source)
    lines = [f"ductwork start: database {database}, config {source}, env {config.env!r}, role {role}"
             + (f"; {version}" if version else ""),
             f"pipelines ({len(pipelines)}): {', '.join(pipelines)}" if pipelines else "pipelines: none listed"]
    processes = []
    if role in ("all", "advancer"):
        processes.append(f"1 advancer process with {config.pipeline_advancer.count} threads")
    if role in ("all", "worker"):
        workers = config.job_worker.processes
        processes.append(f"{workers} worker process{'es' if workers > 1 else ''} with "
                         f"{config.job_worker.count} threads each")
    lines.append(f"processes: {', '.join(processes)}")
    keys = [f"{key}: {_entry_text(entry)}" for key, entry in sorted(config.limits.items())]
    keys += [f"{family}[…]: each partition {_entry_text(f.per_partition)}"
             + (f", {f.concurrency} over the family" if f.concurrency is not None else "")
             for family, f in sorted(config.families.items())]
    lines.append(f"limit keys ({len(keys)}): {'; '.join(keys)}" if keys else "limit keys: none")
    return lines


def _entry_text(entry: LimitEntry) -> str:
    """A key's entry (a family's ``per_partition``) as the start lines say it."""
    parts = [f"concurrency {entry.concurrency}"] if entry.concurrency is not None else []
    if entry.rates:
        parts.append("rate " + ", ".join(f"{r.limit} per {r.per_s}s (burst {r.burst})" for r in entry.rates))
    return ", ".join(parts)


def emit(logger: logging.Logger, level: int, message: str, context: dict[str, Any],
         traceback: str | None = None) -> None:
    """Log ``message`` with ``context`` as record attributes and ``traceback`` (text,
    possibly from another process) as the record's exception text."""
    if not logger.isEnabledFor(level):
        return
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back  # the record names the engine's line that logged, not this module
    record = logger.makeRecord(logger.name, level, frame.f_code.co_filename, frame.f_lineno, message, (), None,
                               frame.f_code.co_name, context)
    if traceback:
        record.exc_text = traceback if len(traceback) <= TRACEBACK_LIMIT else (
            f"... (first {len(traceback) - TRACEBACK_LIMIT} characters left out)\n" + traceback[-TRACEBACK_LIMIT:])
    logger.handle(record)


def _fields(context: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in context.items() if v is not None)


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class StepEnded:
    """An execution that ended without success, as recorded (one WARNING)."""

    outcome: str  # failure | timed_out | process_crashed | invalid
    run_id: str
    pipeline: str
    step: str  # the step class, module:qualname
    node: str
    step_id: str
    execution_id: str
    retry_count: int
    crash_count: int
    #: the budget this outcome spends: max_retry (failure, timed_out) or max_crash
    budget: int
    error: str  # the error's class
    error_message: str
    #: when the next execution becomes eligible; None: the budget is spent, the step failed
    next_at: datetime | None
    traceback: str | None = None

    @property
    def attempt(self) -> int:
        """Which execution of the step this was: 1 for the first, each retry and re-run adds one."""
        return self.retry_count + self.crash_count + 1


_VERBS = {"failure": "failed", "timed_out": "timed out", "process_crashed": "crashed",
          "invalid": "cannot succeed"}


def step_ended(logger: logging.Logger, event: StepEnded) -> None:
    """One WARNING for a failed, timed-out or crashed execution, after its commit.

    ``… step failed: builtins.ValueError: boom; retry 1 of 3 at 2026-11-30 17:05:01 UTC
    (run_id=… pipeline=… step=… node=… step_id=… execution_id=… attempt=1)``
    """
    crash = event.outcome == "process_crashed"
    spent, word = (event.crash_count, "re-run") if crash else (event.retry_count, "retry")
    if event.outcome == "invalid":
        then = "not retried (it would end the same way): the step failed and its branch halts"
    elif event.next_at is not None:
        then = f"{word} {spent + 1} of {event.budget} at {_at(event.next_at)}"
    else:
        budget = "max_crash" if crash else "max_retry"
        then = f"no {word} left ({budget} {event.budget}): the step failed and its branch halts"
    context = {"run_id": event.run_id, "pipeline": event.pipeline, "step": event.step, "node": event.node,
               "step_id": event.step_id, "execution_id": event.execution_id, "attempt": event.attempt,
               "outcome": event.outcome, "error": event.error,
               "next": word if event.next_at is not None else "halt",
               "next_at": event.next_at.isoformat() if event.next_at is not None else None}
    message = (f"step {_VERBS.get(event.outcome, event.outcome)}: {event.error}: {event.error_message}; "
               f"{then} ({_fields(context)})")
    emit(logger, logging.WARNING, message, context, None if event.outcome == "timed_out" else event.traceback)


def branch_halted(logger: logging.Logger, *, run_id: str, pipeline: str, branch_id: str, step: str, node: str,
                  step_id: str, reason: str, run_status: str, error: str | None = None,
                  error_message: str | None = None, traceback: str | None = None) -> None:
    """One WARNING for a halted branch, after its fence committed.

    ``branch halted: job_retries_exhausted at Charge#0; the run is halted (run_id=… …)``
    """
    context = {"run_id": run_id, "pipeline": pipeline, "branch_id": branch_id, "step": step, "node": node,
               "step_id": step_id, "halt_reason": reason, "run_status": run_status, "error": error}
    run = ("the run's other branches go on" if run_status == "in_progress" else f"the run is {run_status}")
    cause = f" ({error}: {error_message})" if error else ""
    emit(logger, logging.WARNING, f"branch halted: {reason} at {node}{cause}; {run} ({_fields(context)})",
         context, traceback)


def hook_ended(logger: logging.Logger, *, run_id: str, pipeline: str, hook: str, hook_id: str, attempt: int,
               outcome: str, status: str, next_at: datetime | None, budget: int, error: str,
               error_message: str, traceback: str | None) -> None:
    """One WARNING for an ``on_halt`` hook attempt that did not succeed, after its commit.

    ``on_halt hook failed: builtins.ValueError: boom; retry 1 of 3 at … (run_id=… pipeline=…
    hook=… hook_id=… attempt=0)``
    """
    crash = outcome == "process_crashed"
    word = "re-run" if crash else "retry"
    if status == "pending" and next_at is not None:
        then = f"{word} {attempt + 1} of {budget} at {_at(next_at)}"
    elif outcome == "invalid":
        then = "not retried (it would end the same way): the hook failed"
    else:
        then = f"no {word} left ({'max_crash' if crash else 'max_retry'} {budget}): the hook failed"
    context = {"run_id": run_id, "pipeline": pipeline, "hook": hook, "hook_id": hook_id, "attempt": attempt,
               "outcome": outcome, "error": error, "next": word if status == "pending" else "failed",
               "next_at": next_at.isoformat() if next_at is not None else None}
    message = (f"on_halt hook {_VERBS.get(outcome, outcome)}: {error}: {error_message}; {then} "
               f"({_fields(context)})")
    emit(logger, logging.WARNING, message, context, traceback)


def advancement_failed(logger: logging.Logger, *, run_id: str, branch_id: str, node: str, step_id: str, error: str,
                       error_message: str, then: str, next_: str, traceback: str | None) -> None:
    """One WARNING for an error while advancing a branch that did not halt it (the
    halt is :func:`branch_halted`), with what became of it (``then``).

    ``advancing past Charge#0 failed: KeyError: 'x'; the branch is released for retry 1 of 10 (run_id=… …)``
    """
    context = {"run_id": run_id, "branch_id": branch_id, "node": node, "step_id": step_id, "error": error,
               "next": next_}
    emit(logger, logging.WARNING, f"advancing past {node} failed: {error}: {error_message}; {then} "
         f"({_fields(context)})", context, traceback)
