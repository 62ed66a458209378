"""
The request-scoped identity of an authenticated caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

ClaimValue = str | int | float | bool | list[str] | None


@attrs.frozen
class Principal:
    """
    An authenticated caller, resolved by the session stage.

    @ivar subject: The principal subject (from C{identity.subjectClaim}); never empty.
    @ivar passport: The allowlisted claims (C{identity.claims}) kept for this caller.
    @ivar groups: The rendered group names (C{identity.groups}), in token order.
    @ivar access_token: The caller's access token, forwarded only where a route asks for it.
    @ivar memo: What per-route stages derived from this principal (the projection's
        header values), kept for the next request of the same session; never part of
        equality.
    """

    subject: str
    passport: Mapping[str, ClaimValue] = attrs.field(factory=dict)
    groups: tuple[str, ...] = ()
    access_token: str | None = attrs.field(default=None, repr=False)
    memo: dict[object, Any] = attrs.field(factory=dict, eq=False, repr=False)
