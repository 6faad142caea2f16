"""The one rule for every value ductwork stores: JSON, at most MAX_PAYLOAD_BYTES of it.

    >>> dump({"order": 7}, "Orders.trigger arguments")
    '{"order": 7}'
    >>> dump(float("nan"), "Orders.trigger arguments")
    NotJSONError: Orders.trigger arguments: not JSON-serialisable (Out of range float values …)

Trigger and resume arguments, a step's return value (with an expand's items), a
context value and the list a collapse or combine hands on are all serialised by
:func:`dump`: ``json.dumps`` with ``allow_nan=False`` (ASCII text, so characters and
bytes count alike), then a size check. A value breaks the rule the same way, with the
same error class and message, wherever it enters: :class:`NotJSONError` or
:class:`PayloadTooLargeError`, naming the value.

Why 8,000,000 bytes, on every database: a value is sent to the database inside one
statement, and MariaDB's default ``max_allowed_packet`` (16 MiB = 16,777,216 bytes;
MySQL 8's is 64 MiB) bounds a statement. PyMySQL writes a value into the statement
with quotes and backslashes escaped, which at worst doubles it (a JSON string of
quotes, ``\\"``, becomes ``\\\\\\"``), so 2 × 8,000,000 bytes plus the statement's
own text and the value's envelope (a few hundred bytes) always fit in 16 MiB.
PostgreSQL and SQLite would take far more (1 GB); the maximum is theirs too, so a
pipeline that runs on one database runs on the others. Not done: compressing or
splitting larger values (store them elsewhere and pass a reference).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ductwork.errors import NotJSONError, PayloadTooLargeError

#: The longest JSON text (in bytes, which is characters: it is ASCII) of one stored value.
MAX_PAYLOAD_BYTES = 8_000_000
#: The statement size (MySQL/MariaDB ``max_allowed_packet``) that a value of the maximum needs.
STATEMENT_BYTES_NEEDED = 16 * 1024 * 1024


def dump(value: object, what: str) -> str:
    """``value``'s JSON text; raises :class:`NotJSONError` or :class:`PayloadTooLargeError`
    naming ``what`` ("Orders.trigger arguments", "shop:Fetch returned list")."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:  # ValueError: NaN/∞, a circular reference
        raise NotJSONError(what, value, str(error)) from None
    check_size(len(text), what)
    return text


def check_size(size: int, what: str) -> None:
    """Raise :class:`PayloadTooLargeError` when ``size`` bytes of JSON exceed the maximum."""
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadTooLargeError(what, size, MAX_PAYLOAD_BYTES)


def statement_limit_warning(limit: int | None) -> str | None:
    """A warning when the database's statement limit (None: no limit) cannot carry a
    value of the maximum; ``ductwork check`` and ``ductwork start`` print it."""
    if limit is None or limit >= STATEMENT_BYTES_NEEDED:
        return None
    return (f"the database's max_allowed_packet is {limit:,} bytes: a value near the maximum payload "
            f"({MAX_PAYLOAD_BYTES:,} bytes of JSON) needs {STATEMENT_BYTES_NEEDED:,}, or the statement that "
            f"stores it is refused; raise it (SET GLOBAL max_allowed_packet = {STATEMENT_BYTES_NEEDED})")


@dataclass(frozen=True)
class Output:
    """A step's validated return value: its JSON text, or, when the edge expands, its items'
    JSON texts (each within the rule above)."""

    value_json: str | None = None
    expand_items: list[str] | None = None

    @property
    def payload_json(self) -> str:
        """The job's ``output_payload``: the value's envelope, or an expand's item count."""
        if self.expand_items is not None:
            return json.dumps({"expand_items": len(self.expand_items)})  # the items are rows
        assert self.value_json is not None, "an Output holds a value or expand items"
        return payload_envelope(self.value_json)


def payload_envelope(value_json: str) -> str:
    """Wrap a value's JSON text as a step's ``output_payload``."""
    return '{"payload": ' + value_json + "}"

