"""
C{python -m edgegw check PATH}: validate a configuration and print its route table.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from edgegw.check import check

USAGE = """usage: edgegw check [PATH]

Validate the configuration at PATH (a YAML file or a directory of them; default
/etc/edgegw), print the effective route table, and exit 0 if it is usable or 1 if not.
To serve, run: twistd -n edgegw --config PATH
"""


def main(argv: Sequence[str] | None = None) -> int:
    """
    The C{edgegw} command line.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]) or not args or args[0] != "check" or len(args) > 2:
        sys.stderr.write(USAGE)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    return check(args[1] if len(args) == 2 else "/etc/edgegw")


if __name__ == "__main__":
    sys.exit(main())
