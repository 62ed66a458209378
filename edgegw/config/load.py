"""
Reading configuration sources: files, YAML documents and C{${VAR}} interpolation.

C{--config} names a file or a directory. A directory is read in lexical filename order over
its C{.yaml} and C{.yml} files; that order, then the order of documents inside each file,
is the document order that decides plugin and policy layering.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import yaml

from edgegw.config.errors import Location, Problems

_VARIABLE = re.compile(r"\$(\$)?\{([^}]*)(\})?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class Interpolated(str):
    """
    A string that came (at least partly) from the environment.

    Numeric and boolean fields accept these as text (C{maxAge: ${HSTS_MAX_AGE}}); a
    literal string in the YAML stays a type error there.
    """

    __slots__ = ()


@attrs.frozen
class Document:
    """
    One non-empty YAML document.

    @ivar location: File and position (kind and name are filled from the envelope).
    @ivar body: The interpolated document.
    @ivar base_dir: Directory of the file, for resolving relative paths in it.
    """

    location: Location
    body: Any
    base_dir: str


def config_files(source: str) -> list[str]:
    """
    The YAML files that C{source} names, in document order.

    @raise FileNotFoundError: C{source} does not exist.
    """
    if os.path.isdir(source):
        names = sorted(
            name
            for name in os.listdir(source)
            if name.endswith((".yaml", ".yml")) and not name.startswith(".")
        )
        return [
            os.path.join(source, name)
            for name in names
            if os.path.isfile(os.path.join(source, name))
        ]
    if os.path.exists(source):
        return [source]
    raise FileNotFoundError(source)


def interpolate(text: str, environ: Mapping[str, str], problems: list[str]) -> str | Interpolated:
    """
    Resolve C{${VAR}} and C{${VAR:-default}} in one string.

    C{${VAR}} requires VAR to be set; C{${VAR:-default}} uses the default only when VAR is
    unset (a set but empty variable stays empty). C{$${} writes a literal C{${}.
    Problems are appended to C{problems} as messages.
    """
    if "${" not in text:
        return text
    out: list[str] = []
    position = 0
    replaced = False
    for found in _VARIABLE.finditer(text):
        out.append(text[position : found.start()])
        position = found.end()
        if found.group(1):
            out.append("${" + found.group(2) + (found.group(3) or ""))
            continue
        if found.group(3) is None:
            problems.append(f"unterminated variable reference in {text!r}")
            return text
        expression = found.group(2)
        name, separator, default = expression.partition(":-")
        if not _NAME.match(name):
            problems.append(f"invalid variable reference ${{{expression}}}")
            continue
        value = environ.get(name)
        if value is None:
            if not separator:
                problems.append(f"environment variable {name} is not set")
                continue
            value = default
        out.append(value)
        replaced = True
    out.append(text[position:])
    result = "".join(out)
    return Interpolated(result) if replaced else result


def _interpolate_tree(
    node: Any, environ: Mapping[str, str], path: str, problems: list[tuple[str, str]]
) -> Any:
    if isinstance(node, str):
        messages: list[str] = []
        value = interpolate(node, environ, messages)
        problems.extend((path, message) for message in messages)
        return value
    if isinstance(node, dict):
        return {
            key: _interpolate_tree(value, environ, _join(path, key), problems)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [
            _interpolate_tree(value, environ, f"{path}[{index}]", problems)
            for index, value in enumerate(node)
        ]
    return node


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class _StrictLoader(yaml.SafeLoader):
    """
    The safe loader, refusing duplicate keys (a silently overridden field is a bug).
    """


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def read_documents(
    source: str, environ: Mapping[str, str], problems: Problems
) -> Iterator[Document]:
    """
    Every non-empty document of every file under C{source}, interpolated, in order.

    Unreadable files, YAML syntax errors and interpolation problems are recorded in
    C{problems}; the documents that could be read are still produced, so that one run
    reports as much as possible.
    """
    try:
        files = config_files(source)
    except FileNotFoundError:
        problems.add(None, "", f"{source}: no such file or directory")
        return
    if not files:
        problems.add(None, "", f"{source}: no .yaml or .yml files in this directory")
        return
    for path in files:
        try:
            with open(path, encoding="utf-8") as stream:
                raw = list(yaml.load_all(stream, Loader=_StrictLoader))
        except OSError as e:
            problems.add(Location(path, 0), "", f"cannot read: {e.strerror}")
            continue
        except UnicodeDecodeError:
            problems.add(Location(path, 0), "", "not valid UTF-8")
            continue
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            document = 0
            detail = getattr(e, "problem", None) or str(e)
            if mark is not None:
                detail = f"{detail} (line {mark.line + 1}, column {mark.column + 1})"
            problems.add(Location(path, document), "", f"invalid YAML: {detail}")
            continue
        base_dir = os.path.dirname(os.path.abspath(path))
        for index, body in enumerate(raw, start=1):
            if body is None:
                continue
            location = _envelope_location(path, index, body)
            found: list[tuple[str, str]] = []
            body = _interpolate_tree(body, environ, "", found)
            for field, message in found:
                problems.add(location, field, message)
            yield Document(location, body, base_dir)


def _envelope_location(path: str, index: int, body: Any) -> Location:
    kind = ""
    name = ""
    if isinstance(body, dict):
        if isinstance(body.get("kind"), str):
            kind = body["kind"]
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
            name = metadata["name"]
    return Location(path, index, kind, name)
