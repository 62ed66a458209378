"""
Checking and installing the modules the Gateway's C{plugins} manifest lists.

This is the Python counterpart of a build-time module manifest: C{edgegw plugins
install CONFIG} installs what is missing into the gateway's own environment (with
pip), and startup refuses a configuration whose listed modules are not installed, or
not at the listed version.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from importlib.metadata import (
    Distribution,
    distributions,
    packages_distributions,
)
from pathlib import Path
from typing import Any, TextIO

from edgegw.config.errors import Problems
from edgegw.config.model import GatewaySpec
from edgegw.config.plugin_refs import ManifestEntry, parse_manifest_entry

_RELEASE = re.compile(r"(\d+(?:\.\d+)*)(.*)")

__all__ = [
    "check_manifest",
    "entry_problem",
    "install_manifest",
    "requirement",
    "same_version",
]


def _spec(import_path: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(import_path)
    except Exception:
        # A parent package is missing (ModuleNotFoundError) or fails to import: which,
        # _import_problem says.
        return None


def _import_problem(import_path: str) -> str:
    """
    Why C{import_path} cannot be found. Finding a module imports its parent packages,
    which runs their code, as loading the plugin would.
    """
    try:
        importlib.util.find_spec(import_path)
    except ModuleNotFoundError:
        pass
    except Exception as e:
        return f"module {import_path} cannot be imported: {type(e).__name__}: {e}"
    return f"module {import_path} is not installed (install it with: edgegw plugins install CONFIG)"


def same_version(wanted: str, installed: str) -> bool:
    """
    Whether C{installed} is the version C{wanted}: equal, or equal once both are read as
    PEP 440 release numbers (C{1.2} is C{1.2.0}) with the same case-insensitive rest.
    """
    if wanted == installed:
        return True
    a, b = _RELEASE.match(wanted), _RELEASE.match(installed)
    if a is None or b is None or a.group(2).lower() != b.group(2).lower():
        return False
    left = [int(part) for part in a.group(1).split(".")]
    right = [int(part) for part in b.group(1).split(".")]
    width = max(len(left), len(right))
    return left + [0] * (width - len(left)) == right + [0] * (width - len(right))


def _owners(import_path: str) -> list[Distribution]:
    """
    The installed distributions that provide the module itself: whose files include the
    file it is imported from (for a namespace package, a file inside it). Matching the
    top-level name alone would confuse distributions sharing it (C{zope.interface} and
    C{zope.event}, Twisted and the packages that ship C{twisted/plugins} files).
    """
    spec = _spec(import_path)
    if spec is None:
        return []
    if spec.origin is not None and spec.has_location:
        wanted = [Path(spec.origin).resolve()]
        inside = False
    else:
        wanted = [Path(location).resolve() for location in spec.submodule_search_locations or ()]
        inside = True
    names = set(packages_distributions().get(import_path.split(".")[0], []))
    # Every distribution of each name: an editable install has a dist-info that lists
    # only its .pth, and the project's egg-info that lists the sources.
    candidates = [dist for dist in distributions() if dist.metadata["Name"] in names]
    owners: dict[str, Distribution] = {}
    for dist in candidates:
        for file in dist.files or ():
            located = Path(str(dist.locate_file(file))).resolve()
            if located in wanted or (inside and any(p in located.parents for p in wanted)):
                owners.setdefault(dist.metadata["Name"], dist)
                break
    if not owners and len(names) == 1:
        # No file list names the module (an editable install of another kind): the one
        # distribution with that top-level package is its owner.
        owners = {dist.metadata["Name"]: dist for dist in candidates[:1]}
    return list(owners.values())


def _versions(import_path: str) -> dict[str, str]:
    return {dist.metadata["Name"]: dist.version for dist in _owners(import_path)}


def entry_problem(entry: ManifestEntry) -> str | None:
    """
    What is wrong with C{entry} in this environment, or L{None}.
    """
    if _spec(entry.import_path) is None:
        return _import_problem(entry.import_path)
    if entry.version is None:
        return None
    versions = _versions(entry.import_path)
    if not versions:
        return (
            f"module {entry.import_path} belongs to no installed distribution, so its "
            f"version cannot be checked against {entry.version}"
        )
    if any(same_version(entry.version, found) for found in versions.values()):
        return None
    have = ", ".join(f"{name} {found}" for name, found in versions.items())
    return (
        f"module {entry.import_path} is installed at another version ({have}); the "
        f"manifest asks for {entry.version} (install it with: edgegw plugins install CONFIG)"
    )


def check_manifest(gateway: GatewaySpec, problems: Problems) -> None:
    """
    Add a problem, located at its C{spec.plugins} entry, for each manifest entry that is
    missing or at another version.
    """
    for index, text in enumerate(gateway.plugins):
        try:
            entry = parse_manifest_entry(text)
        except ValueError:
            continue  # reported at load
        problem = entry_problem(entry)
        if problem is not None:
            problems.add(gateway.location, f"spec.plugins[{index}]", problem)


def requirement(entry: ManifestEntry) -> str:
    """
    What to ask pip for, pinned to the entry's version: the distribution that provides
    C{entry}'s module (when one is installed, at another version); else one named like
    its top-level package (C{acme_edge.plugin} -> C{acme-edge}), or, when installed
    distributions already share that top-level package (a namespace such as C{zope}),
    named like the whole import path (C{zope.sqlalchemy}).
    """
    owners = _owners(entry.import_path)
    if owners:
        name = owners[0].metadata["Name"]
    else:
        top = entry.import_path.split(".")[0]
        shared = top != entry.import_path and top in packages_distributions()
        name = (entry.import_path if shared else top).replace("_", "-")
    return name if entry.version is None else f"{name}=={entry.version}"


PACKAGED_MARKER = os.path.join("share", "edgegw", "packaged-by-dpkg")
"""A file the Debian package puts in its virtual environment (relative to its prefix)."""


def install_manifest(
    gateway: GatewaySpec,
    pip_options: Sequence[str],
    out: TextIO,
    run: Callable[[list[str]], Any] = subprocess.run,
    prefix: str = sys.prefix,
) -> int:
    """
    Install the manifest's missing or mismatched modules with pip, then check them all.
    Into the Debian package's environment (C{prefix} holds L{PACKAGED_MARKER}) nothing is
    installed: dpkg owns its files, and an upgrade would not keep pip's.

    @param pip_options: Passed to C{pip install} (such as C{--no-index --find-links DIR}).
    @param run: Runs the pip command line (tests replace it).
    @param prefix: The environment pip would install into.
    @return: The exit status: 0 when every entry is then satisfied, 1 otherwise.
    """
    entries = [parse_manifest_entry(text) for text in gateway.plugins]
    wanted = [requirement(entry) for entry in entries if entry_problem(entry) is not None]
    if not entries:
        out.write("edgegw: the Gateway lists no plugin modules\n")
        return 0
    if wanted and os.path.exists(os.path.join(prefix, PACKAGED_MARKER)):
        out.write(
            f"edgegw: not installing into {prefix}: it belongs to the Debian package edgegw "
            "(dpkg owns its files, and an upgrade would not keep pip's). Install the "
            "plugins' distributions as Debian packages into its site-packages, or run "
            "edgegw from a virtual environment of your own.\n"
        )
    elif wanted:
        command = [sys.executable, "-m", "pip", "install", *pip_options, *wanted]
        out.write("edgegw: " + " ".join(command) + "\n")
        out.flush()
        result = run(command)
        importlib.invalidate_caches()
        if getattr(result, "returncode", 0) != 0:
            out.write("edgegw: pip failed; nothing more was checked\n")
            return 1
    status = 0
    for entry in entries:
        problem = entry_problem(entry)
        if problem is None:
            have = ", ".join(f"{n} {v}" for n, v in _versions(entry.import_path).items())
            out.write(f"  ok       {entry}" + (f" ({have})" if have else "") + "\n")
        else:
            status = 1
            out.write(f"  missing  {entry}: {problem}\n")
    return status
