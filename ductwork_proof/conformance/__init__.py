"""The conformance machines, engine against model, callable without pytest: what
``ductwork verify`` runs against an adopter's database.

    checks = run_conformance("postgresql://…/scratch", seed=7, examples=20)
    [c.id for c in checks]      # ['CONF-LIMITS', 'CONF-PIPELINES'], each a results.Check

The machines are the test suite's own (one copy each, the suite runs them from here):
:mod:`~ductwork_proof.conformance.limits` (``LimitsAgainstModel``, a hypothesis state
machine: the claim path and the model step by step) and
:mod:`~ductwork_proof.conformance.pipelines` (``HUNTS``: generated pipelines, step outcomes,
prunes, hooks, revives and triggers, whole runs compared). They drive the engine on the
database at ``url``, already created and migrated by the caller, and empty its ductwork
tables before every example: give them a database of their own.

A run is derandomized by ``seed``: the same seed (and ``examples``, ``steps``) makes the
same examples, so a finding is replayed by running again with its seed, with the same
versions of ductwork and hypothesis and from the same code (hypothesis also draws, now and
then, constants it reads in the local modules the process imported: the adopter's own).
Hypothesis's example database is off and its storage directory is a scratch one while the
machines run (nothing is written under the adopter's project); its health checks about
speed are off (they judge a test's strategies, not the engine). Each check's ``detail``
gives the seed and a digest of what the examples did (every step's model state for the
limits machine, every drawn scenario for the hunts): two runs with one seed show the same
digest. The engine's log records are held back while they run (the machines fail steps on
purpose).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, cast

from ductwork_proof.results import Check

__all__ = ["MACHINES", "run_conformance"]

#: the machines ``run_conformance`` knows, in the order it runs them
MACHINES = ("limits", "pipelines")
#: how much of a falsifying example a finding keeps (its head and its tail)
FINDING_CHARS = 6000
_PROFILE = "ductwork-verify"


def run_conformance(url: str, *, seed: int, examples: int, which: tuple[str, ...] = MACHINES,
                    steps: int = 50, shrink: bool = True) -> list[Check]:
    """Run each machine of ``which`` against the database at ``url``; one :class:`Check` each.

    ``examples``: hypothesis examples per machine (per hunt for the pipelines: each of
    ``HUNTS`` runs that many); ``steps``: rules per example of the limits machine;
    ``shrink``: on a failure, shrink it to a smaller falsifying example first (off: the
    first one found, sooner). A machine that fails is ``passed=False`` with the
    falsifying example in ``findings``; one that could not run (hypothesis refused to
    generate: no example satisfied its filters) is ``passed=None`` with the reason."""
    unknown = [name for name in which if name not in MACHINES]
    if unknown:
        raise ValueError(f"unknown conformance machine(s) {unknown}: choose among {list(MACHINES)}")
    if examples < 1 or steps < 1:
        raise ValueError(f"examples ({examples}) and steps ({steps}) must be at least 1")
    runners: dict[str, Callable[..., Check]] = {"limits": _limits, "pipelines": _pipelines}
    with _engine_logs_held(), _scratch_storage():
        return [runners[name](url, seed=seed, examples=examples, steps=steps, shrink=shrink) for name in which]


@contextlib.contextmanager
def _scratch_storage() -> Iterator[None]:
    """Hypothesis's storage directory in a scratch directory while the machines run, then
    back where it was: besides its example database (off), hypothesis caches the constants
    it reads from local modules under ``.hypothesis/`` in the working directory, which is
    the adopter's project."""
    from hypothesis import configuration

    previous = configuration.storage_directory(intent_to_write=False).home_directory
    with tempfile.TemporaryDirectory(prefix="ductwork-verify-hypothesis-") as scratch:
        configuration.set_hypothesis_home_dir(scratch)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(previous)


