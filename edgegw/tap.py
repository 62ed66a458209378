"""
The twistd plugin's options and service factory: C{twistd -n edgegw --config PATH}.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import signal
import sys
from typing import Any

from twisted.application.service import IService
from twisted.python import usage

from edgegw.config.errors import ConfigError
from edgegw.config.parse import load_config

DEFAULT_CONFIG = "/etc/edgegw"
GC_YOUNG_THRESHOLD = 20_000
"""Allocations between collections of the youngest generation (CPython's default: 700)."""

MALLOC_MMAP_THRESHOLD = 1024 * 1024
"""Blocks from this size up get their own mapping from glibc's C{malloc}."""

MALLOC_TRIM_THRESHOLD = 4 * 1024 * 1024
"""Free memory at the top of the heap beyond which glibc gives it back to the kernel."""

# glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


class Options(usage.Options):
    """
    Command-line options of C{twistd edgegw}.
    """

    synopsis = "[--config PATH] [--check] [--runtime-directory DIR]"
    longdesc = (
        "Serve the edge gateway configured by the YAML resources at PATH (a file, or a "
        "directory read in lexical order over its .yaml and .yml files)."
    )
    optParameters = [
        ["config", "c", DEFAULT_CONFIG, "Configuration file or directory."],
        [
            "runtime-directory",
            None,
            None,
            "Where each reload's outcome is written for `edgegw reload` (default: "
            "$RUNTIME_DIRECTORY, which systemd sets; neither: not written).",
        ],
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
    from edgegw.reactor import install_if_unchosen

    install_if_unchosen()
    from twisted.internet import reactor

    from edgegw.generation import open_access_log
    from edgegw.notify import SystemdNotifier
    from edgegw.service import build_service

    source = options["config"]
    if options.get("check"):
        from edgegw.check import check

        raise SystemExit(check(source))
    try:
        service = build_service(load_config(source), reactor, source, SystemdNotifier())
        open_access_log(service.gateway)
    except ConfigError as e:
        sys.stderr.write(f"edgegw: {e.render()}\n")
        raise SystemExit(1) from None
    tune_garbage_collector()
    tune_malloc()
    record_reload_outcomes(service, options.get("runtime-directory"), reactor)
    install_reload_signal(service, reactor)
    return service


def record_reload_outcomes(service: Any, directory: str | None, reactor: Any) -> None:
    """
    Have C{service} write each reload's outcome in C{directory} (or
    C{$RUNTIME_DIRECTORY}) for C{edgegw reload}: the record is named after the serving
    process, so it is written once the reactor runs, and removed when it stops.
    """
    from edgegw.reload_outcome import OutcomeRecord, runtime_directory

    directory = directory or runtime_directory()
    if directory is None:
        return
    service.outcomes = outcomes = OutcomeRecord(directory, service.warm_up_bound)
    reactor.callWhenRunning(outcomes.start)
    reactor.addSystemEventTrigger("after", "shutdown", outcomes.remove)


def install_reload_signal(service: Any, reactor: Any) -> None:
    """
    Reload the configuration on SIGHUP (systemd's C{ExecReload}): the handler only asks
    the reactor, which runs the reload between two events.
    """

    def handler(signum: int, frame: object) -> None:
        reactor.callFromThread(reload_and_refreeze, service)

    signal.signal(signal.SIGHUP, handler)


def reload_and_refreeze(service: Any) -> Any:
    """
    Reload C{service}, with the collector able to free what the reload replaces.

    The serving gateway was frozen out of the collector's sight (L{tune_garbage_collector});
    a gateway the reload retires holds reference cycles (its IdP client, its key
    sources) that only the collector frees, so everything is unfrozen first, and frozen
    again once the retired gateways have drained and stopped: each reload would
    otherwise keep the gateway it replaced for ever.

    @return: Fires once that is done.
    """
    gc.unfreeze()
    done = service.reload()
    done.addCallback(lambda _: service.retired())
    done.addCallback(lambda _: tune_garbage_collector())
    return done


def tune_garbage_collector(young_threshold: int = GC_YOUNG_THRESHOLD) -> None:
    """
    Set the cyclic garbage collector up for serving, once the configuration is built.

    Everything built at load (configuration, compiled routes and policies, the
    OpenTelemetry SDK, the Rego engine) lives as long as the process: C{gc.freeze} moves
    it out of the collector's sight, so that no collection walks it again. A request
    allocates a few hundred short-lived objects that reference counting frees; a larger
    first-generation threshold lets fewer collections run for the few that form cycles.
    Measured on the api fan-out: about 20 µs less CPU per request.
    """
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(young_threshold, second, third)


def tune_malloc(
    mmap_threshold: int = MALLOC_MMAP_THRESHOLD, trim_threshold: int = MALLOC_TRIM_THRESHOLD
) -> bool:
    """
    Keep the heap's free top for the next request instead of giving it back to the
    kernel after each one (glibc only; an operator's C{MALLOC_TRIM_THRESHOLD_} or
    C{MALLOC_MMAP_THRESHOLD_} is left in charge).

    A 64 KiB response passes through a few blocks of that size (a socket read, the
    slice relayed, the head and body joined by the transport). Freed, they leave more
    than glibc's default 128 KiB free at the top of the heap, which it then trims; the
    next response grows the heap again and faults its pages back in: ~13-15 minor page
    faults a response, ~30 µs of CPU of a proxied 64 KiB response and ~38 µs of a static
    one (issue 39, docs/performance.md). Fixed thresholds also end glibc's own
    adjustment of them, so the mapping threshold is set too, above those blocks.

    @return: Whether the thresholds were set.
    """
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )
