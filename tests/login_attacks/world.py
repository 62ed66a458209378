"""Scratch helpers for the security review: a LoginWorld whose config can be extended."""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.trial.unittest import TestCase

from edgegw.config.parse import load_config
from edgegw.gateway import build_gateway
from edgegw.upstream.pool import UpstreamClient
from tests.support.backends import SiteBackend, answer
from tests.support.configs import write_tree
from tests.support.fake_idp import FakeIdP
from tests.support.processes import listen_local, port_of
from tests.test_login import KEY, LoginWorld

reactor: Any = _reactor


class RWorld(LoginWorld):
    async def start_custom(
        self,
        routes: str,
        gateway_extra: str = "",
        session_extra: str = "",
        idp_spec: str = "",
        groups: str = '{source: groups, match: ["ou=groups"], render: cn}',
    ) -> None:
        upstream = f"http://127.0.0.1:{self.backend.port}"
        text = f"""\
kind: Gateway
metadata: {{name: gw}}
spec:
  listen: "127.0.0.1:0"
  session: {{key: "{KEY}"{session_extra}}}
  identity:
    groups: {groups}
{gateway_extra}
---
kind: IdP
metadata: {{name: idp}}
spec:
  type: oidc
  issuer: "{self.idp.issuer}"
  clientID: gw
  clientSecret: gw-secret
{idp_spec}
---
""" + routes.replace("UPSTREAM", upstream)
        root = write_tree(self.test.mktemp(), {"a.yaml": text})
        client = UpstreamClient(reactor)
        self.gateway = build_gateway(load_config(root, {}), reactor, client)
        listening = listen_local(self.gateway.site)
        self.test.addCleanup(listening.stopListening)
        self.test.addCleanup(client.close)
        self.port = port_of(listening)
        self.idp.redirect_uris.append(self.url("/auth/callback"))
        provider = self.gateway.idp
        assert provider is not None
        provider.first_retry = 0.05
        provider.retry_cap = 0.2
        provider.startService()
        self.test.addCleanup(provider.stopService)
        await self.ready()


async def rworld(test: TestCase, routes: str, **kw: Any) -> RWorld:
    idp = FakeIdP()
    await idp.start(test)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    w = RWorld(test, idp, backend)
    await w.start_custom(routes, **kw)
    return w
