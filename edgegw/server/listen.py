"""
Turning C{Gateway.spec.listen} into a Twisted server endpoint description.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IStreamServerEndpoint

from edgegw.config.addresses import endpoint_description


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
