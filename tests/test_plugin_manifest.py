"""
The Gateway's plugin manifest (C{spec.plugins}, C{<import-path>[@version]}) as operators
meet it: C{edgegw check} and startup refuse an entry that is malformed, not installed or
at another version, located at its C{spec.plugins[i]}; a plugin resource naming a plugin
nothing installs is refused at C{spec.plugin}; and C{edgegw plugins install CONFIG}
installs the missing or mismatched modules with pip, offline, into the gateway's own
environment (a real, separate one here) from wheels the tests build by hand.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, distribution, version
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.check import check
from edgegw.config.errors import ConfigError
from edgegw.config.parse import load_config
from edgegw.config.plugin_refs import ManifestEntry
from edgegw.plugins.manifest import PACKAGED_MARKER, install_manifest, requirement
from edgegw.plugins.registry import plugin_names
from tests.support.backends import SiteBackend
from tests.support.configs import GATEWAY, write_tree
from tests.support.daemons import TwistdOutput
from tests.support.processes import REPO_ROOT, edgegw_twistd_args, http_get, kill
from tests.support.wheels import (
    ACME_DISTRIBUTION,
    ACME_HEADER,
    ACME_PLUGIN,
    acme_edge_wheel,
    build_wheel,
    record_hash,
)

# The test environment's own site-packages (where Twisted, pip and edgegw's metadata are).
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
INSTALL_HINT = "(install it with: edgegw plugins install CONFIG)"


def gateway(entries: Sequence[object]) -> str:
    """
    The Gateway document of L{GATEWAY} with C{entries} as its manifest (JSON being
    YAML's flow style).
    """
    return GATEWAY + f"  plugins: {json.dumps(list(entries))}\n"


def run_check(root: str) -> tuple[int, str, str]:
    """
    C{edgegw check root}, in this process: the exit status, stdout and stderr.
    """
    out, err = io.StringIO(), io.StringIO()
    code = check(root, out, err)
    return code, out.getvalue(), err.getvalue()


def located(root: str, document: int, where: str, message: str) -> str:
    """
    A problem of C{root}/a.yaml as C{edgegw check} prints it.
    """
    return f"{root}/a.yaml, document {document}, {where}: {message}"


class ManifestCheckTests(SynchronousTestCase):
    """
    C{edgegw check} (which builds the gateway as startup does) refuses a manifest entry
    that is not installed, at another version, or malformed; the error is located at the
    entry, and nothing else is printed.
    """

    def check_manifest(self, entries: Sequence[object]) -> tuple[str, int, str, str]:
        root = write_tree(self.mktemp(), {"a.yaml": gateway(entries)})
        return (root, *run_check(root))

    def test_missing_module(self) -> None:
        root, code, out, err = self.check_manifest(
            ["edgegw", "acme_missing.plugins@1.0.0", "edgegw.plugins.nope", "json"]
        )
        self.assertEqual((code, out), (1, ""))
        self.assertIn("configuration has 2 errors", err)
        for index, module in ((1, "acme_missing.plugins"), (2, "edgegw.plugins.nope")):
            self.assertIn(
                located(
                    root,
                    1,
                    'Gateway "gw"',
                    f"spec.plugins[{index}]: module {module} is not installed {INSTALL_HINT}",
                ),
                err,
            )
        self.assertNotIn("spec.plugins[0]", err)
        self.assertNotIn("spec.plugins[3]", err)

    def test_version_mismatch_names_both_versions(self) -> None:
        # The module's distribution is found from its top-level package (yaml: PyYAML),
        # and the leading "v" of the asked version is dropped.
        have = version("PyYAML")
        root, code, out, err = self.check_manifest(["yaml@v5.0"])
        self.assertEqual((code, out), (1, ""))
        self.assertIn(
            located(
                root,
                1,
                'Gateway "gw"',
                f"spec.plugins[0]: module yaml is installed at another version (PyYAML {have}); "
                f"the manifest asks for 5.0 {INSTALL_HINT}",
            ),
            err,
        )

    def test_version_of_a_module_without_distribution(self) -> None:
        # json is importable but no distribution has it: its version cannot be checked.
        root, code, out, err = self.check_manifest(["json", "json@1.0"])
        self.assertEqual((code, out), (1, ""))
        self.assertIn(
            located(
                root,
                1,
                'Gateway "gw"',
                "spec.plugins[1]: module json belongs to no installed distribution, so its "
                "version cannot be checked against 1.0",
            ),
            err,
        )
        self.assertNotIn("spec.plugins[0]", err)

    def test_satisfied_entries_pass(self) -> None:
        entries = [
            "edgegw",
            f"edgegw.plugins.headers@{version('edgegw')}",
            f"twisted@{version('Twisted')}",
            f"yaml@v{version('PyYAML')}",
            "json",
        ]
        root, code, out, err = self.check_manifest(entries)
        self.assertEqual((code, err), (0, ""))
        self.assertIn(f"configuration {root} is valid", out)

    def test_malformed_entries(self) -> None:
        for entry in ("example.com/x@v1", "a..b", "x@", "@1.0", "acme edge", "1acme", ""):
            root, code, out, err = self.check_manifest(["edgegw", entry])
            self.assertEqual((code, out), (1, ""), entry)
            self.assertIn(
                located(
                    root,
                    1,
                    'Gateway "gw"',
                    f'spec.plugins[1]: "{entry}" is not <import-path>[@version] '
                    '(such as "acme_edge.plugins@1.2.0")',
                ),
                err,
                entry,
            )
            self.assertIn("configuration has 1 error:", err, entry)

    def test_entry_that_is_not_a_string(self) -> None:
        root, code, out, err = self.check_manifest(["edgegw", 12])
        self.assertEqual((code, out), (1, ""))
        self.assertIn(
            located(root, 1, 'Gateway "gw"', "spec.plugins[1]: expected a string, got an integer"),
            err,
        )

    def test_startup_refuses_an_unsatisfied_manifest(self) -> None:
        # What twistd builds at startup: the service tree, from the loaded configuration.
        from twisted.internet.task import Clock

        from edgegw.service import build_service

        root = write_tree(self.mktemp(), {"a.yaml": gateway(["edgegw", "acme_missing@1.0"])})
        config = load_config(root)
        with self.assertRaises(ConfigError) as raised:
            build_service(config, Clock())
        self.assertEqual(
            [str(problem) for problem in raised.exception.problems],
            [
                located(
                    root,
                    1,
                    'Gateway "gw"',
                    f"spec.plugins[1]: module acme_missing is not installed {INSTALL_HINT}",
                )
            ],
        )

    def test_command_line(self) -> None:
        # The command operators run: the message on stderr, exit status 1.
        root = write_tree(self.mktemp(), {"a.yaml": gateway(["acme_missing.plugins@v2"])})
        result = subprocess.run(
            [sys.executable, "-m", "edgegw", "check", root],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            check=False,
        )
        self.assertEqual((result.returncode, result.stdout), (1, ""), result.stderr)
        self.assertEqual(
            result.stderr,
            "edgegw: configuration has 1 error:\n  "
            + located(
                root,
                1,
                'Gateway "gw"',
                f"spec.plugins[0]: module acme_missing.plugins is not installed {INSTALL_HINT}",
            )
            + "\n",
        )


class UnknownPluginTests(SynchronousTestCase):
    """
    A RequestPlugin or ResponsePlugin resource naming a plugin that no installed
    distribution registers is refused at its C{spec.plugin}, with the installed names.
    """

    def test_unknown_plugin(self) -> None:
        installed = plugin_names()
        self.assertIn("body-limit", installed)
        self.assertIn("headers", installed)
        root = write_tree(
            self.mktemp(),
            {
                "a.yaml": GATEWAY
                + f"""\
---
kind: RequestPlugin
metadata: {{name: stamp}}
spec: {{plugin: {ACME_PLUGIN}, config: {{value: x}}}}
---
kind: ResponsePlugin
metadata: {{name: rewriter}}
spec: {{config: {{}}}}
---
kind: RequestPlugin
metadata: {{name: limit}}
spec: {{plugin: body-limit, config: {{maxBytes: 10}}}}
---
kind: Route
metadata: {{name: r}}
spec: {{match: GET /, handler: {{type: health}}}}
"""
            },
        )
        code, out, err = run_check(root)
        self.assertEqual((code, out), (1, ""))
        names = ", ".join(installed)
        self.assertIn("configuration has 2 errors", err)
        self.assertIn(
            located(
                root,
                2,
                'RequestPlugin "stamp"',
                f'spec.plugin: no plugin "{ACME_PLUGIN}" is installed (installed: {names})',
            ),
            err,
        )
        # Without spec.plugin, the resource's name is the plugin's.
        self.assertIn(
            located(
                root,
                3,
                'ResponsePlugin "rewriter"',
                f'spec.plugin: no plugin "rewriter" is installed (installed: {names})',
            ),
            err,
        )


class InstallManifestTests(SynchronousTestCase):
    """
    L{install_manifest} with the pip command line recorded instead of run: what it asks
    pip for, and what it reports.
    """

    def install(
        self, entries: Sequence[str], returncode: int = 0, prefix: str = sys.prefix
    ) -> tuple[int, str, list[Any]]:
        root = write_tree(self.mktemp(), {"a.yaml": gateway(entries)})
        commands: list[Any] = []

        def run(command: list[str]) -> subprocess.CompletedProcess[bytes]:
            commands.append(command)
            return subprocess.CompletedProcess(command, returncode)

        out = io.StringIO()
        options = ["--no-index", "-f", "/w"]
        code = install_manifest(load_config(root).gateway, options, out, run, prefix)
        return code, out.getvalue(), commands

    def test_asks_pip_for_what_is_missing_or_mismatched(self) -> None:
        code, out, commands = self.install(
            ["json", "yaml@v5.0", "acme_missing_x.plugins@v1.0", "edgegw", "acme_other"]
        )
        # The installed distribution (PyYAML, not "yaml") at the asked version; for a
        # missing module, its top-level package's name with "-" for "_".
        wanted = ["PyYAML==5.0", "acme-missing-x==1.0", "acme-other"]
        pip = [sys.executable, "-m", "pip", "install", "--no-index", "-f", "/w", *wanted]
        self.assertEqual(commands, [pip])
        self.assertEqual(code, 1)  # nothing was installed
        lines = out.splitlines()
        self.assertEqual(lines[0], "edgegw: " + " ".join(pip))
        self.assertEqual(lines[1], "  ok       json")
        self.assertTrue(lines[2].startswith("  missing  yaml@5.0: module yaml is installed at"))
        self.assertEqual(
            lines[3],
            "  missing  acme_missing_x.plugins@1.0: module acme_missing_x.plugins is not "
            f"installed {INSTALL_HINT}",
        )
        self.assertEqual(lines[4], f"  ok       edgegw (edgegw {version('edgegw')})")
        self.assertTrue(lines[5].startswith("  missing  acme_other: module acme_other is not"))
        self.assertEqual(len(lines), 6)

    def test_nothing_to_install(self) -> None:
        code, out, commands = self.install(["edgegw", f"twisted@{version('Twisted')}"])
        self.assertEqual((code, commands), (0, []))
        self.assertIn(f"  ok       edgegw (edgegw {version('edgegw')})\n", out)
        self.assertNotIn("pip", out)

    def test_empty_manifest(self) -> None:
        code, out, commands = self.install([])
        self.assertEqual(
            (code, out, commands), (0, "edgegw: the Gateway lists no plugin modules\n", [])
        )

    def test_never_into_the_debian_package_environment(self) -> None:
        prefix = os.path.abspath(self.mktemp())
        os.makedirs(os.path.dirname(os.path.join(prefix, PACKAGED_MARKER)))
        with open(os.path.join(prefix, PACKAGED_MARKER), "w") as f:
            f.write("edgegw\n")
        code, out, commands = self.install(["edgegw", "acme_missing"], prefix=prefix)
        self.assertEqual((code, commands), (1, []))
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith(f"edgegw: not installing into {prefix}: it belongs"))
        self.assertIn("Debian package", lines[0])
        self.assertEqual(lines[1], f"  ok       edgegw (edgegw {version('edgegw')})")
        self.assertTrue(lines[2].startswith("  missing  acme_missing: module acme_missing is"))
        # Nothing missing: nothing to refuse.
        code, out, commands = self.install(["edgegw"], prefix=prefix)
        self.assertEqual((code, commands), (0, []))

    def test_pip_failure(self) -> None:
        code, out, commands = self.install(["acme_missing"], returncode=1)
        self.assertEqual(code, 1)
        self.assertEqual(len(commands), 1)
        self.assertTrue(out.endswith("edgegw: pip failed; nothing more was checked\n"), out)
        self.assertNotIn("  ok", out)


class WheelTests(SynchronousTestCase):
    """
    The hand-built wheel is one pip accepts: it is checked here as pip checks it.
    """

    def test_record_lists_every_file_with_its_hash_and_size(self) -> None:
        import zipfile

        path = acme_edge_wheel(self.mktemp(), "1.2.0")
        self.assertEqual(os.path.basename(path), "acme_edge-1.2.0-py3-none-any.whl")
        with zipfile.ZipFile(path) as wheel:
            names = set(wheel.namelist())
            record = wheel.read("acme_edge-1.2.0.dist-info/RECORD").decode().splitlines()
            listed = set()
            for line in record:
                name, digest, size = line.rsplit(",", 2)
                listed.add(name)
                if name.endswith("/RECORD"):
                    self.assertEqual((digest, size), ("", ""))
                    continue
                data = wheel.read(name)
                self.assertEqual((digest, int(size)), (record_hash(data), len(data)))
            self.assertEqual(listed, names)
            self.assertIn(
                f"[edgegw.plugins]\n{ACME_PLUGIN} = acme_edge.plugin:plugin\n",
                wheel.read("acme_edge-1.2.0.dist-info/entry_points.txt").decode(),
            )
            self.assertIn(
                "Name: acme-edge\nVersion: 1.2.0\n",
                wheel.read("acme_edge-1.2.0.dist-info/METADATA").decode(),
            )

    def test_record_hash(self) -> None:
        # The example of the binary distribution format's RECORD: sha256 of b"", URL-safe
        # base64, no padding.
        self.assertEqual(record_hash(b""), "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU")

    def test_names_are_normalized(self) -> None:
        path = build_wheel(self.mktemp(), "Acme.Edge--Extra", "0.1", {"m.py": ""})
        self.assertEqual(os.path.basename(path), "Acme_Edge_Extra-0.1-py3-none-any.whl")


# -- a separate environment -------------------------------------------------------------


class Environment:
    """
    A new virtual environment (no pip of its own) that sees the test environment's
    packages behind its own, as if edgegw, Twisted and pip were installed in it: what
    pip installs goes into it alone.

    @ivar python: Its interpreter.
    @ivar site_packages: Its own site-packages.
    """

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)
        self.python = os.path.join(self.directory, "bin", "python")
        self.site_packages = sysconfig.get_paths(
            vars={"base": self.directory, "platbase": self.directory}
        )["purelib"]
        # Run from a directory of its own: never from the checkout, whose edgegw would
        # otherwise come first on sys.path whatever the environment holds.
        self.cwd = os.path.join(self.directory, "work")
        environ = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))
        }
        self.environ = {
            **environ,
            # No pip configuration file, index or find-links of this machine: offline,
            # only what the test passes.
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
            "PIP_NO_CACHE_DIR": "1",
            "PYTHONNOUSERSITE": "1",
        }

    def create(self) -> None:
        """
        C{python -m venv --without-pip}, with the test environment's interpreter, and a
        C{.pth} file that adds the test environment's site-packages.

        The C{.pth} line is C{site.addsitedir(...)}, not a bare path: a path line puts a
        directory on C{sys.path}, but C{site} processes the C{.pth} files only of site
        directories, so the editable install of edgegw (C{__editable__.edgegw-*.pth},
        which adds the checkout, whose C{edgegw/} and C{twisted/plugins/edgegw_plugin.py}
        are imported from there) and C{.venv-oldest}'s namespace C{.pth} for zope would
        be skipped: C{edgegw} would not import outside the checkout. C{addsitedir}
        processes them whatever form the editable install takes. edgegw's own entry
        points (its plugins, its state provider) come from its C{.dist-info} in that
        site-packages (and C{edgegw.egg-info} in the checkout). The directories are
        appended after this environment's own site-packages, so what pip installs here
        comes first, and pip, whose C{sys.prefix} is this environment, installs and
        uninstalls here only.
        """
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", self.directory],
            check=True,
            capture_output=True,
        )
        with open(os.path.join(self.site_packages, "_edgegw_tests.pth"), "w") as pth:
            pth.write(f"import site; site.addsitedir({SITE_PACKAGES!r})\n")
        os.makedirs(self.cwd)

    async def run(self, *args: str) -> tuple[int, str, str]:
        """
        C{python args...} in this environment: the exit status, stdout and stderr.
        """
        out, err, code = await getProcessOutputAndValue(
            self.python, args, env=self.environ, path=self.cwd
        )
        return code, out.decode(), err.decode()

    def edgegw(self, *args: str) -> Deferred[tuple[int, str, str]]:
        """
        C{python -m edgegw args...} in this environment.
        """
        return Deferred.fromCoroutine(self.run("-m", "edgegw", *args))

    def installed(self) -> list[str]:
        """
        What this environment's own site-packages holds, less its C{.pth} file.
        """
        return sorted(set(os.listdir(self.site_packages)) - {"_edgegw_tests.pth", "__pycache__"})


def plugin_config(root: str, entries: Sequence[str], upstream_port: int = 9) -> str:
    """
    Write, under C{root}, a Gateway with the manifest C{entries}, the acme-stamp
    RequestPlugin resource and the C{api} route (a reverse proxy to C{upstream_port})
    it selects; return C{root}.
    """
    return write_tree(
        root,
        {
            "a.yaml": gateway(entries)
            + f"""\
---
kind: RequestPlugin
metadata: {{name: stamp}}
spec:
  plugin: {ACME_PLUGIN}
  selector: {{matchLabels: {{tier: api}}}}
---
kind: Route
metadata: {{name: api, labels: {{tier: api}}}}
spec:
  match: GET /api/
  access: {{auth: public}}
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{upstream_port}", stripPrefix: /api}}
---
kind: Route
metadata: {{name: health}}
spec: {{match: GET /healthz, handler: {{type: health}}}}
""",
        },
    )


class InstallIntoAnEnvironmentTests(TestCase):
    """
    C{edgegw plugins install CONFIG --no-index --find-links WHEELHOUSE}, run by a new
    environment's interpreter, installs real wheels (acme-edge 1.0.0 and 1.2.0, built by
    hand) into that environment alone; C{edgegw check}, C{edgegw plugins list} and the
    served gateway there then see the plugin.
    """

    def setUp(self) -> None:
        self.wheelhouse = os.path.abspath(self.mktemp())
        for release in ("1.0.0", "1.2.0"):
            acme_edge_wheel(self.wheelhouse, release)
        self.env = Environment(self.mktemp())
        self.env.create()
        self.config = os.path.abspath(self.mktemp())

    def install(self) -> Deferred[tuple[int, str, str]]:
        return self.env.edgegw(
            "plugins", "install", self.config, "--no-index", "--find-links", self.wheelhouse
        )

    def assertNotInTestEnvironment(self) -> None:
        importlib.invalidate_caches()
        self.assertIsNone(importlib.util.find_spec("acme_edge"))
        self.assertRaises(PackageNotFoundError, distribution, ACME_DISTRIBUTION)
        self.assertNotIn(ACME_PLUGIN, plugin_names())
        self.assertEqual([n for n in os.listdir(SITE_PACKAGES) if "acme" in n.lower()], [])

    async def test_install_check_and_list(self) -> None:
        plugin_config(self.config, ["acme_edge@v1.2.0"])
        # Before: the new environment has edgegw (and its plugins) but not acme-edge.
        self.assertEqual(self.env.installed(), [])
        code, out, err = await self.env.edgegw("check", self.config)
        self.assertEqual((code, out), (1, ""), err)
        self.assertIn(
            f'Gateway "gw": spec.plugins[0]: module acme_edge is not installed {INSTALL_HINT}',
            err,
        )
        self.assertIn(f'RequestPlugin "stamp": spec.plugin: no plugin "{ACME_PLUGIN}"', err)
        code, out, err = await self.env.edgegw("plugins", "list")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"(?m)^headers\s+RequestPlugin,ResponsePlugin\s")
        self.assertNotIn(ACME_PLUGIN, out)

        code, out, err = await self.install()
        self.assertEqual(code, 0, out + err)
        self.assertIn(
            f"edgegw: {self.env.python} -m pip install --no-index --find-links "
            f"{self.wheelhouse} acme-edge==1.2.0\n",
            out,
        )
        self.assertIn("\n  ok       acme_edge@1.2.0 (acme-edge 1.2.0)\n", out)
        self.assertEqual(self.env.installed(), ["acme_edge", "acme_edge-1.2.0.dist-info"])
        self.assertNotInTestEnvironment()

        code, out, err = await self.env.edgegw("check", self.config)
        self.assertEqual((code, err), (0, ""))
        self.assertIn(f"configuration {self.config} is valid", out)
        self.assertRegex(
            out,
            r"(?m)^GET /api/\s+api\s+service\s+public\s+-\s+-\s+-\s+stamp\s+-\s+"
            r"reverse-proxy http://127\.0\.0\.1:9 \(strip /api\)$",
        )
        self.assertRegex(out, r"(?m)^GET /healthz\s+health\s+app\s+public(\s+-){5}\s+health$")

        code, out, err = await self.env.edgegw("plugins", "list")
        self.assertEqual(code, 0, err)
        self.assertRegex(
            out,
            rf"(?m)^{ACME_PLUGIN}\s+RequestPlugin\s+"
            r"acme_edge\.plugin:plugin \(acme-edge 1\.2\.0\)$",
        )
        self.assertRegex(out, r"(?m)^body-limit\s+RequestPlugin\s")

        # Installed already: pip is not run again.
        code, out, err = await self.install()
        self.assertEqual(code, 0, out + err)
        self.assertEqual(out, "  ok       acme_edge@1.2.0 (acme-edge 1.2.0)\n")

    async def test_install_moves_to_the_manifest_version(self) -> None:
        plugin_config(self.config, ["acme_edge@1.2.0"])
        code, out, err = await self.install()
        self.assertEqual(code, 0, out + err)
        # The manifest now asks for 1.0.0 (through a submodule of the package).
        plugin_config(self.config, ["edgegw", "acme_edge.plugin@v1.0.0"])
        code, out, err = await self.env.edgegw("check", self.config)
        self.assertEqual((code, out), (1, ""), err)
        self.assertIn(
            f'{self.config}/a.yaml, document 1, Gateway "gw": spec.plugins[1]: module '
            "acme_edge.plugin is installed at another version (acme-edge 1.2.0); the "
            f"manifest asks for 1.0.0 {INSTALL_HINT}",
            err,
        )
        self.assertIn("configuration has 1 error:", err)

        code, out, err = await self.install()
        self.assertEqual(code, 0, out + err)
        self.assertIn(f"{self.wheelhouse} acme-edge==1.0.0\n", out)
        self.assertIn("Successfully installed acme-edge-1.0.0", out)
        self.assertTrue(
            out.endswith(
                f"  ok       edgegw (edgegw {version('edgegw')})\n"
                "  ok       acme_edge.plugin@1.0.0 (acme-edge 1.0.0)\n"
            ),
            out,
        )
        self.assertEqual(self.env.installed(), ["acme_edge", "acme_edge-1.0.0.dist-info"])
        self.assertNotInTestEnvironment()

        # Served there, the gateway runs the 1.0.0 plugin on the route it selects.
        backend = SiteBackend().start()
        self.addCleanup(backend.stop)
        plugin_config(self.config, ["acme_edge.plugin@v1.0.0"], backend.port)
        code, out, err = await self.env.edgegw("check", self.config)
        self.assertEqual(code, 0, err)
        daemon = TwistdOutput()
        process = reactor.spawnProcess(
            daemon,
            self.env.python,
            [
                self.env.python,
                "-c",
                "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()",
                *edgegw_twistd_args(self.config),
            ],
            env=self.env.environ,
            path=self.env.cwd,
        )
        # Cleanups run last first: kill it (if the test failed early), then wait for it.
        self.addCleanup(lambda: daemon.ended)
        self.addCleanup(kill, process)
        port = await daemon.listening
        response = await http_get(f"http://127.0.0.1:{port}/api/hello")
        self.assertEqual((response.code, await response.content()), (200, b"hello"))
        self.assertEqual(len(backend.requests), 1)
        self.assertEqual(backend.requests[0].uri, b"/hello")
        self.assertEqual(backend.requests[0].header(ACME_HEADER.encode()), b"acme-edge/1.0.0")
        health = await http_get(f"http://127.0.0.1:{port}/healthz")
        self.assertEqual(health.code, 200)
        await health.content()
        self.assertEqual(len(backend.requests), 1)
        process.signalProcess("TERM")
        await daemon.ended
        self.assertNotIn(b"Traceback", daemon.output)

    async def test_a_release_not_in_the_wheelhouse(self) -> None:
        for entries, wanted in (
            (["acme_edge@1.2.0", "globex_edge.plugins@2.0.0"], "globex-edge==2.0.0"),
            (["acme_edge@1.1.0"], "acme-edge==1.1.0"),
        ):
            plugin_config(self.config, entries)
            code, out, err = await self.install()
            self.assertEqual(code, 1, out + err)
            self.assertIn(f"--find-links {self.wheelhouse} ", out)
            self.assertIn(f" {wanted}\n", out)
            self.assertTrue(out.endswith("edgegw: pip failed; nothing more was checked\n"), out)
            # pip says which requirement it could not find.
            self.assertIn(f"No matching distribution found for {wanted}", err)
            # pip installs all or nothing: acme-edge 1.2.0 is not installed either.
            self.assertEqual(self.env.installed(), [])
            code, out, err = await self.env.edgegw("check", self.config)
            self.assertEqual(code, 1)
            self.assertIn("spec.plugins[0]: module acme_edge is not installed", err)
        self.assertNotInTestEnvironment()


class NamespacePackageTests(SynchronousTestCase):
    """
    A module is matched to the distribution that ships its own file, not to every
    distribution sharing its top-level package (review of the manifest check).
    """

    def test_version_of_a_sibling_distribution_is_not_accepted(self) -> None:
        """
        zope.event's version does not satisfy an entry for zope.interface.
        """
        event, interface = version("zope.event"), version("zope.interface")
        self.assertNotEqual(event, interface)
        root = write_tree(self.mktemp(), {"a.yaml": gateway([f"zope.interface@{event}"])})
        code, out, err = run_check(root)
        self.assertEqual(code, 1, out)
        self.assertIn(
            "spec.plugins[0]: module zope.interface is installed at another version "
            f"(zope.interface {interface}); the manifest asks for {event}",
            err,
        )

    def test_twisted_at_edgegw_version_is_not_accepted(self) -> None:
        """
        edgegw ships twisted/plugins/edgegw_plugin.py, but its version is not Twisted's.
        """
        root = write_tree(self.mktemp(), {"a.yaml": gateway([f"twisted@{version('edgegw')}"])})
        code, out, err = run_check(root)
        self.assertEqual(code, 1, out)
        self.assertIn(f"(Twisted {version('Twisted')})", err)

    def test_requirement_for_a_missing_namespace_module(self) -> None:
        """
        A missing module under a namespace others share is asked for by its whole
        import path, never as one of the sharing distributions.
        """
        self.assertEqual(
            requirement(ManifestEntry("zope.sqlalchemy", "3.1")), "zope.sqlalchemy==3.1"
        )
        self.assertEqual(requirement(ManifestEntry("acme_edge.plugin", "1.0")), "acme-edge==1.0")
        self.assertEqual(requirement(ManifestEntry("zope.interface", "1.0")), "zope.interface==1.0")


class BrokenPackageTests(SynchronousTestCase):
    """
    A listed module whose parent package fails to import is a located error, not a
    traceback from edgegw check (review of the manifest check).
    """

    def test_failing_parent_package(self) -> None:
        root = os.path.abspath(self.mktemp())
        os.makedirs(os.path.join(root, "boompkg"))
        with open(os.path.join(root, "boompkg", "__init__.py"), "w") as stream:
            stream.write("raise RuntimeError('broken on purpose')\n")
        sys.path.insert(0, root)
        importlib.invalidate_caches()
        self.addCleanup(sys.modules.pop, "boompkg", None)
        self.addCleanup(sys.path.remove, root)
        config = write_tree(self.mktemp(), {"a.yaml": gateway(["boompkg.plug"])})
        code, out, err = run_check(config)
        self.assertEqual(code, 1, out)
        self.assertIn(
            "spec.plugins[0]: module boompkg.plug cannot be imported: RuntimeError: "
            "broken on purpose",
            err,
        )
        self.assertNotIn("Traceback", err)
