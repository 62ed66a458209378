"""
The in-process single flight of the silent refresh (issue 36, point 9: with it removed no
test failed, since the Redis lock still lets one refresh through to the IdP).

One gateway with server-side sessions in a real redis-server (tests/support/redis.py)
and the fake OpenID provider; a session whose access token is due. Twenty concurrent
requests of that session all ask for the refresh while the IdP's answer is held back;
the process must start exactly one refresh for them: one attempt at the session's
refresh lock in the store, one refresh grant, every request going on with the new
token. Without the single flight each request starts its own refresh, and all but one
find the lock taken and poll the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.trial.unittest import TestCase

from edgegw.identity.session_cookie import SessionRecord
from tests.support.sessions import sleep
from tests.test_server_sessions import World, app, logged_in, world

reactor: Any = _reactor

CONCURRENT = 20


class SingleFlight(TestCase):
    def instrument(self, w: World) -> tuple[list[bytes], list[str], Deferred[None]]:
        """
        Record the refresh-lock attempts of C{w}'s gateway (each refresh this process
        starts makes one) and the requests that ask for a refresh; hold the IdP's
        refresh answers until the L{Deferred} returned fires.
        """
        gateway = w.gw.gateway
        sessions = gateway.sessions
        provider = gateway.idp
        assert sessions is not None and provider is not None
        refresher = sessions.refresher
        store = sessions.store

        # Refreshes started by this process: attempts at a session's refresh lock.
        locks: list[bytes] = []
        real_acquire = store.acquire

        def acquire(lock_key: bytes, owner: bytes, lease: float) -> Deferred[bool]:
            if lock_key.startswith(b"lock:"):
                locks.append(lock_key)
            return real_acquire(lock_key, owner, lease)

        self.patch(store, "acquire", acquire)

        # Requests that asked for the refresh.
        asked: list[str] = []
        real_refreshed = refresher.refreshed

        def refreshed(session_id: str, record: SessionRecord) -> Deferred[SessionRecord | None]:
            asked.append(session_id)
            return real_refreshed(session_id, record)

        self.patch(refresher, "refreshed", refreshed)

        # The IdP's answer waits until every request has asked.
        release: Deferred[None] = Deferred()
        real_refresh = provider.refresh

        async def held(metadata: Any, refresh_token: str) -> Mapping[str, Any]:
            gate: Deferred[None] = Deferred()
            release.addCallback(lambda _: gate.callback(None))
            await gate
            return await real_refresh(metadata, refresh_token)

        self.patch(provider, "refresh", held)
        return locks, asked, release

    async def asked_by(self, asked: list[str], count: int) -> None:
        for _ in range(3000):
            if len(asked) >= count:
                break
            await sleep(0.01)
        self.assertEqual(len(asked), count, "not every request asked for the refresh")

    async def test_one_refresh_for_concurrent_requests(self) -> None:
        # Tokens issued at login last 30 s, within the 60 s refreshSkew: due at once.
        w = await world(self, token_lifetime=30)
        browser = await logged_in(w)
        before = await w.gw.stored_record(browser)
        assert before is not None and before.access_token is not None
        w.idp.token_lifetime = 3600
        locks, asked, release = self.instrument(w)
        sessions = w.gw.gateway.sessions
        assert sessions is not None
        refresher = sessions.refresher

        requests = [Deferred.fromCoroutine(app(w, browser)) for _ in range(CONCURRENT)]
        await self.asked_by(asked, CONCURRENT)
        self.assertEqual(len(set(asked)), 1)
        release.callback(None)
        responses = await gatherResults(requests)

        self.assertEqual([r.status for r in responses], [200] * CONCURRENT)
        self.assertEqual(len(locks), 1, f"{len(locks)} refreshes started for one session")
        self.assertEqual(refresher.refreshes, 1)
        self.assertEqual(w.idp.refresh_grants, 1)
        after = await w.gw.stored_record(browser)
        assert after is not None and after.access_token is not None
        self.assertNotEqual(after.access_token, before.access_token)
        seen = {r.header(b"Authorization") for r in w.backend.requests if r.uri == b"/app/page"}
        self.assertEqual(seen, {b"Bearer " + after.access_token.encode()})

    async def test_one_flight_per_session(self) -> None:
        """
        Attack: two sessions refreshed at the same moment (two browsers of a user, or two
        users) never share a flight: each session's requests go on with that session's
        new token, never the other's; one refresh each.
        """
        w = await world(self, token_lifetime=30)
        browsers = [await logged_in(w), await logged_in(w)]
        w.idp.token_lifetime = 3600
        locks, asked, release = self.instrument(w)
        half = CONCURRENT // 2
        requests = [
            Deferred.fromCoroutine(app(w, browser)) for browser in browsers for _ in range(half)
        ]
        await self.asked_by(asked, CONCURRENT)
        self.assertEqual(len(set(asked)), 2)
        release.callback(None)
        responses = await gatherResults(requests)
        self.assertEqual([r.status for r in responses], [200] * CONCURRENT)
        self.assertEqual(len(locks), 2)
        self.assertEqual(w.idp.refresh_grants, 2)
        tokens = []
        for browser in browsers:
            record = await w.gw.stored_record(browser)
            assert record is not None and record.access_token is not None
            tokens.append(b"Bearer " + record.access_token.encode())
        self.assertNotEqual(tokens[0], tokens[1])
        seen = [r.header(b"Authorization") for r in w.backend.requests if r.uri == b"/app/page"]
        self.assertEqual(sorted(seen), sorted([tokens[0]] * half + [tokens[1]] * half))
