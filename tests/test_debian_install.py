"""
The Debian package's life cycle with dpkg and its maintainer scripts: install, upgrade
over an edited conffile, remove and purge — run in a throwaway copy of this machine
(tests/support/deb_sandbox.sh: a private mount namespace with an overlay of / on a
tmpfs), so that the host's own dpkg database and files are never touched. Needs root
for the mounts (directly or through C{sudo -n}), as C{make test}'s package build does.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from twisted.trial.unittest import SynchronousTestCase

from tests.support.processes import REPO_ROOT
from tests.test_debian_package import _package, _run

SANDBOX = str(REPO_ROOT / "tests" / "support" / "deb_sandbox.sh")
UPGRADE_VERSION = "0.1.0+upgrade1"

# Runs inside the sandbox, from /sandbox (where both packages are): each step prints
# `name=value` lines for the test to assert on, and the dpkg logs on failure.
LIFE_CYCLE = r"""
set -eu
report() { printf '%s=%s\n' "$1" "$2"; }
dpkg_or_log() {
	if ! dpkg "$@" >dpkg.log 2>&1; then cat dpkg.log; exit 1; fi
}
leftovers() {
	found=""
	for path in /etc/edgegw /opt/venvs/edgegw /var/log/edgegw /usr/bin/edgegw \
		/usr/bin/twistd /lib/systemd/system/edgegw.service /usr/lib/sysusers.d/edgegw.conf \
		/etc/systemd/system/sockets.target.wants/edgegw.socket; do
		if [ -e "$path" ] || [ -L "$path" ]; then found="$found $path"; fi
	done
	echo "$found"
}
check_as_daemon() {
	if runuser -u edgegw -- /usr/bin/edgegw check /etc/edgegw >check.log 2>&1; then
		echo 0
	else
		echo "$?: $(tr '\n' ' ' <check.log)"
	fi
}
cache=/opt/venvs/edgegw/lib/python3.11/site-packages/twisted/plugins/dropin.cache

dpkg_or_log -i "$1"
report installed "$(dpkg-query -W -f='${Status} ${Version}' edgegw)"
report user "$(getent passwd edgegw | cut -d: -f1,7)"
report group "$(getent group edgegw | cut -d: -f1)"
conffiles=$(dpkg-query -W -f='${Conffiles}' edgegw | awk 'NF {print $1}' | sort)
report conffiles "$(echo $conffiles)"
report enabled "$(echo $(ls /etc/systemd/system/sockets.target.wants/))"
report bytecode "$(find /opt/venvs/edgegw/lib -name '*.pyc' | grep -c . || true)"
report check "$(check_as_daemon)"
before=$(sha256sum "$cache")
# As root, twistd would rewrite a stale plugin cache: it is current as shipped.
/usr/bin/twistd --help >/dev/null 2>&1
report cache_rewritten "$([ "$(sha256sum "$cache")" = "$before" ] && echo no || echo yes)"

echo '# edited by the operator' >>/etc/edgegw/10-routes.yaml
mkdir -p /var/log/edgegw && touch /var/log/edgegw/access.log
dpkg_or_log -i "$2"
report upgraded "$(dpkg-query -W -f='${Status} ${Version}' edgegw)"
report edit_kept "$(grep -c '^# edited by the operator$' /etc/edgegw/10-routes.yaml)"
report check_after_upgrade "$(check_as_daemon)"

dpkg_or_log -r edgegw
report removed "$(dpkg-query -W -f='${Status}' edgegw)"
report kept_after_remove "$(ls /etc/edgegw | tr '\n' ' ')"
report bytecode_after_remove "$(find /opt/venvs -name '*.pyc' 2>/dev/null | grep -c . || true)"

dpkg_or_log --purge edgegw
report purged "$(dpkg-query -W -f='${db:Status-Abbrev}' edgegw 2>/dev/null || echo gone)"
report leftovers "$(leftovers)"
"""


def _as_root(argv: list[str]) -> list[str]:
    return argv if os.geteuid() == 0 else ["sudo", "-n", *argv]


class LifeCycleTests(SynchronousTestCase):
    """
    Install, upgrade, remove and purge in the sandbox.
    """

    def upgrade_package(self, deb: str, directory: str) -> str:
        """
        The same package at a higher version (what an upgrade installs): unpacked,
        its control file's version raised, packed again.
        """
        tree = os.path.join(directory, "tree")
        unpacked = _run("dpkg-deb", "-R", deb, tree)
        self.assertEqual(unpacked.returncode, 0, unpacked.stderr)
        control = os.path.join(tree, "DEBIAN", "control")
        with open(control) as f:
            text = f.read()
        self.assertIn("\nVersion: 0.1.0\n", text)
        with open(control, "w") as f:
            f.write(text.replace("\nVersion: 0.1.0\n", f"\nVersion: {UPGRADE_VERSION}\n"))
        upgraded = os.path.join(directory, f"edgegw_{UPGRADE_VERSION}_amd64.deb")
        built = _run("dpkg-deb", "--root-owner-group", "-Zgzip", "-b", tree, upgraded)
        self.assertEqual(built.returncode, 0, built.stderr)
        shutil.rmtree(tree)
        return upgraded

    def test_install_upgrade_remove_purge(self) -> None:
        deb = _package()
        directory = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(directory, "mounts"))
        upgraded = self.upgrade_package(deb, directory)
        script = os.path.join(directory, "life-cycle.sh")
        with open(script, "w") as f:
            # The two packages, as the sandbox names them (copied into /sandbox).
            f.write(f"set -- {os.path.basename(deb)} {os.path.basename(upgraded)}\n")
            f.write(LIFE_CYCLE)
        argv = [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            SANDBOX,
            os.path.join(directory, "mounts"),
            script,
            deb,
            upgraded,
        ]
        run = subprocess.run(
            _as_root(argv), capture_output=True, text=True, timeout=600, check=False
        )
        output = run.stdout + run.stderr
        if run.returncode != 0 and os.geteuid() != 0 and "sudo" in run.stderr:
            self.fail(
                "the package life-cycle test needs root for its throwaway mount namespace: "
                f"run `make test` as root, or allow `sudo -n`\n{output}"
            )
        self.assertEqual(run.returncode, 0, output)
        found = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)

        self.assertEqual(found["installed"], "install ok installed 0.1.0", output)
        self.assertEqual(found["user"], "edgegw:/usr/sbin/nologin")
        self.assertEqual(found["group"], "edgegw")
        self.assertEqual(
            found["conffiles"].split(),
            ["/etc/edgegw/00-gateway.yaml", "/etc/edgegw/10-routes.yaml"],
        )
        self.assertIn("edgegw.socket", found["enabled"].split())
        self.assertGreater(int(found["bytecode"]), 100)  # compiled by postinst
        self.assertEqual(found["check"], "0")
        self.assertEqual(found["cache_rewritten"], "no")

        self.assertEqual(found["upgraded"], f"install ok installed {UPGRADE_VERSION}")
        self.assertEqual(found["edit_kept"], "1")
        self.assertEqual(found["check_after_upgrade"], "0")

        self.assertEqual(found["removed"], "deinstall ok config-files")
        self.assertEqual(found["kept_after_remove"].split(), ["00-gateway.yaml", "10-routes.yaml"])
        self.assertEqual(found["bytecode_after_remove"], "0")  # prerm removed it

        self.assertEqual(found["purged"].strip(), "gone")
        self.assertEqual(found["leftovers"].strip(), "")
