"""
The Debian package C{make deb} builds (C{make test} builds it first): its files,
conffiles, units and maintainer scripts, lintian's verdict, and the bundled virtual
environment checking the packaged configuration.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

from twisted.trial.unittest import SynchronousTestCase

from tests.support.processes import REPO_ROOT

VENV = "opt/venvs/edgegw"
SITE = f"{VENV}/lib/python3.11/site-packages"


def _package() -> str:
    found = sorted(glob.glob(os.path.join(REPO_ROOT, "build", "deb", "edgegw_*.deb")))
    if not found:
        raise AssertionError("no package in build/deb: run `make deb` (make test does)")
    return found[-1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    # Nothing of this interpreter's setup (trial's workers get a PYTHONPATH naming its
    # libraries): the packaged environment runs on Debian's python3.11 alone.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=120, check=False, env=env
    )


class PackageTests(SynchronousTestCase):
    """
    build/deb/edgegw_*.deb, read with dpkg-deb.
    """

    def setUp(self) -> None:
        self.deb = _package()

    def contents(self) -> dict[str, str]:
        """
        Path (without the leading C{./}) to the listing's mode column (C{l} for links,
        with the target after C{ -> }).
        """
        listing = _run("dpkg-deb", "--contents", self.deb)
        self.assertEqual(listing.returncode, 0, listing.stderr)
        entries = {}
        for line in listing.stdout.splitlines():
            fields = line.split(None, 5)
            path = fields[5].removeprefix("./").rstrip("/")
            target = ""
            if " -> " in path:
                path, target = path.split(" -> ", 1)
            entries[path] = fields[0][0] + (f" -> {target}" if target else "")
        return entries

    def test_files(self) -> None:
        entries = self.contents()
        for path in (
            "etc/edgegw/00-gateway.yaml",
            "etc/edgegw/10-routes.yaml",
            "lib/systemd/system/edgegw.service",
            "lib/systemd/system/edgegw.socket",
            "lib/systemd/system/edgegw@.service",
            "lib/systemd/system/edgegw-workers.socket",
            "usr/lib/sysusers.d/edgegw.conf",
            "usr/share/man/man1/edgegw.1.gz",
            "usr/share/doc/edgegw/copyright",
            "usr/share/doc/edgegw/README.md",
            "usr/share/doc/edgegw/examples/edgegw/00-gateway.yaml",
            f"{VENV}/bin/twistd",
            f"{VENV}/bin/edgegw",
            f"{SITE}/edgegw/assembly/assemble.py",
            f"{SITE}/twisted/plugins/edgegw_plugin.py",
            f"{SITE}/twisted/plugins/dropin.cache",
        ):
            self.assertEqual(entries.get(path, "missing")[0], "-", path)
        self.assertEqual(entries["usr/bin/edgegw"], f"l -> /{VENV}/bin/edgegw")
        self.assertEqual(entries["usr/bin/twistd"], f"l -> /{VENV}/bin/twistd")
        self.assertEqual(entries[f"{VENV}/bin/python3.11"], "l -> /usr/bin/python3.11")
        # Byte-code is compiled at install, never shipped.
        self.assertEqual([path for path in entries if "__pycache__" in path], [])

    def test_control(self) -> None:
        depends = _run("dpkg-deb", "--field", self.deb, "Depends").stdout
        self.assertIn("python3.11", depends)
        self.assertIn("libc6", depends)
        extracted = os.path.abspath(self.mktemp())
        self.assertEqual(_run("dpkg-deb", "--control", self.deb, extracted).returncode, 0)
        with open(os.path.join(extracted, "conffiles"), encoding="utf-8") as stream:
            self.assertEqual(
                stream.read().split(), ["/etc/edgegw/00-gateway.yaml", "/etc/edgegw/10-routes.yaml"]
            )
        with open(os.path.join(extracted, "postinst"), encoding="utf-8") as stream:
            postinst = stream.read()
        # The user exists before systemd starts the socket and the service.
        self.assertLess(postinst.index("systemd-sysusers"), postinst.index("deb-systemd-helper"))
        self.assertIn("enable 'edgegw.socket'", postinst)
        self.assertIn("compileall", postinst)
        with open(os.path.join(extracted, "postrm"), encoding="utf-8") as stream:
            self.assertIn("rm -rf /var/log/edgegw", stream.read())
        with open(os.path.join(extracted, "prerm"), encoding="utf-8") as stream:
            prerm = stream.read()
        self.assertIn("__pycache__", prerm)
        # Removal stops the service and the worker processes, not only the socket.
        self.assertIn("deb-systemd-invoke stop edgegw.service edgegw-workers.socket", prerm)

    def test_lintian_is_clean(self) -> None:
        lintian = shutil.which("lintian")
        if lintian is None:
            raise AssertionError("lintian is missing: make test installs it")
        result = _run(lintian, "--fail-on", "error,warning", self.deb)
        tags = [line for line in result.stdout.splitlines() if line[:2] in ("E:", "W:")]
        self.assertEqual((result.returncode, tags), (0, []))

    def test_bundled_environment_checks_the_packaged_configuration(self) -> None:
        root = os.path.abspath(self.mktemp())
        self.assertEqual(_run("dpkg-deb", "--extract", self.deb, root).returncode, 0)
        python = os.path.join(root, VENV, "bin", "python")
        result = _run(python, "-m", "edgegw", "check", os.path.join(root, "etc", "edgegw"))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("is valid: 2 file(s), 1 route(s), listening on systemd:", result.stdout)
        plugins = _run(python, "-m", "edgegw", "plugins", "list")
        self.assertIn("headers", plugins.stdout)
        # pip never writes into the package's environment.
        wants = os.path.abspath(self.mktemp())
        os.makedirs(wants)
        with open(os.path.join(wants, "gateway.yaml"), "w") as f:
            f.write("kind: Gateway\nmetadata: {name: gw}\nspec: {plugins: [acme_absent]}\n")
        refused = _run(python, "-m", "edgegw", "plugins", "install", wants, "--no-index")
        self.assertEqual(refused.returncode, 1, refused.stdout + refused.stderr)
        self.assertIn("belongs to the Debian package edgegw", refused.stdout)
        self.assertNotIn("pip install", refused.stdout)
        # Twisted's plugin cache is newer than every plugin module (dpkg keeps the
        # package's times): an unprivileged daemon never needs to write it.
        plugin_dir = os.path.join(root, SITE, "twisted", "plugins")
        cache = os.path.getmtime(os.path.join(plugin_dir, "dropin.cache"))
        modules = glob.glob(os.path.join(plugin_dir, "*.py"))
        self.assertTrue(modules)
        self.assertTrue(all(os.path.getmtime(module) < cache for module in modules))

    def test_bundled_versions_are_the_pinned_ones(self) -> None:
        root = os.path.abspath(self.mktemp())
        self.assertEqual(_run("dpkg-deb", "--extract", self.deb, root).returncode, 0)
        site = os.path.join(root, SITE)
        bundled = {}
        for info in glob.glob(os.path.join(site, "*.dist-info")):
            name, version = os.path.basename(info).removesuffix(".dist-info").rsplit("-", 1)
            bundled[_normalise(name)] = version
        with open(os.path.join(REPO_ROOT, "debian", "constraints.txt")) as f:
            pinned = {
                _normalise(name): version
                for name, version in (
                    line.strip().split("==") for line in f if line.strip()[:1].isalnum()
                )
            }
        self.assertTrue(pinned)
        for name, version in pinned.items():
            self.assertEqual(bundled.get(name), version, name)
        # Every bundled distribution is pinned, but for the gateway and the venv's own.
        self.assertEqual(set(bundled) - set(pinned), {"edgegw", "pip", "setuptools"})
        # Nothing names the build directory (pip's direct_url.json did).
        found = _run("grep", "-rlI", "build/deb/src", os.path.join(root, VENV))
        self.assertEqual(found.stdout, "")


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
