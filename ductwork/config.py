"""One environment of ``ductwork.yml``, validated: :class:`Config` and its sections.

    >>> Config.from_section({"job_worker": {"max_retry": 0}}).job_worker.max_retry
    0

Reading the file, its environments and its YAML is :mod:`ductwork.config_file`'s.

Guarantees:

- every value is checked at load, and every failure is a :class:`ConfigError` (or a
  subclass) whose ``path`` names the offending key (``job_worker.count``,
  ``job_worker.limits.vendor_api.rate[1].per``); no other exception escapes for any
  input ``yaml.safe_load`` can produce;
- unknown keys fail, listing the valid ones, so a typo fails the boot;
- ``0`` is a value, not "unset" (``max_retry: 0`` means no retries); an omitted key
  takes its default; an explicit ``null`` for a value is an error (a ``null``
  section, like ``job_worker:`` with everything commented out, is empty).

Not done here: importing pipelines, checking that configured pipeline or step names
exist, or checking ``limit_by`` references (``ductwork.limit_entries.validate_references``
does that once pipelines are loaded).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ductwork.durations import parse_interval_us
from ductwork.errors import ConfigError
from ductwork.limit_entries import (
    FamilyEntry,
    LimitEntry,
    check_int,
    check_mapping,
    child_path,
    family_of_key,
    parse_limit_config,
)

log = logging.getLogger("ductwork.config")

#: the values ``logging.level`` and ``logging.format`` take (``ductwork.logs`` uses them;
#: defined here, below it, because ``logs.start_lines`` reads a Config)
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")

DEFAULT_ENV = "default"
Role = Literal["all", "advancer", "worker"]
ROLES: tuple[Role, ...] = ("all", "advancer", "worker")
#: Upper bound of counts and retry/crash budgets (fits a 32-bit INTEGER column).
MAX_COUNT = 2**31 - 1
#: Upper bound of every time value: 100 years, in µs (stays a valid timestamp and wait).
MAX_INTERVAL_US = 3_155_760_000 * 1_000_000

#: the keys of an environment's section
SECTION_KEYS = (
    "pipelines", "imports", "role", "database", "job_worker", "pipeline_advancer", "supervisor", "logging",
)


# --------------------------------------------------------------------------- value checks


def _seconds(path: str, value: object) -> float:
    """A positive time value (int/float seconds or a duration string) as float seconds."""
    try:
        micros = parse_interval_us(value)
    except (ValueError, OverflowError) as exc:  # DurationError; huge digit strings; 1e305
        raise ConfigError(path, value, getattr(exc, "reason", str(exc))) from exc
    if micros > MAX_INTERVAL_US:
        raise ConfigError(path, value, "must be at most 100 years")
    return micros / 1_000_000


def _count(path: str, value: object, maximum: int) -> int:
    return check_int(path, value, minimum=1, maximum=maximum)


def _budget(path: str, value: object) -> int:
    return check_int(path, value, minimum=0, maximum=MAX_COUNT)


def _dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _qualified(name: object) -> bool:
    """``module:Qual.Name`` with identifier parts, or a bare ``Qual.Name``."""
    if not isinstance(name, str):
        return False
    module, _, qualname = name.rpartition(":")
    return _dotted(qualname) and ((module == "" and ":" not in name) or _dotted(module))


def _names(name: str) -> tuple[str, ...]:
    """What ``module:Qual.Name`` answers to, most specific first: itself, ``Qual.Name``, ``Name``.
    """
    qualname = name.rpartition(":")[2]
    return tuple(dict.fromkeys((name, qualname, qualname.rpartition(".")[2])))


# --------------------------------------------------------------------------- max_retry / max_crash


def _budget_key(path: str, name: object, what: str) -> None:
    if name != "default" and not _qualified(name):
        raise ConfigError(
            path, name, f"expected 'default' or a {what} name ('module:Class' or 'Class')"
        )


def _overrides(path: str, value: object, default: int) -> tuple[int, dict[str, dict[str, int]]]:
    """Parse ``n`` or ``{default: n, "<Pipeline>": n | {default: n, "<Step>": n}}``.

    Returns the fleet-wide value and ``{pipeline: {"default"|step: n}}`` (a bare
    ``"<Pipeline>": n`` becomes ``{"default": n}``).
    """
    if not isinstance(value, Mapping):
        return _budget(path, value), {}
    overrides: dict[str, dict[str, int]] = {}
    for pipeline, inner in value.items():
        pipeline_path = child_path(path, pipeline)
        _budget_key(pipeline_path, pipeline, "pipeline")
        if pipeline == "default":
            default = _budget(pipeline_path, inner)
        elif not isinstance(inner, Mapping):
            overrides[pipeline] = {"default": _budget(pipeline_path, inner)}
        else:
            overrides[pipeline] = {}
            for step, n in inner.items():
                _budget_key(child_path(pipeline_path, step), step, "step")
                overrides[pipeline][step] = _budget(child_path(pipeline_path, step), n)
    return default, overrides


def _lookup(
    default: int, overrides: Mapping[str, Mapping[str, int]], pipeline: str, step: str
) -> int:
    for name in _names(pipeline):
        if name in overrides:
            steps = overrides[name]
            for step_name in _names(step):
                if step_name in steps:
                    return steps[step_name]
            if "default" in steps:
                return steps["default"]
            break
    return default


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class JobWorkerConfig:
    """``job_worker``: the threads that claim and execute jobs. Time values are float seconds."""

    #: threads per worker process
    count: int = 5
    #: worker processes per supervisor
    processes: int = 1
    #: retries of a failing step before its branch halts; 0 = never retry [INV-EXE-4]
    max_retry: int = 3
    #: crashes of a step before its branch halts; 0 = halt on the first crash [INV-EXE-4]
    max_crash: int = 10
    #: seconds between polls of an idle worker thread
    polling_timeout: float = 1.0
    #: seconds a stopping worker waits for running steps
    shutdown_timeout: float = 20.0
    #: seconds before a failed execution is retried
    retry_delay: float = 10.0
    #: seconds per crash that a crashed execution waits before it re-runs, once past
    #: the first third of ``max_crash`` (which re-run at once); 10 s as in the Ruby engine
    crash_backoff: float = 10.0
    #: a thread whose step succeeded claims its lane's next execution in the same
    #: transaction, when a poll would claim it (claims.hand_off); false: always poll
    hand_off: bool = True
    #: unkeyed executions a worker thread may claim at once, and record in one commit,
    #: when its recent steps are fast (fleet.worker.Worker); 1: one at a time
    batch_size: int = 64
    #: seconds of recent-pace work a batch may hold: a claimed execution waits behind
    #: its siblings, and a success stays unrecorded, for about this long
    batch_window: float = 0.05
    #: per-pipeline/per-step ``max_retry``: ``{pipeline: {"default" | step: n}}``
    max_retry_overrides: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per-pipeline/per-step ``max_crash``, same shape
    max_crash_overrides: dict[str, dict[str, int]] = field(default_factory=dict)

    def max_retry_for(self, pipeline: str, step: str) -> int:
        """The retry budget of ``step`` in ``pipeline`` (both ``module:qualname``).

        The step's own value under the pipeline, else the pipeline's ``default``, else
        the fleet-wide one. Names match in full or by bare class name, so
        ``max_retry: {default: 3, SyncOrders: {PushOrder: 0}}`` gives
        ``max_retry_for("app.p:SyncOrders", "app.s:PushOrder") == 0`` and 3 elsewhere.
        """
        return _lookup(self.max_retry, self.max_retry_overrides, pipeline, step)

    def max_crash_for(self, pipeline: str, step: str) -> int:
        """The crash budget of ``step`` in ``pipeline``; looked up like :meth:`max_retry_for`."""
        return _lookup(self.max_crash, self.max_crash_overrides, pipeline, step)


@dataclass(frozen=True)
class PipelineAdvancerConfig:
    """``pipeline_advancer``: the threads that advance branches. Time values are float seconds."""

    #: advancer threads per process
    count: int = 3
    #: non-crash advancement errors tolerated before the branch halts; 0 honoured
    max_retry: int = 10
    #: advancement crashes tolerated before the branch halts; 0 honoured
    max_crash: int = 10
    #: seconds between polls of an idle advancer thread
    polling_timeout: float = 1.0
    #: seconds a stopping advancer waits for the advancement in hand
    shutdown_timeout: float = 20.0
    #: children created per transaction by a batched expand [INV-ADV-4]
    expand_batch: int = 1000
    #: branches an advancer thread claims in one transaction; their simple transitions
    #: (leaf, chain, converge, divert, dampen, halts) are advanced in one fenced transaction
    advance_batch: int = 50
    #: advance chain, converge, divert and dampen edges and leaves inside the worker's success
    #: transaction (no advancer hop; branches.advance_on_successes); false leaves every edge to
    #: the advancers
    inline_linear: bool = True


@dataclass(frozen=True)
class SupervisorConfig:
    """``supervisor``: the process that runs workers, advancers and the reaper. Float seconds."""

    #: seconds between supervisor ticks (heartbeat check, child check, reap)
    polling_timeout: float = 1.0
    #: seconds without a heartbeat after which a process is reaped as dead
    reaper_timeout: float = 300.0
    #: seconds a stopping supervisor waits for its children
    shutdown_timeout: float = 30.0
    #: seconds between a process's heartbeats; omitted with ``reaper_timeout`` set, it is
    #: ``min(5, reaper_timeout / 10)`` (:func:`default_heartbeat_interval`)
    heartbeat_interval: float = 5.0
    #: seconds a partition's limit key row must go without a claim or release before the
    #: supervisor's sweep forgets it (limits.executions.forget_idle_partitions); a policy, not a guard
    forget_idle_after: float = 3600.0
    #: limit key rows the sweep reads per supervisor tick, the next ones at the next tick
    forget_batch: int = 100


@dataclass(frozen=True)
class LoggingConfig:
    """``logging``: what the ``ductwork`` command logs (the library itself configures nothing)."""

    #: DEBUG, INFO, WARNING or ERROR; None: INFO for ``ductwork start``, WARNING for the
    #: other commands. ``--log-level`` (or ``-v``) overrides it
    level: str | None = None
    #: ``text`` (one line per record, a traceback under it) or ``json`` (one object per
    #: line); ``--log-format`` overrides it
    format: str = "text"


def _logging(value: object) -> LoggingConfig:
    body = check_mapping("logging", value, ("level", "format"))
    values = {}
    for key, valid in (("level", LEVELS), ("format", FORMATS)):
        if key in body:
            given = body[key]
            chosen = given.upper() if key == "level" and isinstance(given, str) else given
            if not isinstance(chosen, str) or chosen not in valid:
                raise ConfigError(f"logging.{key}", given, f"expected one of {', '.join(valid)}")
            values[key] = chosen
    return LoggingConfig(**values)


_JOB_WORKER_SCALARS = ("count", "processes", "polling_timeout", "shutdown_timeout", "retry_delay",
                       "crash_backoff", "hand_off", "batch_size", "batch_window")
#: keys an earlier version read and this one no longer does: accepted, with a warning that
#: says so, so that a config written for that version still boots
RETIRED = {"job_worker.release_first_after": "every success is now recorded in one transaction, "
                                             "its step advanced before the key's lock (issue 32)"}
_JOB_WORKER_KEYS = (*_JOB_WORKER_SCALARS, "max_retry", "max_crash", "limits")
_ADVANCER_KEYS = tuple(f.name for f in dataclasses.fields(PipelineAdvancerConfig))
_SUPERVISOR_KEYS = tuple(f.name for f in dataclasses.fields(SupervisorConfig))
#: a batch's ids travel in one IN list: keep it far below every driver's parameter limit
MAX_BATCH_SIZE = 1000
#: count fields (at least 1) and the most each may be
_COUNT_FIELDS = {"count": MAX_COUNT, "processes": MAX_COUNT, "expand_batch": MAX_COUNT, "advance_batch": MAX_BATCH_SIZE,
                 "batch_size": MAX_BATCH_SIZE, "forget_batch": MAX_COUNT}
_BUDGET_FIELDS = frozenset({"max_retry", "max_crash"})
_FLAG_FIELDS = frozenset({"inline_linear", "hand_off"})


#: a process's lease (reaper_timeout minus its margin, ductwork.fleet.supervisor.lease_margin) must
#: outlast this many heartbeat intervals, so one slow or failed heartbeat does not end it
LEASE_HEARTBEATS = 2
#: reaper_timeout / heartbeat_interval at least: the lease is reaper_timeout - 2 x interval
#: until reaper_timeout reaches 10 intervals, so 2 intervals of lease need 4
MIN_HEARTBEATS_PER_TIMEOUT = 2 + LEASE_HEARTBEATS
#: when only reaper_timeout is set, heartbeat_interval defaults to reaper_timeout / this
#: (capped at the built-in 5 s): a lease of 8 intervals
DERIVED_HEARTBEATS_PER_TIMEOUT = 10


def default_heartbeat_interval(reaper_timeout: float) -> float:
    """The ``heartbeat_interval`` used when the config sets only ``reaper_timeout``: the
    built-in 5 s, or ``reaper_timeout / 10`` when that is shorter (``reaper_timeout: 10``
    heartbeats every second), so a short timeout never fails validation for want of a
    heartbeat setting."""
    return min(SupervisorConfig.heartbeat_interval, reaper_timeout / DERIVED_HEARTBEATS_PER_TIMEOUT)


def _supervisor(values: dict[str, Any]) -> SupervisorConfig:
    """The supervisor section, checked for a lease that can hold: a process must manage a
    few heartbeats within ``reaper_timeout`` or it would kill itself for want of one.
    ``heartbeat_interval`` omitted with ``reaper_timeout`` set is derived from it."""
    if "reaper_timeout" in values and "heartbeat_interval" not in values:
        values = {**values, "heartbeat_interval": default_heartbeat_interval(values["reaper_timeout"])}
    cfg = SupervisorConfig(**values)
    if cfg.reaper_timeout < MIN_HEARTBEATS_PER_TIMEOUT * cfg.heartbeat_interval:
        raise ConfigError(
            "supervisor.reaper_timeout", cfg.reaper_timeout,
            f"must be at least {MIN_HEARTBEATS_PER_TIMEOUT} x supervisor.heartbeat_interval "
            f"({cfg.heartbeat_interval}), or a process's lease would not outlast "
            f"{LEASE_HEARTBEATS} heartbeats and it would exit for want of one")
    return cfg


def _scalars(path: str, body: Mapping[str, object], keys: tuple[str, ...]) -> dict[str, Any]:
    """Check the plain scalar keys of a section: counts, budgets and time values."""
    values: dict[str, Any] = {}
    for key in keys:
        if key not in body:
            continue
        key_path = f"{path}.{key}"
        if key in _FLAG_FIELDS:
            if not isinstance(body[key], bool):
                raise ConfigError(key_path, body[key], "expected true or false")
            values[key] = body[key]
        elif key in _COUNT_FIELDS:
            values[key] = _count(key_path, body[key], _COUNT_FIELDS[key])
        elif key in _BUDGET_FIELDS:
            values[key] = _budget(key_path, body[key])
        else:
            values[key] = _seconds(key_path, body[key])
    return values


def _unretired(section: str, body: object) -> object:
    """``body`` without the keys :data:`RETIRED` names, each logged as ignored: a config
    written for an earlier version boots, and the valid keys an error lists are current."""
    if not isinstance(body, Mapping):
        return body
    for key in body:
        if (retired := RETIRED.get(f"{section}.{key}")) is not None:
            log.warning("%s.%s is no longer read and is ignored: %s; remove it", section, key, retired)
    return {key: value for key, value in body.items() if f"{section}.{key}" not in RETIRED}


def _job_worker(body: Mapping[str, object]
                ) -> tuple[JobWorkerConfig, tuple[dict[str, LimitEntry], dict[str, FamilyEntry]]]:
    values = _scalars("job_worker", body, _JOB_WORKER_SCALARS)
    for budget in ("max_retry", "max_crash"):
        if budget in body:
            builtin = getattr(JobWorkerConfig, budget)
            values[budget], values[f"{budget}_overrides"] = _overrides(
                f"job_worker.{budget}", body[budget], builtin
            )
    return JobWorkerConfig(**values), parse_limit_config(body.get("limits"), "job_worker.limits")


def _string_list(path: str, value: object, valid: Callable[[str], bool], what: str) -> tuple[str, ...]:
    """A string or a list of strings, each ``valid``, as a tuple (None: empty)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ConfigError(path, value, f"expected a list of {what}")
    for index, item in enumerate(items):
        if not isinstance(item, str) or not valid(item):
            raise ConfigError(f"{path}[{index}]", item, f"expected {what}")
    return tuple(items)


