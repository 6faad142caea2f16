"""The user base class for pipelines: define the graph once, trigger runs of it.

    class SyncOrders(Pipeline):
        @classmethod
        def define(cls, pipeline):
            pipeline.start(FetchPendingOrders).expand(to=PushOrder).collapse(into=RecordResults)

    run = SyncOrders.trigger(since)   # one transaction: run, branch, first step, its execution

Guarantees: ``define`` runs exactly once, when the class statement executes, so every
:class:`~ductwork.errors.DefinitionError` surfaces at import time; the resulting
:class:`~ductwork.pipelines.snapshot.Definition` is stored on the class as ``definition``
and snapshotted into each run. Not done here: database access (``trigger`` delegates
to the engine) and re-definition (edit the class and re-import instead).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, Unpack, cast

from ductwork.db.database import current_default_app, default_app
from ductwork.db.hosts import other_job_workers
from ductwork.errors import DefinitionError, InputError, MainModuleError, TriggerConnectionError
from ductwork.pipelines.definition import PipelineBuilder, build_definition
from ductwork.pipelines.registry import _REGISTRY, _import, _resolve, register_class
from ductwork.pipelines.snapshot import Definition, main_module_refs
from ductwork.pipelines.trigger import check_key, check_window
from ductwork.values import Json

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ductwork.db.database import Database
    from ductwork.pipelines.runs import Run


class TriggerOptions(TypedDict, total=False):
    """:meth:`Pipeline.trigger`'s keyword arguments that :meth:`Pipeline.atrigger` passes on."""

    key: str | None
    key_window: object


class AsyncTriggerOptions(TriggerOptions, total=False):
    """:meth:`Pipeline.atrigger`'s keyword arguments after ``app``: :meth:`Pipeline.trigger`'s,
    with the caller's ``AsyncConnection`` in place of a ``Connection``."""

    connection: AsyncConnection | None


