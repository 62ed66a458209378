"""
Bearer verification end to end: a gateway process (C{twistd -n edgegw}) verifying access
tokens that the real OpenID provider (node's oidc-provider, tests/e2e/provider.mjs)
issues through the client credentials grant, RS256 and ES256; refusing them once
expired; and following a key rotation (the provider restarted with new signing keys on
the same issuer) without a restart of its own.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.trial.unittest import TestCase

from tests.e2e.provider import (
    RESOURCE,
    SERVICE_CLIENT,
    SERVICE_CLIENT_ES256,
    Provider,
    client_credentials_token,
    start_provider,
)
from tests.support.backends import SiteBackend, answer
from tests.support.daemons import GatewayProcess, HttpAnswer, http_exchange, sleep

reactor: Any = _reactor

# The gateway's leeway on exp (edgegw/identity/tokens.py) plus a margin.
EXPIRY_LEEWAY = 5.0
READY_DEADLINE = 20.0


def verifying_gateway(provider: Provider, backend_port: int) -> dict[str, str]:
    """
    A gateway configuration verifying the provider's resource tokens on C{/api/}.
    """
    text = f"""\
kind: Gateway
metadata: {{name: api-gw}}
spec:
  listen: "127.0.0.1:0"
  identity:
    userInfo: never
    claims: []
---
kind: IdP
metadata: {{name: op}}
spec:
  type: oidc
  verificationOnly: true
  issuer: "{provider.issuer}"
  clientID: "{provider.client_id}"
  bearer: {{audience: "{RESOURCE}"}}
---
kind: Route
metadata: {{name: api}}
spec:
  match: /api/
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend_port}"}}
"""
    return {"gateway.yaml": text}


class BearerProcessTests(TestCase):
    """
    A verification-only gateway process in front of a backend, against the real provider.
    """

    async def serve(self, provider: Provider) -> tuple[GatewayProcess, SiteBackend]:
        backend = SiteBackend(answer(body=b"api")).start()
        self.addCleanup(backend.stop)
        gateway = GatewayProcess(self, verifying_gateway(provider, backend.port))
        await gateway.start()
        return gateway, backend

    async def call(self, gateway: GatewayProcess, token: str) -> HttpAnswer:
        return await http_exchange(
            gateway.port, "GET", "/api/x", headers={"Authorization": f"Bearer {token}"}
        )

    async def accepted_once_ready(self, gateway: GatewayProcess, token: str) -> HttpAnswer:
        """
        The answer to C{token} once the gateway has loaded the provider's discovery and
        keys (503 until then); fails the test past a deadline.
        """
        waited = 0.0
        while True:
            answer_ = await self.call(gateway, token)
            if answer_.status != 503 or waited >= READY_DEADLINE:
                return answer_
            await sleep(0.1)
            waited += 0.1

    async def test_client_credentials_tokens_rs256_and_es256(self) -> None:
        provider = await start_provider(self, ["http://127.0.0.1:1/unused"])
        gateway, backend = await self.serve(provider)
        rs256 = await client_credentials_token(provider, SERVICE_CLIENT)
        es256 = await client_credentials_token(provider, SERVICE_CLIENT_ES256)
        self.assertEqual(_alg(rs256), "RS256")
        self.assertEqual(_alg(es256), "ES256")

        for client_id, token in ((SERVICE_CLIENT, rs256), (SERVICE_CLIENT_ES256, es256)):
            reply = await self.accepted_once_ready(gateway, token)
            self.assertEqual((reply.status, reply.body), (200, b"api"), gateway.output)
            seen = backend.requests[-1]
            self.assertEqual(seen.header(b"X-User-Id"), client_id.encode())

        anonymous = await http_exchange(gateway.port, "GET", "/api/x")
        self.assertEqual(anonymous.status, 401)
        forged = await self.call(
            gateway, rs256[:-6] + ("AAAAAA" if rs256[-6:] != "AAAAAA" else "BBBBBB")
        )
        self.assertEqual(forged.status, 401)
        self.assertEqual(forged.header(b"WWW-Authenticate"), b'Bearer error="invalid_token"')

    async def test_expired_token_is_refused(self) -> None:
        provider = await start_provider(
            self, ["http://127.0.0.1:1/unused"], env={"E2E_OIDC_TTL_ACCESS_TOKEN": "1"}
        )
        gateway, _ = await self.serve(provider)
        token = await client_credentials_token(provider)
        fresh = await self.accepted_once_ready(gateway, token)
        self.assertEqual(fresh.status, 200, gateway.output)
        # Verified once and cached: the cache never trusts it past its exp.
        await sleep(1 + EXPIRY_LEEWAY + 0.5)
        expired = await self.call(gateway, token)
        self.assertEqual(expired.status, 401)
        self.assertEqual(expired.header(b"WWW-Authenticate"), b'Bearer error="invalid_token"')

    async def test_new_signing_keys_after_a_provider_restart(self) -> None:
        provider = await start_provider(self, ["http://127.0.0.1:1/unused"])
        gateway, _ = await self.serve(provider)
        before = await client_credentials_token(provider)
        self.assertEqual((await self.accepted_once_ready(gateway, before)).status, 200)

        await provider.stop()
        restarted = await start_provider(
            self,
            ["http://127.0.0.1:1/unused"],
            port=provider.port,
            client_secret=provider.client_secret,
        )
        self.assertEqual(restarted.issuer, provider.issuer)
        after = await client_credentials_token(restarted)
        self.assertNotEqual(_kid(after), _kid(before))
        # The gateway holds only the old keys: the unknown kid makes it refetch at once.
        reply = await self.call(gateway, after)
        self.assertEqual((reply.status, reply.body), (200, b"api"), gateway.output)
        self.assertIn("key set refetched", gateway.output)


def _header(token: str) -> dict[str, Any]:
    head = token.split(".")[0]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    return decoded


def _alg(token: str) -> str:
    return str(_header(token)["alg"])


def _kid(token: str) -> str:
    return str(_header(token)["kid"])
