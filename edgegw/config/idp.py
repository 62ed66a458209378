"""
The IdP kind: the OpenID Connect provider, its client, and bearer-token verification.
"""

from __future__ import annotations

from edgegw.config.fields import Node
from edgegw.config.model import BearerSpec, IdpSpec
from edgegw.config.urls import check_url

ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
"""
The only JWS algorithms ever accepted (here, where configuration checks
C{bearer.signingAlgs} against it; C{edgegw.identity} verifies with it). C{none} and every
HMAC algorithm are refused whatever a configuration or discovery document says.
"""

__all__ = ["read_idp"]


def read_idp(spec: Node, name: str) -> IdpSpec:
    """
    The IdP resource's spec.
    """
    spec.string("type", required=True, choices=("oidc",))
    verification_only = spec.boolean("verificationOnly", False)
    issuer = spec.required_string("issuer")
    check_url(spec, "issuer", issuer, ("https", "http"))
    client_id = spec.required_string("clientID")
    client_secret = spec.string("clientSecret")
    redirect_url = spec.string("redirectURL")
    if verification_only:
        for key, value in (("clientSecret", client_secret), ("redirectURL", redirect_url)):
            if value is not None:
                spec.error(key, "not allowed with verificationOnly: true")
    check_url(spec, "redirectURL", redirect_url, ("https", "http"))
    bearer = BearerSpec()
    bearer_node = spec.mapping("bearer")
    if bearer_node is not None:
        jwks = bearer_node.string("jwksURL")
        # Plain http only when the issuer itself is (a provider on loopback): keys fetched
        # in cleartext could be swapped by anyone on the path.
        check_url(
            bearer_node, "jwksURL", jwks, ("https", "http") if _is_http(issuer) else ("https",)
        )
        algs = (
            bearer_node.strings("signingAlgs", nonempty=True)
            if bearer_node.has("signingAlgs")
            else None
        )
        for index, alg in enumerate(algs or ()):
            if alg not in ASYMMETRIC_ALGORITHMS:
                bearer_node.error(
                    f"signingAlgs[{index}]",
                    f'"{alg}" is not accepted: one of '
                    + ", ".join(sorted(ASYMMETRIC_ALGORITHMS))
                    + " (none and HMAC algorithms never are)",
                )
        bearer = BearerSpec(
            jwks_url=jwks,
            audience_claim=bearer_node.string("audienceClaim", "aud", nonempty=True) or "aud",
            audience=bearer_node.string("audience", nonempty=True),
            signing_algs=algs,
            cache_ttl=_cache_ttl(bearer_node),
        )
        bearer_node.finish()
    return IdpSpec(
        name=name,
        issuer=issuer,
        client_id=client_id,
        verification_only=verification_only,
        client_secret=client_secret,
        redirect_url=redirect_url,
        scopes=spec.strings("scopes", ("openid", "profile", "email"), nonempty=True),
        resource=_resource(spec),
        bearer=bearer,
    )


def _resource(spec: Node) -> str | None:
    """
    C{resource} (RFC 8707): the API the access token is for, an absolute URI.
    """
    resource = spec.string("resource", nonempty=True)
    if resource is not None and (":" not in resource or "#" in resource):
        spec.error("resource", f'"{resource}" is not an absolute URI without a fragment')
    return resource


def _cache_ttl(bearer: Node) -> float:
    """
    C{bearer.cacheTTL}: the longest a verified token is trusted without being verified
    again (never past its own C{exp}); C{0s} turns the cache off.
    """
    ttl = bearer.duration("cacheTTL", 300.0)
    return 300.0 if ttl is None else ttl


def _is_http(url: str | None) -> bool:
    return bool(url) and str(url).lower().startswith("http://")
