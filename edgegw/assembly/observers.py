"""
Metrics observed at each collection rather than counted: the upstream pool's connections
and queue, the IdP's readiness and key sets.
"""

from __future__ import annotations

from collections import Counter

from edgegw.identity.provider import IdentityProvider
from edgegw.metrics.gateway_metrics import GatewayMetrics, IMetrics
from edgegw.upstream.pool import UpstreamClient


def observe_pool(metrics: GatewayMetrics, client: UpstreamClient) -> None:
    """
    The upstream pool's connections (idle, active) and waiting requests, per upstream,
    read at each collection.
    """

    # Summed per origin: two pools to one origin (one of them skipping TLS
    # verification) would otherwise give two series with the same labels.
    def connections() -> list[tuple[tuple[object, ...], float]]:
        found: Counter[tuple[object, ...]] = Counter()
        for upstream, idle, active, _ in client.pool_state():
            found[(upstream, "idle")] += idle
            found[(upstream, "active")] += active
        return list(found.items())

    def waiting() -> list[tuple[tuple[object, ...], float]]:
        found: Counter[tuple[object, ...]] = Counter()
        for upstream, _, _, queued in client.pool_state():
            found[(upstream,)] += queued
        return list(found.items())

    metrics.observe(
        "http.client.open_connections",
        "{connection}",
        "Connections to upstreams, idle or active.",
        ("edgegw.upstream", "http.connection.state"),
        connections,
        "updowncounter",
    )
    metrics.observe(
        "edgegw.upstream.pool.waiting",
        "{request}",
        "Requests waiting for an upstream connection.",
        ("edgegw.upstream",),
        waiting,
        "updowncounter",
    )


def observe_idp(metrics: IMetrics, provider: IdentityProvider) -> None:
    """
    The IdP's state, read at each collection: discovered or not, and its key sets' sizes.
    """
    metrics.observe(
        "edgegw.idp.ready",
        "1",
        "1 once the IdP's discovery document is loaded, else 0.",
        (),
        lambda: [((), 1 if provider.ready else 0)],
    )
    metrics.observe(
        "edgegw.idp.keys",
        "{key}",
        "Signing keys in the IdP's key sets.",
        ("edgegw.idp.key_set",),
        lambda: [
            (("id_token",), len(provider.id_token_keys.keys)),
            (("access_token",), len(provider.access_token_keys.keys)),
        ],
    )