def _pipelines(value: object) -> tuple[str, ...]:
    what = "'module:Class' (e.g. 'myapp.pipelines:SyncOrders'), or the single entry '*'"
    names = _string_list(
        "pipelines", value, lambda v: v == "*" or (_qualified(v) and ":" in v), what
    )
    if "*" in names and len(names) > 1:
        raise ConfigError("pipelines", value, "'*' must be the only entry")
    return names


def _role(body: Mapping[str, object], environ: Mapping[str, str]) -> Role:
    path, role = "role", body.get("role", "all")
    if environ.get("DUCTWORK_ROLE"):
        path, role = "DUCTWORK_ROLE", environ["DUCTWORK_ROLE"]
    for known in ROLES:  # (a value that is not a string equals none of them)
        if role == known:
            return known
    raise ConfigError(path, role, f"expected one of {', '.join(ROLES)}")


def _database_url(value: object) -> str | None:
    body = check_mapping("database", value, ("url",))
    url = body.get("url")
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise ConfigError("database.url", url, "expected a non-blank database URL string")
    return url


# --------------------------------------------------------------------------- Config


@dataclass(frozen=True)
class Config:
    """One environment of ``ductwork.yml``, validated; every field has its default.

    Frozen: build variants with :meth:`with_limits` or ``dataclasses.replace``.
    """

    #: the environment this section came from
    env: str = DEFAULT_ENV
    #: ``database.url``; None lets ``connect`` fall back (env var, then SQLite)
    database_url: str | None = None
    #: ``module:Class`` names, or the single entry ``"*"`` (every Pipeline in ``imports``)
    pipelines: tuple[str, ...] = ()
    #: modules to import (what ``"*"`` scans)
    imports: tuple[str, ...] = ()
    #: ``all``, ``advancer`` or ``worker``; ``DUCTWORK_ROLE`` overrides the file
    role: Role = "all"
    job_worker: JobWorkerConfig = field(default_factory=JobWorkerConfig)
    pipeline_advancer: PipelineAdvancerConfig = field(default_factory=PipelineAdvancerConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    #: ``job_worker.limits``, parsed: key → kept concurrency and rate entries [INV-LIM-7]
    limits: dict[str, LimitEntry] = field(default_factory=dict)
    #: ``job_worker.limits``' key families (an entry with ``per_partition``): family → entry
    families: dict[str, FamilyEntry] = field(default_factory=dict)
    #: where this came from (a file path, ``<mapping>`` or ``<defaults>``), for messages
    source: str = "<defaults>"

    def with_limits(self, limits: Mapping[str, LimitEntry],
                    families: Mapping[str, FamilyEntry] | None = None) -> Config:
        """A copy with ``limits`` (and ``families``, when given) in place of this config's
        (already parsed entries)."""
        return dataclasses.replace(self, limits=dict(limits),
                                   families=self.families if families is None else dict(families))

    def family_of(self, key: str) -> FamilyEntry | None:
        """The entry of the family ``key`` is a partition of; None: a static key."""
        family = family_of_key(key, self.families)
        return None if family is None else self.families[family]

    def family_ceiling(self, key: str) -> tuple[str, int] | None:
        """The family ``key`` is a partition of and the family's ceiling, when it has one;
        None: a static key, or a family without a ceiling (semantics §5.1)."""
        family = self.family_of(key)
        return None if family is None or family.concurrency is None else (family.family, family.concurrency)

    def entry_for(self, key: str) -> LimitEntry | None:
        """The limits a decision on ``key`` applies: a static key's entry, or its family's
        ``per_partition`` (semantics §5.1); None: unconfigured."""
        entry = self.limits.get(key)
        if entry is None and (family := self.family_of(key)) is not None:
            return family.per_partition
        return entry

    @classmethod
    def from_section(
        cls,
        section: object,
        env: str = DEFAULT_ENV,
        *,
        source: str = "<section>",
        environ: Mapping[str, str] | None = None,
    ) -> Config:
        """Validate one environment's section (``{"job_worker": {...}, ...}``).

        ``Config.from_section({"job_worker": {"count": 2}}).job_worker.count == 2``.
        ``environ`` (default ``os.environ``) supplies ``DUCTWORK_ROLE``.
        """
        environ = os.environ if environ is None else environ
        if section is not None and not isinstance(section, Mapping):
            raise ConfigError(
                env or "<environment>", section,
                f"expected a mapping of settings, got {type(section).__name__}",
            )
        body = check_mapping("", section, SECTION_KEYS)
        pipelines = _pipelines(body.get("pipelines"))
        imports = _string_list(
            "imports", body.get("imports"), _dotted,
            "module names (e.g. 'myapp.pipelines')",
        )
        if pipelines == ("*",) and not imports:
            raise ConfigError("pipelines", list(pipelines), "'*' loads the pipelines of the modules listed "
                              "in imports, and imports lists none; add imports: ['myapp.pipelines']")
        job_worker, (limits, families) = _job_worker(
            check_mapping("job_worker", _unretired("job_worker", body.get("job_worker")), _JOB_WORKER_KEYS))
        advancer = check_mapping("pipeline_advancer", body.get("pipeline_advancer"), _ADVANCER_KEYS)
        supervisor = check_mapping("supervisor", body.get("supervisor"), _SUPERVISOR_KEYS)
        return cls(
            env=env,
            database_url=_database_url(body.get("database")),
            pipelines=pipelines,
            imports=imports,
            role=_role(body, environ),
            job_worker=job_worker,
            pipeline_advancer=PipelineAdvancerConfig(
                **_scalars("pipeline_advancer", advancer, _ADVANCER_KEYS)
            ),
            supervisor=_supervisor(_scalars("supervisor", supervisor, _SUPERVISOR_KEYS)),
            logging=_logging(body.get("logging")),
            limits=limits,
            families=families,
            source=source,
        )
