"""
The static terminal's lookup: a raw request path to an open regular file inside the
root (see L{edgegw.handlers.static} for the rules), or a miss.

Dot segments, dotfiles, hidden separators and invalid UTF-8 are refused by
L{decode_segments} before the filesystem is touched; L{StaticTree} then resolves the
names below the root's real path, following a symbolic link only while it stays inside,
and opens the result without following a link swapped in since.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from typing import Final
from urllib.parse import unquote_to_bytes

__all__ = ["StaticTree", "Target", "decode_segments"]

# The path is resolved already; O_NOFOLLOW turns a link swapped in since into a miss, and
# O_NONBLOCK keeps a FIFO planted in the tree from blocking the reactor.
_OPEN_FLAGS: Final = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_BINARY", 0)
)

Target = tuple[int, os.stat_result, str, str]
"""An open file: descriptor, status, the name its headers are chosen by, its real path."""


class StaticTree:
    """
    The files under one directory and the index file each directory is served by.

    The root is resolved once, here (at load): re-pointing a symlinked root (an atomic
    deploy) takes effect on reload.

    @ivar root: The root's real path.
    @ivar base: C{root} as paths are built on it (C{""} for C{/}).
    @ivar index_name: The index file's own name (its last path component).
    """

    def __init__(self, directory: str, index: str) -> None:
        """
        @param directory: The directory to serve.
        @param index: The index file's path relative to each directory.
        @raise ValueError: C{index} does not name a file inside the directory.
        """
        self.root = os.path.realpath(directory)
        # Paths are built as f"{base}/{name}", so "/" as the root becomes "".
        self.base = self.root.rstrip("/")
        # A prefix test on normalised real paths is commonpath() without its cost.
        self._prefix = self.base + "/"
        self._index_parts = tuple(part for part in index.split("/") if part not in ("", "."))
        if not self._index_parts or ".." in self._index_parts:
            raise ValueError(f"static index {index!r} must name a file inside dir")
        self.index_name = self._index_parts[-1]

    def open_target(self, names: list[str], want_directory: bool) -> Target | None:
        """
        Open the regular file that the decoded segments name, or the index of the
        directory they name.

        @param names: Decoded, already vetted path segments.
        @param want_directory: The path ended with C{/}, so a plain file does not match.
        @return: The open file, or L{None} on a miss.
        """
        if not names:
            return self.open_index(self.base)
        opened = self._open(self.base, names)
        if opened is None:
            return None
        fd, info, real = opened
        if stat.S_ISREG(info.st_mode) and not want_directory:
            return fd, info, names[-1], real
        os.close(fd)
        if not stat.S_ISDIR(info.st_mode):
            return None
        return self.open_index(real)

    def open_index(self, directory: str) -> Target | None:
        """
        Open the index file of a directory inside the root.

        @param directory: The directory's real path (L{base} for the root).
        @return: The open index, or L{None} when it is missing or not a regular file.
        """
        opened = self._open(directory, self._index_parts)
        if opened is None:
            return None
        fd, info, real = opened
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        return fd, info, self.index_name, real

    def open_sidecar(self, real: str, suffix: str) -> tuple[int, os.stat_result] | None:
        """
        Open the precompressed sidecar of a file (C{app.js.br} beside C{app.js}), under
        the same rules as any file (a link followed only while it stays inside).

        @param real: The file's real path, as L{Target} has it.
        @param suffix: The sidecar's suffix (C{.br}).
        @return: The open regular file and its status, or L{None}.
        """
        directory, _, name = real.rpartition("/")
        opened = self._open(directory, (name + suffix,))
        if opened is None:
            return None
        fd, info, _ = opened
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        return fd, info

    def _open(self, directory: str, names: Sequence[str]) -> tuple[int, os.stat_result, str] | None:
        """
        Open C{names} under C{directory} if it stays inside the root.

        The last component is opened without a look first (one C{lstat} a request
        less): C{O_NOFOLLOW} refuses it if it is a link, and only when the open fails is
        it looked at, and a link resolved and opened at its real path.

        @param directory: A real path inside the root (C{""} for C{/}).
        @param names: Plain names: no separators, never C{.} or C{..}.
        @return: The descriptor, its status and its real path, or L{None} on a miss.
        """
        path = self._resolve(directory, names, check_last=False)
        if path is None:
            return None
        found = _open_real(path)
        if found is not None:
            return (*found, path)
        # Missing, not openable, or a link at the end: the full look decides.
        real = self._resolve(directory, names)
        if real is None or real == path:
            return None
        found = _open_real(real)
        return None if found is None else (*found, real)

    def _resolve(self, directory: str, names: Sequence[str], check_last: bool = True) -> str | None:
        """
        The real path of C{names} under C{directory}, if it stays inside the root.

        Only the components below C{directory} are examined (it is real already), and
        the full C{realpath} runs only once a symbolic link turns up, which is what makes
        this cheaper than resolving the whole path on every request.

        @param directory: A real path inside the root (C{""} for C{/}).
        @param names: Plain names: no separators, never C{.} or C{..}.
        @param check_last: Whether the last name is looked at too; if not, the path
            returned may end in a link, for an open with C{O_NOFOLLOW} to refuse.
        @return: The real path, or L{None} when a component is missing or a link leads
            outside the root.
        """
        path = directory
        last = len(names) - 1
        for position, name in enumerate(names):
            path = f"{path}/{name}"
            if position == last and not check_last:
                break
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                return None
            if stat.S_ISLNK(mode):
                real = os.path.realpath(os.path.join(path, *names[position + 1 :]))
                if real == self.root or real.startswith(self._prefix):
                    return real
                return None
        return path


def _open_real(path: str) -> tuple[int, os.stat_result] | None:
    """
    Open a resolved path without following a link at its end.

    @param path: A real path inside the root.
    @return: The descriptor and its status, or L{None} when it cannot be opened.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    return fd, info


def decode_segments(path: bytes) -> list[str] | None:
    """
    Split and percent-decode a raw request path.

    @param path: The raw path, after prefix stripping.
    @return: The non-empty segments, decoded; L{None} when any segment is a dot segment,
        a dotfile, invalid UTF-8, or hides a separator or NUL.
    """
    names: list[str] = []
    for raw in path.split(b"/"):
        if not raw:
            continue
        segment = unquote_to_bytes(raw) if b"%" in raw else raw
        if segment[:1] == b"." or b"/" in segment or b"\\" in segment or b"\0" in segment:
            return None
        try:
            names.append(segment.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return names
