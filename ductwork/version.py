"""Which ductwork this is: its version and the git commit it was built from, for
``ductwork --version`` and the first line ``ductwork start`` logs.

    >>> describe()
    'ductwork 0.1.0 (commit 1a2b3c4) from /srv/app/.venv/lib/python3.11/site-packages/ductwork'

The commit comes from, in order: the git checkout the package is imported from (a
development checkout or an editable install: ``git rev-parse --short HEAD``, with
``-dirty`` when ``git status`` shows a change, an untracked file included); the
``_build.py`` module that building a wheel or an sdist writes (``setup.py`` runs
:func:`checkout_commit` there); else ``commit unknown``. Never raises: a missing
``git``, a checkout git refuses to read, or a slow one (5 s) means ``commit unknown``.

Imports nothing of ductwork at module level: ``setup.py`` runs this file on its own,
before ductwork's dependencies are installed.
"""

from __future__ import annotations

import importlib
import subprocess
from importlib import metadata
from pathlib import Path

#: the directory of the ductwork package (``ductwork/``)
PACKAGE = Path(__file__).resolve().parent
#: the module a build writes, holding ``COMMIT``
BUILD_MODULE = "ductwork._build"


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def checkout_commit(root: Path) -> str | None:
    """The short hash of ``root``'s checked-out commit, with ``-dirty`` when its tree has
    changes (tracked or untracked files; ignored ones do not count); None when ``root``
    is not the top of a git checkout or git cannot tell."""
    if not (root / ".git").exists():  # only the checkout itself: never a repository above it
        return None
    found = (_git(root, "rev-parse", "--show-toplevel", "--short", "HEAD") or "").split()
    if len(found) != 2 or Path(found[0]).resolve() != root.resolve():  # git found another repository
        return None
    status = _git(root, "status", "--porcelain")
    return None if status is None else found[1] + ("-dirty" if status.strip() else "")


def commit(package: Path = PACKAGE) -> str | None:
    """The commit of the code imported from ``package`` (module docstring); None: unknown."""
    found = checkout_commit(package.parent)
    if found is not None:
        return found
    try:
        built: str | None = getattr(importlib.import_module(BUILD_MODULE), "COMMIT", None)
    except ImportError:
        return None
    return built


def version() -> str:
    """The installed distribution's version (pyproject.toml's), or ``unknown`` when ductwork
    is imported from a directory no installer recorded."""
    try:
        return metadata.version("ductwork")
    except metadata.PackageNotFoundError:
        return "unknown"


def describe(package: Path = PACKAGE) -> str:
    """``ductwork VERSION (commit HASH[-dirty]) from PATH``, or ``(commit unknown)``."""
    return f"ductwork {version()} (commit {commit(package) or 'unknown'}) from {package}"
