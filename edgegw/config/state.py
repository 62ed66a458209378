"""
The Gateway's stateProvider block: where session records are kept, with the shipped
C{kvstore} type's settings.
"""

from __future__ import annotations

from edgegw.config.addresses import is_host_port
from edgegw.config.fields import Node
from edgegw.config.model import KvStoreConfig, StateProviderRef

__all__ = ["read_kvstore", "read_state_ref"]


def read_state_ref(node: Node | None) -> StateProviderRef | None:
    """
    The stateProvider block, or L{None} when there is none.
    """
    if node is None:
        return None
    type_ = node.required_string("type")
    config = node.opaque_mapping("config")
    kvstore = None
    if type_ == "kvstore":
        config_node = node.mapping("config", required=True)
        if config_node is not None:
            kvstore = read_kvstore(config_node)
    ref = StateProviderRef(
        type=type_,
        refresh_skew=node.duration("refreshSkew", 60.0) or 0.0,
        key_prefix=node.string("keyPrefix", "gw:sess:") or "",
        config=config,
        kvstore=kvstore,
    )
    node.finish()
    return ref


def read_kvstore(node: Node) -> KvStoreConfig:
    """
    The C{kvstore} provider's C{config} mapping (address host:port, user, password, db,
    tls, timeout), reporting problems on C{node}.
    """
    address = node.required_string("address")
    if address and not is_host_port(address):
        node.error("address", f'"{address}" is not host:port')
    config = KvStoreConfig(
        address=address,
        user=node.string("user", "default") or "default",
        password=node.string("password"),
        db=node.integer("db", 0, minimum=0),
        tls=node.boolean("tls", False),
        timeout=node.duration("timeout", 3.0, positive=True) or 3.0,
    )
    node.finish()
    return config
