"""
Finding (low): IdP responses with a non-200 status (discovery, key set, userinfo) are
drained with treq.content(), which buffers the whole body with no cap: MAX_DOCUMENT (1 MiB)
applies only to 200 answers. A misbehaving IdP (or anything on the path) answering
401/500 with an endless body grows the gateway's memory without bound -- userinfo is now
asked on every login under userInfo: auto, and its failure is tolerated.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import succeed
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from twisted.web.client import ResponseDone
from twisted.web.iweb import UNKNOWN_LENGTH

from edgegw.config.model import IdpSpec
from edgegw.identity.discovery import ProviderMetadata
from edgegw.identity.provider import MAX_DOCUMENT, IdentityProvider, IdPError


class _Transport:
    def __init__(self) -> None:
        self.stopped = False

    def stopProducing(self) -> None:
        self.stopped = True

    pauseProducing = resumeProducing = loseConnection = abortConnection = stopProducing


class _HugeErrorResponse:
    code = 401
    phrase = b"Unauthorized"
    length = UNKNOWN_LENGTH
    headers: Any = None

    def __init__(self, total: int) -> None:
        self.total = total
        self.delivered = 0

    def deliverBody(self, protocol: Any) -> None:
        transport = _Transport()
        protocol.makeConnection(transport)
        chunk = b"x" * 65536
        while self.delivered < self.total and not transport.stopped:
            protocol.dataReceived(chunk)
            self.delivered += len(chunk)
        protocol.connectionLost(Failure(ResponseDone()))


class _Client:
    def __init__(self, response: _HugeErrorResponse) -> None:
        self.response = response

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return succeed(self.response)


class ErrorBodies(TestCase):
    async def test_error_body_is_read_with_a_cap(self) -> None:
        spec = IdpSpec(name="i", issuer="https://i.example", client_id="gw")
        provider = IdentityProvider(spec, None, reactor)  # type: ignore[arg-type]
        response = _HugeErrorResponse(64 * MAX_DOCUMENT)
        provider._http = _Client(response)  # type: ignore[assignment]
        metadata = ProviderMetadata(
            issuer="https://i.example",
            authorization_endpoint="https://i.example/a",
            token_endpoint="https://i.example/t",
            jwks_uri="https://i.example/j",
            userinfo_endpoint="https://i.example/u",
            id_token_algorithms=("RS256",),
            token_auth_method="client_secret_basic",
            access_token_jwks_uri="https://i.example/j",
        )
        with self.assertRaises(IdPError):
            await provider.userinfo(metadata, "token")
        self.assertLessEqual(
            response.delivered, 2 * MAX_DOCUMENT, f"buffered {response.delivered} bytes"
        )