@contextlib.contextmanager
def _engine_logs_held() -> Iterator[None]:
    """The engine's log records dropped while the machines run: they fail, crash and time
    out steps on purpose, and every one would be logged as a warning or an error."""
    logger = logging.getLogger("ductwork")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


class _Trace:
    """What a machine did: examples, steps and a digest of each, in order."""

    def __init__(self) -> None:
        self.examples = 0
        self.steps = 0
        self._hash = hashlib.sha256()

    def example(self, what: object) -> None:
        self.examples += 1
        self._add(["example", what])

    def step(self, what: object) -> None:
        self.steps += 1
        self._add(what)

    def _add(self, what: object) -> None:
        self._hash.update(json.dumps(what, sort_keys=True, default=repr).encode() + b"\n")

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()[:16]


def _settings(examples: int, steps: int, shrink: bool) -> Any:
    """The run's hypothesis settings: from hypothesis's defaults (not a profile the caller
    loaded), no example database, not derandomized (the seed decides), no deadline, no
    health checks; shrinking only if asked; one failure reported."""
    from hypothesis import HealthCheck, Phase, settings

    phases = [Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])]
    return settings(settings.get_profile("default"), max_examples=examples, stateful_step_count=steps,
                    database=None, derandomize=False, deadline=None, phases=phases, print_blob=False,
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck))


@contextlib.contextmanager
def _profile(chosen: Any) -> Iterator[None]:
    """``chosen`` as hypothesis's current profile while the hunts run (each takes its
    settings from the current profile, as the test suite's ``HYPOTHESIS_PROFILE`` gives
    them there); the caller's profile again after."""
    from hypothesis import settings

    previous = settings.get_current_profile_name()
    settings.register_profile(_PROFILE, chosen)
    settings.load_profile(_PROFILE)
    try:
        yield
    finally:
        settings.load_profile(previous)


def _falsified(run: Callable[[], None]) -> tuple[bool | None, list[str], str]:
    """Run ``run`` (a hypothesis test), hypothesis's report captured: (passed, findings,
    why it did not run). A failure's finding is its error and the falsifying example."""
    from hypothesis.errors import FailedHealthCheck, InvalidArgument, Unsatisfiable
    from hypothesis.reporting import with_reporter

    reported: list[str] = []
    try:
        with with_reporter(lambda text: reported.append(str(text))):
            run()
    except (Unsatisfiable, FailedHealthCheck, InvalidArgument) as error:  # no example ran to the end
        return None, [], f"hypothesis could not run it: {type(error).__name__}: {error}"
    except Exception as error:  # noqa: BLE001 - the engine and the model disagreed, or the engine raised
        return False, [_finding(error, reported)], ""
    return True, [], ""


def _finding(error: BaseException, reported: list[str]) -> str:
    """The error, its notes (hypothesis adds the falsifying example there) and what
    hypothesis reported, trimmed to :data:`FINDING_CHARS` (its head and its tail)."""
    parts = [f"{type(error).__name__}: {error}", *getattr(error, "__notes__", []), *reported]
    text = "\n".join(dict.fromkeys(part.rstrip() for part in parts if part.strip()))
    if len(text) > FINDING_CHARS:
        half = FINDING_CHARS // 2
        text = f"{text[:half]}\n… ({len(text) - FINDING_CHARS} characters left out) …\n{text[-half:]}"
    return text


def _detail(seed: int, trace: _Trace, why: str) -> str:
    replay = (f"seed {seed}: the same seed and budget replay the same examples "
              f"(ductwork verify --seed {seed}); examples digest {trace.digest}")
    return f"{why}; {replay}" if why else replay


