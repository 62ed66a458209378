"""
api backends receive the same projected identity headers as reverse-proxy backends
(issue 36, point 7): the subject, the groups under a custom header name and claims under
custom names from an explicit C{projection.session.claims} map, not only C{X-User-*};
and, like the proxy's, never one a client sent.

Over real sockets: a gateway with browser login (the in-repo fake OpenID provider), an
api route fanning out to two backends that record what they receive, and a reverse-proxy
route with the same projection for comparison.
"""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from tests.support.backends import RecordedRequest, SiteBackend, answer
from tests.support.browser import Browser
from tests.support.fake_idp import FakeIdP
from tests.test_login import LoginWorld

_JSON = [(b"Content-Type", b"application/json")]

# The projection of the api route /fan/ and the proxy route /px/: claims and groups under
# names outside X-User-*. /open-fan/ is a public api route with the default projection.
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
metadata: {name: fan}
spec:
  match: /fan/
  type: app
  access:
    auth: required
    projection: {session: {claims: {email: X-Mail, name: X-Display}, groups: {header: X-Teams}}}
  handler:
    type: api
    backends:
      - {group: one, upstream: "UPSTREAM", path: /one}
      - {group: two, upstream: "SECOND", path: /two}
---
kind: Route
metadata: {name: px}
spec:
  match: /px/
  type: app
  access:
    auth: required
    projection: {session: {claims: {email: X-Mail, name: X-Display}, groups: {header: X-Teams}}}
  handler: {type: reverse-proxy, upstream: "UPSTREAM"}
---
kind: Route
metadata: {name: open-fan}
spec:
  match: /open-fan/
  type: app
  access: {auth: public}
  handler:
    type: api
    backends:
      - {group: one, upstream: "UPSTREAM", path: /one}
      - {group: two, upstream: "SECOND", path: /two}
"""

# Headers a client sends to pose as someone else: X-User-*, and every custom identity
# header some route projects.
FORGED = {
    "X-User-Id": "mallory",
    "X-User-Email": "mallory@example.com",
    "X-Mail": "mallory@example.com",
    "X-Display": "Mallory",
    "X-Teams": "root",
}

IDENTITY = (b"x-user-", b"x-mail", b"x-display", b"x-teams")


def identity_of(request: RecordedRequest) -> dict[bytes, list[bytes]]:
    """
    The identity headers a backend received (lowercased names, every value).
    """
    found: dict[bytes, list[bytes]] = {}
    for name, value in request.headers:
        lower = name.lower()
        if lower.startswith(IDENTITY):
            found.setdefault(lower, []).append(value)
    return found


class ApiIdentityHeaderTests(TestCase):
    async def setUp(self) -> None:  # type: ignore[override]
        idp = FakeIdP()
        await idp.start(self)
        self.one = SiteBackend(answer(body=b'{"n":1}', headers=_JSON)).start()
        self.addCleanup(self.one.stop)
        self.two = SiteBackend(answer(body=b'{"n":2}', headers=_JSON)).start()
        self.addCleanup(self.two.stop)
        self.world = LoginWorld(self, idp, self.one)
        routes = ROUTES.replace("SECOND", f"http://127.0.0.1:{self.two.port}")
        await self.world.start_routes(routes)

    def last(self, backend: SiteBackend, path: bytes) -> RecordedRequest:
        return [request for request in backend.requests if request.uri == path][-1]

    async def test_both_backends_get_the_custom_projection(self) -> None:
        """
        Each backend of an authenticated api request gets the subject, the groups under
        their custom name and the mapped claims under theirs; none of the client's
        forged values, and not the claims under their default X-User-* names.
        """
        w = self.world
        await w.login("/app/x")
        response = await w.browser.get(w.url("/fan/x"), headers=FORGED)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.json(), {"one": {"n": 1}, "two": {"n": 2}})
        expected = {
            b"x-user-id": [b"alice"],
            b"x-teams": [b"admins"],
            b"x-mail": [b"alice@example.com"],
            b"x-display": [b"Alice Example"],
        }
        self.assertEqual(identity_of(self.last(self.one, b"/one")), expected)
        self.assertEqual(identity_of(self.last(self.two, b"/two")), expected)

    async def test_the_same_set_as_the_proxy(self) -> None:
        """
        A reverse-proxy route with the same projection sends its backend exactly the
        identity headers the api route sends each of its backends.
        """
        w = self.world
        await w.login("/app/x")
        await w.browser.get(w.url("/px/x"), headers=FORGED)
        proxied = identity_of(self.last(self.one, b"/px/x"))
        await w.browser.get(w.url("/fan/x"), headers=FORGED)
        self.assertEqual(identity_of(self.last(self.one, b"/one")), proxied)
        self.assertEqual(identity_of(self.last(self.two, b"/two")), proxied)

    async def test_default_projection_on_a_public_api_route(self) -> None:
        """
        A public api route with the default projection sends a logged-in browser's
        X-User-* claims to both backends, and none of the custom names another route
        projects, even when the client sends them (the attack: a client-sent X-Mail,
        which the /fan/ backends trust, through a route that does not project it).
        """
        w = self.world
        await w.login("/app/x")
        await w.browser.get(w.url("/open-fan/x"), headers=FORGED)
        for backend, path in ((self.one, b"/one"), (self.two, b"/two")):
            self.assertEqual(
                identity_of(self.last(backend, path)),
                {
                    b"x-user-id": [b"alice"],
                    b"x-user-groups": [b"admins"],
                    b"x-user-email": [b"alice@example.com"],
                    b"x-user-name": [b"Alice Example"],
                },
            )

    async def test_anonymous_forgeries_reach_no_backend(self) -> None:
        """
        An anonymous client's forged X-User-* and custom identity headers reach neither
        backend of a public api route.
        """
        w = self.world
        response = await Browser().get(w.url("/open-fan/x"), headers=FORGED)
        self.assertEqual(response.status, 200)
        self.assertEqual(identity_of(self.last(self.one, b"/one")), {})
        self.assertEqual(identity_of(self.last(self.two, b"/two")), {})
