"""
The access block of Routes and RouteGroups: authentication, policies, claim projection and
the redirect on denial.
"""

from __future__ import annotations

from typing import Any, cast

from edgegw.config.fields import Node
from edgegw.config.header_syntax import check_header_name
from edgegw.config.model import AccessSpec, ProjectionSpec
from edgegw.config.urls import check_local_path

__all__ = ["read_access"]


def read_access(node: Node | None) -> AccessSpec:
    """
    The access block, or the empty one (nothing required) when there is none.
    """
    if node is None:
        return AccessSpec()
    auth = node.string("auth", choices=("required", "public"))
    authorize = node.strings("authorize")
    projection = ProjectionSpec()
    projection_node = node.mapping("projection")
    if projection_node is not None:
        projection_node.know("request")
        session_node = projection_node.mapping("session")
        if session_node is not None:
            claims = session_node.string_map("claims")
            for claim, header in (claims or {}).items():
                check_header_name(session_node, f"claims.{claim}", header)
            groups_header = None
            groups_node = session_node.mapping("groups")
            if groups_node is not None:
                groups_header = groups_node.string("header", nonempty=True)
                check_header_name(groups_node, "header", groups_header)
                groups_node.finish()
            projection = ProjectionSpec(claims=claims, groups_header=groups_header)
            session_node.finish()
        projection_node.finish()
    redirect = None
    on_deny = node.mapping("onDeny")
    if on_deny is not None:
        redirect = on_deny.string("redirect")
        check_local_path(on_deny, "redirect", redirect)
        on_deny.finish()
    node.finish()
    return AccessSpec(
        auth=cast(Any, auth),
        authorize=tuple(dict.fromkeys(authorize)),
        projection=projection,
        on_deny_redirect=redirect,
    )
