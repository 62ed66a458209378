"""
The C{edgegw} command line: C{edgegw check PATH} validates a configuration and prints
its route table; C{edgegw reload --pid PID} reloads a running daemon and reports whether
it took the configuration (systemd's C{ExecReload}); C{edgegw plugins ...} lists plugins
and installs the manifest's modules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from edgegw.check import check
from edgegw.config.errors import ConfigError
from edgegw.config.parse import load_config
from edgegw.plugins.manifest import install_manifest
from edgegw.plugins.registry import describe_plugins
from edgegw.reload_outcome import request_reload, runtime_directory

DEFAULT_RUNTIME = "/run/edgegw"
"""The runtime directory C{edgegw reload} reads when C{$RUNTIME_DIRECTORY} is not set."""

USAGE = """usage: edgegw check [PATH]
       edgegw reload --pid PID [--runtime-directory DIR] [--timeout SECONDS]
       edgegw plugins list
       edgegw plugins install PATH [PIP-OPTION...]

check    Validate the configuration at PATH (a YAML file or a directory of them;
         default /etc/edgegw), print the effective route table, and exit 0 if it is
         usable or 1 if not.
reload   Send SIGHUP to the daemon PID and wait for the outcome of a reload that began
         after it (its record in DIR, default $RUNTIME_DIRECTORY or /run/edgegw); exit
         0 once the new configuration serves, or 1 with the reason on stderr (refused:
         the located errors; no such daemon, no record, the daemon exited, no outcome
         within SECONDS: by default twice the daemon's warm-up timeout plus 10).
plugins  list: the installed request and response plugins.
         install: install the Gateway's plugin manifest (spec.plugins) into this
         environment with pip (options such as --no-index --find-links DIR are passed
         on), then verify every entry; exit 0 when all are satisfied.

To serve, run: twistd -n edgegw --config PATH
"""


def main(argv: Sequence[str] | None = None) -> int:
    """
    The C{edgegw} command line.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    if args[:1] == ["check"] and len(args) <= 2:
        return check(args[1] if len(args) == 2 else "/etc/edgegw")
    if args[:1] == ["reload"]:
        return reload_command(args[1:])
    if args[:2] == ["plugins", "list"] and len(args) == 2:
        sys.stdout.write(describe_plugins())
        return 0
    if args[:2] == ["plugins", "install"] and len(args) >= 3:
        try:
            config = load_config(args[2])
        except ConfigError as e:
            sys.stderr.write(f"edgegw: {e.render()}\n")
            return 1
        return install_manifest(config.gateway, args[3:], sys.stdout)
    sys.stderr.write(USAGE)
    return 2


def reload_command(args: Sequence[str]) -> int:
    """
    C{edgegw reload --pid PID [--runtime-directory DIR] [--timeout SECONDS]}
    (L{request_reload}); a malformed command line exits 2 with the usage.
    """
    options: dict[str, str] = {}
    rest = list(args)
    while len(rest) >= 2 and rest[0] in ("--pid", "--runtime-directory", "--timeout"):
        options[rest[0]] = rest[1]
        rest = rest[2:]
    try:
        if rest or "--pid" not in options:
            raise ValueError
        pid = int(options["--pid"])
        timeout = float(options["--timeout"]) if "--timeout" in options else None
        if pid <= 1 or (timeout is not None and not timeout > 0):
            raise ValueError
    except ValueError:
        sys.stderr.write(USAGE)
        return 2
    directory = options.get("--runtime-directory") or runtime_directory() or DEFAULT_RUNTIME
    return request_reload(pid, directory, timeout)


if __name__ == "__main__":
    sys.exit(main())
