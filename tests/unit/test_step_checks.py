"""Mistakes that can never succeed are refused when the class is created or at trigger.

Pure: no database. ``async def execute`` and a non-callable ``execute`` raise when
the Step subclass is created; a step class of ``__main__`` with ``timeout=`` raises
when the pipeline is created; ``trigger`` binds its arguments to the first step's
``__init__`` before touching anything; and the halt reason of a failed step follows
its last execution's outcome (``invalid`` halts ``job_invalid``), in the engine and
the model alike. Relates to INV-EXE-4 (an invalid execution fails its step at once).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types

import pytest

from ductwork.errors import AsyncStepError, DefinitionError, InputError, MainModuleError
from ductwork.pipelines.pipeline import Pipeline
from ductwork.pipelines.registry import in_main_module
from ductwork.pipelines.rules import job_halt_reason
from ductwork.pipelines.snapshot import main_module_refs
from ductwork.pipelines.step import Step, is_async
from model.pipelines import job_halt_reason as model_job_halt_reason
from tests.workloads import Since, SinceP


class Flexible(Step):
    def __init__(self, first, *rest, flag=False):  # noqa: ARG002 - the signature is what is checked
        self.first = first

    def execute(self):
        return self.first


class NoInit(Step):
    def execute(self):
        return 0


class KeywordOnly(Step):
    """Takes its one input by keyword only: no positional input binds (the engine passes them positionally)."""

    def __init__(self, *, since):
        self.since = since

    def execute(self):
        return self.since


# --------------------------------------------------------------------------- class creation


def test_async_execute_is_a_step_and_an_async_generator_is_refused():
    class Fetch(Step):
        async def execute(self):
            return 1

    class Static(Step):
        @staticmethod
        async def execute():
            return 1

    assert is_async(Fetch)
    assert is_async(Static)
    assert not is_async(Step)
    with pytest.raises(AsyncStepError) as info:
        class Stream(Step):
            async def execute(self):
                yield 1
    assert str(info.value) == (
        "Stream.execute: an async generator is not a step's work (it yields values, and a step "
        "returns one): define `async def execute(self)` with a `return`")
    assert isinstance(info.value, DefinitionError)

    class Base(Step):
        pass

    Base.execute = _async_generator  # bypasses the class statement's check ...
    with pytest.raises(AsyncStepError, match=r"Child.execute: an async generator"):
        class Child(Base):  # ... but a subclass inheriting it is checked
            pass
    with pytest.raises(AsyncStepError, match=r"Base.execute: an async generator"):
        class UsesBase(Pipeline):  # ... and so is a class a definition uses
            @classmethod
            def define(cls, pipeline):
                pipeline.start(Base)


async def _async_generator(self):  # noqa: ARG001  # pragma: no cover - never iterated
    yield 1


def test_execute_must_be_callable():
    with pytest.raises(DefinitionError) as info:
        class NotCallable(Step):
            execute = 5
    assert str(info.value) == "NotCallable.execute: execute must be a method, got 5"


def test_plain_and_abstract_steps_are_accepted():
    class Abstract(Step):  # no execute of its own: allowed here, definitions reject it
        pass

    class Concrete(Abstract):
        def execute(self):
            return 1

    assert Concrete().execute() == 1


# --------------------------------------------------------------------------- binding input


@pytest.mark.parametrize(("cls", "args"), [
    (Since, [1]), (Flexible, [1]), (Flexible, [1, 2, 3]), (NoInit, []),
])
def test_arguments_that_bind(cls, args):
    cls._ductwork_bind(args)


@pytest.mark.parametrize(("cls", "args", "message"), [
    (Since, [1, 2, 3], "Since(since) cannot take the arguments (1, 2, 3): too many positional arguments"),
    (Since, [], "Since(since) cannot take the arguments (): missing a required argument: 'since'"),
    (Flexible, [], "Flexible(first, *rest, flag=False) cannot take the arguments (): "
                   "missing a required argument: 'first'"),
    (NoInit, [1], "NoInit() cannot take the arguments (1,): too many positional arguments"),
    (KeywordOnly, [1], "KeywordOnly(*, since) cannot take the arguments (1,): too many positional arguments"),
])
def test_arguments_that_do_not_bind_name_the_class_and_its_signature(cls, args, message):
    with pytest.raises(TypeError) as info:
        cls._ductwork_bind(args)
    assert str(info.value) == message


class Tally(Step, dict):
    """A step whose ``__init__`` is a C type's (``dict``'s): a signature, but no function."""

    def execute(self):
        return dict(self)


class _UnreadableInit:
    """An ``__init__`` whose signature inspect cannot read (as a C extension's may be)."""

    __signature__ = "unreadable"  # not a Signature: inspect.signature raises TypeError

    def __call__(self, step, *args):
        step.args = args


class Opaque(Step):
    __init__ = _UnreadableInit()

    def execute(self):
        return self.args


def _priced_init(step, amount, *, unit):
    step.amount, step.unit = amount, unit


class Priced(Step):
    """A step whose ``__init__`` is no function: a ``functools.partial`` (not a descriptor)."""

    __init__ = functools.partial(_priced_init, unit="EUR")

    def execute(self):
        return f"{self.amount} {self.unit}"


@dataclasses.dataclass
class _Scale:
    """A callable ``__init__`` that is an instance of a dataclass: equal by value, so unhashable."""

    factor: int

    def __call__(self, step, amount):
        step.amount = amount * self.factor


class Scaled(Step):
    __init__ = _Scale(10)

    def execute(self):
        return self.amount


def test_an_init_that_is_not_a_function_is_bound_through_its_signature():
    """A C type's ``__init__`` (``dict``'s) and a ``functools.partial`` are read with
    ``inspect.signature`` as they are: the arguments bind, or the refusal names the signature."""
    Tally._ductwork_bind([[("a", 1)]])
    assert Tally._ductwork_build([[("a", 1)]], "s", "r", None).execute() == {"a": 1}
    Priced._ductwork_bind([5])
    assert Priced._ductwork_build([5], "s", "r", None).execute() == "5 EUR"
    with pytest.raises(TypeError) as info:
        Priced._ductwork_bind([5, 6])
    assert str(info.value) == ("Priced(amount, *, unit='EUR') cannot take the arguments (5, 6): "
                               "too many positional arguments")
    Scaled._ductwork_bind([5])  # (an unhashable __init__: its signature is read, not remembered)
    assert Scaled._ductwork_build([5], "s", "r", None).execute() == 50
    with pytest.raises(TypeError, match=r"^Scaled\(amount\) cannot take the arguments \(\): missing"):
        Scaled._ductwork_bind([])


def test_a_step_built_without_a_context_has_its_key_and_refuses_its_context():
    """Built through the seam with no Context (as a unit test of a step does): its id is its
    key, and ``context`` raises instead of answering None."""
    step = Scaled._ductwork_build([1], "step-1", "run-1", None)
    assert step.idempotency_key == "step-1"
    with pytest.raises(RuntimeError, match=r"^Scaled\.context is only available while ductwork runs the step"):
        _ = step.context


def test_an_init_whose_signature_cannot_be_read_is_not_checked():
    """Nothing is refused beforehand: the arguments go to ``__init__``, which decides."""
    Opaque._ductwork_bind([1, 2, 3])
    assert Opaque._ductwork_build([1, 2, 3], "s", "r", None).execute() == (1, 2, 3)


def test_trigger_refuses_arguments_the_first_step_cannot_take(monkeypatch):
    calls = []
    runs = types.ModuleType("ductwork.pipelines.runs")
    runs.trigger_run = lambda _app, _cls, args, **_: calls.append(args) or "handle"
    monkeypatch.setitem(sys.modules, "ductwork.pipelines.runs", runs)
    with pytest.raises(InputError) as info:
        SinceP.trigger(1, 2, 3, app="app")
    assert str(info.value) == ("SinceP.trigger: Since(since) cannot take the arguments (1, 2, 3): "
                               "too many positional arguments")
    assert calls == []  # refused before the engine was asked to write anything
    assert SinceP.trigger("2026-01-01", app="app") == "handle"
    assert calls == [["2026-01-01"]]


def test_trigger_of_a_snapshot_whose_first_step_is_not_loaded_here_binds_nothing(monkeypatch):
    """A pipeline whose definition is a snapshot naming a step class this process never
    loaded (a service that only triggers): there is no ``__init__`` to bind against, so the
    arguments go to the trigger as they are (the worker that runs the step binds them)."""
    from ductwork.pipelines.snapshot import Definition

    calls = []
    runs = types.ModuleType("ductwork.pipelines.runs")
    runs.trigger_run = lambda _app, _cls, args, **_: calls.append(args) or "handle"
    monkeypatch.setitem(sys.modules, "ductwork.pipelines.runs", runs)

    class TriggerOnly(Pipeline):
        pass

    snapshot = {"format": 1, "pipeline": "elsewhere.pipelines:Charge", "start": "Charge#0",
                "nodes": {"Charge#0": {"klass": "elsewhere.steps:Charge", "delay_us": None, "timeout_us": None,
                                       "limit_by": None}}, "edges": {}}
    monkeypatch.setattr(TriggerOnly, "definition", Definition.from_json(snapshot))
    assert TriggerOnly.trigger(1, 2, 3, app="app") == "handle"
    assert calls == [[1, 2, 3]]


# --------------------------------------------------------------------------- __main__


def _in_main(cls: type) -> type:
    cls.__module__ = "__main__"
    return cls


def test_main_module_refs_name_the_pipeline_and_step_classes_of_main():
    main_step = _in_main(type("Script", (Since,), {}))

    class Mixed(Pipeline):
        @classmethod
        def define(cls, pipeline):
            pipeline.start(main_step).chain(to=Since)

    assert in_main_module("__main__:Script")
    assert not in_main_module("shop.steps:Script")
    assert main_module_refs(Mixed.definition) == ["__main__:Script"]
    assert main_module_refs(SinceP.definition) == []


def test_a_main_step_with_timeout_is_refused_when_the_pipeline_is_created():
    main_step = _in_main(type("Script", (Since,), {}))
    with pytest.raises(MainModuleError) as info:
        class Timed(Pipeline):
            @classmethod
            def define(cls, pipeline):
                pipeline.start(Since).chain(to=main_step, timeout=5)
    assert str(info.value) == (
        "Timed.chain: Script is defined in __main__ and has timeout=, so it runs in a child "
        "process, which cannot import __main__: move it into an importable module")


# --------------------------------------------------------------------------- halt reasons


@pytest.mark.parametrize(("outcome", "reason"), [
    ("failure", "job_retries_exhausted"), ("timed_out", "job_retries_exhausted"),
    ("process_crashed", "job_crashes_exhausted"), ("invalid", "job_invalid"),
])
def test_halt_reason_follows_the_last_outcome_in_engine_and_model(outcome, reason):
    assert job_halt_reason(outcome) == model_job_halt_reason(outcome) == reason
