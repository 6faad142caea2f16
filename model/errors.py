"""Errors the executable specification raises.

The model never imports ``ductwork``; these mirror the engine's error tree only
in meaning, so a test comparing the two maps one onto the other by name::

    ModelError
    ├── ConfigError(ValueError)     a limits entry the boot validation rejects [INV-LIM-7]
    ├── DefinitionError(ValueError) a snapshot that is not snapshot format 1
    ├── PreconditionError           the operation is not enabled in this state
    ├── CommitFailed                a guarded execution commit was rejected [INV-EXE-2]
    ├── StaleClaim                  a fenced advancement with a stale token [INV-ADV-2]
    └── OverwriteError              a context key set twice without overwrite [INV-CTX-1]

A ``PreconditionError`` means the caller (usually a hypothesis rule) asked for
something the real system could not do at all (claim by a dead worker, run an
execution that is not eligible yet); it is a bug in the caller, not a refusal.
The other errors are refusals the real system also produces.
"""

from __future__ import annotations


class ModelError(Exception):
    """Base of every error the model raises on purpose."""


class ConfigError(ModelError, ValueError):
    """A limits configuration value is invalid; the message names the path and value.

    Example: ``rate[1].per='1mo': months and years are not supported``.
    """

    def __init__(self, path: str, value: object, reason: str) -> None:
        self.path = path
        self.value = value
        self.reason = reason
        super().__init__(f"{path}={value!r}: {reason}")


class DefinitionError(ModelError, ValueError):
    """A definition snapshot is not a valid snapshot format 1 (semantics §1)."""


class PreconditionError(ModelError):
    """The operation is not enabled in the model's current state."""


class CommitFailed(ModelError):
    """The execution is no longer open or no longer owned: nothing recorded [INV-EXE-2]."""


class StaleClaim(ModelError):
    """The branch's claim token differs from the caller's: nothing committed [INV-ADV-2]."""


class OverwriteError(ModelError):
    """``context_set`` on a key already set in this run, without ``overwrite`` [INV-CTX-1]."""