class Pipeline:
    """Subclass and override the classmethod ``define(cls, pipeline)``.

    A subclass that does not override ``define`` (itself or through a parent) is
    abstract: its ``definition`` is None and ``trigger`` raises DefinitionError. A
    subclass of a concrete pipeline that does not override ``define`` reuses the
    parent's ``define`` and gets its own definition, named after itself.
    """

    #: the frozen graph built from ``define`` at class creation; None when abstract
    definition: ClassVar[Definition | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.definition = None
        raw = inspect.getattr_static(cls, "define")
        if raw is not Pipeline.__dict__["define"]:
            if not isinstance(raw, classmethod):
                raise DefinitionError(cls.__name__, "define",
                                      "define must be a @classmethod taking the builder")
            cls.definition = build_definition(cls, cls.define)
        register_class(cls)

    @classmethod
    def define(cls, pipeline: PipelineBuilder) -> None:
        """Build the graph: ``pipeline.start(A).chain(to=B)``. Called once, at class creation."""
        raise NotImplementedError(f"{cls.__name__} must override the classmethod define")

    @classmethod
    def trigger(cls, *args: Json, app: Database | None = None, key: str | None = None,
                key_window: object = None, connection: Connection | None = None) -> Run:
        """Start a run with ``args`` as the first step's input; returns the run handle.

            run = Orders.trigger(order_id, key=f"order-{order_id}")   # twice: the same run
            Orders.trigger(order_id, connection=conn)                   # in the caller's transaction

        ``app`` defaults to the last ``ductwork.connect``. ``key``: at most one run of this
        pipeline holds it; a trigger with a key that a run holds returns that run and writes
        nothing (its arguments are not compared), also when callers race, in threads or
        processes; the key is held until the run is pruned [INV-TRG-1]. ``key_window``: a
        positive duration (seconds, a ``timedelta`` or a string like ``"1d"``): a run that
        finished (completed or halted) at least that long before this trigger gives its key
        to a new run (it keeps its history); a running, dampened or more recently finished
        run is returned as without a window. ``connection``: a
        SQLAlchemy ``Connection`` with a transaction begun, on the app's database: the run is
        written through it and commits or rolls back with the caller's transaction, which
        this never ends [INV-TRG-2] (docs/triggers.md). Checked before anything is
        written: DefinitionError on an abstract pipeline (no database touched);
        :class:`~ductwork.errors.InputError` when ``args`` do not bind to the first
        step's ``__init__`` (``trigger(1, 2, 3)`` for ``__init__(self, since)``), and
        :class:`~ductwork.errors.PartitionValueError` (one) when its ``limit_by=(family,
        field)`` finds no partition value it can render in them;
        :class:`~ductwork.errors.TriggerKeyError` for a key that is not a non-empty string
        of at most 255 characters; :class:`~ductwork.errors.TriggerKeyWindowError` for a
        window that is not a positive duration or has no key;
        :class:`~ductwork.errors.TriggerConnectionError` for a
        connection that cannot be written through;
        :class:`~ductwork.errors.MainModuleError` when the pipeline or a step class is
        defined in ``__main__`` while job workers of another process are alive on the
        database (they could never import it). Not checked: the later steps' inputs
        (they are outputs, known only at run time) and workers started after this call.
        """
        definition = cls.definition
        if definition is None:
            raise DefinitionError(cls.__name__, "trigger",
                                  "Must define pipeline before triggering "
                                  "(override the classmethod define)")
        check_window(cls.__qualname__, check_key(cls.__qualname__, key), key_window)
        bind = getattr(_REGISTRY.get(definition.nodes[definition.start].klass), "_ductwork_bind", None)
        if bind is not None:  # (a definition read from a snapshot may name a class not loaded here)
            try:
                bind(args)
            except TypeError as error:
                raise InputError(f"{cls.__name__}.trigger: {error}") from None
        from ductwork.pipelines.runs import trigger_run

        refs = main_module_refs(definition)
        if refs:
            app = app or default_app()
            workers = other_job_workers(app)
            if workers:
                raise MainModuleError(
                    cls.__name__, "trigger",
                    f"{', '.join(refs)} {'is' if len(refs) == 1 else 'are'} defined in __main__ (the "
                    f"script this process runs), which the {workers} job worker process(es) on this "
                    "database cannot import: move the classes into a module they can import (and "
                    "import them from there)")
        return trigger_run(app, cls, list(args), key=key, key_window=key_window, connection=connection)


    @classmethod
    async def atrigger(cls, *args: Json, app: Database | None = None, **options: Unpack[AsyncTriggerOptions]) -> Run:
        """:meth:`trigger`, awaited: the same checks and the same one transaction, run in a
        thread (``asyncio.to_thread``) so the event loop runs on; returns the run handle
        (whose :meth:`~ductwork.pipelines.runs.Run.arefresh` and
        :meth:`~ductwork.pipelines.runs.Run.await_completion` use the async driver).
        ``options`` are :meth:`trigger`'s keyword arguments, passed on unchanged, except
        that ``connection`` is the caller's SQLAlchemy ``AsyncConnection`` (with a
        transaction begun): the run is written through it, on the loop, by the async
        driver (``AsyncConnection.run_sync``), and commits or rolls back with the caller's
        transaction [INV-TRG-2].

        Without ``connection``, a thread, not the async driver, because :meth:`trigger`
        writes through ductwork's synchronous transaction (its clock, its wake-ups) and
        reads before it writes (the ``__main__`` check): done in the thread, none of it can
        block the loop. The thread is one of the loop's default executor's; cancelling the
        awaiting task does not undo a trigger the thread has begun (it commits or rolls
        back on its own). Checks first, before anything is written, that the async client's
        modules import: :class:`~ductwork.errors.MissingExtraError` names
        ``pip install 'ductwork[async]'`` otherwise (the run's handle awaits through them)."""
        target = app or current_default_app()  # (none: trigger's checks say so, after its own)
        if target is not None:
            target.require_async(f"{cls.__qualname__}.atrigger")
        connection = options.pop("connection", None)
        passed_on = cast(TriggerOptions, options)  # (without its connection now)
        if connection is not None:
            run_sync = getattr(connection, "run_sync", None)
            if run_sync is None:
                raise TriggerConnectionError(
                    cls.__qualname__,
                    f"atrigger takes an AsyncConnection (async with engine.begin() as conn), not "
                    f"{type(connection).__name__}; a synchronous Connection goes to trigger()")
            run: Run = await run_sync(lambda sync: cls.trigger(*args, app=app, connection=sync, **passed_on))
            return run
        return await asyncio.to_thread(cls.trigger, *args, app=app, **passed_on)


# The lookups of a stored or configured pipeline name live here, next to the class
# they check for (registry.py, which this module imports, cannot import it back).
def resolve_pipeline(ref: str) -> type:
    """The Pipeline subclass a stored ``pipeline`` names, among those this process defined;
    UnknownStepClassError naming ``ref`` otherwise. Never imports (see ``registry.resolve_step``)."""
    return _resolve(ref, Pipeline, "pipeline")


def import_pipeline(ref: str) -> type:
    """The Pipeline subclass a *configuration* entry names, importing its module if needed
    (``ductwork.yml``'s ``pipelines``); ``ImportError`` naming ``ref`` if none. For names
    the operator configured, never for names read from the database."""
    found = _REGISTRY.get(ref) or _import(ref)
    if not (isinstance(found, type) and issubclass(found, Pipeline)):
        raise ImportError(f"pipeline class {ref!r} resolves to {found!r}, not a Pipeline subclass")
    return found
