"""Reading ``ductwork.yml``: the file, its YAML, and the environment picked from it.

    >>> config_from_mapping({"default": {"job_worker": {"max_retry": 0}}}).job_worker.max_retry
    0

Top-level keys are environments (``default``, ``production``, …); the one used is
``env``, else ``DUCTWORK_ENV``, else ``default``, and :meth:`Config.from_section
<ductwork.config.Config.from_section>` validates it. The file is read with
``yaml.safe_load``'s rules, so anchors and ``<<`` merge keys work as YAML defines them:
*shallow*. ``staging: {<<: *default, job_worker: {limits: …}}`` replaces the whole
``job_worker`` mapping of ``default``, so staging has only the limits it lists.

Every failure is a :class:`ConfigError` (or a subclass): naming the file for an
unreadable file, YAML syntax (with the line) or a key repeated in one mapping
(:class:`DuplicateKeyError`, with both lines), and naming the key for everything else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ductwork.config import DEFAULT_ENV, SECTION_KEYS, Config
from ductwork.errors import ConfigError, DuplicateKeyError
from ductwork.limit_entries import child_path

DEFAULT_PATH = "ductwork.yml"


def config_from_mapping(
    doc: object,
    env: str = DEFAULT_ENV,
    source: str = "<mapping>",
    *,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Validate a whole ``ductwork.yml`` document (environments at the top) and pick ``env``.

    ``config_from_mapping({"default": {"role": "worker"}}).role == "worker"``. An
    empty document (``None``) means all defaults. A missing environment raises
    ``ConfigError`` naming it and the environments the document defines.
    """
    source = source if source else "<mapping>"
    if doc is None:
        return Config.from_section(None, env, source=source, environ=environ)
    if not isinstance(doc, Mapping):
        raise ConfigError(
            source, doc, f"expected a mapping of environment names to settings, got "
            f"{type(doc).__name__}"
        )
    if env not in doc:
        defined = ", ".join(sorted(map(str, doc))) or "none"
        hint = ""
        if any(key in SECTION_KEYS for key in doc):
            hint = "; settings must sit under an environment name such as 'default:'"
        raise ConfigError(
            source, env, f"environment not defined (defined: {defined}); choose one with "
            f"--env or DUCTWORK_ENV{hint}"
        )
    return Config.from_section(doc[env], env, source=source, environ=environ)


class _SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (same tags, anchors, merge keys) whose value errors carry a line,
    and which rejects a key repeated in one mapping.

    PyYAML's safe constructors raise plain ``ValueError`` for a scalar such as
    ``2020-02-30`` or a 5,000-digit integer; this re-raises it as a
    ``ConstructorError`` marked with the node's position. A mapping that lists a key
    twice (at any depth) raises :class:`DuplicateKeyError` naming the key's path and
    both lines, where YAML would keep the last silently; a key brought in by a ``<<``
    merge and overridden in place is not a duplicate.
    """

    source = "<yaml>"

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"invalid {node.tag} value: {exc}", node.start_mark
            ) from exc

    def construct_document(self, node: yaml.Node) -> Any:
        self._reject_duplicate_keys(node)
        return super().construct_document(node)

    def _reject_duplicate_keys(self, root: yaml.Node) -> None:
        seen_nodes: set[int] = set()
        stack: list[tuple[yaml.Node, str]] = [(root, "")]
        while stack:
            node, path = stack.pop()
            if id(node) in seen_nodes:  # an alias: checked where its anchor is
                continue
            seen_nodes.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                stack.extend(reversed([(item, f"{path}[{i}]") for i, item in enumerate(node.value)]))
            elif isinstance(node, yaml.MappingNode):
                lines: dict[Any, int] = {}
                children: list[tuple[yaml.Node, str]] = []
                for key_node, value_node in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    try:
                        key = self.construct_object(key_node)
                        hash(key)
                    except (yaml.YAMLError, TypeError):
                        # construction reports it with its position; PyYAML left the node
                        # marked as being constructed, which it would report as recursive
                        self.recursive_objects.pop(key_node, None)
                        continue
                    key_path = child_path(path, key)
                    line = key_node.start_mark.line + 1
                    if key in lines:
                        raise DuplicateKeyError(self.source, key_path, key, lines[key], line)
                    lines[key] = line
                    children.append((value_node, key_path))
                stack.extend(reversed(children))  # depth first, in document order


def _safe_load(text: str, source: str) -> Any:
    loader = None
    try:
        loader = _SafeLoader(text)  # may already raise: it reads the first characters
        loader.source = source
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        if mark is None:
            raise ConfigError(source, None, f"invalid YAML: {problem}") from exc
        lines = text.splitlines()
        line = lines[mark.line] if mark.line < len(lines) else ""
        line = line if len(line) <= 120 else line[:117] + "..."
        context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        where = f" ({context} at line {start.line + 1})" if context and start is not None else ""
        raise ConfigError(
            source,
            line,
            f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}{where}",
        ) from exc
    except RecursionError as exc:
        raise ConfigError(source, None, "invalid YAML: nested too deeply") from exc
    finally:
        if loader is not None:
            loader.dispose()


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load and validate ``ductwork.yml``.

    ``load_config("ductwork.yml", "production")``. ``path`` None reads the file named
    by ``DUCTWORK_CONFIG``, else ``./ductwork.yml`` when it exists, else returns all
    defaults; a path given explicitly or in ``DUCTWORK_CONFIG`` must exist. ``env``
    None reads ``DUCTWORK_ENV``, then ``default``. ``environ`` (default
    ``os.environ``) supplies ``DUCTWORK_CONFIG``, ``DUCTWORK_ENV`` and ``DUCTWORK_ROLE``.
    Raises :class:`ConfigError` naming the file for unreadable files and YAML syntax
    errors (with the line), and naming the key for everything else.
    """
    environ = os.environ if environ is None else environ
    if env is None:
        env = environ.get("DUCTWORK_ENV") or DEFAULT_ENV
    if path is None and environ.get("DUCTWORK_CONFIG"):
        path = environ["DUCTWORK_CONFIG"]
        if not Path(path).is_file():
            raise ConfigError("DUCTWORK_CONFIG", path, "no such file")
    if path is None:
        if not Path(DEFAULT_PATH).exists():
            return Config.from_section(None, env, source="<defaults>", environ=environ)
        path = DEFAULT_PATH
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(source, source, "no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, source, f"cannot read: {exc}") from exc
    return config_from_mapping(_safe_load(text, source), env, source, environ=environ)
