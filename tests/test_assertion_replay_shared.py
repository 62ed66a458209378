"""
The identity-assertion replay record shared through the state store (issue 36, point 8):
real C{twistd -n edgegw} processes accepting assertions from gateway C{gw-a}, a real
redis-server, a test backend in the test process; the assertions are signed here.

  - with a C{stateProvider}, an assertion accepted at one process is refused at the
    other and at the same one again, its record (C{SET NX}) living as long as the
    assertion can be accepted at any instance, and two uses racing at two processes
    admit exactly one;
  - without one, the record is per process: each process accepts it once (the
    documented limit);
  - with the store down (or not answering), an assertion is not accepted (fail
    closed): 503 with C{Retry-After} where a login is required, anonymous where it is
    not;
  - requests without an assertion (or with an invalid one) send nothing to the store;
  - the record's key and lifetime (a clock the test moves), and a stateProvider that
    needs no session block on a gateway that accepts assertions.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from typing import Any

from nacl.signing import SigningKey
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from edgegw.assembly.assemble import build_gateway
from edgegw.config.model import AssertionAcceptSpec, AssertionKeySpec
from edgegw.identity.assertion import (
    AssertionRefusedError,
    AssertionUnavailableError,
    AssertionVerifier,
    record_key,
)
from tests.support.backends import SiteBackend, answer
from tests.support.configs import load_text
from tests.support.daemons import GatewayProcess, HttpAnswer, http_exchange, sleep
from tests.support.redis import RedisProbe, RedisServer, redis_server

HEADER = "X-Gw-Identity"
KEY_PREFIX = "gw:sess:"
ISSUER = "gw-a"
READY_TIMEOUT = 30.0


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def gateway_b(port: int, backend: int, public: bytes, redis: RedisServer | None) -> str:
    """
    An instance of gateway B: accepts C{gw-a}'s assertions alone (no Bearer token) on
    C{/svc/} (a login required) and C{/open/} (public), with C{redis} as its state
    provider when given.
    """
    state = ""
    if redis is not None:
        state = f"""\
  stateProvider:
    type: kvstore
    keyPrefix: "{KEY_PREFIX}"
    config: {{address: "{redis.address}", timeout: 2s}}
"""
    route = """\
---
kind: Route
metadata: {{name: {name}}}
spec:
  match: /{name}/
  type: service
  access: {{auth: {auth}}}
  handler: {{type: reverse-proxy, upstream: "http://127.0.0.1:{backend}"}}
"""
    return (
        f"""\
kind: Gateway
metadata: {{name: gw-b}}
spec:
  listen: "127.0.0.1:{port}"
  readiness: {{}}
{state}  identity:
    assertion:
      accept:
        issuer: {ISSUER}
        requireBearer: false
        keys: [{{keyId: a-1, publicKey: "{base64.b64encode(public).decode()}"}}]
