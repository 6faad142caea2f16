"""The base class of every pipeline step.

    class ChargeOrder(Step):
        def __init__(self, order_id):   # input: trigger args or the previous step's output
            self.order_id = order_id
        def execute(self):              # the return value must be JSON-serialisable
            return gateway.charge(self.order_id, idempotency_key=self.idempotency_key)

Execution is **at-least-once**: ``execute`` may run again after a crash, a reap or a
timeout, possibly after its side effects already happened; its outcome is recorded
at most once (INV-EXE-2). Use :attr:`Step.idempotency_key` (equal across every
execution of one step, distinct across steps and runs, INV-EXE-3) and
:attr:`Step.context` to make a re-run harmless. Ductwork does not undo, dedupe or
detect side effects itself.
"""

from __future__ import annotations

import functools
import inspect
import reprlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from ductwork.pipelines.context import Context

from ductwork.errors import AsyncStepError, DefinitionError
from ductwork.values import Json

_UNBOUND = "is only available while ductwork runs the step (build it with the engine, not Step())"


def _init_signature(init: Any) -> inspect.Signature | None:
    """The signature of an ``__init__`` (None when it cannot be read: a C-level one), read
    once per function (a worker binds every execution's input to it)."""
    if inspect.isfunction(init) or init is object.__init__:
        return _cached_signature(init)
    return _read_signature(init)


@functools.lru_cache(maxsize=4096)
def _positional_counts(init: Any) -> tuple[int, int] | None:
    """How many positional arguments (after ``self``) an ``__init__`` whose parameters are
    all plain positional ones takes, at least and at most; None for any other signature
    (keyword-only, ``*args``, ``**kwargs``, positional-only, unreadable)."""
    signature = _read_signature(init)
    if signature is None:  # pragma: no cover  called only for a Python function, whose signature is readable
        return None
    params = list(signature.parameters.values())[1:]
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    return sum(1 for p in params if p.default is inspect.Parameter.empty), len(params)


def _read_signature(init: Any) -> inspect.Signature | None:
    if init is object.__init__:  # object.__init__ refuses any argument here
        return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)])
    try:
        return inspect.signature(init)
    except (TypeError, ValueError):
        return None


#: :func:`_read_signature`, remembered per ``__init__`` (a Python function's or object's: :func:`_init_signature`)
_cached_signature = functools.lru_cache(maxsize=4096)(_read_signature)


