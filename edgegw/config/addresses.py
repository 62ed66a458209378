"""
Address grammar: the Gateway's listen address as a Twisted endpoint string, and
C{host:port}.
"""

from __future__ import annotations

import re

__all__ = ["endpoint_description", "is_host_port", "listen_port"]

_ENDPOINT_TYPES = ("tcp:", "tcp6:", "ssl:", "systemd:", "unix:")
_PORT = re.compile(r"\d{1,5}\Z")


def endpoint_description(listen: str) -> str:
    """
    The Twisted endpoint string for a listen address.

    Accepts Go-style addresses (C{":8080"} for every interface, C{"127.0.0.1:8080"},
    C{"[::1]:8080"}) and Twisted endpoint strings (C{"tcp:…"}, C{"tcp6:…"}, C{"ssl:…"},
    C{"systemd:…"}, C{"unix:…"}) unchanged.

    @raise ValueError: The address is neither form.
    """
    if listen.startswith(_ENDPOINT_TYPES):
        return listen
    host, sep, port = listen.rpartition(":")
    if not sep or not _PORT.match(port) or not 0 <= int(port) < 65536:
        raise ValueError(
            f'invalid listen address "{listen}": use ":8080", "127.0.0.1:8080", '
            '"[::1]:8080" or a Twisted endpoint such as "tcp:8080" or "ssl:8443:..."'
        )
    if host == "":
        # Go's ":8080" listens on every address; a tcp6 socket on :: is dual-stack on Linux.
        return f"tcp6:{port}:interface=\\:\\:"
    if host.startswith("[") and host.endswith("]"):
        address = host[1:-1]
        if not address or ":" not in address:
            raise ValueError(f'invalid listen address "{listen}": bad IPv6 literal')
        return f"tcp6:{port}:interface=" + address.replace(":", "\\:")
    if ":" in host:
        raise ValueError(f'invalid listen address "{listen}": write IPv6 as "[::1]:{port}"')
    return f"tcp:{port}:interface={host}"


def is_host_port(address: str) -> bool:
    """
    Whether C{address} is C{host:port} with a non-empty host and a port from 1 to 65535.
    """
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def listen_port(listen: str) -> int | None:
    """
    The TCP port a listen address names (C{":443"}, C{"HOST:8443"}, C{"tcp:443:..."});
    L{None} when it names none before it is bound (C{systemd:}, C{unix:}, port 0).

    @raise ValueError: The address is not valid (L{endpoint_description}).
    """
    description = endpoint_description(listen)
    kind, _, rest = description.partition(":")
    if kind not in ("tcp", "tcp6", "ssl"):
        return None
    port = rest.split(":", 1)[0]
    if port.startswith("port="):
        port = port[len("port=") :]
    return int(port) if port.isdigit() and int(port) else None
