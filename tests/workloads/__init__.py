"""The steps and pipelines the tests share: each step does one plain thing with its input.

    from tests.workloads import Echo, Fan, Unkeyed
    run = Fan.trigger(3)   # Items → expand(Times10) → collapse(Gather): [0, 10, 20]

A test module imports its workload from here and defines a class of its own only when
the class is what the test is about (state the test reads back, a name it orders by, a
failure of its own kind). The classes are importable by module path, so a fleet's
workers and a ``timeout=`` child resolve what a run names. Beside this module:

- ``processes``: steps that sleep, block, spawn or end their process, for tests of real
  fleets, kills and ``timeout=`` children (their markers and readers);
- ``hooks``: an ``on_halt`` handler that logs each attempt to a file, and a run that owes it;
- ``rolling``: the witnessed calls of the rolling-deploy test;
- ``web``: the dashboard's gated and hostile runs.
"""

from __future__ import annotations

from typing import ClassVar

from ductwork import Pipeline, Step


class Takes(Step):
    """Keeps its one input as ``value``: the base of the plain steps below."""

    def __init__(self, value):
        self.value = value


# --------------------------------------------------------------------------- values


class Echo(Takes):
    """Returns its input."""

    def execute(self):
        return self.value


class Add1(Takes):
    """Returns its input plus one."""

    def execute(self):
        return self.value + 1


class Times10(Takes):
    """Returns its input times ten."""

    def execute(self):
        return self.value * 10


class Square(Takes):
    """Returns its input squared."""

    def execute(self):
        return self.value * self.value


# --------------------------------------------------------------------------- fan-out and fan-in


class Items(Takes):
    """Returns ``list(range(n))`` for input ``n``: an expand's items."""

    def execute(self):
        return list(range(self.value))


class Gather(Echo):
    """A fan-in: returns the outputs it gathered, in fan-out order."""


class Sum(Takes):
    """A fan-in: returns the sum of the outputs it gathered."""

    def execute(self):
        return sum(self.value)


# --------------------------------------------------------------------------- failures


class Boom(Takes):
    """Always raises ``ValueError("boom <input>")``: once its retries are spent, its branch halts."""

    def execute(self):
        raise ValueError(f"boom {self.value}")


class FailsOnce(Takes):
    """Fails the first attempt in its run (marked in the run's context), then returns its input."""

    def execute(self):
        if self.context.get("failed_once") is None:
            self.context.set("failed_once", True)
            raise ValueError(f"first attempt of {self.value}")
        return self.value


class BadInit(Step):
    """Cannot be built (its ``__init__`` raises): each execution is a crash."""

    def __init__(self, value):  # noqa: ARG002 - the step takes one argument, and fails to build
        raise KeyError("constructor fails")

    def execute(self):  # pragma: no cover - never reached
        return 1


class Since(Step):
    """Takes exactly one argument, named ``since`` (``Since(since)``), and returns it: the
    first step whose ``__init__`` a trigger's arguments must bind to."""

    def __init__(self, since):
        self.since = since

    def execute(self):
        return self.since


class ReturnsSet(Takes):
    """Returns ``{1, 2}``, which is not JSON: its execution is invalid."""

    def execute(self):
        return {1, 2}


# --------------------------------------------------------------------------- pipelines


class Unkeyed(Pipeline):
    """One unkeyed Echo: the smallest run there is."""

    @classmethod
    def define(cls, p):
        p.start(Echo)


class TwoStep(Pipeline):
    """Echo, then a chain to Echo."""

    @classmethod
    def define(cls, p):
        p.start(Echo).chain(to=Echo)


class OnKey(Pipeline):
    """One Echo on the key ``key``: a test's keyed pipeline is a subclass naming its key
    (``class Solo(OnKey): key = "solo"``), which reuses this ``define`` under its own name.
    This one's key is ``k``."""

    key: ClassVar[str] = "k"

    @classmethod
    def define(cls, p):
        p.start(Echo, limit_by=cls.key)


class Approval(Pipeline):
    """Echo, then a dampen: the run waits for ``resume`` (from any process), whose input the
    last Echo returns."""

    @classmethod
    def define(cls, p):
        p.start(Echo).dampen(before=Echo)


class Fan(Pipeline):
    """Items → expand(Times10) → collapse(Gather): ``Fan.trigger(3)`` gathers ``[0, 10, 20]``."""

    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Times10).collapse(into=Gather)


class Fails(Pipeline):
    """One Boom: the run halts once its retries are spent."""

    @classmethod
    def define(cls, p):
        p.start(Boom)


class FailsLater(Pipeline):
    """Echo, then Boom: the run halts at its second step."""

    @classmethod
    def define(cls, p):
        p.start(Echo).chain(to=Boom)


class SinceP(Pipeline):
    """One Since: ``SinceP.trigger(1, 2, 3)`` is refused before anything is written."""

    @classmethod
    def define(cls, p):
        p.start(Since)


class NotJson(Pipeline):
    """One ReturnsSet: its execution is invalid, and the run halts ``step_return_invalid``."""

    @classmethod
    def define(cls, p):
        p.start(ReturnsSet)


class Crashes(Pipeline):
    """One BadInit: the run halts once its crashes are spent."""

    @classmethod
    def define(cls, p):
        p.start(BadInit)
