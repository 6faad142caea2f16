"""Every document a file of the repository cites is in the repository.

An auditor follows a citation (``docs/semantics.md §5``, ``INVARIANTS.md``, a
Markdown link) and must find the document in a clone of this repository alone.
This scans every tracked source and documentation file for

* Markdown links ``[text](target)`` to a relative path (anchors and URLs aside),
* names of Markdown documents (``something.md``) in code, comments and prose,

and fails on each one that resolves to no file, naming the file, the line and
the reference. A reference resolves relative to the citing file's folder, to the
repository root, or (a bare name) to a file of that name in ``docs/``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".txt", ".mako"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_NAME = re.compile(r"(?<![\w/.:-])((?:\.\./|\./)?[\w./-]*[\w-]\.md)\b")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # not a checkout (an sdist): every file
        return [p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / line for line in out.splitlines() if line]


def resolves(source: Path, target: str) -> bool:
    target = target.split("#", 1)[0]
    if not target:
        return True  # an anchor in the same page
    candidates = [source.parent / target, ROOT / target]
    if "/" not in target:
        candidates.append(ROOT / "docs" / target)
    return any(c.exists() for c in candidates)


def dangling(path: Path) -> list[str]:
    problems = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if path.suffix == ".md" and line.lstrip().startswith("```"):
            fenced = not fenced
        # Markdown links outside code blocks (a diagram's "[A](x)" is not a link)
        targets = {m.group(1) for m in LINK.finditer(line)} if path.suffix == ".md" and not fenced else set()
        targets |= {m.group(1) for m in DOC_NAME.finditer(line)}
        for target in sorted(targets):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, …
                continue
            if not resolves(path, target):
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                problems.append(f"{shown}:{number}: cites {target!r}, which is not in the repository")
    return problems


def test_every_cited_document_is_in_the_repository() -> None:
    here = Path(__file__).resolve()  # its own examples of dangling references aside
    files = [p for p in tracked_files() if p.suffix in SUFFIXES and p.exists() and p != here]
    assert len(files) > 50, "the scan found too few files to be meaningful"
    problems = [problem for path in files for problem in dangling(path)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see [the design]({absent}) for more", ["cites '{absent}'"]),
        ("as {absent} says", ["cites '{absent}'"]),
        ("see [semantics](semantics.md#3-advancement)", []),
        ("see docs/semantics.md §5 and INVARIANTS.md", []),
        ("a link to [a page](https://example.org/x.md)", []),
        ("[missing](../nowhere/at-all.md)", ["cites '../nowhere/at-all.md'"]),
    ],
)
def test_the_scan_finds_what_it_must(tmp_path: Path, text: str, expected: list[str]) -> None:
    absent = f"{tmp_path.name}.md"  # a bare document name, unique to this test run
    assert not (ROOT / absent).exists()
    text, expected = text.format(absent=absent), [e.format(absent=absent) for e in expected]
    probe = tmp_path / "probe.md"
    probe.write_text(text + "\n", encoding="utf-8")
    found = dangling(probe)
    assert [p.split(": ", 1)[1].split(",")[0] for p in found] == expected


def test_printed_schema_revisions_in_the_docs_are_the_head() -> None:
    """What ``ductwork db upgrade`` prints, as the docs show it, names the newest migration
    (a new migration otherwise leaves every shown output one revision behind)."""
    from ductwork.db import migrate

    head = migrate.head()
    stale = [f"{path.relative_to(ROOT)}: {line.strip()}"
             for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
             for line in path.read_text().splitlines()
             if (found := re.search(r"at revision (\w+) \(head (\w+)\)", line)) and found.group(2) != head]
    assert stale == [], f"head is {head}"
