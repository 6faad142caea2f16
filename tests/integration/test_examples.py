"""The examples run, and so does every code block of README.md and docs/*.md.

Checks: none directly; the documentation's examples run.

Each example in ``examples/`` runs as a subprocess on a temporary SQLite file and
must exit 0 and print its key lines. The Django project (``examples/django_shop``) runs on
every database: its point is a transaction shared by Django and ductwork. It also runs
with its connection wrapper removed, and must then fail (SQLAlchemy ends Django's
transaction).

Each Markdown page runs in a fresh interpreter (this file run as a script) in an
empty directory of its own, top to bottom, like a reader would go through it:

- every ```` ```python ```` block is executed, in order, in one module namespace per
  page (so a page builds on its earlier blocks);
- every ```` ```yaml ```` block must load, and validates as ``ductwork.yml`` (an
  environment section if its top level has setting names, else whole environments);
  every ```` ```json ```` block must parse;
- an HTML comment on the line before a block changes that:
  ``<!-- not run: REASON -->`` skips it (say why; keep these few);
  ``<!-- file: PATH -->`` writes the block to PATH instead of running it (a module
  the page imports later, or a ``ductwork.yml``);
  ``<!-- run -->`` runs a ```` ```sh ```` block with bash, which must exit 0;
  ``<!-- run in background -->`` starts a ```` ```sh ```` block (``ductwork start``)
  and leaves it running for the blocks after it; it is stopped with SIGTERM when
  the page ends and must exit within 60 s;
- ``<!-- check: ductwork.yml → ductwork check -->`` before a table: in every row,
  the first cell is a whole ``ductwork.yml`` and the second a line that
  ``ductwork check`` prints for it (without the ``ductwork check:`` prefix);
- ``<!-- check: define → DefinitionError -->`` before a table: in every row, the
  first cell is the body of a ``define(cls, pipeline)`` over steps ``A`` to ``D``
  and the second the error that creating the pipeline ``Example`` raises;
- ``<!-- support file PATH`` … ``-->`` holds a file the page needs that the reader
  does not (a stand-in vendor client); it is written before anything runs.

Commands run with the page's directory first on ``PYTHONPATH``, as for an installed
application (then this checkout, then the ``PYTHONPATH`` the tests got, if any), and
without ``DUCTWORK_*`` variables from the environment.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: blocks of pages other teams own that are not marked yet: (page, first line) -> reason
UNMARKED_ELSEWHERE: dict[tuple[str, int], str] = {}
_DIRECTIVE = re.compile(r"^<!--\s*(.*?)\s*-->$")
_FENCE = re.compile(r"^```(\S*)\s*$")
_CHECK_CONFIG = "check: ductwork.yml → ductwork check"
_CHECK_DEFINE = "check: define → DefinitionError"
_CLEAN_ENV = ("DUCTWORK_DATABASE_URL", "DUCTWORK_CONFIG", "DUCTWORK_ENV", "DUCTWORK_ROLE", "DUCTWORK_FAULT")


# --------------------------------------------------------------------------- examples


def _example(tmp_path: Path, name: str, *args: str, url: str | None = None) -> str:
    url = url or f"sqlite:///{tmp_path / 'example.sqlite3'}"
    done = subprocess.run([sys.executable, str(REPO / "examples" / name), "--database-url", url, *args],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_charge_charges_once_though_the_step_runs_twice(tmp_path):
    out = _example(tmp_path, "charge.py", "--orders", "2")
    for order in (1, 2):
        assert f"order {order}: run completed, 2 charge requests, 1 charge" in out
    assert "naive order 3: run completed, 2 charges" in out
    assert "ok: 2 orders, each charged once and sent one receipt" in out


def test_vendor_sync_keeps_every_limit_across_two_pipelines(tmp_path):
    out = _example(tmp_path, "vendor_sync.py", "--orders", "5", "--pages", "4")
    assert "runs: RefreshCatalog completed, SyncOrders completed" in out
    assert "requests: 9, claimed over" in out
    assert re.search(r"highest in flight: [1-3] by the database's claim history, [1-3] seen", out)
    assert "rate 10 per 1s, burst 1: every stretch of claims fits" in out
    assert "rate 20 per 5s, burst 4: every stretch of claims fits" in out
    assert "ok: every limit held" in out


def test_approval_waits_then_resumes_with_the_decision(tmp_path):
    out = _example(tmp_path, "approval.py")
    assert out.count(": dampened, waiting after") == 2
    assert re.search(r"completed, PayExpense: paid 120.00 to ann \(approved by dana", out)
    assert re.search(r"completed, NotifySubmitter: told bob: rejected by dana", out)
    assert "second resume refused: run" in out
    assert "ok: both runs waited for a decision" in out


def _shop_database(kind: str, tmp_path: Path, worker_id: str) -> str:
    """A fresh database of ``kind`` for examples/django_shop alone."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    from tests import databases

    server = databases.server_for_session(kind, worker_id)
    if isinstance(server, str):
        databases.skip_or_fail(server)
    prefix = os.environ.get("DUCTWORK_TEST_DB_PREFIX", "ductwork_test") + "_django"
    return databases.fresh_database(server, databases.database_name(worker_id, prefix=prefix))


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_django_shop_starts_each_order_s_run_once_on_commit_or_atomically(kind, tmp_path, worker_id):
    out = _example(tmp_path, "django_shop/run_shop.py", url=_shop_database(kind, tmp_path, worker_id))
    assert re.search(r"on commit: order 1 has run \S+; a second trigger returned the same run", out)
    assert "sweep: triggered runs for 2 orders: [2, 3]; order 3 got its existing run back" in out
    assert "second sweep: triggered runs for 0 orders: []" in out
    assert re.search(r"atomic: run \S+ is not visible before the commit", out)
    assert re.search(r"atomic: after the commit, order 4 and its run \S+ both exist", out)
    assert re.search(r"atomic rollback: neither order 5 nor run \S+ exists", out)
    assert "FAILED" not in out
    assert "ok: every order has exactly one run, and a rolled-back order has none" in out


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_django_shop_fails_without_the_wrapper_that_keeps_django_s_transaction(kind, tmp_path, worker_id):
    """The example's mutant: SQLAlchemy handed Django's DBAPI connection itself rolls back
    Django's transaction at its first connect (after reading the server's settings), so
    the order inserted before the trigger is gone and run_shop.py fails."""
    url = _shop_database(kind, tmp_path, worker_id)
    script = ("import ductwork_django, run_shop\n"
              "ductwork_django._Borrowed = lambda dbapi_connection: dbapi_connection\n"
              f"raise SystemExit(run_shop.main(['--database-url', {url!r}]))\n")
    env = _env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join((str(REPO / "examples" / "django_shop"), env["PYTHONPATH"]))
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0, done.stdout
    assert "Save with update_fields did not affect any rows" in done.stderr, done.stderr


