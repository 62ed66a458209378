"""
Policies compiled once per gateway, and the per-route union that the authz stage checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

import attrs
from twisted.web.server import Request

from edgegw.authz.rego import RegoLoadError, RegoPolicy
from edgegw.authz.require import RequireRule
from edgegw.config.errors import Problems
from edgegw.config.model import PolicySpec
from edgegw.identity.principal import Principal


class Subject(Protocol):
    """
    What policies are checked against: the request and its principal (the per-route
    exchange is one).
    """

    @property
    def request(self) -> Request:
        """
        The request, as the gateway read it.
        """

    @property
    def principal(self) -> Principal | None:
        """
        The authenticated principal, if any.
        """


@attrs.frozen
class CompiledPolicy:
    """
    A Policy resource ready to evaluate: satisfied when C{require} passes (if present)
    and C{rego} yields no deny (if present).
    """

    name: str
    require: RequireRule | None
    rego: RegoPolicy | None

    def check(self, exchange: Subject, document: Mapping[str, Any] | None) -> str | None:
        """
        L{None} when satisfied, else the reason (for logs and spans, never the client).
        """
        if self.require is not None:
            reason = self.require.check(exchange.principal)
            if reason is not None:
                return f"policy {self.name}: {reason}"
        if self.rego is not None and document is not None:
            denied = self.rego.evaluate(document)
            if denied is not None:
                return f"policy {self.name}: " + "; ".join(denied)
        return None


def compile_policies(
    policies: Mapping[str, PolicySpec], problems: Problems
) -> dict[str, CompiledPolicy]:
    """
    Compile every policy (Rego files are read and compiled here, once, so that a broken
    policy stops startup even before a route uses it).
    """
    compiled: dict[str, CompiledPolicy] = {}
    for name in policies:
        spec = policies[name]
        rego = None
        if spec.rego is not None:
            try:
                rego = RegoPolicy(spec.rego.path)
            except RegoLoadError as e:
                problems.add(spec.location, "spec.rego.path", str(e))
                continue
        require = RequireRule(spec.require) if spec.require is not None else None
        compiled[name] = CompiledPolicy(name=name, require=require, rego=rego)
    return compiled


class RoutePolicies:
    """
    The policies a route needs (its own C{authorize} plus its groups'), all of which must
    be satisfied.
    """

    def __init__(
        self,
        policies: Sequence[CompiledPolicy],
        route_pattern: str,
        route_name: str,
        labels: Mapping[str, str],
    ) -> None:
        self.policies = tuple(policies)
        self.needs_document = any(policy.rego is not None for policy in self.policies)
        self.route_pattern = route_pattern
        self.route_name = route_name
        self.labels = dict(labels)

    def input_document(self, exchange: Subject) -> dict[str, Any]:
        """
        The Rego input: identity and request attributes; keys always present (empty when
        anonymous); the access token never included.
        """
        principal = exchange.principal
        request = exchange.request
        return {
            "subject": principal.subject if principal is not None else "",
            "groups": list(principal.groups) if principal is not None else [],
            "claims": dict(principal.passport) if principal is not None else {},
            "request": {
                "method": request.method.decode("latin-1"),
                # Decoded, as the mux matched it (and as backends will read it): on the raw
                # path, /%70rivate would get past a rule about /private.
                "path": unquote_to_bytes(request.path).decode("utf-8", "replace"),
                "route": self.route_pattern,
                "route_name": self.route_name,
                "labels": self.labels,
            },
        }

    def first_denial(self, exchange: Subject) -> str | None:
        """
        The reason the first unsatisfied policy gives, or L{None} when all are satisfied.
        """
        document = self.input_document(exchange) if self.needs_document else None
        for policy in self.policies:
            reason = policy.check(exchange, document)
            if reason is not None:
                return reason
        return None
