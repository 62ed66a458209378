"""
A small typed reader over one YAML mapping, recording every problem with its field path.

Parsers ask for each field they know (C{node.string("upstream", required=True)}); what is
left when they call L{Node.finish} is an unknown field, reported with a did-you-mean
suggestion. A field with a problem yields its default (or an empty value when required),
so that parsing continues and every problem is reported in one run.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, TypeVar

from edgegw.config.errors import Location, Problems
from edgegw.config.load import Interpolated
from edgegw.durations import parse_duration

T = TypeVar("T")


def type_name(value: object) -> str:
    """
    How a YAML value's type is named in messages.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def suggest(word: str, known: list[str]) -> str:
    """
    C{'; did you mean "x"?'} for the closest known word, or C{""}.
    """
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    if not close:
        lowered = {k.lower(): k for k in known}
        if word.lower() in lowered:
            close = [lowered[word.lower()]]
    return f'; did you mean "{close[0]}"?' if close else ""


class Node:
    """
    One mapping of a resource being read.

    @ivar location: The resource it belongs to.
    @ivar path: Its dotted field path inside the resource (C{""} for the document root).
    """

    def __init__(
        self, raw: Mapping[str, Any], location: Location, path: str, problems: Problems
    ) -> None:
        self.raw = raw
        self.location = location
        self.path = path
        self.problems = problems
        self._known: list[str] = []

    # -- reporting ---------------------------------------------------------------------------

    def field_path(self, key: str) -> str:
        """
        The dotted path of C{key} in this mapping.
        """
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> None:
        """
        Record a problem with field C{key} (C{""} for the mapping itself).
        """
        self.problems.add(self.location, self.field_path(key) if key else self.path, message)

    def finish(self) -> None:
        """
        Report every field that no parser asked for.
        """
        for key in self.raw:
            if key not in self._known:
                name = str(key)
                self.error(name, "unknown field" + suggest(name, self._known))

    def know(self, *keys: str) -> None:
        """
        Declare fields as known without reading them.
        """
        self._known.extend(keys)

    # -- raw access --------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        """
        Whether C{key} is present (a null value counts as absent).
        """
        self.know(key)
        return self.raw.get(key) is not None

    def value(self, key: str) -> Any:
        """
        The raw value of C{key} (opaque fields), or L{None}.
        """
        self.know(key)
        return self.raw.get(key)

    def _get(self, key: str, required: bool) -> Any:
        self.know(key)
        value = self.raw.get(key)
        if value is None and required:
            self.error(key, "required field is missing")
        return value

    # -- scalars -----------------------------------------------------------------------------

    def string(
        self,
        key: str,
        default: str | None = None,
        *,
        required: bool = False,
        choices: tuple[str, ...] = (),
        nonempty: bool = False,
    ) -> str | None:
        """
        A string field; with C{choices}, one of them.
        """
        value = self._get(key, required)
        if value is None:
            return "" if required else default
        if not isinstance(value, str):
            self.error(key, f"expected a string, got {type_name(value)}")
            return "" if required else default
        if choices and value not in choices:
            listed = ", ".join(f'"{c}"' for c in choices)
            self.error(key, f'"{value}" is not one of {listed}' + suggest(value, list(choices)))
            return "" if required else default
        if nonempty and not value:
            self.error(key, "must not be empty")
        return str(value)

    def required_string(self, key: str, *, nonempty: bool = True) -> str:
        """
        A required, by default non-empty, string field.
        """
        value = self.string(key, required=True)
        assert value is not None
        if nonempty and self.raw.get(key) == "":
            self.error(key, "must not be empty")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        """
        A boolean field; C{"true"}/C{"false"} from an environment variable are accepted.
        """
        value = self._get(key, False)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, Interpolated) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.error(key, f"expected a boolean (true or false), got {type_name(value)}")
        return default

    def integer(self, key: str, default: int, *, minimum: int | None = None) -> int:
        """
        An integer field; digits from an environment variable are accepted.
        """
        value = self._get(key, False)
        if value is None:
            return default
        if isinstance(value, Interpolated):
            try:
                value = int(value.strip())
            except ValueError:
                self.error(key, f'expected an integer, got "{value}"')
                return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(key, f"expected an integer, got {type_name(value)}")
            return default
        if minimum is not None and value < minimum:
            self.error(key, f"must be at least {minimum}, got {value}")
            return default
        return value

    def number(self, key: str, default: float, *, minimum: float, maximum: float) -> float:
        """
        A number between C{minimum} and C{maximum}; text from an environment variable is
        accepted.
        """
        value = self._get(key, False)
        if value is None:
            return default
        if isinstance(value, Interpolated):
            try:
                value = float(value.strip())
            except ValueError:
                self.error(key, f'expected a number, got "{value}"')
                return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(key, f"expected a number, got {type_name(value)}")
            return default
        if not minimum <= value <= maximum:
            self.error(key, f"must be between {minimum:g} and {maximum:g}, got {value:g}")
            return default
        return float(value)

    def duration(self, key: str, default: float | None, *, positive: bool = False) -> float | None:
        """
        A Go-style duration string (C{"500ms"}, C{"1h30m"}), in seconds.
        """
        value = self._get(key, False)
        if value is None:
            return default
        if not isinstance(value, str):
            self.error(
                key,
                f'expected a duration string such as "30s" or "1h30m", got {type_name(value)}',
            )
            return default
        try:
            seconds = parse_duration(value)
        except ValueError as e:
            self.error(key, f'{e}; use a number with a unit, such as "500ms", "30s", "1h30m"')
            return default
        if positive and seconds <= 0:
            self.error(key, f'must be greater than 0, got "{value}"')
            return default
        if seconds < 0:
            self.error(key, f'must not be negative, got "{value}"')
            return default
        return seconds

    # -- collections -------------------------------------------------------------------------

    def strings(
        self, key: str, default: tuple[str, ...] = (), *, nonempty: bool = False
    ) -> tuple[str, ...]:
        """
        A list of strings.
        """
        value = self._get(key, False)
        if value is None:
            return default
        if not isinstance(value, list):
            self.error(key, f"expected a list of strings, got {type_name(value)}")
            return default
        out: list[str] = []
        for index, item in enumerate(value):
            if not isinstance(item, str):
                self.error(f"{key}[{index}]", f"expected a string, got {type_name(item)}")
            else:
                out.append(str(item))
        if nonempty and not value:
            self.error(key, "must not be an empty list")
        return tuple(out)

    def string_map(self, key: str) -> dict[str, str] | None:
        """
        A mapping of string to string, or L{None} when absent.
        """
        value = self._get(key, False)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.error(key, f"expected a mapping of string to string, got {type_name(value)}")
            return None
        out: dict[str, str] = {}
        for name, item in value.items():
            if not isinstance(name, str):
                self.error(key, f"keys must be strings, got {type_name(name)}")
            elif not isinstance(item, str):
                self.error(f"{key}.{name}", f"expected a string, got {type_name(item)}")
            else:
                out[name] = str(item)
        return out

    def mapping(self, key: str, *, required: bool = False) -> Node | None:
        """
        A nested mapping as a L{Node}, or L{None} when absent (or not a mapping).
        """
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.error(key, f"expected a mapping, got {type_name(value)}")
            return None
        return Node(value, self.location, self.field_path(key), self.problems)

    def opaque_mapping(self, key: str) -> dict[str, Any]:
        """
        A mapping kept as it is (plugin and provider C{config}).
        """
        value = self._get(key, False)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(key, f"expected a mapping, got {type_name(value)}")
            return {}
        return dict(value)

    def nodes(self, key: str, *, required: bool = False) -> list[Node]:
        """
        A list of mappings, each as a L{Node}; C{required} also rejects an empty list.
        """
        value = self._get(key, required)
        if value is None:
            return []
        if not isinstance(value, list):
            self.error(key, f"expected a list, got {type_name(value)}")
            return []
        if required and not value:
            self.error(key, "must list at least one entry")
        out: list[Node] = []
        for index, item in enumerate(value):
            path = f"{self.field_path(key)}[{index}]"
            if not isinstance(item, dict):
                self.problems.add(self.location, path, f"expected a mapping, got {type_name(item)}")
                continue
            out.append(Node(item, self.location, path, self.problems))
        return out
