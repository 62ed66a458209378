"""
The identity side of the gateway's metrics (issue 18, point 2), counted exactly and read
back through a real scrape over HTTP: login and callback outcomes, session, Bearer and
assertion authentications by outcome and reason class, silent refreshes and their
failures, policy denials per policy, IdP discovery and key-set fetches, and state-store
operations and errors — with the fake OpenID provider, a real redis-server and the
server-side sessions of L{tests.support.sessions}.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from edgegw.metrics.gateway_metrics import GatewayMetrics
from edgegw.metrics.serve import scrape_root
from edgegw.server.scrape_site import ScrapeSite
from tests.support.browser import Browser
from tests.support.fake_idp import FakeIdP, SigningKey
from tests.support.processes import listen_local, port_of
from tests.support.redis import redis_server
from tests.support.sessions import COOKIE, SessionGateway, server_session_config, stream_backend
from tests.test_assertion import CLIENT_ID
from tests.test_assertion import get as assertion_get
from tests.test_assertion import world as assertion_world
from tests.test_metrics_instrumented import METRICS
from tests.test_metrics_scrape import parse

reactor: Any = _reactor

EXTRA = (
    METRICS
    + """\
---
kind: Policy
metadata: {name: auditors-only}
spec: {require: {groups: [auditors]}}
---
kind: Route
metadata: {name: admin}
spec:
  match: /admin/
  type: app
  access: {auth: required, authorize: [auditors-only]}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
