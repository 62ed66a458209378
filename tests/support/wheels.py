"""
Building real wheel files by hand, for tests that install them with pip, offline.

A wheel is a zip of the distribution's files and a C{<name>-<version>.dist-info}
directory (METADATA, WHEEL, entry_points.txt, RECORD) as the binary distribution format
specifies: https://packaging.python.org/en/latest/specifications/binary-distribution-format/
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from collections.abc import Mapping

__all__ = [
    "ACME_DISTRIBUTION",
    "ACME_HEADER",
    "ACME_PLUGIN",
    "acme_edge_wheel",
    "build_wheel",
    "record_hash",
]

ACME_DISTRIBUTION = "acme-edge"
"""The distribution L{acme_edge_wheel} builds; its package is C{acme_edge}."""

ACME_PLUGIN = "acme-stamp"
"""The name its plugin registers in the C{edgegw.plugins} entry point group."""

ACME_HEADER = "X-Acme-Stamp"
"""The request header its plugin sets (by default to C{acme-edge/<version>})."""

# Every member gets this timestamp, so the same inputs make the same bytes.
_EPOCH = (2020, 1, 1, 0, 0, 0)


def record_hash(data: bytes) -> str:
    """
    A RECORD hash: C{sha256=} and the digest in URL-safe base64 without padding.
    """
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _normalized(distribution: str) -> str:
    # Wheel file and .dist-info names: runs of "-", "_" and "." become one "_".
    return re.sub(r"[-_.]+", "_", distribution)


def build_wheel(
    directory: str,
    distribution: str,
    version: str,
    files: Mapping[str, str],
    entry_points: Mapping[str, Mapping[str, str]] | None = None,
    summary: str = "a wheel built by the tests",
) -> str:
    """
    Write a pure-Python wheel (tag C{py3-none-any}) into C{directory}.

    @param files: Path inside the wheel (such as C{acme_edge/__init__.py}) -> its text.
    @param entry_points: Group -> name -> object reference, for C{entry_points.txt}.
    @return: The wheel's path.
    """
    os.makedirs(directory, exist_ok=True)
    stem = f"{_normalized(distribution)}-{version}"
    dist_info = f"{stem}.dist-info"
    members: dict[str, bytes] = {path: text.encode("utf-8") for path, text in files.items()}
    members[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\nSummary: {summary}\n"
    ).encode()
    members[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\n"
        b"Generator: tests.support.wheels\n"
        b"Root-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    if entry_points:
        sections = []
        for group, names in entry_points.items():
            lines = "".join(f"{name} = {target}\n" for name, target in names.items())
            sections.append(f"[{group}]\n{lines}")
        members[f"{dist_info}/entry_points.txt"] = "\n".join(sections).encode()
    record = "".join(f"{path},{record_hash(data)},{len(data)}\n" for path, data in members.items())
    record_path = f"{dist_info}/RECORD"
    members[record_path] = (record + f"{record_path},,\n").encode()
    path = os.path.join(directory, f"{stem}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            wheel.writestr(info, data)
    return path


_ACME_INIT = '''\
"""
acme-edge {version}: an edgegw request plugin installed from a test wheel.
"""

__version__ = "{version}"
'''

_ACME_PLUGIN = '''\
"""
The acme-stamp request plugin: sets the {header} request header.

Config::

    value: some-text   # optional; default acme-edge/<version>
"""

from zope.interface import implementer

from acme_edge import __version__
from edgegw.plugins.interfaces import IRequestHook, IRequestPlugin, PluginConfigError


@implementer(IRequestHook)
class StampHook:
    def __init__(self, value):
        self.value = value

    def on_request(self, request):
        request.headers.set("{header}", self.value)
        return None


@implementer(IRequestPlugin)
class StampPlugin:
    def request_hook(self, config):
        unknown = sorted(set(config) - {{"value"}})
        if unknown:
            raise PluginConfigError(unknown[0], "unknown field (expected: value)")
        value = config.get("value", "acme-edge/" + __version__)
        if not isinstance(value, str):
            raise PluginConfigError("value", "must be a string")
        return StampHook(value)


plugin = StampPlugin()
'''


def acme_edge_wheel(directory: str, version: str) -> str:
    """
    Write the C{acme-edge} wheel at C{version} into C{directory}: package C{acme_edge},
    whose C{acme_edge.plugin:plugin} is an C{IRequestPlugin} registered as
    L{ACME_PLUGIN}, setting L{ACME_HEADER}.

    @return: The wheel's path.
    """
    return build_wheel(
        directory,
        ACME_DISTRIBUTION,
        version,
        {
            "acme_edge/__init__.py": _ACME_INIT.format(version=version),
            "acme_edge/plugin.py": _ACME_PLUGIN.format(header=ACME_HEADER),
        },
        {"edgegw.plugins": {ACME_PLUGIN: "acme_edge.plugin:plugin"}},
        summary="Acme's edge plugins",
    )
