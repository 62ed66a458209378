"""
The systemd units in systemd/: what C{systemd-analyze verify} and
C{systemd-analyze security} say of them (systemd's own tools; C{make test} installs
Debian's systemd where they are missing), and the settings the daemon relies on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from twisted.trial.unittest import SynchronousTestCase

from tests.support.processes import REPO_ROOT, venv_bin

UNITS = str(REPO_ROOT / "systemd")
PREFIX = "/opt/venvs/edgegw"
"""Where the package installs the gateway's virtual environment (the units name it)."""


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise AssertionError("systemd-analyze is missing: make test installs Debian's systemd")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, check=False)


def _settings(name: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    with open(os.path.join(UNITS, name), encoding="utf-8") as stream:
        for line in stream:
            line = line.strip()
            if not line or line.startswith(("#", "[")):
                continue
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


class UnitFileTests(SynchronousTestCase):
    """
    The units, as installed, checked by systemd's own tools.
    """

    def installed(self) -> str:
        """
        The units in a temporary directory, the package's prefix replaced by one where
        edgegw and twistd (this environment's) exist: verify checks every command.
        """
        directory: str = os.path.abspath(self.mktemp())
        bin_dir = os.path.join(directory, "venv", "bin")
        os.makedirs(bin_dir)
        for command in ("edgegw", "twistd"):
            os.symlink(
                venv_bin(command),
                os.path.join(bin_dir, command),
            )
        for name in os.listdir(UNITS):
            with open(os.path.join(UNITS, name), encoding="utf-8") as source:
                text = source.read().replace(PREFIX, os.path.join(directory, "venv"))
            # The template as systemd instantiates it (the worker units).
            installed = name.replace("@.", "@1.")
            with open(os.path.join(directory, installed), "w", encoding="utf-8") as target:
                target.write(text)
        return directory

    def test_verify_is_clean(self) -> None:
        directory = self.installed()
        units = sorted(
            os.path.join(directory, name)
            for name in os.listdir(directory)
            if name.endswith((".service", ".socket"))
        )
        result = _analyze("verify", *units)
        self.assertEqual((result.returncode, result.stdout + result.stderr), (0, ""))

    def test_security_is_ok_or_better(self) -> None:
        directory = self.installed()
        for service in ("edgegw.service", "edgegw@1.service"):
            # --threshold is the exposure times ten: at most 4.9, systemd's "OK".
            result = _analyze(
                "security",
                "--offline=true",
                "--threshold=49",
                "--no-pager",
                os.path.join(directory, service),
            )
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertRegex(
                result.stdout,
                rf"Overall exposure level for {re.escape(service)}: \d\.\d (OK|SAFE)",
            )

    def test_service_settings(self) -> None:
        for name in ("edgegw.service", "edgegw@.service"):
            self.check_service(_settings(name))
        self.assertEqual(_settings("edgegw@.service")["Sockets"], ["edgegw-workers.socket"])
        for name in ("edgegw.socket", "edgegw-workers.socket"):
            socket = _settings(name)
            self.assertEqual(socket["FileDescriptorName"], ["edgegw"])
            # What the packaged configuration's listen is served on (etc/edgegw-package).
            self.assertEqual(socket["ListenStream"], ["8080"])
        self.assertEqual(_settings("edgegw-workers.socket")["Service"], ["edgegw@1.service"])

    def check_service(self, service: dict[str, list[str]]) -> None:
        for key, value in {
            "LogRateLimitIntervalSec": "0",
            "RuntimeDirectoryPreserve": "yes",
            "Type": "notify",
            "NotifyAccess": "main",
            "User": "edgegw",
            "Group": "edgegw",
            "ExecStartPre": f"{PREFIX}/bin/edgegw check /etc/edgegw",
            "ConfigurationDirectory": "edgegw",
            "LogsDirectory": "edgegw",
            "RuntimeDirectory": "edgegw",
            "Restart": "on-failure",
            "NoNewPrivileges": "yes",
            "ProtectSystem": "strict",
            "CapabilityBoundingSet": "",
            "SystemCallArchitectures": "native",
        }.items():
            self.assertEqual(service.get(key), [value], key)
        self.assertIn("@system-service", service["SystemCallFilter"])
        self.assertEqual(
            service["ExecReload"],
            # The reload fails unless the daemon itself took the configuration.
            [
                f"{PREFIX}/bin/edgegw check /etc/edgegw",
                f"{PREFIX}/bin/edgegw reload --pid $MAINPID",
            ],
        )
        self.assertEqual(
            service["ExecStart"],
            [
                f"{PREFIX}/bin/twistd --nodaemon --pidfile= --logger=edgegw.journal.observer "
                "edgegw --config /etc/edgegw"
            ],
        )
