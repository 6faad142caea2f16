"""The user base class for pipelines: define the graph once, trigger runs of it.

    class SyncOrders(Pipeline):
        @classmethod
        def define(cls, pipeline):
            pipeline.start(FetchPendingOrders).expand(to=PushOrder).collapse(into=RecordResults)

    run = SyncOrders.trigger(since)   # one transaction: run, branch, first step, its job

Guarantees: ``define`` runs exactly once, when the class statement executes, so every
:class:`~ductwork.errors.DefinitionError` surfaces at import time; the resulting
:class:`~ductwork.definition.Definition` is stored on the class as ``definition``
and snapshotted into each run. Not done here: database access (``trigger`` delegates
to the engine) and re-definition (edit the class and re-import instead).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar

from ductwork.definition import Definition, PipelineBuilder, build_definition, register_class
from ductwork.errors import DefinitionError

if TYPE_CHECKING:
    from ductwork.app import App
    from ductwork.runs import Run


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
    def trigger(cls, *args: Any, app: App | None = None) -> Run:
        """Start a run with ``args`` as the first step's input; returns the run handle.

        ``app`` defaults to the last ``ductwork.connect``. Raises DefinitionError on an
        abstract pipeline before touching the database.
        """
        if cls.definition is None:
            raise DefinitionError(cls.__name__, "trigger",
                                  "Must define pipeline before triggering "
                                  "(override the classmethod define)")
        from ductwork.runs import trigger_run

        return trigger_run(app, cls, list(args))