"""
)


class MeasuredGateway(SessionGateway):
    """
    The sessions' gateway with metrics on and one more route, C{/admin/}, which the
    policy C{auditors-only} (the group C{auditors}, which alice is not in) guards.
    """

    def config_text(self) -> str:
        upstream = f"http://127.0.0.1:{self.backend.port}"
        return server_session_config(
            key=self.key,
            redis_address=self.redis.address,
            issuer=self.idp.issuer,
            upstream=upstream,
            skew=self.skew,
            prefix=self.prefix,
            timeout=self.timeout,
            extra_routes=EXTRA.replace("UPSTREAM", upstream),
        )


def series(name: str, **labels: str) -> str:
    """
    A sample's key as L{parse} gives it: the name and the labels in the order given.
    """
    if not labels:
        return name
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return f"{name}{{{inner}}}"


class IdentityMetricsTests(TestCase):
    timeout = 120

    async def setUp(self) -> None:  # type: ignore[override]
        self.redis = await redis_server(self)
        self.idp = FakeIdP()
        # Due at once (refreshSkew 60s): the session's first request refreshes.
        self.idp.token_lifetime = 30
        await self.idp.start(self)
        self.backend, _ = stream_backend()
        self.addCleanup(self.backend.stop)
        self.gw = await MeasuredGateway(self, self.idp, self.backend, self.redis).start()
        metrics = self.gw.gateway.metrics
        assert isinstance(metrics, GatewayMetrics)
        self.metrics = metrics
        listening = listen_local(ScrapeSite(scrape_root(metrics.registry, "/metrics", {})))
        self.addCleanup(listening.stopListening)
        self.scrape_port = port_of(listening)

    async def scrape(self) -> dict[str, float]:
        reply = await Browser().get(f"http://127.0.0.1:{self.scrape_port}/metrics")
        self.assertEqual(reply.status, 200)
        return parse(reply.body.decode())

    async def counts(self, prefix: str) -> dict[str, float]:
        """
        The scraped samples whose names start with C{prefix}, without the zero ones.
        """
        return {k: v for k, v in (await self.scrape()).items() if k.startswith(prefix) and v}

    async def test_login_session_refresh_and_policy(self) -> None:
        idp = self.idp
        # Discovery fetched the document and its key set once each.
        self.assertEqual(
            await self.counts("edgegw_idp_fetches"),
            {
                series("edgegw_idp_fetches_total", **idp_labels("discovery", "ok")): 1,
                series("edgegw_idp_fetches_total", **idp_labels("keys", "ok")): 1,
            },
        )
        browser = Browser()
        back = await self.gw.login(browser)
        self.assertEqual(back.status, 302)
        self.assertIn(COOKIE, browser.cookies)
        # A callback whose state no login began.
        stray = await Browser().get(self.gw.url("/auth/callback?state=made-up&code=x"))
        self.assertEqual(stray.status, 400)
        # Each request refreshes first (tokens of 30s, refreshSkew 60s).
        self.assertEqual((await browser.get(self.gw.url("/app/x"))).status, 200)
        self.assertEqual((await browser.get(self.gw.url("/admin/x"))).status, 403)
        idp.refresh_error = "invalid_grant"
        # Refused while the access token is valid: the session goes on.
        self.assertEqual((await browser.get(self.gw.url("/app/y"))).status, 200)
        # A cookie that does not open is a rejected session; none at all is nothing.
        forged = await Browser().get(
            self.gw.url("/app/x"), headers={"Cookie": f"{COOKIE}=not-a-session"}
        )
        self.assertEqual(forged.status, 302)
        self.assertEqual((await Browser().get(self.gw.url("/app/x"))).status, 302)
        out = await browser.post(self.gw.url("/auth/logout"), headers={"Origin": self.gw.origin})
        self.assertEqual(out.status, 302)
        login = "edgegw_login_outcomes_total"
        auth = "edgegw_auth_outcomes_total"
        refreshes = "edgegw_session_refreshes_total"
        self.assertEqual(
            await self.counts("edgegw_login"),
            {
                # Once: the anonymous /app/x is sent to /auth/login, not redirected.
                series(login, **login_labels("login", "redirected")): 1,
                series(login, **login_labels("callback", "ok")): 1,
                series(login, **login_labels("callback", "bad_request")): 1,
                series(login, **login_labels("logout", "ok")): 1,
            },
        )
        self.assertEqual(
            await self.counts("edgegw_auth"),
            {
                series(auth, **auth_labels("session", "accepted", "")): 3,
                series(auth, **auth_labels("session", "rejected", "invalid")): 1,
            },
        )
        self.assertEqual(
            await self.counts("edgegw_session_refreshes"),
            {
                series(refreshes, edgegw_refresh_outcome="ok"): 2,
                series(refreshes, edgegw_refresh_outcome="refused"): 1,
            },
        )
        self.assertEqual(
            await self.counts("edgegw_policy"),
            {
                series(
                    "edgegw_policy_denials_total",
                    edgegw_policy="auditors-only",
                    http_route="/admin/",
                ): 1
            },
        )

    async def test_state_operations_and_errors(self) -> None:
        browser = Browser()
        await self.gw.login(browser)
        # The store's operations, by the session's life: subscribed at start; at login
        # the record set and indexed by subject and IdP session; each refreshing
        # request reads the record, takes the session's lock, reads it again under the
        # lock, replaces it and lets the lock go.
        self.assertEqual((await browser.get(self.gw.url("/app/x"))).status, 200)
        ops = "edgegw_state_operations_total"
        self.assertEqual(
            await self.counts("edgegw_state"),
            {
                series(ops, **state_labels("subscribe", "ok")): 1,
                series(ops, **state_labels("set", "ok")): 1,
                series(ops, **state_labels("add_to_index", "ok")): 2,
                series(ops, **state_labels("get", "ok")): 2,
                series(ops, **state_labels("acquire", "ok")): 1,
                series(ops, **state_labels("replace", "ok")): 1,
                series(ops, **state_labels("release", "ok")): 1,
            },
        )
        await self.redis.stop()
        # The record cannot be read: the request is not authenticated (fail closed).
        self.assertEqual((await browser.get(self.gw.url("/app/x"))).status, 302)
        errors = {k: v for k, v in (await self.counts("edgegw_state")).items() if "error" in k}
        self.assertEqual(errors, {series(ops, **state_labels("get", "error")): 1})
        # An outage, not a forged or ended session.
        auth = "edgegw_auth_outcomes_total"
        self.assertEqual(
            await self.counts("edgegw_auth"),
            {
                series(auth, **auth_labels("session", "accepted", "")): 1,
                series(auth, **auth_labels("session", "unavailable", "state_store")): 1,
            },
        )

    async def test_a_refresh_that_cannot_be_stored(self) -> None:
        browser = Browser()
        await self.gw.login(browser)
        self.idp.refresh_delay = 0.5
        pending = ensureDeferred(browser.get(self.gw.url("/app/x")))
        while self.idp.refresh_grants == 0:
            await deferLater(reactor, 0.01, lambda: None)
        await self.redis.stop()
        # This request goes on with its new token; the store never got it.
        self.assertEqual((await pending).status, 200)
        self.assertEqual(
            await self.counts("edgegw_session_refreshes"),
            {series("edgegw_session_refreshes_total", edgegw_refresh_outcome="not_stored"): 1},
        )

    async def test_idp_fetch_failures(self) -> None:
        # A Bearer token signed by a key the gateway has not seen makes it fetch the
        # key set again at once; with the IdP gone, that fetch fails.
        await self.idp.stop()
        token = self.idp.mint_access_token(
            {"aud": "gw"}, key=SigningKey.generate("new-key", "RS256")
        )
        reply = await Browser().get(
            self.gw.url("/api/x"), headers={"Authorization": f"Bearer {token}"}
        )
        self.assertEqual(reply.status, 401)
        counts = await self.counts("edgegw_idp_fetches")
        self.assertEqual(
            counts[series("edgegw_idp_fetches_total", **idp_labels("keys", "failed"))], 1
        )
        self.assertEqual(counts[series("edgegw_idp_fetches_total", **idp_labels("keys", "ok"))], 1)


def idp_labels(document: str, outcome: str) -> dict[str, str]:
    return {"edgegw_idp_document": document, "edgegw_idp_outcome": outcome}


def login_labels(stage: str, outcome: str) -> dict[str, str]:
    return {"edgegw_login_stage": stage, "edgegw_login_outcome": outcome}


def auth_labels(method: str, outcome: str, reason: str) -> dict[str, str]:
    return {
        "edgegw_auth_method": method,
        "edgegw_auth_outcome": outcome,
        "edgegw_auth_reason": reason,
    }


def state_labels(operation: str, outcome: str) -> dict[str, str]:
    return {"edgegw_state_operation": operation, "edgegw_state_outcome": outcome}


TELEMETRY = """---
kind: Telemetry
metadata: {name: t}
spec:
  service: {name: b}
  metrics: {prometheus: {listen: "127.0.0.1:0"}}
