"""
The reverse proxy's upstream leg: a lean HTTP/1.1 client with a persistent connection
pool (L{UpstreamClient}), streaming bodies both ways and handing over upgraded (101)
connections.
"""

from edgegw.upstream.pool import UpstreamClient
from edgegw.upstream.request_encoding import RequestBodyError
from edgegw.upstream.response import (
    BodySink,
    ResponseTruncatedError,
    UpstreamProtocolError,
    UpstreamResponse,
)
from edgegw.upstream.upstreams import Upstream

__all__ = [
    "BodySink",
    "RequestBodyError",
    "ResponseTruncatedError",
    "Upstream",
    "UpstreamClient",
    "UpstreamProtocolError",
    "UpstreamResponse",
]
