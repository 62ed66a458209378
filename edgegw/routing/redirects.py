"""
Local redirect targets: the one check for every same-origin C{Location} the gateway
emits from configuration or from a request (C{onDeny.redirect}, the login and logout
paths, C{postLogoutRedirect}, a login's C{return_to}).

Browsers do not take such a target as written: they drop tabs and newlines, trim
spaces and control characters, and read C{\\} as C{/}, so C{"/\\t/evil.example/"} goes to
C{//evil.example/}, another origin. A target is therefore accepted only when it is
printable ASCII without spaces or backslashes, and has the shape of a same-origin path.
"""

from __future__ import annotations

__all__ = ["is_local_redirect", "is_same_origin_path", "unsafe_redirect_char"]


def unsafe_redirect_char(target: str) -> str | None:
    """
    The first character of C{target} that a browser may drop or rewrite: a control
    character, whitespace, C{\\} or anything outside ASCII; L{None} when there is none.
    """
    for char in target:
        if not ("!" <= char <= "~") or char == "\\":
            return char
    return None


def is_same_origin_path(target: str) -> bool:
    """
    Whether C{target} has the shape of a same-origin path: it starts with C{/}, not with
    C{//} or C{/\\}, and contains no C{://}.
    """
    return target[:1] == "/" and target[1:2] not in ("/", "\\") and "://" not in target


def is_local_redirect(target: str) -> bool:
    """
    Whether C{target} is safe to send as the C{Location} of a same-origin redirect.
    """
    return is_same_origin_path(target) and unsafe_redirect_char(target) is None
