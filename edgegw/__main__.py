"""
The C{edgegw} command line: C{edgegw check PATH} validates a configuration and prints
its route table; C{edgegw plugins ...} lists plugins and installs the manifest's modules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from edgegw.check import check
from edgegw.config.errors import ConfigError
from edgegw.config.parse import load_config
from edgegw.plugins.manifest import install_manifest
from edgegw.plugins.registry import describe_plugins

USAGE = """usage: edgegw check [PATH]
       edgegw plugins list
       edgegw plugins install PATH [PIP-OPTION...]

check    Validate the configuration at PATH (a YAML file or a directory of them;
         default /etc/edgegw), print the effective route table, and exit 0 if it is
         usable or 1 if not.
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


if __name__ == "__main__":
    sys.exit(main())