def test_the_django_recipe_in_the_docs_is_the_example_s_module():
    page = read_page(REPO / "docs" / "triggers.md")
    assert page.support["ductwork_django.py"] == (REPO / "examples" / "django_shop" / "ductwork_django.py").read_text()


def test_every_example_says_how_to_run_it():
    for path in [*sorted((REPO / "examples").glob("*.py")), REPO / "examples" / "django_shop" / "run_shop.py"]:
        doc = path.read_text().split('"""')[1]
        assert f"python {path.relative_to(REPO)} [--database-url URL]" in doc, path.name


# --------------------------------------------------------------------------- reading pages


@dataclass
class Block:
    page: str
    line: int  # line of the first line of code (1-based)
    lang: str
    code: str
    directive: str | None = None


@dataclass
class Page:
    name: str
    blocks: list[Block] = field(default_factory=list)
    support: dict[str, str] = field(default_factory=dict)
    #: (directive, line, [(given, expected)]) for every checked table
    checks: list[tuple[str, int, list[tuple[str, str]]]] = field(default_factory=list)


def _cell(text: str) -> str:
    code = re.fullmatch(r"(`+) ?(.*?) ?\1", text.strip().replace("\\|", "|"))
    assert code, f"a checked table cell must be `code`: {text!r}"
    return code.group(2)


def read_page(path: Path) -> Page:
    name = str(path.relative_to(REPO))
    lines = path.read_text().splitlines()
    page = Page(name)
    directive: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- support file "):
            target = line[len("<!-- support file "):].strip()
            end = lines.index("-->", i)
            page.support[target] = "\n".join(lines[i + 1:end]) + "\n"
            i = end + 1
            continue
        found = _DIRECTIVE.match(line.strip())
        if found:
            directive = found.group(1)
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            page.blocks.append(Block(name, i + 2, fence.group(1), "\n".join(lines[i + 1:end]) + "\n", directive))
            directive = None
            i = end + 1
            continue
        if directive in (_CHECK_CONFIG, _CHECK_DEFINE) and line.startswith("|"):
            rows = []
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                cells = re.split(r"(?<!\\)\|", lines[i])[1:-1]
                if i - start >= 2:  # after the header and the separator
                    rows.append((_cell(cells[0]), _cell(cells[1])))
                i += 1
            page.checks.append((directive, start + 1, rows))
            directive = None
            continue
        if line.strip():
            directive = None
        i += 1
    return page


