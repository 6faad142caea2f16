"""Which ductwork this is (``ductwork --version``, the first line ``ductwork start`` logs):
the version and the commit, from a git checkout, from what a build recorded, or unknown;
never an error. Git repositories are made in temporary directories. No database.

Checks: none (no invariant: a report of what code runs).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from ductwork import version
from ductwork.cli import main

ROOT = Path(__file__).resolve().parents[2]

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


@needs_git
def test_a_checkouts_commit_is_its_short_hash_and_dirty_with_any_change(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("*.log\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    assert version.checkout_commit(tmp_path) == head
    (tmp_path / "run.log").write_text("ignored\n")
    assert version.checkout_commit(tmp_path) == head  # an ignored file is no change
    (tmp_path / "a.py").write_text("x = 2\n")
    assert version.checkout_commit(tmp_path) == f"{head}-dirty"
    _git(tmp_path, "checkout", "-q", "a.py")
    (tmp_path / "b.py").write_text("y = 1\n")
    assert version.checkout_commit(tmp_path) == f"{head}-dirty"  # an untracked file is code that may run
    (tmp_path / "sub").mkdir()
    assert version.checkout_commit(tmp_path / "sub") is None  # only the top of a checkout
    (tmp_path / "sub" / ".git").mkdir()  # not a repository: git finds the one above, which is not it
    assert version.checkout_commit(tmp_path / "sub") is None


def test_not_a_checkout_and_no_build_record_is_commit_unknown(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, version.BUILD_MODULE, None)  # no _build.py (a checkout's case)
    package = tmp_path / "ductwork"
    package.mkdir()
    assert version.commit(package) is None
    assert version.describe(package) == f"ductwork {version.version()} (commit unknown) from {package}"


def test_an_installed_copy_names_the_commit_its_build_recorded(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, version.BUILD_MODULE, types.SimpleNamespace(COMMIT="1a2b3c4"))
    package = tmp_path / "site-packages" / "ductwork"
    package.mkdir(parents=True)
    assert version.describe(package) == f"ductwork {version.version()} (commit 1a2b3c4) from {package}"


def test_git_that_fails_or_is_missing_is_commit_unknown(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()  # looks like a checkout; git says it is not one
    assert version.checkout_commit(tmp_path) is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no git at all
    assert version.checkout_commit(ROOT) is None


@needs_git
def test_version_names_this_checkouts_commit(capsys):
    if not (ROOT / ".git").exists():
        pytest.skip("the tests do not run from a git checkout")
    head = _git(ROOT, "rev-parse", "--short", "HEAD")
    dirty = "-dirty" if _git(ROOT, "status", "--porcelain") else ""
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"ductwork {version.version()} (commit {head}{dirty}) from {ROOT / 'ductwork'}\n"
