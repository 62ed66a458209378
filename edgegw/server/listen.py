"""
Turning C{Gateway.spec.listen} into a Twisted server endpoint description.
"""

from __future__ import annotations

import re
from typing import Any

from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IStreamServerEndpoint

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


def server_endpoint(reactor: Any, listen: str) -> IStreamServerEndpoint:
    """
    Build the server endpoint for a listen address (reading TLS key and certificate files
    for C{ssl:}, taking the inherited socket for C{systemd:}).

    @raise ValueError: With a message that says what is wrong.
    """
    description = endpoint_description(listen)
    try:
        endpoint: IStreamServerEndpoint = serverFromString(reactor, description)
        return endpoint
    except IndexError:
        if description.startswith("systemd:"):
            raise ValueError(
                "no socket with that index was passed by systemd (LISTEN_FDS/LISTEN_PID)"
            ) from None
        raise ValueError(f'invalid endpoint "{listen}"') from None
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f'invalid endpoint "{listen}": {e}') from None
    except OSError as e:
        raise ValueError(f'invalid endpoint "{listen}": {e.strerror or e}') from None
    except Exception as e:  # pyOpenSSL errors for unreadable keys or certificates
        raise ValueError(f'invalid endpoint "{listen}": {e}') from None
