"""
Policies compiled once per gateway, and the per-route union that the authz stage checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from time import monotonic
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

import attrs
from twisted.web.server import Request

from edgegw.authz.rego import EVALUATION_ERROR, RegoLoadError, RegoPolicy
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


REMEMBERED_DECISIONS = 4096
"""Decisions a route remembers (principal, method and path) before starting over."""

DECISION_TTL = 60.0
"""Seconds a remembered decision is used for."""

LONGEST_REMEMBERED_PATH = 256
"""Longer paths are decided every time (the memory stays small whatever clients send)."""


class RoutePolicies:
    """
    The policies a route needs (its own C{authorize} plus its groups'), all of which must
    be satisfied.

    When every policy's decision is a function of the input document alone (C{require}
    rules, and Rego policies that are L{pure<RegoPolicy.pure>}), the route remembers the
    decision for a principal (the same object: a session's record and a verified token
    keep theirs), method and path, up to L{REMEMBERED_DECISIONS} (then it starts over:
    the memory stays bounded whatever clients send) and for L{DECISION_TTL} seconds
    (should a policy that reads the clock slip past the purity check). The input document
    is made of those and of what the route is, so the same input gets the same answer; a
    Rego evaluation costs about 100 µs, a remembered decision a dictionary lookup. Paths
    over L{LONGEST_REMEMBERED_PATH} bytes and evaluation errors (possibly transient) are
    not remembered.
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
        self.deterministic = all(
            policy.rego is None or policy.rego.pure for policy in self.policies
        )
        # (id of the principal or 0, method, raw path) -> (the principal, the decision):
        # the principal is kept so that its id cannot be reused by another meanwhile.
        self._decisions: dict[
            tuple[int, bytes, bytes], tuple[Principal | None, str | None, float]
        ] = {}
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
        The reason the first unsatisfied policy gives, or L{None} when all are satisfied
        (remembered, see the class docstring).
        """
        if not self.deterministic or not self.needs_document:
            # Without Rego the rules are a few comparisons: nothing to remember.
            return self._decide(exchange)
        request = exchange.request
        path = request.path
        if len(path) > LONGEST_REMEMBERED_PATH:
            return self._decide(exchange)
        principal = exchange.principal
        key = (0 if principal is None else id(principal), request.method, path)
        decisions = self._decisions
        found = decisions.get(key)
        now = monotonic()
        if found is not None and found[0] is principal and found[2] > now:
            return found[1]
        reason = self._decide(exchange)
        if reason is not None and reason.endswith(EVALUATION_ERROR):
            return reason
        if len(decisions) >= REMEMBERED_DECISIONS:
            decisions.clear()
        decisions[key] = (principal, reason, now + DECISION_TTL)
        return reason

    def _decide(self, exchange: Subject) -> str | None:
        document = self.input_document(exchange) if self.needs_document else None
        for policy in self.policies:
            reason = policy.check(exchange, document)
            if reason is not None:
                return reason
        return None