class Step:
    """Subclass, take the step's input in ``__init__`` and do the work in ``execute``.

        class Double(Step):
            def __init__(self, n): self.n = n
            def execute(self): return self.n * 2

    The engine builds each instance with :meth:`_ductwork_build`, which binds the step
    id, run id and context *before* ``__init__`` runs, so ``__init__`` may already read
    :attr:`idempotency_key` and :attr:`context`. An instance created directly
    (``Double(2)``, e.g. in a unit test) is unbound: both properties raise
    ``RuntimeError``. ``execute`` takes no arguments; definitions reject a class whose
    ``execute`` needs any.

    ``execute`` may be ``async def`` (an async step): its worker awaits it on the event
    loop of its process, concurrently with the other async steps it claimed
    (``ductwork.fleet.steploop``), with the same guarantees as a plain one.

    Checked when the subclass is created: an ``execute`` it defines or inherits must be
    callable and not an async generator (:class:`~ductwork.errors.AsyncStepError`). A
    subclass that does not override ``execute`` is allowed (an abstract base);
    definitions reject it.
    """

    #: set by the engine before ``__init__``; None on an instance built directly
    _ductwork_step_id: str | None = None
    #: the run this step belongs to; None when unbound
    _ductwork_run_id: str | None = None
    #: the run-scoped Context object the engine passed; None when unbound
    _ductwork_context: Context | None = None

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        check_execute(cls)

    @classmethod
    def _ductwork_bind(cls, args: Sequence[Any]) -> None:
        """Engine seam, not API: raise ``TypeError`` if ``__init__`` cannot take ``args``.

        Binds the arguments to ``__init__``'s signature without calling it, so a step
        that can never be built from this input (``trigger(1, 2, 3)`` for a one-argument
        step) is told apart from an ``__init__`` that raised. Nothing is checked when
        the signature cannot be read (a C-level ``__init__``).
        """
        init = cls.__init__
        counts = _positional_counts(init) if inspect.isfunction(init) else None
        if counts is not None and counts[0] <= len(args) <= counts[1]:
            return  # binds: only positional parameters, and as many arguments as they take
        signature = _init_signature(init)
        if signature is None:
            return
        try:
            signature.bind(None, *args)  # None stands for self
        except TypeError as error:
            takes = signature.replace(parameters=list(signature.parameters.values())[1:])
            raise TypeError(f"{cls.__name__}{takes} cannot take the arguments "
                            f"{reprlib.repr(tuple(args))}: {error}") from None

    @classmethod
    def _ductwork_build(
        cls, args: Sequence[Any], step_id: object, run_id: object, context: Context | None
    ) -> Self:
        """Engine seam, not API: allocate, bind ids and context, then ``__init__(*args)``.

        Errors raised by the user's ``__init__`` propagate unchanged (the engine counts
        them as a crash of this execution, as the Ruby engine does); arguments that do
        not bind are told apart beforehand by :meth:`_ductwork_bind`.
        """
        step = cls.__new__(cls)
        step._ductwork_step_id = str(step_id)
        step._ductwork_run_id = str(run_id)
        step._ductwork_context = context
        cls.__init__(step, *args)
        return step

    @property
    def idempotency_key(self) -> str:
        """The step's id: stable across re-executions of this step, unique across steps and runs.

        Except after a revive: a failed step that ``Run.revive`` re-enqueues in the new run
        keeps the key of the step it re-runs, so a side effect made before the halt under
        that key is not made twice (docs/semantics.md, "Reviving a halted run")."""
        if self._ductwork_step_id is None:
            raise RuntimeError(f"{type(self).__name__}.idempotency_key {_UNBOUND}")
        return self._ductwork_step_id

    @property
    def context(self) -> Context:
        """The run-scoped Context (``get``/``set``) shared by every step of this run."""
        if self._ductwork_step_id is None or self._ductwork_context is None:
            raise RuntimeError(f"{type(self).__name__}.context {_UNBOUND}")
        return self._ductwork_context

    def execute(self) -> Json:
        """Do the step's work and return its output; override this. May run more than once."""
        raise NotImplementedError(f"{type(self).__name__} must override execute(self)")


def check_execute(cls: type) -> None:
    """Raise if ``cls.execute`` can never run as a step's work; an un-overridden one passes.

    ``async def execute`` is a step's work too (an async step, run on its worker
    process's event loop: ``ductwork.fleet.steploop``); an async generator is not (it
    returns no value to record):

        >>> class Stream(Step):
        ...     async def execute(self):
        ...         yield 1
        Traceback (most recent call last):
        AsyncStepError: Stream.execute: an async generator is not a step's work ...
    """
    raw = inspect.getattr_static(cls, "execute", None)
    if raw is Step.__dict__["execute"]:
        return
    function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if not callable(function):
        raise DefinitionError(cls.__name__, "execute", f"execute must be a method, got {raw!r}")
    if inspect.isasyncgenfunction(function):
        raise AsyncStepError(cls.__name__, "execute",
                             "an async generator is not a step's work (it yields values, and a step "
                             "returns one): define `async def execute(self)` with a `return`")


def is_async(cls: type[Step]) -> bool:
    """Whether ``cls.execute`` is ``async def`` (an async step: its worker awaits it)."""
    return inspect.iscoroutinefunction(cls.execute)  # (a classmethod's is bound: it looks through that)
