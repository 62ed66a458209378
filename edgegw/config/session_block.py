"""
The Gateway's session block: the cookie, its key and lifetime, and the session endpoints.
"""

from __future__ import annotations

from edgegw.config.fields import Node
from edgegw.config.header_syntax import TOKEN, check_header_name
from edgegw.config.model import SessionSpec
from edgegw.config.urls import check_local_path

__all__ = ["read_session"]


def read_session(node: Node | None) -> SessionSpec | None:
    """
    The session block, or L{None} when there is none.
    """
    if node is None:
        return None
    key_text = node.string("key", required=True) or ""
    key = key_text.encode("utf-8")
    if key_text and len(key) != 32:
        node.error("key", f"must be exactly 32 bytes (AES-256-GCM key), got {len(key)}")
    cookie_name = node.string("cookieName", "gw_session") or ""
    if not TOKEN.match(cookie_name):
        node.error("cookieName", f'"{cookie_name}" is not a valid cookie name')
    fingerprint = node.strings("fingerprintHeaders", ("User-Agent",))
    for index, header in enumerate(fingerprint):
        check_header_name(node, f"fingerprintHeaders[{index}]", header)
    info_path = node.string("infoPath", "/auth/session") or ""
    check_local_path(node, "infoPath", info_path)
    post_logout = node.string("postLogoutRedirect", "/") or ""
    check_local_path(node, "postLogoutRedirect", post_logout)
    session = SessionSpec(
        key=key,
        cookie_name=cookie_name,
        ttl=node.duration("ttl", 8 * 3600.0, positive=True) or 8 * 3600.0,
        fingerprint_headers=fingerprint,
        info_path=info_path,
        post_logout_redirect=post_logout,
        host_prefix=node.boolean("hostPrefix", True),
    )
    node.finish()
    return session
