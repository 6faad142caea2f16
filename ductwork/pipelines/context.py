"""Run-scoped key/value store: a race-safe "have I done X in this run" guard.

    >>> self.context.set("charged", True)          # inside a step
    >>> self.context.get("charged")
    True

``set`` inserts; the database's ``uq_context_run_key`` constraint makes a key
settable once per run, so of concurrent setters exactly one wins and the rest get
:class:`Context.OverwriteError` [INV-CTX-1]. ``overwrite=True`` upserts instead
(last writer wins; avoid it for guards). Values are JSON. Each call is its own
transaction: a value set by a step stays set even if the step later fails.

In an async step, ``await self.context.aget(key)`` and ``await self.context.aset(key,
value)`` do the same without blocking the event loop: the call runs in a thread of the
loop's default executor (``asyncio.to_thread``), with the same transaction and the same
guarantee.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, TypeVar

import sqlalchemy as sa

from ductwork.db import dialects, schema
from ductwork.db.ids import new_id
from ductwork.errors import InputError, OverwriteError, UnknownRunError
from ductwork.limit_entries import has_whitespace_around
from ductwork.pipelines import payloads
from ductwork.values import Json

if TYPE_CHECKING:
    from ductwork.db.database import Database

T = TypeVar("T")


class Context:
    """The context of one run."""

    OverwriteError = OverwriteError

    def __init__(self, app: Database, run_id: str):
        self._app = app
        self.run_id = run_id

    @staticmethod
    def _check_key(key: object) -> None:
        if not isinstance(key, str) or not key:
            raise InputError(f"Context key must be a non-empty str, got {key!r}")
        if len(key) > 255:
            raise InputError(f"Context key is longer than 255 characters: {key[:40]!r}…")
        if "\x00" in key or has_whitespace_around(key):  # as a trigger key (trigger.check_key): the
            # same on every database (PostgreSQL holds no NUL; MySQL ignores trailing spaces)
            raise InputError(f"Context key has whitespace around it or a NUL character: {key!r}")

    def get(self, key: str) -> Json:
        """The value set for ``key`` in this run, or None."""
        self._check_key(key)
        with self._app.begin(readonly=True) as tx:
            text = tx.execute(
                sa.select(schema.context.c.value).where(
                    schema.context.c.run_id == self.run_id, schema.context.c.key == key
                )
            ).scalar_one_or_none()
        return None if text is None else json.loads(text)["raw_value"]

    def set(self, key: str, value: T, overwrite: bool = False) -> T:
        """Set ``key`` once for this run (or replace it with ``overwrite=True``); returns value.

        A value that breaks the payload rule (``payloads.dump``) raises
        :class:`~ductwork.errors.PayloadError` and nothing is written. A run that does not
        exist (never triggered, or pruned) raises :class:`~ductwork.errors.UnknownRunError`,
        as :class:`~ductwork.pipelines.runs.Run` does, and nothing is written."""
        self._check_key(key)
        text = '{"raw_value": ' + payloads.dump(value, f"context key {key!r}") + "}"
        try:
            with self._app.begin() as tx:
                row = {"id": new_id(), "run_id": self.run_id, "key": key, "value": text,
                       "first_set_at": tx.now, "last_set_at": tx.now}
                if overwrite:
                    tx.execute(dialects.upsert(tx.conn, schema.context, ["run_id", "key"], row,
                                               ["value", "last_set_at"]))
                else:
                    with dialects.translate_db_errors(
                        {"uq_context_run_key": lambda _: OverwriteError(self.run_id, key)}  # [INV-CTX-1]
                    ):
                        tx.execute(schema.context.insert().values(**row))
        except sa.exc.IntegrityError as error:  # the run's foreign key: named differently by each database
            with self._app.begin(readonly=True) as tx:
                if tx.execute(sa.select(schema.runs.c.id).where(schema.runs.c.id == self.run_id)).first() is None:
                    raise UnknownRunError(self.run_id) from error
            raise  # pragma: no cover  the run exists: not its foreign key
        return value

    async def aget(self, key: str) -> Json:
        """:meth:`get`, awaited: run in a thread (``asyncio.to_thread``), so the loop runs on."""
        return await asyncio.to_thread(self.get, key)

    async def aset(self, key: str, value: T, overwrite: bool = False) -> T:
        """:meth:`set`, awaited: run in a thread (``asyncio.to_thread``), so the loop runs on;
        the same :class:`Context.OverwriteError` for a key already set [INV-CTX-1]."""
        return await asyncio.to_thread(self.set, key, value, overwrite)
