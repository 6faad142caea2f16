"""Every exception ductwork raises, in one place.

The tree::

    DuctworkError
    ├── DefinitionError (ValueError)      a pipeline definition is wrong; raised at class creation
    │   ├── StartError                    start() missing or repeated
    │   ├── CombineError                  combine() without a matching divide()
    │   ├── CollapseError                 collapse() without a matching expand()
    │   ├── ConvergeError                 converge() without a matching divert()
    │   └── DivertError                   divert() without an "otherwise" target
    ├── DurationError (ValueError)        a duration value cannot be parsed (no context)
    ├── ConfigError (ValueError)          ductwork.yml or a config value is wrong; names the path
    │   ├── InvalidPeriodError            a rate ``per`` is zero, sub-second, months/years or garbage
    │   ├── DuplicatePeriodError          two rate entries of one key share a period
    │   ├── EmptyLimitError               a limit entry declares neither concurrency nor rate
    │   ├── MissingLimitError             a ``limit_by`` key has no entry (names key and pipelines)
    │   └── DatabaseURLError              a database URL is malformed or names no known driver
    ├── MissingTablesError                the schema lacks tables (names them)
    ├── SchemaVersionError                the schema is not at this ductwork's migration head
    ├── UnsupportedDialectError (NotImplementedError)
    ├── StaleClaim                        a fence found another claim token (internal, caught)
    ├── CommitFailed                      a guarded execution commit matched nothing (reaped owner)
    ├── TransitionError                   an edge cannot be applied to a run at advance time
    ├── StepReturnError (TypeError)       a step returned a value its edge cannot carry
    ├── UnknownStepClassError (LookupError) a stored class name is not of the configured pipelines
    ├── OverwriteError                    Context.set on a key already set (``Context.OverwriteError``)
    ├── RunStateError                     an operation not allowed in the run's state (resume)
    ├── InputError (TypeError)            trigger/resume/context input is not JSON-serialisable
    ├── DrainTimeout (TimeoutError)       testing.drain gave up
    └── FaultInjection (RuntimeError)     raised by an armed ``raise`` fault checkpoint

Constructors take the subject and build the message, so every message names the
offending key, value, class or transition.  Driver errors are translated at one
boundary (``ductwork.dialects.translate_db_errors``); anything unknown propagates
unchanged.
"""

from __future__ import annotations

from typing import Any, Iterable


class DuctworkError(Exception):
    """Base of every error ductwork raises on purpose."""


# --------------------------------------------------------------------------- definitions


class DefinitionError(DuctworkError, ValueError):
    """A pipeline definition is invalid.

    Raised when the Pipeline subclass is created, naming the class and the transition:
    ``DefinitionError("Orders", "expand", "limit_by must be a non-blank str, got ''")``
    reads ``Orders.expand: limit_by must be a non-blank str, got ''``.
    """

    def __init__(self, pipeline: str, transition: str, reason: str):
        self.pipeline = pipeline
        self.transition = transition
        self.reason = reason
        super().__init__(f"{pipeline}.{transition}: {reason}")


class StartError(DefinitionError):
    """``start`` was called twice, or something came before it."""


class CombineError(DefinitionError):
    """``combine`` does not close a ``divide``."""


class CollapseError(DefinitionError):
    """``collapse`` does not close an ``expand``."""


class ConvergeError(DefinitionError):
    """``converge`` does not close a ``divert``."""


class DivertError(DefinitionError):
    """``divert`` lacks an ``otherwise`` target or has a bad key."""


# --------------------------------------------------------------------------- configuration


class DurationError(DuctworkError, ValueError):
    """A duration cannot be parsed; callers wrap it with the path it came from."""

    def __init__(self, value: Any, reason: str):
        self.value = value
        self.reason = reason
        super().__init__(f"{value!r}: {reason}")


class ConfigError(DuctworkError, ValueError):
    """A configuration value is wrong.

    ``ConfigError("job_worker.limits.api.rate[1].per", "1mo", "months are not supported")``
    reads ``job_worker.limits.api.rate[1].per='1mo': months are not supported``.
    """

    def __init__(self, path: str, value: Any, reason: str):
        self.path = path
        self.value = value
        self.reason = reason
        super().__init__(f"{path}={value!r}: {reason}")


class InvalidPeriodError(ConfigError):
    """A rate entry's ``per`` is not a whole, positive number of seconds."""


class DuplicatePeriodError(ConfigError):
    """Two rate entries of one key share a period."""


class EmptyLimitError(ConfigError):
    """A limit entry declares neither ``concurrency`` nor ``rate``; never silently unlimited."""


