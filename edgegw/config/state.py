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
    The C{kvstore} provider's C{config} mapping (address host:port, or sentinels and
    masterName with sentinelUser and sentinelPassword; user, password, db, tls, timeout,
    caFile), reporting problems on C{node}.
    """
    sentinels = node.strings("sentinels")
    master_name = node.string("masterName")
    sentinel_user = node.string("sentinelUser")
    sentinel_password = node.string("sentinelPassword")
    address = ""
    if node.has("sentinels"):
        if node.has("address"):
            node.error("address", "address and sentinels are mutually exclusive: give one")
        if not sentinels and isinstance(node.raw.get("sentinels"), list):
            node.error("sentinels", "must not be an empty list")
        for index, sentinel in enumerate(sentinels):
            if not is_host_port(sentinel):
                node.error(f"sentinels[{index}]", f'"{sentinel}" is not host:port')
        if not master_name:
            if master_name is None:
                node.error("masterName", "required field is missing (with sentinels)")
            else:
                node.error("masterName", "must not be empty")
    else:
        for key in ("masterName", "sentinelUser", "sentinelPassword"):
            if node.has(key):
                node.error(key, "is only used with sentinels")
        if not node.has("address"):
            node.error("address", "required field is missing (or give sentinels)")
        else:
            address = node.required_string("address")
            if address and not is_host_port(address):
                node.error("address", f'"{address}" is not host:port')
    if sentinel_user is not None and sentinel_password is None:
        node.error("sentinelUser", "is only used with sentinelPassword")
    config = KvStoreConfig(
        address=address,
        sentinels=sentinels,
        master_name=master_name or "",
        sentinel_user=sentinel_user,
        sentinel_password=sentinel_password,
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
