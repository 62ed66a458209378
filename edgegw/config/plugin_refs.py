"""
The Gateway's plugin manifest: C{plugins} entries of the form C{<import-path>[@version]}.
"""

from __future__ import annotations

import re
from typing import Final

import attrs

__all__ = ["ManifestEntry", "parse_manifest_entry"]

_ENTRY: Final = re.compile(
    r"(?P<path>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r"(?:@(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*))?"
)


@attrs.frozen
class ManifestEntry:
    """
    One module the gateway needs installed.

    @ivar import_path: The module, such as C{acme_edge.plugins}.
    @ivar version: The version its distribution must have (a leading C{v} dropped), or
        L{None} for any.
    """

    import_path: str
    version: str | None = None

    def __str__(self) -> str:
        return self.import_path if self.version is None else f"{self.import_path}@{self.version}"


def parse_manifest_entry(text: str) -> ManifestEntry:
    """
    Parse C{<import-path>[@version]}.

    @raise ValueError: C{text} is not of that form.
    """
    found = _ENTRY.fullmatch(text)
    if found is None:
        raise ValueError(
            f'"{text}" is not <import-path>[@version] (such as "acme_edge.plugins@1.2.0")'
        )
    version = found.group("version")
    if version is not None and version[:1] in ("v", "V") and version[1:2].isdigit():
        version = version[1:]
    return ManifestEntry(found.group("path"), version)
