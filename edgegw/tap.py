"""
The twistd plugin's options and service factory: C{twistd -n edgegw --config PATH}.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.application.service import IService
from twisted.python import usage

from edgegw.config.errors import ConfigError
from edgegw.config.parse import load_config

DEFAULT_CONFIG = "/etc/edgegw"


class Options(usage.Options):
    """
    Command-line options of C{twistd edgegw}.
    """

    synopsis = "[--config PATH] [--check]"
    longdesc = (
        "Serve the edge gateway configured by the YAML resources at PATH (a file, or a "
        "directory read in lexical order over its .yaml and .yml files)."
    )
    optParameters = [
        ["config", "c", DEFAULT_CONFIG, "Configuration file or directory."],
    ]
    optFlags = [
        ["check", None, "Validate the configuration, print the route table and exit."],
    ]


def makeService(options: Options | dict[str, Any]) -> IService:
    """
    Load the configuration and build the gateway's service tree (L{build_service}).

    A configuration error is printed without a traceback and exits with status 1;
    C{--check} exits 0 or 1 after printing.
    """
    from twisted.internet import reactor

    from edgegw.service import build_service

    source = options["config"]
    if options.get("check"):
        from edgegw.check import check

        raise SystemExit(check(source))
    try:
        return build_service(load_config(source), reactor)
    except ConfigError as e:
        sys.stderr.write(f"edgegw: {e.render()}\n")
        raise SystemExit(1) from None
