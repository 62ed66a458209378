"""
The Gateway's security block: CSRF protection (trusted origins, bypass patterns), the
static security headers and what an encoded slash in a request path gets.
"""

from __future__ import annotations

from typing import Any, cast

from edgegw.config.fields import Node
from edgegw.config.header_syntax import check_header_value
from edgegw.config.model import CsrfSpec, HstsSpec, SecurityHeadersSpec, SecuritySpec
from edgegw.config.origins import TrustedOriginError, validate_trusted_origin
from edgegw.routing.mux import ConflictError, Mux
from edgegw.routing.paths import ENCODED_SLASH_MODES
from edgegw.routing.pattern import PatternError

__all__ = ["read_security"]


def read_security(node: Node | None) -> SecuritySpec:
    """
    The security block, or the defaults when there is none.
    """
    if node is None:
        return SecuritySpec()
    encoded_slashes = node.string(
        "encodedSlashes", ENCODED_SLASH_MODES[0], choices=ENCODED_SLASH_MODES
    )
    csrf = CsrfSpec()
    csrf_node = node.mapping("csrf")
    if csrf_node is not None:
        origins = csrf_node.strings("trustedOrigins")
        for index, origin in enumerate(origins):
            try:
                validate_trusted_origin(origin)
            except TrustedOriginError as e:
                csrf_node.error(f"trustedOrigins[{index}]", str(e))
        patterns = csrf_node.strings("bypassPatterns")
        bypass: Mux[int] = Mux()
        for index, pattern in enumerate(patterns):
            try:
                bypass.register(pattern, index)
            except (PatternError, ConflictError) as e:
                csrf_node.error(f"bypassPatterns[{index}]", str(e))
        csrf = CsrfSpec(
            enabled=csrf_node.boolean("enabled", True),
            trusted_origins=origins,
            bypass_patterns=patterns,
        )
        csrf_node.finish()
    headers = SecurityHeadersSpec()
    headers_node = node.mapping("headers")
    if headers_node is not None:
        hsts = HstsSpec()
        hsts_node = headers_node.mapping("hsts")
        if hsts_node is not None:
            hsts = HstsSpec(
                enabled=hsts_node.boolean("enabled", True),
                max_age=hsts_node.integer("maxAge", 31536000, minimum=0),
                include_subdomains=hsts_node.boolean("includeSubDomains", True),
                preload=hsts_node.boolean("preload", False),
            )
            hsts_node.finish()
        values = {}
        for key, default in (
            ("frameOptions", "DENY"),
            ("contentTypeOptions", "nosniff"),
            ("referrerPolicy", "strict-origin-when-cross-origin"),
            ("contentSecurityPolicy", None),
        ):
            value = headers_node.string(key, default)
            check_header_value(headers_node, key, value)
            values[key] = value
        headers = SecurityHeadersSpec(
            frame_options=values["frameOptions"] or "",
            content_type_options=values["contentTypeOptions"] or "",
            referrer_policy=values["referrerPolicy"] or "",
            hsts=hsts,
            content_security_policy=values["contentSecurityPolicy"],
        )
        headers_node.finish()
    node.finish()
    return SecuritySpec(csrf=csrf, headers=headers, encoded_slashes=cast(Any, encoded_slashes))
