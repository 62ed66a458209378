"""
The Gateway's identity block: claims, groups, and signed identity assertions.
"""

from __future__ import annotations

from typing import Any, cast

from edgegw.config.fields import Node
from edgegw.config.header_syntax import TOKEN, check_own_header_name
from edgegw.config.keys import ed25519_key
from edgegw.config.model import (
    AssertionAcceptSpec,
    AssertionIssueSpec,
    AssertionKeySpec,
    AssertionSpec,
    GroupsSpec,
    IdentitySpec,
)

__all__ = ["read_identity"]


def read_identity(node: Node | None) -> IdentitySpec:
    """
    The identity block, or the defaults when there is none.
    """
    if node is None:
        return IdentitySpec()
    groups = GroupsSpec()
    groups_node = node.mapping("groups")
    if groups_node is not None:
        as_ = groups_node.string("as", "groups") or ""
        if not TOKEN.match(as_):
            groups_node.error("as", f'"{as_}" cannot be used in a header name')
        groups = GroupsSpec(
            source=groups_node.string("source"),
            match=groups_node.strings("match"),
            render=cast(Any, groups_node.string("render", "cn", choices=("cn", "dn"))),
            as_=as_,
            strip=groups_node.strings("strip"),
        )
        groups_node.finish()
    claims = node.strings("claims", ("email", "name", "given_name", "family_name"))
    taken = {"id", groups.as_.replace("_", "-").lower()}
    for index, claim in enumerate(claims):
        if claim.replace("_", "-").lower() in taken:
            node.error(
                f"claims[{index}]",
                f'"{claim}" would be projected as the subject or groups header '
                f"(X-User-{claim}); map it under another name with "
                "projection.session.claims, or leave it out",
            )
    identity = IdentitySpec(
        claims=claims,
        groups=groups,
        user_info=cast(Any, node.string("userInfo", "auto", choices=("auto", "always", "never"))),
        subject_claim=node.string("subjectClaim", "sub", nonempty=True) or "sub",
        assertion=_assertion(node.mapping("assertion")),
    )
    node.finish()
    return identity


def _assertion(node: Node | None) -> AssertionSpec | None:
    if node is None:
        return None
    issue = None
    issue_node = node.mapping("issue")
    if issue_node is not None:
        header = issue_node.string("header", "X-Gw-Identity") or ""
        check_own_header_name(issue_node, "header", header)
        issue = AssertionIssueSpec(
            name=issue_node.required_string("name"),
            key_id=issue_node.required_string("keyId"),
            seed=ed25519_key(issue_node, "key", "the Ed25519 seed"),
            ttl=_ttl(issue_node),
            header=header,
            audience=issue_node.string("audience", nonempty=True),
        )
        issue_node.finish()
    accept = None
    accept_node = node.mapping("accept")
    if accept_node is not None:
        header = accept_node.string("header", "X-Gw-Identity") or ""
        check_own_header_name(accept_node, "header", header)
        keys = []
        seen: set[str] = set()
        for index, key_node in enumerate(accept_node.nodes("keys", required=True)):
            key_id = key_node.required_string("keyId")
            if key_id in seen:
                accept_node.error(f"keys[{index}].keyId", f'"{key_id}" is listed twice')
            seen.add(key_id)
            keys.append(
                AssertionKeySpec(
                    key_id=key_id,
                    public_key=ed25519_key(key_node, "publicKey", "the Ed25519 public key"),
                )
            )
            key_node.finish()
        accept = AssertionAcceptSpec(
            issuer=accept_node.required_string("issuer"),
            keys=tuple(keys),
            header=header,
            require_bearer=accept_node.boolean("requireBearer", True),
            audience=accept_node.string("audience", nonempty=True),
        )
        accept_node.finish()
    if issue is None and accept is None:
        node.error("", "configure issue, accept, or both")
    node.finish()
    return AssertionSpec(issue=issue, accept=accept)


MAX_ASSERTION_TTL = 600.0
"""The longest an assertion may be valid (the accepting side refuses longer ones)."""


def _ttl(issue: Node) -> float:
    ttl = issue.duration("ttl", 60.0, positive=True) or 60.0
    if ttl > MAX_ASSERTION_TTL:
        issue.error("ttl", "must be at most 10m: an assertion is for one hop, not a session")
        return 60.0
    return ttl
