"""
From verified claims to a principal: whether to ask the IdP's userinfo endpoint, how its
answer merges with the token, and which claims the principal keeps.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgegw.config.model import IdentitySpec
from edgegw.identity.groups import GroupRenderer
from edgegw.identity.principal import ClaimValue, Principal


def needs_userinfo(identity: IdentitySpec, claims: Mapping[str, object]) -> bool:
    """
    Whether the userinfo endpoint should be asked for more claims.

    @param identity: The C{identity} configuration; its C{userInfo} decides.
    @param claims: The verified token's claims.
    @return: L{True} for C{always}, L{False} for C{never}; for C{auto}, L{True} when the
        token lacks an allowlisted claim, the group source claim or the subject claim.
    """
    if identity.user_info == "always":
        return True
    if identity.user_info == "never":
        return False
    if any(name not in claims for name in identity.claims):
        return True
    source = identity.groups.source
    if source is not None and source not in claims:
        return True
    return identity.subject_claim not in claims


def merge_userinfo(
    token_claims: Mapping[str, object], userinfo: Mapping[str, object] | None
) -> dict[str, object]:
    """
    The token's claims overlaid with the userinfo's.

    A userinfo answer whose C{sub} is missing or is not the token's is ignored
    entirely (OpenID Connect Core 5.3.2): it may describe someone else.

    @param token_claims: The verified token's claims.
    @param userinfo: The userinfo endpoint's claims, or L{None} when it was not asked.
    @return: A new dict; userinfo wins for every claim both carry.
    """
    merged = dict(token_claims)
    if userinfo is None:
        return merged
    subject = userinfo.get("sub")
    if not isinstance(subject, str) or subject != token_claims.get("sub"):
        return merged
    merged.update(userinfo)
    return merged


def subject_of(identity: IdentitySpec, claims: Mapping[str, object]) -> str | None:
    """
    The principal subject.

    @param identity: The C{identity} configuration; C{subjectClaim} names the claim.
    @param claims: The caller's claims (token merged with userinfo).
    @return: The C{subjectClaim} claim when it is a non-empty string, else C{sub} when it
        is one, else L{None} (no principal: the login is refused).
    """
    for name in (identity.subject_claim, "sub"):
        value = claims.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _claim_value(value: object) -> tuple[bool, ClaimValue]:
    """
    C{value} as a L{ClaimValue}, with L{False} first when it has no such form (an
    object, or a list holding anything but scalars).
    """
    if value is None or isinstance(value, str | int | float):
        return True, value
    if isinstance(value, list | tuple):
        items: list[str] = []
        for item in value:
            if isinstance(item, bool):
                items.append("true" if item else "false")
            elif isinstance(item, str | int | float):
                items.append(str(item))
            else:
                return False, None
        return True, items
    return False, None


def passport_of(identity: IdentitySpec, claims: Mapping[str, object]) -> dict[str, ClaimValue]:
    """
    The claims a principal keeps: those in C{identity.claims} whose value is a scalar or
    a list of scalars (list items become strings).

    @param identity: The C{identity} configuration; C{claims} is the allowlist.
    @param claims: The caller's claims (token merged with userinfo).
    @return: The kept claims, in allowlist order; C{sub} only when allowlisted.
    """
    passport: dict[str, ClaimValue] = {}
    for name in identity.claims:
        if name not in claims:
            continue
        representable, value = _claim_value(claims[name])
        if representable:
            passport[name] = value
    return passport


def principal_of(
    identity: IdentitySpec,
    renderer: GroupRenderer,
    claims: Mapping[str, object],
    access_token: str | None = None,
) -> Principal | None:
    """
    The principal for a caller's claims.

    @param identity: The C{identity} configuration.
    @param renderer: The group renderer built from C{identity.groups}.
    @param claims: The caller's claims (token merged with userinfo).
    @param access_token: The caller's access token, kept for routes that forward it.
    @return: The principal, or L{None} when the claims carry no subject.
    """
    subject = subject_of(identity, claims)
    if subject is None:
        return None
    return Principal(
        subject=subject,
        passport=passport_of(identity, claims),
        groups=renderer.render(claims),
        access_token=access_token,
    )
