"""
Reading configuration sources: files, YAML documents and C{${VAR}} interpolation.

C{--config} names a file or a directory. A directory is read in lexical filename order over
its C{.yaml} and C{.yml} files; that order, then the order of documents inside each file,
is the document order that decides plugin and policy layering.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
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


MAX_NODES = 200_000
"""
The most nodes one document may hold once its aliases are expanded: far more than any
real configuration, few enough that an alias bomb is refused quickly and in little memory.
"""


class _TooManyNodesError(Exception):
    """
    A document is over L{MAX_NODES} once its aliases are expanded.
    """


class _RecursiveError(Exception):
    """
    A mapping or list contains itself; the argument is the field path where it does.
    """


class _Interpolator:
    """
    Interpolates one document, walking each mapping and list once.

    Aliases make the YAML tree a graph: a node referenced twice is one shared object.
    Results are memoised on the identity of the original, so that a shared node is
    interpolated once and stays shared; its expanded size (what a reader walking the tree
    would visit) is what L{MAX_NODES} limits.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.problems: list[tuple[str, str]] = []
        self._done: dict[int, tuple[Any, int]] = {}
        self._active: set[int] = set()

    def walk(self, node: Any, path: str) -> tuple[Any, int]:
        """
        The interpolated C{node} and its expanded size in nodes.

        @raise _TooManyNodesError: The expanded size is over L{MAX_NODES}.
        @raise _RecursiveError: C{node} contains itself.
        """
        if isinstance(node, str):
            messages: list[str] = []
            value = interpolate(node, self.environ, messages)
            self.problems.extend((path, message) for message in messages)
            if not value.isascii() and _lone_surrogate(value) is not None:
                self.problems.append((path, _not_text(value)))
                # Readers after this one see printable text (and the load fails anyway).
                value = _escaped(value)
            return value, 1
        if not isinstance(node, dict | list):
            return node, 1
        identity = id(node)
        done = self._done.get(identity)
        if done is not None:
            return done
        if identity in self._active:
            raise _RecursiveError(path)
        self._active.add(identity)
        size = 1
        result: dict[Any, Any] | list[Any]
        if isinstance(node, dict):
            result = {}
            for key, item in node.items():
                if isinstance(key, str) and not key.isascii() and _lone_surrogate(key) is not None:
                    self.problems.append((_join(path, _escaped(key)), _not_text(key)))
                    key = _escaped(key)
                result[key], count = self.walk(item, _join(path, key))
                size += count
                if size > MAX_NODES:
                    raise _TooManyNodesError
        else:
            result = []
            for index, item in enumerate(node):
                value, count = self.walk(item, f"{path}[{index}]")
                result.append(value)
                size += count
                if size > MAX_NODES:
                    raise _TooManyNodesError
        self._active.discard(identity)
        self._done[identity] = (result, size)
        return result, size


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _lone_surrogate(text: str) -> int | None:
    """
    The first lone surrogate in C{text} (from a C{"\\ud800"} escape, or from an
    environment variable that is not UTF-8), or L{None}: such a string is not text, and
    printing or encoding it fails.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return ord(text[e.start])
    return None


def _escaped(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _not_text(text: str) -> str:
    code = _lone_surrogate(text) or 0
    return (
        f'"{_escaped(text)}" is not valid Unicode text: U+{code:04X} is a lone surrogate, '
        "which no UTF-8 text can hold"
    )


_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"
_STR_TAG = "tag:yaml.org,2002:str"
_YAML_TAG_PREFIX = "tag:yaml.org,2002:"


class _StrictLoader(yaml.SafeLoader):
    """
    The safe loader, made strict: duplicate keys are refused (a silently overridden field
    is a bug), keys must be scalars, a node cannot contain itself, and a value its tag
    cannot hold (C{2024-02-30}) is a YAML error with its line instead of a crash.

    Merge keys (C{<<: *defaults}) keep their YAML meaning: the mapping's own keys override
    merged ones, and earlier merged mappings override later ones. Merged mappings are
    constructed once and reused, so repeated merges cannot blow up.
    """

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node in self.recursive_objects:
            raise yaml.constructor.ConstructorError(
                None, None, "recursive alias: a node cannot contain itself", node.start_mark
            )
        try:
            return super().construct_object(node, deep)
        except (ArithmeticError, LookupError, TypeError, ValueError) as e:
            raise yaml.constructor.ConstructorError(
                None, None, _bad_value(node, e), node.start_mark
            ) from e

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"expected a mapping, but found a {node.id}", node.start_mark
            )
        merged: dict[Any, Any] = {}
        own: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                self._merge(merged, value_node)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "mapping keys must be scalars", key_node.start_mark
                )
            if key_node.tag == _VALUE_TAG:
                key_node.tag = _STR_TAG
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in own
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "mapping keys must be scalars", key_node.start_mark
                ) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            own[key] = self.construct_object(value_node, deep=deep)
        if not merged:
            return own
        merged.update(own)
        return merged

    def _merge(self, into: dict[Any, Any], value_node: yaml.Node) -> None:
        if isinstance(value_node, yaml.SequenceNode):
            sources = list(value_node.value)
        else:
            sources = [value_node]
        for source in sources:
            data = (
                self.construct_object(source, deep=True)
                if isinstance(source, yaml.MappingNode)
                else None
            )
            if not isinstance(data, dict):
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    "a merge key (<<) takes a mapping or a list of mappings",
                    source.start_mark,
                )
            for key, value in data.items():
                into.setdefault(key, value)


def _bad_value(node: yaml.Node, error: Exception) -> str:
    tag = str(node.tag)
    if tag.startswith(_YAML_TAG_PREFIX):
        tag = "!!" + tag.removeprefix(_YAML_TAG_PREFIX)
    if not isinstance(node, yaml.ScalarNode):
        return f"cannot construct {tag}"
    value = "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in str(node.value)
    )
    detail = "" if isinstance(error, LookupError) else f" ({error})"
    return f'"{value}" is not a valid {tag} value{detail}; quote it to make it a string'


def _construct_map(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    return loader.construct_mapping(node, deep=True)


def _construct_seq(loader: _StrictLoader, node: yaml.SequenceNode) -> list[Any]:
    # Built at once rather than in two steps (SafeLoader's way), so that a list that
    # contains itself is refused like a mapping that does.
    return loader.construct_sequence(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


@attrs.frozen
class Sources:
    """
    What a configuration source holds.

    @ivar documents: Every non-empty document that could be read, interpolated, in order.
    @ivar complete: Whether every file was read and every document in them parsed. When
        not, rules about the configuration as a whole (exactly one Gateway, references to
        other resources) are not checked: what they miss may be in what could not be read.
    """

    documents: tuple[Document, ...]
    complete: bool


def read_sources(source: str, environ: Mapping[str, str], problems: Problems) -> Sources:
    """
    Every non-empty document of every file under C{source}, interpolated, in order.

    Unreadable files, YAML errors and interpolation problems are recorded in C{problems};
    the documents that could be read are still returned, so that one run reports as much
    as possible.
    """
    try:
        files = config_files(source)
    except FileNotFoundError:
        problems.add(None, "", f"{source}: no such file or directory")
        return Sources((), complete=False)
    if not files:
        problems.add(None, "", f"{source}: no .yaml or .yml files in this directory")
        return Sources((), complete=False)
    documents: list[Document] = []
    complete = True
    for path in files:
        found = _read_file(path, environ, problems)
        if found is None:
            complete = False
            continue
        for document in found:
            if document is None:
                complete = False
            else:
                documents.append(document)
    return Sources(tuple(documents), complete)


def _read_file(
    path: str, environ: Mapping[str, str], problems: Problems
) -> list[Document | None] | None:
    """
    The documents of one file (L{None} for one that could not be used), or L{None} when
    the file cannot be read or parsed; problems are recorded.
    """
    file = Location(path, 0)
    try:
        with open(path, encoding="utf-8") as stream:
            raw = list(yaml.load_all(stream, Loader=_StrictLoader))
    except OSError as e:
        problems.add(file, "", f"cannot read: {e.strerror or e}")
        return None
    except UnicodeDecodeError:
        problems.add(file, "", "not valid UTF-8")
        return None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        detail = getattr(e, "problem", None) or str(e)
        if mark is not None:
            detail = f"{detail} (line {mark.line + 1}, column {mark.column + 1})"
        problems.add(file, "", f"invalid YAML: {detail}")
        return None
    except RecursionError:
        problems.add(file, "", "invalid YAML: nested too deeply")
        return None
    base_dir = os.path.dirname(os.path.abspath(path))
    out: list[Document | None] = []
    for index, body in enumerate(raw, start=1):
        if body is None:
            continue
        location = _envelope_location(path, index, body)
        interpolator = _Interpolator(environ)
        try:
            body, _ = interpolator.walk(body, "")
        except _TooManyNodesError:
            problems.add(
                location,
                "",
                f"invalid YAML: too many nodes (more than {MAX_NODES} once aliases are "
                "expanded: an alias bomb?)",
            )
            out.append(None)
            continue
        except RecursionError:
            problems.add(location, "", "invalid YAML: nested too deeply")
            out.append(None)
            continue
        except _RecursiveError as e:
            problems.add(location, str(e), "recursive alias: a node cannot contain itself")
            out.append(None)
            continue
        for field, message in interpolator.problems:
            problems.add(location, field, message)
        out.append(Document(location, body, base_dir))
    return out


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
