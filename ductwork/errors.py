"""Every exception ductwork raises, in one place.

The tree::

    DuctworkError
    ├── DefinitionError (ValueError)      a pipeline definition is wrong; raised at class creation
    │   ├── StartError                    start() missing or repeated
    │   ├── CombineError                  combine() without a matching divide()
    │   ├── CollapseError                 collapse() without a matching expand()
    │   ├── ConvergeError                 converge() without a matching divert()
    │   ├── DivertError                   divert() without an "otherwise" target
    │   ├── AsyncStepError                a Step subclass's ``execute`` is an async generator
    │   └── MainModuleError               a class in ``__main__`` triggered where other processes run steps
    ├── DurationError (ValueError)        a duration value cannot be parsed (no context)
    ├── ConfigError (ValueError)          ductwork.yml or a config value is wrong; names the path
    │   ├── InvalidPeriodError            a rate ``per`` is zero, sub-second, months/years or garbage
    │   ├── DuplicatePeriodError          two rate entries of one key share a period
    │   ├── EmptyLimitError               a limit entry declares neither concurrency nor rate
    │   ├── MissingLimitError             a ``limit_by`` key has no entry (names key and pipelines)
    │   │   └── MissingFamilyError        a ``limit_by`` key family has no family entry (per_partition)
    │   ├── FamilyKeyError                a static ``limit_by`` key names a key family or one of its partitions
    │   ├── DuplicateKeyError             a YAML mapping repeats a key (names it, its path and lines)
    │   └── DatabaseURLError              a database URL is malformed or names no database
    ├── MissingTablesError                the schema lacks tables (names them and the database)
    │   └── MissingDatabaseError          a SQLite file does not exist (never created by a check)
    ├── SchemaVersionError                the schema is not at this ductwork's migration head
    ├── MissingExtraError (ImportError)  a module of an optional extra does not import (names the extra)
    ├── UnsupportedDialectError (NotImplementedError)
    ├── StaleClaim                        a fence found another claim token (internal, caught)
    ├── CommitFailed                      a guarded execution commit matched nothing (reaped owner)
    ├── TransitionError                   an edge cannot be applied to a run at advance time
    ├── StepReturnError (TypeError)       a step returned a value its edge cannot carry
    ├── UnknownStepClassError (LookupError) a stored class name is not of the configured pipelines
    ├── OverwriteError                    Context.set on a key already set (``Context.OverwriteError``)
    ├── RunStateError                     an operation not allowed in the run's state (resume)
    │   └── UnknownRunError (LookupError) no run has this id (never triggered, or pruned)
    ├── RunFilterError (ValueError)       a run-listing or prune option is malformed (names it)
    │   └── ReviveError                   revive of a run that is not halted, or unknown
    ├── InputError (TypeError)            trigger/resume/context input is not JSON-serialisable
    │   ├── TriggerKeyError (ValueError)  a trigger key is not a non-empty string of at most 255 characters
    │   ├── TriggerKeyWindowError (ValueError)  a key window is not a positive duration, or has no key
    │   └── PartitionValueError (TransitionError)  a step's ``limit_by`` partition value cannot be rendered
    ├── TriggerConnectionError (TypeError) ``trigger(connection=…)`` got no usable Connection
    ├── TriggeredConcurrently             a trigger key was taken by a transaction this one cannot see
    ├── PayloadError (InputError, StepReturnError)  a value breaks the one payload rule (payloads.dump)
    │   ├── NotJSONError                  not JSON-serialisable (NaN, ∞, a set, an object)
    │   └── PayloadTooLargeError (ValueError)  its JSON text is longer than MAX_PAYLOAD_BYTES
    ├── DrainTimeout (TimeoutError)       testing.drain gave up
    └── FaultInjection (RuntimeError)     raised by an armed ``raise`` fault checkpoint

Constructors take the subject and build the message, so every message names the
offending key, value, class or transition.  Driver errors are translated at one
boundary (``ductwork.db.dialects.translate_db_errors``); anything unknown propagates
unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable


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


class AsyncStepError(DefinitionError):
    """A Step subclass's ``execute`` is an async generator; raised when the class is created.

    ``AsyncStepError("Stream", "execute", reason)`` reads ``Stream.execute: an async
    generator is not a step's work …``: it yields values, and a step returns one.
    (``async def execute`` with a ``return`` is an async step, and is run.)
    """


class MainModuleError(DefinitionError):
    """A pipeline or step class lives in ``__main__``, which no other process can import.

    Raised by ``trigger`` when worker processes of another OS process are alive on the
    database, and when the class is created for a step with ``timeout=`` (which always
    runs in a child process). The fix is to move the class into an importable module.
    """


# --------------------------------------------------------------------------- configuration


class DurationError(DuctworkError, ValueError):
    """A duration cannot be parsed; callers wrap it with the path it came from."""

    def __init__(self, value: object, reason: str):
        self.value = value
        self.reason = reason
        super().__init__(f"{value!r}: {reason}")


class ConfigError(DuctworkError, ValueError):
    """A configuration value is wrong.

    ``ConfigError("job_worker.limits.api.rate[1].per", "1mo", "months are not supported")``
    reads ``job_worker.limits.api.rate[1].per='1mo': months are not supported``.
    """

    def __init__(self, path: str, value: object, reason: str):
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


class MissingFamilyError(MissingLimitError):
    """A key family that loaded pipelines partition by (``limit_by=(family, field)``) has no
    family entry (one with ``per_partition``) under ``job_worker.limits``."""

    def __init__(self, family: str, pipelines: Iterable[str], static: bool = False):
        super().__init__(family, pipelines)
        why = "is a static key's; a family's entry has per_partition" if static else "is missing"
        self.args = (f"job_worker.limits.{family}: the entry of key family {family!r} {why}, "
                     f"referenced by limit_by=({family!r}, …) in {', '.join(self.pipelines)}",)


class FamilyKeyError(ConfigError):
    """A static ``limit_by`` key names a key family the configuration declares, or is one of
    its partitions (``family[…]``): a key is either static or a partition, never both."""

    def __init__(self, key: str, family: str, pipelines: Iterable[str]):
        what = "names key family" if key == family else "is a partition of key family"
        super().__init__(f"job_worker.limits.{family}", key, f"limit_by={key!r} in {', '.join(sorted(pipelines))} "
                         f"{what} {family!r}; partition by limit_by=({family!r}, field) or use another key")


class DuplicateKeyError(ConfigError):
    """A YAML mapping lists one key twice; YAML would silently keep only the last.

    ``DuplicateKeyError("ductwork.yml", "default.job_worker", "job_worker", 3, 9)`` reads
    ``ductwork.yml: default.job_worker: key 'job_worker' appears twice, at lines 3 and 9
    (YAML keeps only the last; merge the two)``.
    """

    def __init__(self, source: str, path: str, key: object, first_line: int, second_line: int):
        self.source, self.first_line, self.second_line = source, first_line, second_line
        DuctworkError.__init__(
            self,
            f"{source}: {path}: key {key!r} appears twice, at lines {first_line} and {second_line} "
            "(YAML keeps only the last; merge the two)",
        )
        self.path = path
        self.value = key
        self.reason = "duplicate key"


class DatabaseURLError(ConfigError):
    """A database URL is malformed, names a backend ductwork does not support or no
    database. (A driver that is not installed is a :class:`MissingExtraError`.)"""


class MissingTablesError(DuctworkError):
    """Tables that configured features need are absent; run ``ductwork db upgrade``.

    ``database`` (the URL, password masked) is named when known:
    ``missing tables in postgresql://app@db/shop: ductwork_limit_keys (run `ductwork db
    upgrade` to create them)``; when every table is missing the message says so
    instead of listing them.
    """

    def __init__(self, tables: Iterable[str], database: str | None = None, *, every: bool = False):
        self.tables = sorted(tables)
        self.database = database
        where = f" in {database}" if database else ""
        text = f"no ductwork tables{where}" if every else f"missing tables{where}: " + ", ".join(self.tables)
        super().__init__(text + " (run `ductwork db upgrade` to create them)")


class MissingDatabaseError(MissingTablesError):
    """The database does not exist (a SQLite file that is absent): every table is missing.

    Raised instead of creating an empty file: only ``ductwork db upgrade`` (and
    ``ductwork demo``) create a SQLite database.
    """

    def __init__(self, tables: Iterable[str], database: str, path: str):
        self.path = path
        DuctworkError.__init__(
            self, f"no database at {database}: no file {path} (run `ductwork db upgrade` to create it)"
        )
        self.tables = sorted(tables)
        self.database = database


class SchemaVersionError(DuctworkError):
    """The database's ductwork schema is at another revision than this ductwork needs."""

    def __init__(self, current: str | None, head: str):
        self.current, self.head = current, head
        super().__init__(f"schema at revision {current!r}, this ductwork needs {head!r} "
                         "(run `ductwork db upgrade`)")


class MissingExtraError(DuctworkError, ImportError):
    """A module that one of ductwork's optional extras installs does not import; raised
    before anything is written (``ductwork.db.extras.require``).

    ``MissingExtraError("greenlet", "async", "Pipeline.atrigger", "is not installed")``
    reads ``Pipeline.atrigger needs greenlet, which is not installed: pip install
    'ductwork[async]' (nothing was written)``.
    """

    def __init__(self, module: str, extra: str, user: str, reason: str):
        self.module, self.extra, self.user = module, extra, user
        super().__init__(f"{user} needs {module}, which {reason}: pip install 'ductwork[{extra}]' "
                         "(nothing was written)", name=module)


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

    def __init__(self, branch_id: str, expected: str | None):
        self.branch_id = branch_id
        self.expected = expected
        super().__init__(f"branch {branch_id}: claim token {expected!r} no longer held")


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

    def __init__(self, step: str, value: object, reason: str):
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


class UnknownRunError(RunStateError, LookupError):
    """No run has this id: it was never triggered, or ``ductwork prune`` deleted it."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} (never triggered, or pruned)")


class RunFilterError(DuctworkError, ValueError):
    """An option of ``ductwork runs``/``show``/``prune`` (or its Python call) is malformed."""

    def __init__(self, option: str, value: object, reason: str):
        self.option = option
        self.value = value
        super().__init__(f"{option}={value!r}: {reason}")


class ReviveError(RunStateError):
    """``Run.revive`` of a run that is not halted (running, completed, dampened) or does not
    exist; names the run and its status.

    ``ReviveError("0193…", "completed")`` reads ``cannot revive run 0193…: it is completed;
    only a halted run can be revived``.
    """

    def __init__(self, run_id: str, status: str | None):
        self.run_id = run_id
        self.status = status
        why = "it does not exist" if status is None else f"it is {status}"
        super().__init__(f"cannot revive run {run_id}: {why}; only a halted run can be revived")


class RevivedConcurrently(ReviveError):
    """Internal: another transaction revived the run first (``uq_run_revived_from``);
    ``Run.revive`` catches it and returns the run that revived it."""

    def __init__(self, run_id: str):
        super().__init__(run_id, "halted")
        self.args = (f"run {run_id} was revived concurrently by another transaction",)


class InputError(DuctworkError, TypeError):
    """A value given to trigger, resume or Context cannot be stored (not JSON, bad key)."""


class TriggerKeyError(InputError, ValueError):
    """A trigger key that is not a non-empty string of at most ``MAX_TRIGGER_KEY`` characters;
    names the pipeline and the key. Raised before anything is written.

    ``TriggerKeyError("Orders", 42, "not a string")`` reads
    ``Orders.trigger key=42: not a string; a trigger key is a non-empty string of at most 255
    characters``.
    """

    #: the longest key (characters): the unique index holds it with the pipeline's name
    MAX_TRIGGER_KEY = 255

    def __init__(self, pipeline: str, key: object, reason: str):
        self.pipeline = pipeline
        self.key = key
        shown = repr(key) if len(repr(key)) <= 60 else repr(key)[:57] + "..."
        DuctworkError.__init__(
            self, f"{pipeline}.trigger key={shown}: {reason}; a trigger key is a non-empty string of at "
                  f"most {self.MAX_TRIGGER_KEY} characters")


class TriggerKeyWindowError(InputError, ValueError):
    """A ``key_window`` that is not a positive duration (seconds, a ``timedelta`` or a
    duration string such as ``"1d"``), or one given without a key; names the pipeline and
    the window. Raised before anything is written.

    ``TriggerKeyWindowError("Orders", "-1d", "not a duration")`` reads
    ``Orders.trigger key_window='-1d': not a duration; a key window is a positive duration
    (seconds, a timedelta or a string like '1d') given with a key``.
    """

    def __init__(self, pipeline: str, window: object, reason: str):
        self.pipeline = pipeline
        self.window = window
        shown = repr(window) if len(repr(window)) <= 60 else repr(window)[:57] + "..."
        DuctworkError.__init__(
            self, f"{pipeline}.trigger key_window={shown}: {reason}; a key window is a positive duration "
                  "(seconds, a timedelta or a string like '1d') given with a key")


class PartitionValueError(InputError, TransitionError):
    """A step's partition cannot be rendered into its limit key (docs/semantics.md §5.1):
    ``limit_by=(family, field)`` finds no such field in the step's input, or a value that is
    not a str or an int, a str with a lone surrogate, or one whose key is longer than 255
    characters. Names the pipeline, the node, the family, the field and the value (repr,
    truncated). ``trigger`` raises it before anything is written; when an advancer creates
    the step, the branch halts ``transition_invalid`` with it (the value is the same on every
    attempt).

    ``PartitionValueError("shop:Orders", "Push#1", "vendor_api", "account_id", 4.5, "not a str
    or an int")`` reads ``shop:Orders node Push#1: limit_by=('vendor_api', 'account_id'): not
    a str or an int, got 4.5``.
    """

    def __init__(self, pipeline: str, node: str, family: str, field: str, value: object, reason: str):
        self.pipeline, self.node, self.family, self.field, self.value = pipeline, node, family, field, value
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        DuctworkError.__init__(self, f"{pipeline} node {node}: limit_by=({family!r}, {field!r}): {reason}, got {shown}")


class TriggerConnectionError(DuctworkError, TypeError):
    """``Pipeline.trigger(..., connection=…)`` got something it cannot write through: not a
    SQLAlchemy ``Connection`` (a Session, an ``AsyncConnection``, a DBAPI connection), a
    connection with no transaction begun, or one on another kind of database than the app's.
    Names the pipeline and what is wrong. Raised before anything is written."""

    def __init__(self, pipeline: str, reason: str):
        self.pipeline = pipeline
        super().__init__(f"{pipeline}.trigger(connection=…): {reason}")


class TriggeredConcurrently(DuctworkError):
    """Another transaction committed a run with this pipeline and trigger key after the
    caller's transaction took its snapshot (``uq_run_trigger_key`` refused the insert, and
    the run is not visible to it: REPEATABLE READ or SERIALIZABLE). Nothing of the trigger
    was written and the caller's transaction is still usable; retry it (a new transaction
    finds the run). A trigger in ductwork's own transaction (READ COMMITTED) never raises it."""

    def __init__(self, pipeline: str, key: str):
        self.pipeline = pipeline
        self.key = key
        super().__init__(f"{pipeline}.trigger key={key!r}: another transaction triggered a run with this key, "
                         "committed after this transaction's snapshot; retry the transaction to get that run")


class PayloadError(InputError, StepReturnError):
    """A value breaks the one rule for stored values (``ductwork.pipelines.payloads.dump``), naming it.

    The same class and message shape wherever the value enters: trigger and resume
    arguments and ``Context.set`` raise it to the caller (an :class:`InputError`); a
    step's return value fails the execution once and halts the branch (a
    :class:`StepReturnError`); the list a collapse or combine assembles halts the
    branch that would fire it. ``what`` names the value:
    ``Orders.trigger arguments: not JSON-serialisable (…)``.
    """

    def __init__(self, what: str, reason: str):
        self.what = what
        self.reason = reason
        DuctworkError.__init__(self, f"{what}: {reason}")


class NotJSONError(PayloadError):
    """The value is not JSON-serialisable by ``json.dumps(allow_nan=False)``: NaN or ∞, a
    set, bytes, an object (tuples become lists and keys strings, as JSON gives them back)."""

    def __init__(self, what: str, value: object, reason: str):
        self.value_type = type(value).__name__
        super().__init__(what, f"not JSON-serialisable ({reason})")


class PayloadTooLargeError(PayloadError, ValueError):
    """The value's JSON text is longer than ``ductwork.pipelines.payloads.MAX_PAYLOAD_BYTES``.

    ``Orders.trigger arguments: 8,000,012 bytes of JSON, more than the maximum of
    8,000,000 (MAX_PAYLOAD_BYTES)``; ``size`` and ``maximum`` carry the numbers.
    """

    def __init__(self, what: str, size: int, maximum: int):
        self.size = size
        self.maximum = maximum
        super().__init__(what, f"{size:,} bytes of JSON, more than the maximum of {maximum:,} (MAX_PAYLOAD_BYTES)")


class DrainTimeout(DuctworkError, TimeoutError):
    """``ductwork.testing.drain`` reached its deadline with runs still active."""


class FaultInjection(DuctworkError, RuntimeError):
    """Raised by a fault checkpoint armed with the ``raise`` action."""

    def __init__(self, checkpoint: str):
        self.checkpoint = checkpoint
        super().__init__(f"FaultInjection: {checkpoint}")