"""


class BearerAndAssertionMetricsTests(TestCase):
    """
    Bearer and assertion outcomes at a gateway B that accepts C{gw-a}'s assertions
    (L{tests.test_assertion}), with C{requireBearer}.
    """

    async def test_outcomes_by_reason_class(self) -> None:
        w = await assertion_world(self)
        b = await w.gateway_b(require_bearer=True, routes=TELEMETRY)
        metrics = b.gateway.metrics
        assert isinstance(metrics, GatewayMetrics)
        bearer = w.bearer()
        expired = w.idp.mint_access_token(
            {"aud": CLIENT_ID, "iat": b.now() - 600, "exp": b.now() - 10}, user_claims=True
        )
        rogue = w.idp.mint_access_token(
            {"aud": CLIENT_ID}, key=SigningKey.generate("rsa-9", "RS256"), user_claims=True
        )
        sent: list[tuple[str | None, str | None, int]] = [
            (None, bearer, 200),
            (None, bearer, 200),  # the cached verification counts as accepted too
            (None, expired, 401),
            (None, rogue, 401),
            (None, "not a token", 401),
            (w.assertion(), bearer, 200),
            (w.assertion(), None, 401),
            (w.assertion(w.claims(sub="bob")), bearer, 200),
            (w.assertion(kid="a-1", key=w.keys["b-1"]), bearer, 200),
        ]
        for assertion, token, status in sent:
            reply = await assertion_get(b, "/svc/x", assertion, bearer=token)
            self.assertEqual(reply.status, status, (assertion, token))
        counted = {values: value for _, values, value in metrics.auth_outcomes.points() if value}
        self.assertEqual(
            counted,
            {
                ("bearer", "accepted", ""): 5,
                ("bearer", "rejected", "expired"): 1,
                ("bearer", "rejected", "signature"): 1,
                ("bearer", "rejected", "malformed"): 1,
                ("assertion", "accepted", ""): 1,
                ("assertion", "rejected", "no_bearer"): 1,
                ("assertion", "rejected", "subject_mismatch"): 1,
                ("assertion", "rejected", "signature"): 1,
            },
        )
