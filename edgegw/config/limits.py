"""
The Gateway's limits block: deadlines for slow clients, caps on connections (client and
upstream).
"""

from __future__ import annotations

from edgegw.config.fields import Node
from edgegw.config.model import LimitsSpec

__all__ = ["read_limits"]

_DEFAULTS = LimitsSpec()


def read_limits(node: Node | None) -> LimitsSpec:
    """
    The limits block, or the defaults when there is none.
    """
    if node is None:
        return _DEFAULTS
    limits = LimitsSpec(
        header_timeout=_duration(node, "headerTimeout", _DEFAULTS.header_timeout),
        body_timeout=_duration(node, "bodyTimeout", _DEFAULTS.body_timeout),
        send_timeout=_duration(node, "sendTimeout", _DEFAULTS.send_timeout),
        max_connections=node.integer("maxConnections", _DEFAULTS.max_connections, minimum=0),
        max_connections_per_address=node.integer(
            "maxConnectionsPerAddress", _DEFAULTS.max_connections_per_address, minimum=0
        ),
        max_connections_per_upstream=node.integer(
            "maxConnectionsPerUpstream", _DEFAULTS.max_connections_per_upstream, minimum=0
        ),
        upstream_queue_timeout=_duration(
            node, "upstreamQueueTimeout", _DEFAULTS.upstream_queue_timeout
        ),
        max_streams_per_connection=node.integer(
            "maxStreamsPerConnection", _DEFAULTS.max_streams_per_connection, minimum=1
        ),
    )
    node.finish()
    return limits


def _duration(node: Node, key: str, default: float) -> float:
    value = node.duration(key, default, positive=True)
    return default if value is None else value
