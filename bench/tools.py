"""
The external programs the benchmarks need (wrk; nginx for C{proxy}), installed when
missing.

As root on Debian/Ubuntu the harness installs them with apt-get itself so that a newcomer's
single command works; otherwise it says exactly what to install and stops.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

import attrs

# nginx lives in /usr/sbin, which is not on every user's PATH.
_SEARCH_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"]
)

APT_PACKAGES = {
    "wrk": "wrk",
    "nginx": "nginx-light",
    "h2load": "nghttp2-client",
    "caddy": "caddy",
    "chromium": "chromium",
    "chromedriver": "chromium-driver",
    "npm": "npm",
}
"""The Debian package providing each program: wrk, a small nginx (``nginx`` is the
fallback), h2load, Caddy, Chromium and its driver (for C{pageload}), and npm (which
fetches C{pageload}'s single-page app)."""


class MissingToolsError(Exception):
    """
    A required program is missing and could not be installed; the message says how to
    install it.
    """


@attrs.frozen
class Tools:
    """
    Paths of the external programs.

    @ivar wrk: The wrk load generator.
    @ivar nginx: The nginx binary.
    """

    wrk: str
    nginx: str


def _which(name: str) -> str | None:
    return shutil.which(name, path=_SEARCH_PATH)


def _apt_install(packages: list[str]) -> bool:
    """
    Install C{packages} with apt-get without starting their services (``RUNLEVEL=1``
    keeps invoke-rc.d from starting the stock nginx on port 80).
    """
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "RUNLEVEL": "1"}
    print(f"bench: installing {' '.join(packages)} with apt-get ...", file=sys.stderr, flush=True)
    if subprocess.run(["apt-get", "update", "-q"], env=env, check=False).returncode != 0:
        return False
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    return subprocess.run(command, env=env, check=False).returncode == 0


def _ensure(names: Sequence[str]) -> dict[str, str]:
    """
    The paths of the programs C{names} (keys of L{APT_PACKAGES}), installing the missing
    ones with apt-get when running as root.

    @raise MissingToolsError: If some are missing and cannot be installed here.
    """
    found = {name: _which(name) for name in names}
    missing = [name for name, path in found.items() if not path]
    if not missing:
        return {name: path for name, path in found.items() if path}
    packages = [APT_PACKAGES[name] for name in missing]
    if os.geteuid() != 0 or not _which("apt-get"):
        raise MissingToolsError(
            f"bench: {' and '.join(missing)} not found. Install "
            f"{'them' if len(missing) > 1 else 'it'} as root, e.g.\n"
            f"  sudo apt-get update && sudo apt-get install -y {' '.join(packages)}\n"
            "or run this command as root (on Debian/Ubuntu it then installs them itself)."
        )
    if not _apt_install(packages) and "nginx-light" in packages:
        # Newer Debian releases dropped nginx-light; plain nginx is the same server.
        _apt_install(["nginx" if p == "nginx-light" else p for p in packages])
    found = {name: _which(name) for name in names}
    if not all(found.values()):
        raise MissingToolsError(
            f"bench: apt-get could not install {' '.join(packages)}; install "
            f"{' and '.join(names)} and run again."
        )
    for service in ("nginx", "caddy"):
        if service in missing:
            _stop_stock_service(service)
    return {name: path for name, path in found.items() if path}


def ensure(names: Sequence[str]) -> dict[str, str]:
    """
    The paths of the programs C{names} (keys of L{APT_PACKAGES}), installing the missing
    ones with apt-get when running as root.

    @raise MissingToolsError: If some are missing and cannot be installed here.
    """
    return _ensure(names)


def ensure_tools() -> Tools:
    """
    Find wrk and nginx, installing them with apt-get when missing and running as root.

    @raise MissingToolsError: If they are missing and cannot be installed here.
    """
    found = _ensure(("wrk", "nginx"))
    return Tools(wrk=found["wrk"], nginx=found["nginx"])


def ensure_wrk() -> str:
    """
    Find wrk (only), installing it with apt-get when missing and running as root.

    @raise MissingToolsError: If it is missing and cannot be installed here.
    """
    return _ensure(("wrk",))["wrk"]


_SERVICE_MARKS = {"nginx": "/run/nginx.pid", "caddy": "/run/systemd/units/invocation:caddy.service"}


def _stop_stock_service(name: str) -> None:
    """
    Stop the distribution's C{name} service (nginx, Caddy) if installing the package
    started it anyway: the benchmark machine should run only what the harness starts.
    """
    if not os.path.exists(_SERVICE_MARKS[name]):
        return
    for command in (["systemctl", "stop", name], ["service", name, "stop"]):
        if _which(command[0]):
            subprocess.run(command, capture_output=True, check=False)
            return


def version(argv: list[str]) -> str:
    """
    The first line a program prints for its version option (nginx prints to stderr).
    """
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError as e:
        return f"unknown ({e})"
    text = (done.stdout + done.stderr).strip()
    return text.splitlines()[0] if text else "unknown"
