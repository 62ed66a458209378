"""
The external programs the proxy benchmark needs (wrk, nginx), installed when missing.

As root on Debian/Ubuntu the harness installs them with apt-get itself so that a newcomer's
single command works; otherwise it says exactly what to install and stops.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import attrs

# nginx lives in /usr/sbin, which is not on every user's PATH.
_SEARCH_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"]
)

APT_PACKAGES = ("wrk", "nginx-light")
"""The Debian packages providing wrk and a small nginx (``nginx`` is the fallback)."""


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


def _find() -> tuple[str | None, str | None]:
    return _which("wrk"), _which("nginx")


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


def ensure_tools() -> Tools:
    """
    Find wrk and nginx, installing them with apt-get when missing and running as root.

    @raise MissingToolsError: If they are missing and cannot be installed here.
    """
    wrk, nginx = _find()
    if wrk and nginx:
        return Tools(wrk=wrk, nginx=nginx)
    missing = [name for name, path in (("wrk", wrk), ("nginx", nginx)) if not path]
    packages = [p for p, path in zip(APT_PACKAGES, (wrk, nginx), strict=True) if not path]
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
    wrk, nginx = _find()
    if not (wrk and nginx):
        raise MissingToolsError(
            f"bench: apt-get could not install {' '.join(packages)}; install wrk and nginx "
            "and run again."
        )
    _stop_stock_nginx()
    return Tools(wrk=wrk, nginx=nginx)


def _stop_stock_nginx() -> None:
    """
    Stop the distribution's nginx service if installing the package started it anyway:
    the benchmark machine should run only what the harness starts.
    """
    if not os.path.exists("/run/nginx.pid"):
        return
    for command in (["systemctl", "stop", "nginx"], ["service", "nginx", "stop"]):
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