def _check_directive(block: Block) -> None:
    where = f"{block.page}:{block.line}"
    d = block.directive
    if d is None or d.startswith("file: "):
        return
    if d.startswith("not run:"):
        assert d[len("not run:"):].strip(), f"{where}: say why the block is not run"
        return
    assert d in ("run", "run in background"), f"{where}: unknown directive <!-- {d} -->"
    assert block.lang == "sh", f"{where}: <!-- {d} --> is for sh blocks"


def _starts_a_fleet(path: Path) -> bool:
    return "<!-- run in background -->" in path.read_text()


@pytest.mark.parametrize("path", [pytest.param(p, marks=[pytest.mark.slow] if _starts_a_fleet(p) else [])
                                  for p in PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_page_code_blocks_run(path, tmp_path):
    page = read_page(path)
    for block in page.blocks:
        _check_directive(block)
    if not any(b.lang in ("python", "yaml", "json", "sh") for b in page.blocks) and not page.checks:
        pytest.skip(f"{page.name} has no code blocks")
    done = subprocess.run([sys.executable, __file__, str(path), str(tmp_path)], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{page.name}:\n{done.stdout}\n{done.stderr}"


def test_pages_mark_few_blocks_not_run():
    skipped = [f"{b.page}:{b.line}" for path in PAGES for b in read_page(path).blocks
               if b.lang == "python" and ((b.directive or "").startswith("not run:")
                                          or (b.page, b.line - 1) in UNMARKED_ELSEWHERE)]
    assert len(skipped) <= 3, f"python blocks not run: {skipped}"


def test_pages_name_every_file_they_write_where_a_reader_sees_it():
    """A page's code may import a module that a ``<!-- file: PATH -->`` block writes or a
    ``<!-- support file PATH -->`` holds only if PATH is on the rendered page (in its prose or
    in a block), where a reader copying the code learns what to save where: HTML comments are
    not rendered."""
    hidden = []
    for path in PAGES:
        page = read_page(path)
        visible = re.sub(r"<!--.*?-->", "", path.read_text(), flags=re.S)
        written = [b.directive[len("file: "):] for b in page.blocks if (b.directive or "").startswith("file: ")]
        hidden += [f"{page.name}: {name}" for name in [*written, *page.support] if name not in visible]
    assert not hidden, f"files written by a page but named only in HTML comments: {hidden}"


def test_checked_tables_are_found():
    rows = {_CHECK_CONFIG: 0, _CHECK_DEFINE: 0}
    for path in PAGES:
        for kind, _, table in read_page(path).checks:
            rows[kind] += len(table)
    assert rows[_CHECK_CONFIG] >= 30, "docs/configuration.md's error tables went missing"
    assert rows[_CHECK_DEFINE] >= 10, "docs/pipelines.md's error table went missing"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _prose(path: Path) -> str:
    """A page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)


def test_links_between_pages_resolve():
    broken = []
    for path in PAGES:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", _prose(path)):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            linked = (path.parent / target).resolve() if target else path
            if not linked.exists():
                broken.append(f"{path.name}: {target}")
            elif anchor and linked.suffix == ".md":
                slugs = {_slug(line.lstrip("#")) for line in _prose(linked).splitlines()
                         if line.startswith("#")}
                if anchor not in slugs:
                    broken.append(f"{path.name}: {target}#{anchor}")
    assert not broken, broken


# --------------------------------------------------------------------------- running a page


def _env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV}
    # The page's directory first, then this checkout (its ductwork, not whichever one is
    # installed), then an inherited PYTHONPATH, so commands run this checkout's code.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(workdir), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


class _Background:
    def __init__(self, block: Block, workdir: Path):
        self.block = block
        self.log = workdir / f"background-{block.line}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(["bash", "-c", block.code], cwd=workdir, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.block.page}:{self.block.line}: the background block exited "
                                 f"{self.proc.returncode}:\n{self.log.read_text()}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.proc.poll()
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        raise AssertionError(f"{self.block.page}:{self.block.line}: still running 60 s after SIGTERM:\n"
                             f"{self.log.read_text()}")


def _validate_yaml(block: Block) -> None:
    import yaml

    from ductwork.config import SECTION_KEYS, Config
    from ductwork.config_file import config_from_mapping

    doc = yaml.safe_load(block.code)
    assert isinstance(doc, dict), f"{block.page}:{block.line}: YAML is not a mapping"
    if any(key in SECTION_KEYS for key in doc):
        Config.from_section(doc, environ={})
    else:
        for env in doc:
            if not str(env).startswith("."):
                config_from_mapping(doc, env, environ={})


def _check_definitions(page: Page, line: int, rows: list[tuple[str, str]]) -> None:
    from ductwork import Pipeline, Step

    steps = {name: type(name, (Step,), {"__init__": lambda _self, *_args: None, "execute": lambda _self: None,
                                        "__module__": "steps"}) for name in "ABCD"}
    for body, expected in rows:
        source = f"class Example(Pipeline):\n    @classmethod\n    def define(cls, pipeline):\n        {body}\n"
        try:
            exec(source, {"Pipeline": Pipeline, **steps})  # noqa: S102
        except Exception as error:  # noqa: BLE001 - compared below
            raised = f"{type(error).__name__}: {error}"
        else:
            raised = "no error"
        assert raised == expected, f"{page.name}:{line}: {body}\n raised {raised}\n not   {expected}"
    print(f"{page.name}:{line}: {len(rows)} definitions raise as the table says")


def _run_checks(page: Page, workdir: Path) -> None:
    from ductwork.cli import main
    from ductwork.db import engines, migrate

    sys.path.insert(0, str(REPO))  # the tables name the pipelines of examples/
    checkdir = workdir / "check"
    checkdir.mkdir()
    os.chdir(checkdir)
    engine = engines.create_engine("sqlite:///ductwork.sqlite3")
    migrate.upgrade(engine)
    engine.dispose()
    for kind, line, rows in page.checks:
        if kind == _CHECK_DEFINE:
            _check_definitions(page, line, rows)
            continue
        for text, expected in rows:
            Path("ductwork.yml").write_text(text + "\n")
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main(["check", "-c", "ductwork.yml"])
            printed = [ln.removeprefix("ductwork check: ") for ln in (out.getvalue() + err.getvalue()).splitlines()]
            assert expected in printed, (f"{page.name}:{line}: for {text!r} ductwork check printed\n"
                                         + "\n".join(printed) + f"\nnot\n{expected}")
        print(f"{page.name}:{line}: {len(rows)} rows as ductwork check prints them")
    os.chdir(workdir)


def run_page(path: Path, workdir: Path) -> None:
    """Run one page's blocks in ``workdir`` (this process is the page's fresh interpreter)."""
    page = read_page(path)
    os.chdir(workdir)
    sys.path[0] = str(workdir)
    for target, text in page.support.items():
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text)
    module = types.ModuleType("docs_" + re.sub(r"\W", "_", path.stem.lower()))
    sys.modules[module.__name__] = module
    background: list[_Background] = []
    try:
        for block in page.blocks:
            where = f"{block.page}:{block.line}"
            for proc in background:
                proc.check_alive()
            d = block.directive or ""
            if d.startswith("not run:") or UNMARKED_ELSEWHERE.get((block.page, block.line - 1)):
                print(f"{where}: not run ({d or UNMARKED_ELSEWHERE[(block.page, block.line - 1)]})")
                continue
            if d.startswith("file: "):
                target = Path(d[len("file: "):])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.code)
                if block.lang == "yaml":
                    _validate_yaml(block)
                print(f"{where}: wrote {target}")
            elif block.lang == "python":
                print(f"{where}: python", flush=True)
                code = compile("\n" * (block.line - 1) + block.code, block.page, "exec")
                exec(code, module.__dict__)  # noqa: S102 - running the documentation is the point
            elif block.lang == "yaml":
                _validate_yaml(block)
                print(f"{where}: yaml validated")
            elif block.lang == "json":
                json.loads(block.code)
                print(f"{where}: json parsed")
            elif block.lang == "sh" and d == "run":
                print(f"{where}: sh", flush=True)
                done = subprocess.run(["bash", "-e", "-c", block.code], capture_output=True, text=True,
                                      timeout=300)
                print(textwrap.indent(done.stdout + done.stderr, "    "))
                assert done.returncode == 0, f"{where}: exited {done.returncode}"
            elif block.lang == "sh" and d == "run in background":
                print(f"{where}: started in the background", flush=True)
                background.append(_Background(block, workdir))
        if page.checks:
            _run_checks(page, workdir)
    finally:
        for proc in background:
            proc.stop()


if __name__ == "__main__":
    run_page(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
