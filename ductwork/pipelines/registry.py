"""The classes definitions name, by reference (``"module:qualname"``), resolved without importing.

    >>> register_class(Fetch)                  # what a definition stores for a node
    'shop.steps:Fetch'
    >>> resolve_step("shop.steps:Fetch") is Fetch
    True

A worker runs what a stored row names, so a name must resolve to the class this process
defined, never make it import a module its configuration does not: :func:`resolve_step`
(and ``pipeline.resolve_pipeline``) look in the registry that every definition fills,
then in the modules those classes come from, already imported. Only a configuration
entry imports (``pipeline.import_pipeline``, through :func:`_import`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from ductwork.errors import UnknownStepClassError
from ductwork.pipelines.step import Step

#: every class a definition referenced and every Pipeline subclass, by reference: the
#: classes of the pipelines this process defined (its configuration's, which every
#: worker imports at boot, and those its own code imported). Stored names resolve only
#: through it. Strong references: a class defined inside a function stays resolvable
#: for the life of the process. A later class with the same reference replaces the earlier.
_REGISTRY: dict[str, type] = {}


def step_ref(cls: type) -> str:
    """``"module:qualname"`` of a class: ``step_ref(Fetch) == "shop.steps:Fetch"``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register_class(cls: type) -> str:
    """Record ``cls`` under its reference, so resolving it needs no import; returns the ref."""
    ref = step_ref(cls)
    _REGISTRY[ref] = cls
    return ref


def in_main_module(ref: str) -> bool:
    """Whether ``ref`` names a class of ``__main__``: the script (or ``python -m`` module)
    this process runs, which another process cannot import under that name."""
    return ref.partition(":")[0] == "__main__"


def resolve_step(ref: str) -> type[Step]:
    """The Step subclass a stored ``klass`` names, among the classes of the pipelines this
    process defined; :class:`~ductwork.errors.UnknownStepClassError` naming ``ref`` if it
    is none of them. Never imports: a name written into a row cannot make a worker import
    a module its configuration does not."""
    return _resolve(ref, Step, "step")


def _resolve(ref: str, base: type, what: str) -> type:
    """The registry, else a name in a module a registered class comes from (an alias such
    as ``OldName = NewName`` left for running runs), looked up in the module already
    imported. Anything else is unknown; nothing is imported."""
    found: object = _REGISTRY.get(ref)
    if found is None:
        module_name, _, qualname = ref.partition(":")
        registered = {cls.__module__ for cls in list(_REGISTRY.values())}
        module = sys.modules.get(module_name) if module_name in registered else None
        found = module
        for part in qualname.split(".") if module is not None and qualname else ():
            found = getattr(found, part, None)
        if found is None or found is module:
            raise UnknownStepClassError(what, ref)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise UnknownStepClassError(what, ref, f"names {found!r}, not a {base.__name__} subclass")
    return found


def _import(ref: str) -> Any:
    module_name, _, qualname = ref.partition(":")
    cannot = f"cannot resolve pipeline class {ref!r}"
    if not module_name or not qualname:
        raise ImportError(f"{cannot}: expected 'module:qualname'")
    if "<locals>" in qualname:
        raise ImportError(
            f"{cannot}: it is defined inside a function and no definition in this process "
            "referenced it (such classes resolve only where they were defined)",
            name=module_name,
        )
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"{cannot}: {exc}", name=module_name) from exc
    if ref in _REGISTRY:  # importing the module created (and registered) it
        return _REGISTRY[ref]
    for part in qualname.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ImportError(
                f"{cannot}: module {module_name!r} has no {qualname!r}", name=module_name
            ) from None
    return found