"""
        + route.format(name="svc", auth="required", backend=backend)
        + route.format(name="open", auth="public", backend=backend)
    )


class SharedReplayTests(TestCase):
    """
    Gateway B's instances, with and without a shared state store.
    """

    async def instances(self, count: int, redis: RedisServer | None) -> list[GatewayProcess]:
        self.key = SigningKey.generate()
        self.backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(self.backend.stop)
        public = bytes(self.key.verify_key)
        started = []
        for index in range(count):
            process = GatewayProcess(
                self, {"b.yaml": gateway_b(0, self.backend.port, public, redis)}, f"b{index}"
            )
            await process.start()
            await self.ready(process)
            started.append(process)
        return started

    async def ready(self, process: GatewayProcess) -> None:
        """
        Wait until C{process} is ready (its store connected, with one).
        """
        waited = 0.0
        while (await http_exchange(process.port, "GET", "/readyz")).status != 200:
            self.assertLess(waited, READY_TIMEOUT, process.output[-3000:])
            await sleep(0.1)
            waited += 0.1

    def assertion(self, jti: str | None = None, **claims: Any) -> tuple[str, str]:
        """
        An assertion of C{gw-a} for alice, valid for a minute from now (C{claims}
        override), and its token id.
        """
        now = int(time.time())
        jti = jti if jti is not None else _b64url(secrets.token_bytes(16))
        body = {
            "iss": ISSUER,
            "sub": "alice",
            "iat": now,
            "exp": now + 60,
            "jti": jti,
            "groups": ["staff"],
            "claims": {},
            **claims,
        }
        head = _b64url(json.dumps({"alg": "EdDSA", "kid": "a-1"}).encode())
        payload = _b64url(json.dumps(body).encode())
        signature = self.key.sign(f"{head}.{payload}".encode()).signature
        return f"{head}.{payload}.{_b64url(signature)}", jti

    async def send(self, gateway: GatewayProcess, token: str, path: str = "/svc/") -> HttpAnswer:
        return await http_exchange(gateway.port, "GET", path, {HEADER: token})

    def assertAccepted(self, response: HttpAnswer, gateway: GatewayProcess) -> None:
        self.assertEqual(response.status, 200, gateway.output[-3000:])
        self.assertEqual(self.backend.requests[-1].header(b"X-User-Id"), b"alice")

    def assertRefused(self, response: HttpAnswer, gateway: GatewayProcess) -> None:
        self.assertEqual(response.status, 401, gateway.output[-3000:])

    async def test_accepted_at_one_instance_refused_at_the_other(self) -> None:
        redis = await redis_server(self)
        one, two = await self.instances(2, redis)
        token, jti = self.assertion()
        self.assertAccepted(await self.send(one, token), one)
        self.assertRefused(await self.send(two, token), two)
        self.assertRefused(await self.send(one, token), one)
        self.assertIn("replayed token id", two.output)
        keys = await RedisProbe(redis).keys(KEY_PREFIX + "assertion-jti:*")
        self.assertEqual(keys, {KEY_PREFIX.encode() + record_key(ISSUER, jti)})

    async def test_without_a_state_provider_each_instance_accepts_it_once(self) -> None:
        # The documented limit: the record is per process.
        one, two = await self.instances(2, None)
        token, _ = self.assertion()
        self.assertAccepted(await self.send(one, token), one)
        self.assertAccepted(await self.send(two, token), two)
        self.assertRefused(await self.send(one, token), one)
        self.assertRefused(await self.send(two, token), two)

    async def test_the_record_lives_as_long_as_the_assertion_is_acceptable(self) -> None:
        redis = await redis_server(self)
        [one] = await self.instances(1, redis)
        # Expired 20 s ago: still accepted for 10 s (30 s of leeway), at an instance
        # whose clock is 30 s behind for 40 s. The record lasts that long, no longer.
        now = int(time.time())
        token, jti = self.assertion(iat=now - 80, exp=now - 20)
        self.assertAccepted(await self.send(one, token), one)
        left = await RedisProbe(redis).pttl(KEY_PREFIX.encode() + record_key(ISSUER, jti))
        self.assertGreater(left, 10_000)
        self.assertLessEqual(left, 40_000)

    async def test_the_store_down_refuses_the_assertion(self) -> None:
        redis = await redis_server(self)
        [one] = await self.instances(1, redis)
        warm, _ = self.assertion()
        self.assertAccepted(await self.send(one, warm), one)
        await redis.stop()
        token, _ = self.assertion()
        # Where a login is required: 503, retry later (not the caller's fault).
        down = await self.send(one, token)
        self.assertEqual(down.status, 503, one.output[-3000:])
        self.assertEqual(down.header(b"retry-after"), b"5")
        # Where it is not: the request goes on anonymous.
        seen = len(self.backend.requests)
        anonymous = await self.send(one, token, "/open/")
        self.assertEqual(anonymous.status, 200, one.output[-3000:])
        self.assertEqual(len(self.backend.requests), seen + 1)
        self.assertIsNone(self.backend.requests[-1].header(b"X-User-Id"))
        self.assertIn("replay record unavailable", one.output)

    async def test_a_store_that_does_not_answer_refuses_the_assertion(self) -> None:
        redis = await redis_server(self)
        [one] = await self.instances(1, redis)
        redis.pause()
        token, _ = self.assertion()
        # Within the store's timeout (2 s): not accepted, and not left waiting.
        frozen = await self.send(one, token)
        self.assertEqual(frozen.status, 503, one.output[-3000:])
        self.assertEqual(len(self.backend.requests), 0)

    async def test_no_store_round_trip_without_a_valid_assertion(self) -> None:
        redis = await redis_server(self)
        [one] = await self.instances(1, redis)
        probe = RedisProbe(redis)

        async def commands() -> int:
            stats = (await probe.command("INFO", "commandstats")).decode()
            return sum(
                int(line.split("calls=", 1)[1].split(",", 1)[0])
                for line in stats.splitlines()
                if line.startswith("cmdstat_") and not line.startswith("cmdstat_info:")
            )

        before = await commands()
        for _ in range(3):
            self.assertEqual((await http_exchange(one.port, "GET", "/svc/")).status, 401)
        token, _ = self.assertion()
        forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        self.assertRefused(await self.send(one, forged), one)
        self.assertEqual(await commands(), before)
        self.assertAccepted(await self.send(one, token), one)
        self.assertEqual(await commands(), before + 1)

    async def test_a_replay_racing_the_first_use_at_two_instances(self) -> None:
        # The attack: the same assertion sent to two instances at the same moment, before
        # either has recorded it. SET NX decides: exactly one of them accepts it.
        redis = await redis_server(self)
        one, two = await self.instances(2, redis)
        for _ in range(10):
            token, _ = self.assertion()
            answers = await gatherResults(
                [Deferred.fromCoroutine(self.send(gateway, token)) for gateway in (one, two)]
            )
            statuses = sorted(a.status for a in answers)
            self.assertEqual(statuses, [200, 401], one.output[-2000:] + two.output[-2000:])


class RecordKeyTests(SynchronousTestCase):
    """
    The attack on the key: a token id crafted to land on another issuer's record (or to
    shape the key) cannot.
    """

    def test_issuer_and_token_id_cannot_be_shifted_into_each_other(self) -> None:
        self.assertNotEqual(record_key("gw-a", "bc"), record_key("gw-ab", "c"))
        self.assertNotEqual(record_key("gw-a", "x"), record_key("gw-b", "x"))
        self.assertNotEqual(record_key("gw-a", "1:x"), record_key("gw-a:1", "x"))

    def test_any_token_id_makes_a_key_of_fixed_shape(self) -> None:
        for jti in ("x", "a:b*?[]\r\n", "\u00e9" * 256, "assertion-jti:" + "0" * 64):
            key = record_key("gw-a", jti)
            self.assertRegex(key, rb"\Aassertion-jti:[0-9a-f]{64}\Z")


class SharedRecordTests(TestCase):
    """
    L{AssertionVerifier.accept} with a shared record (a dict standing in for the store)
    and a clock the test moves: what it records, for how long, and when it asks.
    """

    def setUp(self) -> None:
        self.key = SigningKey.generate()
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.recorded: dict[bytes, float] = {}
        self.down = False
        spec = AssertionAcceptSpec(
            issuer=ISSUER,
            keys=(AssertionKeySpec("a-1", bytes(self.key.verify_key)),),
            require_bearer=False,
        )
        self.verifier = AssertionVerifier(spec, self.clock, shared=self.claim)

    async def claim(self, key: bytes, ttl: float) -> bool:
        if self.down:
            raise AssertionUnavailableError("replay record unavailable (test)")
        if key in self.recorded:
            return False
        self.recorded[key] = ttl
        return True

    def token(self, **claims: Any) -> bytes:
        now = int(self.clock.seconds())
        body = {"iss": ISSUER, "sub": "alice", "iat": now, "exp": now + 60, "jti": "j1"}
        body.update(claims)
        head = _b64url(json.dumps({"alg": "EdDSA", "kid": "a-1"}).encode())
        payload = _b64url(json.dumps(body).encode())
        signature = self.key.sign(f"{head}.{payload}".encode()).signature
        return f"{head}.{payload}.{_b64url(signature)}".encode()

    async def test_the_record_expires_60_s_after_exp(self) -> None:
        await self.verifier.accept(self.token())
        self.assertEqual(self.recorded, {record_key(ISSUER, "j1"): 120.0})

    async def test_a_second_use_is_refused_as_a_replay(self) -> None:
        token = self.token()
        await self.verifier.accept(token)
        with self.assertRaises(AssertionRefusedError) as caught:
            await self.verifier.accept(token)
        self.assertEqual(caught.exception.reason, "replayed token id")

    async def test_nothing_is_recorded_for_an_assertion_refused_otherwise(self) -> None:
        now = int(self.clock.seconds())
        for claims in (
            {"iss": "gw-x"},
            {"exp": now - 31},
            {"iat": now + 31, "exp": now + 90},
            {"exp": now + 601},
            {"sub": ""},
        ):
            with self.assertRaises(AssertionRefusedError):
                await self.verifier.accept(self.token(**claims))
        self.assertEqual(self.recorded, {})

    async def test_an_unreachable_record_is_not_an_acceptance(self) -> None:
        self.down = True
        with self.assertRaises(AssertionUnavailableError):
            await self.verifier.accept(self.token())
        # Nor does the process remember it: once the store is back, it is accepted.
        self.down = False
        await self.verifier.accept(self.token())


class StateProviderWithoutSessionTests(SynchronousTestCase):
    """
    A gateway that only accepts assertions may have a stateProvider (edgegw addition):
    its store keeps the replay record, and nothing else needs a session block.
    """

    STATE = """\
kind: Gateway
metadata: {name: g}
spec:
  listen: "127.0.0.1:0"
  stateProvider: {type: kvstore, config: {address: "127.0.0.1:6379"}}
"""

    def test_with_accept_it_loads_and_is_built(self) -> None:
        public = base64.b64encode(bytes(SigningKey.generate().verify_key)).decode()
        text = (
            self.STATE
            + f"""\
  identity:
    assertion:
      accept: {{issuer: gw-a, keys: [{{keyId: a-1, publicKey: "{public}"}}]}}
"""
        )
        gateway = build_gateway(load_text(self.mktemp(), text, gateway=False), Clock())
        self.assertIsNotNone(gateway.state)
        self.assertIsNone(gateway.sessions)

    def test_without_accept_or_session_the_store_is_the_plugins(self) -> None:
        """
        Neither sessions nor assertions: the store is built all the same (plugins such
        as a shared rate limit use it), and holds no session.
        """
        gateway = build_gateway(load_text(self.mktemp(), self.STATE, gateway=False), Clock())
        self.assertIsNotNone(gateway.state)
        self.assertIsNone(gateway.sessions)