class MissingLimitError(ConfigError):
    """A ``limit_by`` key used by loaded pipelines has no entry under ``job_worker.limits``."""

    def __init__(self, key: str, pipelines: Iterable[str]):
        self.key = key
        self.pipelines = sorted(pipelines)
        DuctworkError.__init__(
            self,
            f"job_worker.limits.{key}: no entry for limit key {key!r}, "
            f"referenced by limit_by in {', '.join(self.pipelines)}",
        )
        self.path = f"job_worker.limits.{key}"
        self.value = None
        self.reason = "missing"


class DatabaseURLError(ConfigError):
    """A database URL is malformed or names a backend ductwork does not support."""


class MissingTablesError(DuctworkError):
    """Tables that configured features need are absent; run ``ductwork db upgrade``."""

    def __init__(self, tables: Iterable[str]):
        self.tables = sorted(tables)
        super().__init__(
            "missing tables: "
            + ", ".join(self.tables)
            + " (run `ductwork db upgrade` to create them)"
        )


class SchemaVersionError(DuctworkError):
    """The database's ductwork schema is at another revision than this ductwork needs."""

    def __init__(self, current: str | None, head: str):
        self.current, self.head = current, head
        super().__init__(f"schema at revision {current!r}, this ductwork needs {head!r} "
                         "(run `ductwork db upgrade`)")


class UnsupportedDialectError(DuctworkError, NotImplementedError):
    """The database dialect is not one ductwork supports; never a silent fallback."""

    def __init__(self, dialect: str, what: str):
        self.dialect = dialect
        super().__init__(
            f"{what} is not implemented for dialect {dialect!r} "
            "(supported: postgresql, mysql/mariadb, sqlite)"
        )


# --------------------------------------------------------------------------- run time


class StaleClaim(DuctworkError):
    """A fence found the branch's claim token changed; nothing was committed."""

    def __init__(self, branch_id: str, expected: str | None, found: str | None):
        self.branch_id = branch_id
        self.expected = expected
        self.found = found
        super().__init__(
            f"branch {branch_id}: claim token {expected!r} no longer held (found {found!r})"
        )


class CommitFailed(DuctworkError):
    """A guarded execution commit matched no row: the owner was reaped or it already ended."""

    def __init__(self, execution_id: str, process_id: str | None):
        self.execution_id = execution_id
        self.process_id = process_id
        super().__init__(
            f"execution {execution_id}: not open and owned by process {process_id} "
            "(reaped or already completed); its outcome was not recorded"
        )


class TransitionError(DuctworkError):
    """An edge of the run's definition cannot be applied (unknown kind, unresolvable barrier)."""


class StepReturnError(DuctworkError, TypeError):
    """A step returned a value that its outgoing edge cannot carry."""

    def __init__(self, step: str, value: Any, reason: str):
        self.step = step
        self.value_type = type(value).__name__
        super().__init__(f"{step} returned {type(value).__name__}: {reason}")


class UnknownStepClassError(DuctworkError, LookupError):
    """A class name stored in a run (a step's ``klass``, the run's pipeline) is not a class
    of the pipelines this process runs, so it is not resolved, and nothing is imported.

    ``UnknownStepClassError("step", "evil:Payload")`` reads ``step class 'evil:Payload'
    is not in the configured pipelines (only their classes run; nothing was imported)``.
    A worker halts the run's branch ``unknown_step_class`` with this error.
    """

    def __init__(self, what: str, ref: str, reason: str = "is not in the configured pipelines"):
        self.what = what
        self.ref = ref
        super().__init__(f"{what} class {ref!r} {reason} (only their classes run; nothing was imported)")


class OverwriteError(DuctworkError):
    """``Context.set`` found the key already set for this run (use ``overwrite=True``)."""

    def __init__(self, run_id: str, key: str):
        self.run_id = run_id
        self.key = key
        super().__init__(f"context key {key!r} is already set for run {run_id}")


class RunStateError(DuctworkError):
    """The run is not in a state that allows the operation."""


class InputError(DuctworkError, TypeError):
    """A value given to trigger, resume or Context cannot be stored (not JSON, bad key)."""


class DrainTimeout(DuctworkError, TimeoutError):
    """``ductwork.testing.drain`` reached its deadline with runs still active."""


class FaultInjection(DuctworkError, RuntimeError):
    """Raised by a fault checkpoint armed with the ``raise`` action."""

    def __init__(self, checkpoint: str):
        self.checkpoint = checkpoint
        super().__init__(f"FaultInjection: {checkpoint}")
