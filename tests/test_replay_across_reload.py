"""
The identity-assertion replay record of a gateway without a C{stateProvider} across a
reload (SIGHUP), in one real C{twistd -n edgegw} process: docs/configuration.md and
docs/architecture.md call that record "per process", so an assertion accepted before a
reload must still be refused as a replay after it.

Found while writing docs/deployment.md (issue 37, point 5): each configuration builds
its own L{AssertionVerifier<edgegw.identity.assertion.AssertionVerifier>} (in
C{edgegw/assembly/identity_wiring.py}), and a reload did not hand the old one's record
over, so a SIGHUP forgot it; the login states spent at the callback likewise. Both are
now carried over (L{edgegw.reload.carry_replay_records}).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import time

from nacl.signing import SigningKey
from twisted.trial.unittest import TestCase

from tests.support.backends import SiteBackend, answer
from tests.support.daemons import GatewayProcess, http_exchange, sleep
from tests.test_assertion_replay_shared import HEADER, ISSUER, gateway_b

RELOAD_TIMEOUT = 30.0


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def mint(key: SigningKey) -> str:
    """
    An assertion of C{gw-a} for alice, valid for a minute from now, with a fresh id.
    """
    now = int(time.time())
    body = {
        "iss": ISSUER,
        "sub": "alice",
        "iat": now,
        "exp": now + 60,
        "jti": _b64url(secrets.token_bytes(16)),
        "groups": [],
        "claims": {},
    }
    head = _b64url(json.dumps({"alg": "EdDSA", "kid": "a-1"}).encode())
    payload = _b64url(json.dumps(body).encode())
    signature = key.sign(f"{head}.{payload}".encode()).signature
    return f"{head}.{payload}.{_b64url(signature)}"


class ReplayAcrossReloadTests(TestCase):
    """
    One instance of gateway B (assertions alone, no Bearer token, no state provider).
    """

    async def test_an_assertion_accepted_before_a_reload_is_refused_after_it(self) -> None:
        key = SigningKey.generate()
        backend = SiteBackend(answer(body=b"backend")).start()
        self.addCleanup(backend.stop)
        public = bytes(key.verify_key)
        gateway = GatewayProcess(self, {"b.yaml": gateway_b(0, backend.port, public, None)}, "b")
        await gateway.start()
        token = mint(key)
        accepted = await http_exchange(gateway.port, "GET", "/svc/", {HEADER: token})
        self.assertEqual(accepted.status, 200, gateway.output[-3000:])
        replayed = await http_exchange(gateway.port, "GET", "/svc/", {HEADER: token})
        self.assertEqual(replayed.status, 401, gateway.output[-3000:])

        os.kill(gateway.pid, signal.SIGHUP)
        waited = 0.0
        while "configuration reloaded from" not in gateway.output:
            self.assertLess(waited, RELOAD_TIMEOUT, gateway.output[-3000:])
            await sleep(0.1)
            waited += 0.1

        after = await http_exchange(gateway.port, "GET", "/svc/", {HEADER: token})
        self.assertEqual(
            after.status, 401, "a replayed assertion was accepted again after a reload"
        )


class SpentLoginStatesAcrossReloadTests(TestCase):
    async def test_a_login_state_spent_before_a_reload_stays_spent(self) -> None:
        """
        A login state the callback took before a reload (or that the replaced
        configuration takes while it drains) is refused after it: the new
        configuration shares the record.
        """
        from twisted.internet import reactor

        from edgegw.config.parse import load_config
        from edgegw.service import build_service
        from tests.support.configs import write_tree
        from tests.test_reload_carry import HEALTH, with_idp

        root = write_tree(self.mktemp(), {"a.yaml": with_idp("http://127.0.0.1:9") + HEALTH})
        service = build_service(load_config(root, {}), reactor, source=root)
        service.privilegedStartService()
        service.startService()
        self.addCleanup(service.stopService)
        old = service.gateway.login
        assert old is not None
        now = int(reactor.seconds())
        self.assertTrue(old.spent.spend("before", now))
        self.assertTrue(await service.reload())
        new = service.gateway.login
        assert new is not None and new is not old
        self.assertFalse(new.spent.spend("before", now))
        # What the replaced configuration spends while it drains counts too.
        self.assertTrue(old.spent.spend("draining", now))
        self.assertFalse(new.spent.spend("draining", now))
