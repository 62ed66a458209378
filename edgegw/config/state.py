"""
The Gateway's stateProvider block: where session records are kept, with the shipped
C{kvstore} type's settings.
"""

from __future__ import annotations

import os

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
    tls, timeout, caFile), reporting problems on C{node}.
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
        ca_file=node.string("caFile"),
    )
    if config.ca_file is not None:
        problem = _ca_file_problem(config.ca_file, config.tls)
        if problem is not None:
            node.error("caFile", problem)
    node.finish()
    return config


def _ca_file_problem(path: str, tls: bool) -> str | None:
    if not tls:
        return "is only used with tls: true"
    if not os.path.isabs(path):
        return f"{path} is not an absolute path"
    try:
        with open(path, "rb") as f:
            pem = f.read(1024 * 1024 + 1)
    except OSError as e:
        return f"{path} cannot be read: {e.strerror}"
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        return f"{path} holds no PEM certificate"
    return None
