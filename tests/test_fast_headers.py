"""
Tests for L{GatewayHeaders}: the same answers as Twisted's L{Headers}, faster.
"""

from __future__ import annotations

import random
from typing import Any, cast

from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers, InvalidHeaderName
from twisted.web.test.requesthelper import DummyChannel

from edgegw import header_names
from edgegw.header_names import canonical_name, canonical_names
from edgegw.seam import GatewayHeaders
from edgegw.server.request import GatewayRequest
from edgegw.stream.response_headers import ResponseHeaders

_NAMES: list[Any] = [
    b"host",
    b"Host",
    b"HOST",
    b"etag",
    b"www-authenticate",
    b"x-request-id",
    b"X-Forwarded-For",
    "content-type",
    "X-Str",
    b"x_under",
]
_VALUES: list[Any] = [b"v", b"", b" a b ", b"a\r\nb", b"a\nb", b"a\rb", "caf\u00e9", b"caf\xc3\xa9"]


def _outcome(call: Any, *args: Any) -> Any:
    try:
        return ("ok", call(*args))
    except Exception as e:
        return ("raised", type(e))


class SameAsHeadersTests(SynchronousTestCase):
    """
    Every look-up and set gives what L{Headers} gives, the stored headers included.
    """

    def test_random_operations(self) -> None:
        chooser = random.Random(1127)
        for _ in range(300):
            plain, fast = Headers(), GatewayHeaders()
            for _ in range(12):
                name = chooser.choice(_NAMES)
                roll = chooser.random()
                if roll < 0.1:
                    self.assertEqual(
                        _outcome(fast.hasHeader, name), _outcome(plain.hasHeader, name)
                    )
                elif roll < 0.2:
                    self.assertEqual(
                        _outcome(fast.removeHeader, name), _outcome(plain.removeHeader, name)
                    )
                elif roll < 0.35:
                    value = chooser.choice(_VALUES)
                    self.assertEqual(
                        _outcome(fast.addRawHeader, name, value),
                        _outcome(plain.addRawHeader, name, value),
                    )
                elif roll < 0.6:
                    values = chooser.sample(_VALUES, chooser.randint(0, 3))
                    self.assertEqual(
                        _outcome(fast.setRawHeaders, name, values),
                        _outcome(plain.setRawHeaders, name, values),
                    )
                else:
                    default = chooser.choice([None, [b"d"], "d"])
                    self.assertEqual(
                        _outcome(fast.getRawHeaders, name, default),
                        _outcome(plain.getRawHeaders, name, default),
                    )
                self.assertEqual(sorted(fast.getAllRawHeaders()), sorted(plain.getAllRawHeaders()))
            self.assertEqual(fast, plain)

    def test_invalid_names_refused_as_twisted_refuses_them(self) -> None:
        for name in (b"bad name", b"", b"a:b", b"a\x00"):
            self.assertRaises(InvalidHeaderName, GatewayHeaders().getRawHeaders, name)
            self.assertRaises(InvalidHeaderName, GatewayHeaders().hasHeader, name)
            self.assertRaises(InvalidHeaderName, GatewayHeaders().removeHeader, name)
            self.assertRaises(InvalidHeaderName, GatewayHeaders().addRawHeader, name, b"v")
            self.assertRaises(InvalidHeaderName, GatewayHeaders().setRawHeaders, name, [b"v"])
            self.assertRaises(InvalidHeaderName, Headers().getRawHeaders, name)

    def test_canonical_names(self) -> None:
        self.assertEqual(canonical_name(b"etag"), b"ETag")
        self.assertEqual(canonical_name(b"x-request-id"), b"X-Request-Id")
        headers = GatewayHeaders()
        headers.setRawHeaders(b"etag", [b'"1"'])
        self.assertEqual(list(headers.getAllRawHeaders()), [(b"ETag", [b'"1"'])])

    def test_beyond_the_name_cache(self) -> None:
        self.patch(header_names, "MAX_NAMES", 0)
        saved = dict(canonical_names)
        canonical_names.clear()
        self.addCleanup(canonical_names.update, saved)
        headers = GatewayHeaders()
        headers.setRawHeaders(b"x-new", [b"1"])
        self.assertEqual(headers.getRawHeaders(b"X-NEW"), [b"1"])
        self.assertEqual(canonical_names, {})

    def test_values_from_an_iterator(self) -> None:
        # Review finding: checking the values read an iterator that Headers then got
        # empty.
        cases: list[list[Any]] = [[b" a b ", b"\r", b"ba"], [b"x", "y"], [b"ok"]]
        for values in cases:
            plain, fast = Headers(), GatewayHeaders()
            plain.setRawHeaders(b"x-it", cast(Any, iter(values)))
            fast.setRawHeaders(b"x-it", cast(Any, iter(values)))
            self.assertEqual(fast, plain)
            self.assertEqual(len(fast.getRawHeaders(b"x-it") or []), len(values))

    def test_long_names_not_remembered(self) -> None:
        # Names a client or upstream makes up cannot fill the cache with long strings.
        long_name = b"x-" + b"a" * 100
        headers = GatewayHeaders()
        headers.setRawHeaders(long_name, [b"v"])
        self.assertEqual(headers.getRawHeaders(long_name), [b"v"])
        self.assertNotIn(long_name, canonical_names)
        headers.setRawHeaders(b"x-short", [b"v"])
        self.assertIn(b"x-short", canonical_names)

    def test_requests_use_them(self) -> None:
        request = GatewayRequest(DummyChannel())  # type: ignore[arg-type]
        self.assertIsInstance(request.requestHeaders, GatewayHeaders)
        self.assertIsInstance(request.responseHeaders, ResponseHeaders)
        self.assertIsInstance(request.responseHeaders, GatewayHeaders)
