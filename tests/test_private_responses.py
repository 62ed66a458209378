"""
Authenticated responses are private (issue 36, point 5): when a request carries a
principal and the response the gateway relays has no C{Cache-Control}, the gateway adds
C{Cache-Control: private}, so that a shared cache in front never stores one user's answer
for another; a backend's own C{Cache-Control} is relayed as it is (C{public} included),
and an anonymous request's response is unchanged.

Over real sockets: a gateway with browser login (the in-repo fake OpenID provider), a
backend answering per path, reverse-proxy, api and static routes.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import TestCase
from twisted.web.server import Request

from tests.support.backends import SiteBackend
from tests.support.browser import Browser, BrowserResponse
from tests.support.fake_idp import FakeIdP
from tests.test_login import LoginWorld

# What the backend answers per path: the Cache-Control lines it sends (none, one, an
# empty one, one it names hop-by-hop).
ANSWERS: dict[bytes, list[tuple[bytes, bytes]]] = {
    b"/none": [],
    b"/max-age": [(b"Cache-Control", b"max-age=60")],
    b"/public": [(b"Cache-Control", b"public, max-age=60")],
    b"/empty": [(b"Cache-Control", b"")],
    b"/hop": [(b"Connection", b"Cache-Control"), (b"Cache-Control", b"public, max-age=60")],
    b"/expires": [(b"Expires", b"Thu, 01 Jan 2099 00:00:00 GMT")],
}


def respond(request: Request) -> bytes:
    """
    The backend: a small JSON body; for the paths above, their Cache-Control lines.
    """
    path = (request.path or b"").rsplit(b"/", 1)[-1]
    for name, value in ANSWERS.get(b"/" + path, []):
        request.responseHeaders.addRawHeader(name, value)
    request.setHeader(b"Content-Type", b"application/json")
    return b'{"user":"data"}'


ROUTES = """\
kind: Route
metadata: {name: app}
spec:
  match: /app/
  type: app
  access: {auth: required}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
---
kind: Route
metadata: {name: open}
spec:
  match: /open/
  type: app
  access: {auth: public}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
---
kind: Route
metadata: {name: svc}
spec:
  match: /svc/
  type: service
  access: {auth: required}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
---
kind: Route
metadata: {name: fan}
spec:
  match: /fan/
  type: app
  access: {auth: public}
  handler:
    type: api
    backends:
      - {group: one, upstream: "UPSTREAM", path: /none}
---
kind: Route
metadata: {name: files}
spec:
  match: /files/
  type: app
  access: {auth: public}
  handler: {type: static, dir: "FILES", stripPrefix: /files}
---
kind: Route
metadata: {name: assets}
spec:
  match: /assets/
  type: app
  access: {auth: public}
  handler: {type: static, dir: "FILES", stripPrefix: /assets, cacheControl: "public, max-age=600"}
"""


class PrivateResponseTests(TestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        idp = FakeIdP()
        await idp.start(self)
        self.backend = SiteBackend(respond).start()
        self.addCleanup(self.backend.stop)
        files = self.mktemp()
        os.makedirs(files)
        for name, content in (("index.html", b"<html></html>"), ("app.js", b"let a = 1;")):
            with open(os.path.join(files, name), "wb") as f:
                f.write(content)
        self.world = LoginWorld(self, idp, self.backend)
        await self.world.start_routes(ROUTES.replace("FILES", os.path.abspath(files)))
        await self.world.login("/app/x")

    async def get(self, path: str, anonymous: bool = False) -> BrowserResponse:
        browser = Browser() if anonymous else self.world.browser
        response = await browser.get(self.world.url(path))
        self.assertEqual(response.status, 200, path)
        return response

    def cache_control(self, response: BrowserResponse) -> list[str]:
        return list(response.headers.getRawHeaders("Cache-Control", []))

    async def test_proxy_adds_private_when_absent(self) -> None:
        """
        A logged-in browser's proxied response without Cache-Control gets
        C{Cache-Control: private}, on an app route that requires the login and on a
        public one it visits with its session alike; a service route too.
        """
        for path in ("/app/none", "/open/none", "/svc/none", "/app/expires"):
            response = await self.get(path)
            self.assertEqual(self.cache_control(response), ["private"], path)
            self.assertEqual(response.body, b'{"user":"data"}')

    async def test_bearer_principal_too(self) -> None:
        """
        A principal from a Bearer token (a service route, no cookie) makes the answer
        private as a session does.
        """
        token = self.world.idp.mint_access_token({"aud": "gw"}, user_claims=True)
        response = await Browser().get(
            self.world.url("/svc/none"), headers={"Authorization": f"Bearer {token}"}
        )
        self.assertEqual(response.status, 200)
        self.assertEqual(self.cache_control(response), ["private"])
        self.assertEqual(self.backend.requests[-1].header(b"X-User-Id"), b"alice")

    async def test_proxy_leaves_the_backends_own(self) -> None:
        """
        A backend's own Cache-Control reaches the logged-in browser as it is: nothing
        added, nothing changed.
        """
        response = await self.get("/app/max-age")
        self.assertEqual(self.cache_control(response), ["max-age=60"])

    async def test_backend_saying_public_is_left_public(self) -> None:
        """
        The attack on the rule: a backend that marks a per-user answer C{public}. The
        gateway relays the backend's word (documented: the backend knows whether its
        answer is per user; shared assets behind a login are a legitimate C{public}).
        """
        response = await self.get("/app/public")
        self.assertEqual(self.cache_control(response), ["public, max-age=60"])

    async def test_directives_that_are_not_relayed_do_not_count(self) -> None:
        """
        A Cache-Control the backend names in its Connection header is hop-by-hop and
        not relayed, and an empty one has no directive: both answers are private.
        """
        for path in ("/app/hop", "/app/empty"):
            response = await self.get(path)
            self.assertEqual(self.cache_control(response), ["private"], path)

    async def test_anonymous_response_unchanged(self) -> None:
        """
        An anonymous request's proxied response has no Cache-Control added; its own
        passes as it is.
        """
        response = await self.get("/open/none", anonymous=True)
        self.assertEqual(self.cache_control(response), [])
        response = await self.get("/open/max-age", anonymous=True)
        self.assertEqual(self.cache_control(response), ["max-age=60"])

    async def test_api_answers_stay_no_store(self) -> None:
        """
        The api's merged answer always has its own C{Cache-Control: no-store}
        (stricter than private): left as it is for a logged-in browser, and the same
        for an anonymous one. A backend's Cache-Control is never relayed by the api.
        """
        for anonymous in (False, True):
            response = await self.get("/fan/x", anonymous=anonymous)
            self.assertEqual(self.cache_control(response), ["no-store"])
            self.assertEqual(response.json(), {"one": {"user": "data"}})

    async def test_static_behind_a_login_is_private(self) -> None:
        """
        A static file without a configured C{cacheControl} is private for a logged-in
        browser and unchanged for an anonymous one; the index's C{no-cache} and a
        configured C{cacheControl} are left as they are.
        """
        response = await self.get("/files/app.js")
        self.assertEqual(self.cache_control(response), ["private"])
        response = await self.get("/files/app.js", anonymous=True)
        self.assertEqual(self.cache_control(response), [])
        for anonymous in (False, True):
            response = await self.get("/files/", anonymous=anonymous)
            self.assertEqual(self.cache_control(response), ["no-cache"])
            response = await self.get("/assets/app.js", anonymous=anonymous)
            self.assertEqual(self.cache_control(response), ["public, max-age=600"])
