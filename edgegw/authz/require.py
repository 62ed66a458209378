"""
The built-in C{require} rule: groups any-of, claims all-of (any-of within a list).
"""

from __future__ import annotations

from collections.abc import Mapping

from edgegw.config.model import RequireSpec
from edgegw.identity.principal import ClaimValue, Principal


class RequireRule:
    """
    A compiled C{Policy.spec.require}.

    A principal satisfies it when it belongs to at least one of C{groups} (if any are
    listed) and, for every claim listed, its passport value equals one of the allowed
    values; a passport value that is a list matches when any element does.
    """

    def __init__(self, spec: RequireSpec) -> None:
        self.groups = frozenset(spec.groups)
        self.claims: tuple[tuple[str, frozenset[str]], ...] = tuple(
            (claim, frozenset(values)) for claim, values in spec.claims.items()
        )

    def check(self, principal: Principal | None) -> str | None:
        """
        L{None} when satisfied, else the reason (for logs only).
        """
        if principal is None:
            return "no authenticated principal"
        if self.groups and self.groups.isdisjoint(principal.groups):
            return "not in any required group"
        passport = principal.passport
        for claim, allowed in self.claims:
            if not _claim_matches(passport, claim, allowed):
                return f"claim {claim} does not match"
        return None


def _claim_matches(passport: Mapping[str, ClaimValue], claim: str, allowed: frozenset[str]) -> bool:
    value = passport.get(claim)
    if value is None:
        return False
    if isinstance(value, list):
        return any(_text(item) in allowed for item in value)
    return _text(value) in allowed


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
