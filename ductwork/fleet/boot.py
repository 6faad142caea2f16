"""Boot validation: what ``ductwork check`` runs, and ``ductwork start`` before anything.

    >>> warnings = validate(app)        # raises on the first problem

Fails closed, one rule per check, each error naming what is wrong (the seed's
table) [INV-LIM-7]:

===========================================  =========================================
A ``limit_by`` key has no entry              MissingLimitError naming key and pipelines
A key family has no family entry             MissingFamilyError naming family and pipelines
A static key names a family or a partition   FamilyKeyError naming key, family and pipelines
An entry has neither concurrency nor rate    EmptyLimitError (raised by config parsing)
Two rate entries share a period              DuplicatePeriodError (config parsing)
A period is months/years, zero or garbage    InvalidPeriodError (config parsing)
Tables are missing                           MissingTablesError naming them and the database
The SQLite file does not exist               MissingDatabaseError (the file is not created)
A configured key or family nobody uses       a warning only
MySQL's max_allowed_packet below 16 MiB      a warning only (payloads.statement_limit_warning)
===========================================  =========================================

Only the pipelines the config lists (``pipelines``, or ``"*"`` for every Pipeline
subclass in the ``imports`` modules) are seen; importing them runs their
``define``, so definition errors surface here too.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from typing import TYPE_CHECKING

from ductwork.db import dialects
from ductwork.errors import ConfigError, SchemaVersionError
from ductwork.limit_entries import validate_references
from ductwork.pipelines import payloads
from ductwork.pipelines.pipeline import Pipeline, import_pipeline

if TYPE_CHECKING:
    from ductwork.config import Config
    from ductwork.db.database import Database


def load_pipelines(config: Config) -> list[type[Pipeline]]:
    """Import the configured pipelines (ConfigError naming the entry that fails)."""
    for module in config.imports:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError("imports", module, f"cannot import module ({error})") from None
    if config.pipelines == ("*",):
        found = [cls for cls in _subclasses(Pipeline)
                 if cls.definition is not None and cls.__module__ in config.imports]
        if not found:
            raise ConfigError("pipelines", ["*"], "no Pipeline subclass is defined in the imports "
                              f"({', '.join(config.imports)})")
        return sorted(found, key=lambda c: (c.__module__, c.__qualname__))
    pipelines = []
    for i, ref in enumerate(config.pipelines):
        try:
            pipelines.append(import_pipeline(ref))
        except ImportError as error:
            raise ConfigError(f"pipelines[{i}]", ref, f"cannot load pipeline ({error})") from None
    return pipelines


def _subclasses(cls: type[Pipeline]) -> list[type[Pipeline]]:
    """Every subclass of ``cls``, at any depth, each before its own subclasses."""
    return [found for sub in cls.__subclasses__() for found in (sub, *_subclasses(sub))]


def limit_references(pipelines: list[type[Pipeline]], *, families: bool = False) -> dict[str, set[str]]:
    """Static limit_by key (``families``: key family) -> names of the pipelines whose
    definitions reference it."""
    refs: dict[str, set[str]] = defaultdict(set)
    for cls in pipelines:
        if cls.definition is not None:
            for key in cls.definition.limit_families() if families else cls.definition.limit_keys():
                refs[key].add(cls.definition.pipeline)
    return dict(refs)


def validate(app: Database, pipelines: list[type[Pipeline]] | None = None) -> list[str]:
    """Run every boot check; returns warnings, raises the first error."""
    loaded = load_pipelines(app.config) if pipelines is None else pipelines
    # [INV-LIM-7] every referenced key has an entry (fail closed); unreferenced entries warn
    warnings = validate_references(app.config.limits, limit_references(loaded), families=app.config.families,
                                   family_references=limit_references(loaded, families=True))
    from ductwork.db import migrate

    app.check_schema()
    current, head = migrate.current(app.engine), migrate.head()
    if current != head:
        raise SchemaVersionError(current, head)
    with app.engine.connect() as conn:
        packet = payloads.statement_limit_warning(dialects.statement_limit(conn))
    return warnings + ([packet] if packet else [])
