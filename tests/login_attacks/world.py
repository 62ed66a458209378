"""
A L{LoginWorld} whose routes and Gateway blocks each attack test writes itself.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor as _reactor
from twisted.trial.unittest import TestCase

from tests.support.backends import SiteBackend, answer
from tests.support.fake_idp import FakeIdP
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
        await self.serve(text)


async def rworld(test: TestCase, routes: str, **kw: Any) -> RWorld:
    idp = FakeIdP()
    await idp.start(test)
    backend = SiteBackend(answer(body=b"backend")).start()
    test.addCleanup(backend.stop)
    w = RWorld(test, idp, backend)
    await w.start_custom(routes, **kw)
    return w