def _limits(url: str, *, seed: int, examples: int, steps: int, shrink: bool) -> Check:
    from hypothesis import seed as seeded
    from hypothesis.stateful import invariant, run_state_machine_as_test

    from ductwork.db import engines
    from ductwork_proof.conformance.limits import LimitsAgainstModel

    trace = _Trace()

    def record_for_the_digest(self: LimitsAgainstModel) -> None:
        """Record each step's model state (hypothesis checks invariants once before the
        first step too, before ``setup`` made the model)."""
        if hasattr(self, "model"):
            trace.step([self.now_us, len(self.held), sorted(self.generation.items()),
                        [[key, self.model.in_flight(key), self.model.levels(key), self.model.blocked_until(key)]
                         for key in self.compared_keys()]])

    # the machine as it is (rules, draws, name in a falsifying example), with one invariant more;
    # type() returns a bare ``type``, this one a subclass of LimitsAgainstModel by its bases
    traced_machine = cast(type[LimitsAgainstModel],
                          type(LimitsAgainstModel.__name__, (LimitsAgainstModel,),
                               {"record_for_the_digest": invariant()(record_for_the_digest)}))
    engine = engines.create_engine(url)

    def machine() -> LimitsAgainstModel:
        trace.example(None)
        return traced_machine(url, engine)

    try:
        # hypothesis 6.155 ships run_state_machine_as_test unannotated: no typed way to call it
        passed, findings, why = _falsified(lambda: run_state_machine_as_test(  # type: ignore[no-untyped-call]
            seeded(seed)(machine), settings=_settings(examples, steps, shrink)))
    finally:
        engine.dispose()
    return Check(
        id="CONF-LIMITS",
        statement=("every operation of the engine's limits layer (enqueue, claim, batch claim, complete, hand-off, "
                   "group commit, fail and retry, crash and reap, restart with new limits, the clock moving) leaves "
                   "each key's in-flight count, bucket levels and blocked_until stamp where the model's operation "
                   "leaves them, every claim takes the job the model's does, and every model invariant holds "
                   "after each step"),
        checker=LimitsAgainstModel.__name__, passed=passed, detail=_detail(seed, trace, why),
        counts={"examples": trace.examples, "steps": trace.steps}, findings=findings)


def _pipelines(url: str, *, seed: int, examples: int, steps: int, shrink: bool) -> Check:  # noqa: ARG001
    from ductwork_proof.conformance.pipelines import HUNTS, hunt

    trace = _Trace()
    counts: dict[str, int] = {}
    findings: list[str] = []
    verdicts: list[bool | None] = []
    reasons: list[str] = []
    with _profile(_settings(examples, 1, shrink)):
        for name, which in HUNTS.items():
            before = trace.examples

            def recording(db_url: str, engine: Any, scenario: Any, config: Any, *, _name: str = name,
                          _check: Callable[..., None] = which.check, **drawn: Any) -> None:
                definition, args, oracle = scenario
                trace.example([_name, definition, args, json.loads(oracle.to_json()), repr(config),
                               {key: repr(value) for key, value in drawn.items()}])
                _check(db_url, engine, scenario, config, **drawn)

            def run(which: Any = which, recording: Callable[..., None] = recording) -> None:
                hunt(url, which, examples=examples, seed=seed, check=recording)

            passed, found, why = _falsified(run)
            verdicts.append(passed)
            counts[name] = trace.examples - before
            findings.extend(f"{name}: {text}" for text in found)
            if why:
                reasons.append(f"{name}: {why}")
    counts = {"examples": trace.examples, "hunts": len(HUNTS), **counts}
    passed_all = False if False in verdicts else None if None in verdicts else True
    return Check(
        id="CONF-PIPELINES",
        statement=("every generated pipeline run (every transition kind; failures, timeouts, crashes and invalid "
                   "returns; batched, keyed, with expands parked between batches) ends in the engine where it ends in "
                   "the model, and so do prunes, on_halt hooks, revives and keyed or transactional triggers"),
        checker="; ".join(sorted({which.check.__name__ for which in HUNTS.values()})),
        passed=passed_all, detail=_detail(seed, trace, "; ".join(reasons)), counts=counts,
        findings=findings)

