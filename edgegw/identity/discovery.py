"""
The IdP's discovery document (OpenID Connect Discovery 1.0), read and checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

import attrs

from edgegw.identity.keyset import ASYMMETRIC_ALGORITHMS

__all__ = ["DiscoveryError", "ProviderMetadata", "discovery_url", "parse_discovery"]


class DiscoveryError(ValueError):
    """
    The discovery document cannot be used; the message says why (for the log).
    """


@attrs.frozen
class ProviderMetadata:
    """
    What the gateway uses of the IdP's discovery document.

    @ivar id_token_algorithms: The document's C{id_token_signing_alg_values_supported}
        that the gateway accepts at all (asymmetric ones: never C{none} or HMAC).
    @ivar token_auth_method: How the client authenticates at the token endpoint:
        C{client_secret_basic} unless the document supports only C{client_secret_post}.
    @ivar iss_parameter_supported: The IdP sends C{iss} with every authorization
        response (RFC 9207): a callback without one is then refused.
    @ivar access_token_jwks_uri: C{jwks_access_token_uri} when the document has one
        (the key set for access tokens, for Bearer verification), else C{jwks_uri}.
    """

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    id_token_algorithms: tuple[str, ...]
    token_auth_method: str
    access_token_jwks_uri: str
    end_session_endpoint: str | None = None
    iss_parameter_supported: bool = False


def discovery_url(issuer: str) -> str:
    """
    C{<issuer>/.well-known/openid-configuration} (one slash between them).
    """
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def parse_discovery(document: object, issuer: str) -> ProviderMetadata:
    """
    Check C{document} against the configured C{issuer} and keep what the gateway uses.

    Endpoints must be absolute URLs; https, unless the issuer itself is plain http (a
    provider on loopback in development), so that a document cannot downgrade the token
    exchange to cleartext.

    @raise DiscoveryError: The document is unusable: not an object, another issuer, a
        missing or bad endpoint, no acceptable signing algorithm.
    """
    if not isinstance(document, Mapping):
        raise DiscoveryError("the discovery document is not a JSON object")
    found = document.get("issuer")
    if found != issuer:
        raise DiscoveryError(
            f"the discovery document names issuer {str(found)[:200]!r}, not {issuer!r}"
        )
    schemes = ("https",) if urlsplit(issuer).scheme == "https" else ("https", "http")

    def endpoint(name: str, required: bool = True) -> str | None:
        value = document.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not _absolute(value, schemes):
            raise DiscoveryError(f"{name} is missing or not an absolute {'/'.join(schemes)} URL")
        return value

    authorization = endpoint("authorization_endpoint")
    token = endpoint("token_endpoint")
    jwks = endpoint("jwks_uri")
    assert authorization is not None and token is not None and jwks is not None
    userinfo = endpoint("userinfo_endpoint", required=False)
    access_jwks = endpoint("jwks_access_token_uri", required=False) or jwks
    end_session = endpoint("end_session_endpoint", required=False)
    algorithms = document.get("id_token_signing_alg_values_supported", ["RS256"])
    if not isinstance(algorithms, list):
        raise DiscoveryError("id_token_signing_alg_values_supported is not a list")
    accepted = tuple(
        alg for alg in algorithms if isinstance(alg, str) and alg in ASYMMETRIC_ALGORITHMS
    )
    if not accepted:
        raise DiscoveryError(
            "id_token_signing_alg_values_supported has no asymmetric algorithm "
            "(none and HMAC are never accepted)"
        )
    methods = document.get("token_endpoint_auth_methods_supported", ["client_secret_basic"])
    if not isinstance(methods, list):
        raise DiscoveryError("token_endpoint_auth_methods_supported is not a list")
    methods = [method for method in methods if isinstance(method, str)]
    method = (
        "client_secret_post"
        if "client_secret_post" in methods and "client_secret_basic" not in methods
        else "client_secret_basic"
    )
    return ProviderMetadata(
        issuer=issuer,
        authorization_endpoint=authorization,
        token_endpoint=token,
        jwks_uri=jwks,
        userinfo_endpoint=userinfo,
        id_token_algorithms=accepted,
        token_auth_method=method,
        access_token_jwks_uri=access_jwks,
        end_session_endpoint=end_session,
        iss_parameter_supported=document.get("authorization_response_iss_parameter_supported")
        is True,
    )


def _absolute(url: str, schemes: tuple[str, ...]) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    # Printable ASCII only: the authorization endpoint becomes a Location header.
    if any(not ("!" <= char <= "~") for char in url):
        return False
    return parts.scheme in schemes and bool(parts.hostname) and not parts.fragment
