"""
The reverse proxy's upstream leg: a lean HTTP/1.1 client with a persistent connection
pool (L{UpstreamClient}), streaming bodies both ways and handing over upgraded (101)
connections.
"""

from edgegw.upstream.http11 import (
    BodySink,
    RequestBodyError,
    ResponseTruncatedError,
    UpstreamProtocolError,
    UpstreamResponse,
)
from edgegw.upstream.pool import Upstream, UpstreamClient

__all__ = [
    "BodySink",
    "RequestBodyError",
    "ResponseTruncatedError",
    "Upstream",
    "UpstreamClient",
    "UpstreamProtocolError",
    "UpstreamResponse",
]
