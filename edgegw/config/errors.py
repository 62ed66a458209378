"""
Configuration errors that say exactly where the problem is.

Every problem names the file, the document inside it, the resource (kind and name) and the
field path, in the spirit of Synapse's config errors, and loading collects all of them
before failing so that an operator fixes a configuration in one pass.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs


@attrs.frozen
class Location:
    """
    Where a resource came from.

    @ivar file: The YAML file, as given (relative paths stay relative).
    @ivar document: 1-based position of the YAML document inside the file.
    @ivar kind: The resource kind, or C{""} when the document has none.
    @ivar name: The resource's C{metadata.name}, or C{""}.
    """

    file: str
    document: int
    kind: str = ""
    name: str = ""

    def describe(self) -> str:
        """
        A human-readable prefix such as C{routes.yaml, document 2, Route "spa"}.
        """
        where = f"{self.file}, document {self.document}" if self.document else self.file
        if self.kind and self.name:
            return f'{where}, {self.kind} "{self.name}"'
        if self.kind:
            return f"{where}, {self.kind}"
        return where


@attrs.frozen
class Problem:
    """
    One thing wrong with the configuration.

    @ivar location: The resource it was found in, or L{None} for problems of the whole
        configuration (such as a missing Gateway).
    @ivar field: Dotted field path inside the resource, such as C{spec.handler.upstream};
        empty when the problem is about the resource as a whole.
    @ivar message: What is wrong, and what would be right.
    """

    location: Location | None
    field: str
    message: str

    def __str__(self) -> str:
        parts = []
        if self.location is not None:
            parts.append(self.location.describe())
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)


class ConfigError(Exception):
    """
    The configuration cannot be used; carries every problem that was found.
    """

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__(self.render())

    def render(self) -> str:
        """
        The whole report, one problem per line.
        """
        count = len(self.problems)
        noun = "error" if count == 1 else "errors"
        lines = [f"configuration has {count} {noun}:"]
        lines.extend(f"  {problem}" for problem in self.problems)
        return "\n".join(lines)


class Problems:
    """
    A collector that stages append to while loading, and that raises once at the end.
    """

    def __init__(self) -> None:
        self._items: list[Problem] = []
        self._fields: set[tuple[Location | None, str]] = set()

    def add(self, location: Location | None, field: str, message: str) -> None:
        """
        Record one problem; only the first problem of each field is kept, so that one
        mistake (an unset variable, a wrong type) does not cascade into several reports.
        """
        key = (location, field)
        if field and key in self._fields:
            return
        self._fields.add(key)
        self._items.append(Problem(location, field, message))

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def raise_if_any(self) -> None:
        """
        Raise L{ConfigError} with everything recorded so far, if anything was.
        """
        if self._items:
            raise ConfigError(self._items)
