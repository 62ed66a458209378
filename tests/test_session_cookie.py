"""
Tests for L{edgegw.identity.session_cookie} and the cookie plumbing of
L{edgegw.identity.cookies}.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from edgegw.config.model import SessionSpec
from edgegw.identity.cookies import (
    MAX_CHUNK,
    clear_chunked,
    is_https,
    read_chunked,
    set_cookie,
    without_cookies,
    write_chunked,
)
from edgegw.identity.principal import ClaimValue, Principal
from edgegw.identity.sealing import LOGIN_STATE_AAD, SESSION_AAD, Sealer
from edgegw.identity.session_cookie import (
    MAX_SESSION_CHUNKS,
    SessionCookie,
    SessionRecord,
    SessionTooLargeError,
    fingerprint_of,
)

KEY = bytes(range(32))
NOW = 1_700_000_000
UA = b"Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0"
ATTRIBUTES = b"; Path=/; Max-Age=%d; HttpOnly; SameSite=Lax"


def make_request(
    cookies: Mapping[bytes, bytes] | None = None,
    headers: Iterable[tuple[bytes, bytes]] = ((b"User-Agent", UA),),
    secure: bool = False,
) -> Request:
    """
    A real request, as the gateway sees it once the Cookie header has been parsed.
    """
    request = Request(DummyChannel())
    for name, value in headers:
        request.requestHeaders.addRawHeader(name, value)
    if secure:
        request.setHost(b"gw.example", 443, ssl=True)
    request.received_cookies = dict(cookies or {})
    return request


def set_cookie_lines(request: Request) -> list[bytes]:
    return list(request.responseHeaders.getRawHeaders(b"Set-Cookie", []))


def apply_set_cookies(jar: Mapping[bytes, bytes], request: Request) -> dict[bytes, bytes]:
    """
    The cookies a browser holds after the response to C{request}: each C{Set-Cookie} line
    stores its cookie, or deletes it when C{Max-Age=0}.
    """
    result = dict(jar)
    for line in set_cookie_lines(request):
        pair, *attributes = line.split(b"; ")
        name, value = pair.split(b"=", 1)
        if b"Max-Age=0" in attributes:
            result.pop(name, None)
        else:
            result[name] = value
    return result


def cleared(request: Request) -> list[bytes]:
    """
    The names of the cookies the response to C{request} clears, in order.
    """
    return [
        line.split(b"=", 1)[0]
        for line in set_cookie_lines(request)
        if line.split(b"=", 1)[1].startswith(b";") and b"; Max-Age=0;" in line
    ]


def set_names(request: Request) -> list[bytes]:
    """
    The names of the cookies the response to C{request} sets to a value, in order.
    """
    return [
        line.split(b"=", 1)[0] for line in set_cookie_lines(request) if b"; Max-Age=0;" not in line
    ]


def many_claims(count: int) -> dict[str, ClaimValue]:
    """
    A passport of C{count} claims, about 26 bytes of JSON each.
    """
    return {f"claim{index}": f"value-{index:05d}" for index in range(count)}


class CookiePlumbingTests(SynchronousTestCase):
    def test_set_cookie_attributes(self) -> None:
        """
        A cookie is C{Path=/}, C{HttpOnly}, C{SameSite=Lax}, with C{Max-Age}, and
        C{Secure} only when asked; existing C{Set-Cookie} lines are kept.
        """
        request = make_request()
        request.responseHeaders.addRawHeader(b"Set-Cookie", b"backend=1")
        set_cookie(request, "a", "v1", max_age=60, secure=False)
        set_cookie(request, "b", "v2", max_age=0, secure=True)
        self.assertEqual(
            set_cookie_lines(request),
            [
                b"backend=1",
                b"a=v1; Path=/; Max-Age=60; HttpOnly; SameSite=Lax",
                b"b=v2; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure",
            ],
        )

    def test_is_https(self) -> None:
        """
        https is a TLS transport, or C{X-Forwarded-Proto} whose first item is C{https}.
        """
        self.assertFalse(is_https(make_request()))
        self.assertTrue(is_https(make_request(secure=True)))
        for value, expected in (
            (b"https", True),
            (b"HTTPS", True),
            (b" https , http", True),
            (b"http", False),
            (b"http, https", False),
            (b"", False),
            (b"httpsx", False),
        ):
            request = make_request(headers=[(b"X-Forwarded-Proto", value)])
            self.assertEqual(is_https(request), expected, value)
        request = make_request(
            headers=[(b"X-Forwarded-Proto", b"http"), (b"X-Forwarded-Proto", b"https")]
        )
        self.assertFalse(is_https(request))

    def test_read_chunked(self) -> None:
        """
        The single cookie wins; else the contiguous run from C{.0}; else L{None}.
        """
        self.assertIsNone(read_chunked({}, "c"))
        self.assertEqual(read_chunked({b"c": b"one", b"c.0": b"x"}, "c"), b"one")
        self.assertEqual(read_chunked({b"c.0": b"a", b"c.1": b"b", b"c.2": b"c"}, "c"), b"abc")
        self.assertEqual(read_chunked({b"c.0": b"a", b"c.2": b"c"}, "c"), b"a")
        self.assertIsNone(read_chunked({b"c.1": b"b", b"c.2": b"c"}, "c"))
        self.assertIsNone(read_chunked({b"cc": b"b", b"c.login.x": b"c"}, "c"))
        many = {b"c.%d" % index: b"x" for index in range(100)}
        self.assertEqual(read_chunked(many, "c"), b"x" * 64)

    def test_write_chunked_single(self) -> None:
        """
        A value that fits is one cookie; chunks the browser sent are cleared.
        """
        request = make_request({b"c.0": b"a", b"c.1": b"b", b"c.07": b"z", b"c.login.s": b"l"})
        write_chunked(request, "c", "v" * MAX_CHUNK, max_age=5, secure=False)
        self.assertEqual(set_names(request), [b"c"])
        self.assertEqual(cleared(request), [b"c.0", b"c.07", b"c.1"])

    def test_write_chunked_many(self) -> None:
        """
        A longer value is split into chunks of at most L{MAX_CHUNK}; the plain cookie and
        stale higher chunks are cleared.
        """
        value = "".join(chr(ord("a") + index % 26) for index in range(2 * MAX_CHUNK + 1))
        request = make_request({b"c": b"old", b"c.1": b"b", b"c.3": b"d", b"c.4": b"e"})
        write_chunked(request, "c", value, max_age=5, secure=True)
        lines = set_cookie_lines(request)
        self.assertEqual(
            lines[:3],
            [
                b"c.0=" + value[:MAX_CHUNK].encode() + ATTRIBUTES % 5 + b"; Secure",
                b"c.1=" + value[MAX_CHUNK : 2 * MAX_CHUNK].encode() + ATTRIBUTES % 5 + b"; Secure",
                b"c.2=" + value[-1:].encode() + ATTRIBUTES % 5 + b"; Secure",
            ],
        )
        self.assertEqual(cleared(request), [b"c", b"c.3", b"c.4"])
        jar = apply_set_cookies(request.received_cookies, request)
        self.assertEqual(read_chunked(jar, "c"), value.encode())

    def test_write_chunked_too_long(self) -> None:
        """
        A value that would need more than 64 chunks is refused.
        """
        request = make_request()
        with self.assertRaises(ValueError):
            write_chunked(request, "c", "x" * (64 * MAX_CHUNK + 1), max_age=5, secure=False)
        write_chunked(request, "c", "x" * (64 * MAX_CHUNK), max_age=5, secure=False)
        self.assertEqual(len(set_names(request)), 64)

    def test_clear_chunked(self) -> None:
        """
        Clearing clears the plain cookie and every chunk the browser sent.
        """
        request = make_request({b"c.0": b"a", b"c.1": b"b", b"d.0": b"x"})
        clear_chunked(request, "c", secure=True)
        self.assertEqual(
            set_cookie_lines(request),
            [
                b"c=" + ATTRIBUTES % 0 + b"; Secure",
                b"c.0=" + ATTRIBUTES % 0 + b"; Secure",
                b"c.1=" + ATTRIBUTES % 0 + b"; Secure",
            ],
        )

    def test_without_cookies(self) -> None:
        """
        The other pairs are kept byte for byte, in order, joined by C{; }.
        """
        drop = {b"gw", b"gw.0"}.__contains__
        self.assertEqual(
            without_cookies([b'a=1; gw=x;b="q"', b"gw.0=y; c=; d", b" ; e=5=6 "], drop),
            b'a=1; b="q"; c=; d; e=5=6',
        )
        self.assertIsNone(without_cookies([b"gw=x; gw.0=y", b""], drop))
        self.assertIsNone(without_cookies([], drop))
        self.assertEqual(without_cookies([b"gw =x; a=1"], drop), b"a=1")


class FingerprintTests(SynchronousTestCase):
    def test_exact(self) -> None:
        """
        SHA-256 over C{lowercased-name=value\\n} per header, lines joined by C{, }, an
        absent header hashed as empty.
        """
        request = make_request(
            headers=[
                (b"User-Agent", b"UA/1"),
                (b"Accept-Language", b"en"),
                (b"accept-language", b"de"),
            ]
        )
        self.assertEqual(
            fingerprint_of(request, ["User-Agent", "ACCEPT-LANGUAGE", "X-Absent"]),
            hashlib.sha256(b"user-agent=UA/1\naccept-language=en, de\nx-absent=\n").digest(),
        )
        self.assertEqual(fingerprint_of(request, []), hashlib.sha256(b"").digest())


class SessionCookieTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW)
        self.spec = SessionSpec(key=KEY)
        self.cookie = SessionCookie(self.spec, self.clock)

    def login(
        self,
        passport: Mapping[str, ClaimValue] | None = None,
        request: Request | None = None,
        jar: Mapping[bytes, bytes] | None = None,
    ) -> tuple[SessionRecord, dict[bytes, bytes], Request]:
        """
        Write a session on a response, as the callback does; the browser's cookies after
        it and the request.
        """
        if request is None:
            request = make_request(jar)
        record = self.cookie.new_record(
            request,
            "alice",
            passport if passport is not None else {"email": "a@example.com"},
            ["admins", "dev"],
            access_token="at-secret",
            access_token_expires_at=NOW + 300,
        )
        self.cookie.write(request, record)
        return record, apply_set_cookies(request.received_cookies, request), request

    def test_round_trip(self) -> None:
        """
        A written session reads back equal on the browser's next request.
        """
        record, jar, _ = self.login()
        self.assertEqual(
            record,
            SessionRecord(
                subject="alice",
                passport={"email": "a@example.com"},
                groups=("admins", "dev"),
                issued_at=NOW,
                expires_at=NOW + 8 * 3600,
                fingerprint=hashlib.sha256(b"user-agent=" + UA + b"\n").digest(),
                access_token="at-secret",
                access_token_expires_at=NOW + 300,
            ),
        )
        self.assertEqual(list(jar), [b"gw_session"])
        self.assertEqual(self.cookie.read(make_request(jar)), record)
        self.assertEqual(
            record.principal(),
            Principal("alice", {"email": "a@example.com"}, ("admins", "dev"), "at-secret"),
        )

    def test_round_trip_minimal(self) -> None:
        """
        A session without access token and with an empty passport reads back equal.
        """
        request = make_request()
        record = self.cookie.new_record(request, "bob", {}, [])
        self.cookie.write(request, record)
        jar = apply_set_cookies({}, request)
        read = self.cookie.read(make_request(jar))
        self.assertEqual(read, record)
        assert read is not None
        self.assertIsNone(read.access_token)
        self.assertIsNone(read.access_token_expires_at)

    def test_claim_types(self) -> None:
        """
        Every claim type of a passport survives the round trip.
        """
        passport: dict[str, ClaimValue] = {
            "s": "é\u2603\ud800",
            "i": 3,
            "f": 1.5,
            "b": True,
            "l": ["x", "y"],
            "n": None,
        }
        _, jar, _ = self.login(passport)
        read = self.cookie.read(make_request(jar))
        assert read is not None
        self.assertEqual(read.passport, passport)
        self.assertIs(read.passport["b"], True)

    def test_cookie_attributes(self) -> None:
        """
        The cookie is exactly C{gw_session=<sealed>; Path=/; Max-Age=<ttl>; HttpOnly;
        SameSite=Lax} over http.
        """
        _, jar, request = self.login()
        self.assertEqual(
            set_cookie_lines(request),
            [b"gw_session=" + jar[b"gw_session"] + ATTRIBUTES % (8 * 3600)],
        )

    def test_max_age_counts_down(self) -> None:
        """
        Rewriting a session later sets the remaining lifetime as C{Max-Age}.
        """
        record, _, _ = self.login()
        self.clock.advance(100)
        request = make_request()
        self.cookie.write(request, record)
        self.assertIn(b"; Max-Age=%d;" % (8 * 3600 - 100), set_cookie_lines(request)[0])

    def test_secure(self) -> None:
        """
        C{Secure} over TLS and with C{X-Forwarded-Proto: https}; not over http.
        """
        for request, secure in (
            (make_request(secure=True), True),
            (make_request(headers=[(b"User-Agent", UA), (b"X-Forwarded-Proto", b"https")]), True),
            (make_request(headers=[(b"User-Agent", UA), (b"X-Forwarded-Proto", b"http")]), False),
            (make_request(), False),
        ):
            self.login(request=request)
            [line] = set_cookie_lines(request)
            self.assertEqual(line.endswith(b"; SameSite=Lax; Secure"), secure)
            self.assertEqual(line.endswith(b"; SameSite=Lax"), not secure)
            self.cookie.clear(request)
            self.assertEqual(
                set_cookie_lines(request)[1],
                (b"__Host-gw_session=" if secure else b"gw_session=")
                + ATTRIBUTES % 0
                + (b"; Secure" if secure else b""),
            )

    def test_chunked(self) -> None:
        """
        A large passport is split over three chunks (the most a session may take) and
        reads back equal.
        """
        passport = many_claims(300)
        record, jar, request = self.login(passport)
        names = set_names(request)
        self.assertEqual(len(names), MAX_SESSION_CHUNKS)
        self.assertEqual(names, [b"gw_session.%d" % index for index in range(len(names))])
        self.assertEqual(sorted(jar), sorted(names))
        for name in names[:-1]:
            self.assertEqual(len(jar[name]), MAX_CHUNK)
        self.assertLessEqual(len(jar[names[-1]]), MAX_CHUNK)
        self.assertEqual(self.cookie.read(make_request(jar)), record)

    def test_smaller_replaces_larger(self) -> None:
        """
        A smaller session over a chunked one clears every old chunk; a chunked session
        over a longer one clears the stale higher chunks.
        """
        big = many_claims(300)
        _, jar, _ = self.login(big)
        count = len(jar)
        medium = many_claims(150)
        record, jar2, request = self.login(medium, jar=jar)
        medium_count = len(set_names(request))
        self.assertLess(1, medium_count)
        self.assertLess(medium_count, count)
        self.assertEqual(
            sorted(cleared(request)),
            sorted(b"gw_session.%d" % index for index in range(medium_count, count)),
        )
        self.assertEqual(sorted(jar2), [b"gw_session.%d" % index for index in range(medium_count)])
        self.assertEqual(self.cookie.read(make_request(jar2)), record)

        record, jar3, request = self.login(jar=jar2)
        self.assertEqual(set_names(request), [b"gw_session"])
        self.assertEqual(cleared(request), sorted(jar2))
        self.assertEqual(list(jar3), [b"gw_session"])
        self.assertEqual(self.cookie.read(make_request(jar3)), record)

        record, jar4, request = self.login(big, jar=jar3)
        self.assertEqual(cleared(request), [b"gw_session"])
        self.assertEqual(self.cookie.read(make_request(jar4)), record)

    def test_too_large(self) -> None:
        """
        A session that would need more than L{MAX_SESSION_CHUNKS} cookies is refused:
        the browser would send them with every request past the header budget.
        """
        request = make_request()
        record = self.cookie.new_record(request, "alice", many_claims(500), ())
        self.assertRaises(SessionTooLargeError, self.cookie.write, request, record)
        self.assertEqual(set_cookie_lines(request), [])

    def test_opened_once(self) -> None:
        """
        The same sealed value is opened once; expiry and fingerprint are still checked
        on every read.
        """
        record, jar, _ = self.login(many_claims(3))
        opened = []
        unseal = self.cookie.sealer.unseal

        def counting(sealed: str | bytes, aad: bytes) -> bytes | None:
            opened.append(sealed)
            return unseal(sealed, aad)

        self.cookie.sealer.unseal = counting  # type: ignore[method-assign]
        self.assertEqual(self.cookie.read(make_request(jar)), record)
        self.assertEqual(self.cookie.read(make_request(jar)), record)
        self.assertEqual(len(opened), 1)
        self.assertIsNone(self.cookie.read(make_request(jar, headers=((b"User-Agent", b"other"),))))
        self.clock.advance(8 * 3600)
        self.assertIsNone(self.cookie.read(make_request(jar)))

    def test_missing_chunk(self) -> None:
        """
        A session missing its first, a middle or its last chunk is no session.
        """
        passport = many_claims(300)
        _, jar, _ = self.login(passport)
        last = len(jar) - 1
        for missing in (0, 1, last):
            partial = dict(jar)
            del partial[b"gw_session.%d" % missing]
            self.assertIsNone(self.cookie.read(make_request(partial)), missing)
        swapped = dict(jar)
        swapped[b"gw_session.1"], swapped[b"gw_session.2"] = (
            jar[b"gw_session.2"],
            jar[b"gw_session.1"],
        )
        self.assertIsNone(self.cookie.read(make_request(swapped)))

    def test_expired(self) -> None:
        """
        A session reads until just before C{expires_at}, and is gone from then on.
        """
        record, jar, _ = self.login()
        self.clock.advance(8 * 3600 - 1)
        self.assertEqual(self.cookie.read(make_request(jar)), record)
        self.clock.advance(1)
        self.assertIsNone(self.cookie.read(make_request(jar)))

    def test_fingerprint_mismatch(self) -> None:
        """
        The session only reads for a request with the same fingerprint headers.
        """
        _, jar, _ = self.login()
        for headers in ([(b"User-Agent", b"curl/8.0")], [], [(b"User-Agent", UA)] * 2):
            self.assertIsNone(self.cookie.read(make_request(jar, headers=headers)), headers)

    def test_fingerprint_headers(self) -> None:
        """
        Several configured headers are all bound, in order.
        """
        spec = SessionSpec(key=KEY, fingerprint_headers=("User-Agent", "Accept-Language"))
        cookie = SessionCookie(spec, self.clock)
        headers = [(b"User-Agent", UA), (b"Accept-Language", b"en")]
        request = make_request(headers=headers)
        record = cookie.new_record(request, "alice", {}, [])
        cookie.write(request, record)
        jar = apply_set_cookies({}, request)
        self.assertEqual(cookie.read(make_request(jar, headers=headers)), record)
        other = [(b"User-Agent", UA), (b"Accept-Language", b"de")]
        self.assertIsNone(cookie.read(make_request(jar, headers=other)))

    def test_custom_name(self) -> None:
        """
        The cookie is named after C{cookieName}.
        """
        cookie = SessionCookie(SessionSpec(key=KEY, cookie_name="sid"), self.clock)
        request = make_request()
        record = cookie.new_record(request, "alice", {}, [])
        cookie.write(request, record)
        jar = apply_set_cookies({}, request)
        self.assertEqual(list(jar), [b"sid"])
        self.assertEqual(cookie.cookie_name, "sid")
        self.assertEqual(cookie.read(make_request(jar)), record)

    def test_tampered(self) -> None:
        """
        A changed, truncated or extended cookie value is no session.
        """
        _, jar, _ = self.login()
        value = jar[b"gw_session"]
        flipped = bytes([value[20] ^ 0x01]) if value[20:21] != b"-" else b"A"
        for bad in (
            value[:20] + flipped + value[21:],
            value[:-1],
            value + b"A",
            b"",
            b"garbage",
            b"!!!!",
            b'"' + value + b'"',
        ):
            self.assertIsNone(self.cookie.read(make_request({b"gw_session": bad})), bad)

    def test_wrong_key(self) -> None:
        """
        A session sealed under another key is no session.
        """
        _, jar, _ = self.login()
        other = SessionCookie(SessionSpec(key=bytes(32)), self.clock)
        self.assertIsNone(other.read(make_request(jar)))

    def sealed(self, data: object, aad: bytes = SESSION_AAD) -> dict[bytes, bytes]:
        """
        A cookie jar with C{data} sealed as the session under the session key.
        """
        plaintext = json.dumps(data, separators=(",", ":")).encode()
        return {b"gw_session": Sealer(KEY).seal(plaintext, aad).encode()}

    def valid_data(self) -> dict[str, object]:
        fingerprint = hashlib.sha256(b"user-agent=" + UA + b"\n").hexdigest()
        return {
            "v": 1,
            "s": "alice",
            "p": {"email": "a@example.com"},
            "g": ["dev"],
            "i": NOW,
            "e": NOW + 60,
            "f": fingerprint,
        }

    def test_sealed_by_hand(self) -> None:
        """
        The record format: short keys, version 1, fingerprint in hex.
        """
        read = self.cookie.read(make_request(self.sealed(self.valid_data())))
        self.assertEqual(
            read,
            SessionRecord(
                "alice",
                {"email": "a@example.com"},
                ("dev",),
                NOW,
                NOW + 60,
                hashlib.sha256(b"user-agent=" + UA + b"\n").digest(),
            ),
        )

    def test_other_version(self) -> None:
        """
        A record of another version (or a version of another type) is no session.
        """
        for version in (0, 2, "1", 1.0, True, None):
            data = self.valid_data()
            data["v"] = version
            self.assertIsNone(self.cookie.read(make_request(self.sealed(data))), version)
        data = self.valid_data()
        del data["v"]
        self.assertIsNone(self.cookie.read(make_request(self.sealed(data))))

    def test_wrong_shape(self) -> None:
        """
        A record with a missing field or a field of the wrong type is no session.
        """
        bad_values: dict[str, list[object]] = {
            "s": ["", 1, None, ["alice"]],
            "p": [[], "x", None, {"k": {"nested": 1}}, {"k": [1]}],
            "g": ["dev", None, [1], {}],
            "i": ["1", 1.5, None, True],
            "e": ["1", float(NOW + 60), None, False],
            "f": ["", 1, None, "zz" * 32, "ab" * 31, "ab" * 33],
            "t": [1, ["x"]],
            "x": ["1", 1.5, True],
        }
        for key, values in bad_values.items():
            for value in values:
                data = self.valid_data()
                data[key] = value
                self.assertIsNone(self.cookie.read(make_request(self.sealed(data))), (key, value))
            if key not in ("t", "x"):
                data = self.valid_data()
                del data[key]
                self.assertIsNone(self.cookie.read(make_request(self.sealed(data))), key)
        not_objects: list[object] = [[], "x", 1, None]
        for not_an_object in not_objects:
            jar = self.sealed(not_an_object)
            self.assertIsNone(self.cookie.read(make_request(jar)), not_an_object)
        request = make_request({b"gw_session": Sealer(KEY).seal(b"\xff{", SESSION_AAD).encode()})
        self.assertIsNone(self.cookie.read(request))
        deep = b"[" * 100_000 + b"]" * 100_000
        request = make_request({b"gw_session": Sealer(KEY).seal(deep, SESSION_AAD).encode()})
        self.assertIsNone(self.cookie.read(request))

    def test_login_state_is_not_a_session(self) -> None:
        """
        A valid record sealed as a login state does not read as a session.
        """
        jar = self.sealed(self.valid_data(), LOGIN_STATE_AAD)
        self.assertIsNone(self.cookie.read(make_request(jar)))
        self.assertIsNotNone(self.cookie.read(make_request(self.sealed(self.valid_data()))))

    def test_no_cookie(self) -> None:
        """
        No cookie, or only unrelated ones, is no session.
        """
        self.assertIsNone(self.cookie.read(make_request()))
        self.assertIsNone(self.cookie.read(make_request({b"other": b"x", b"gw_session.1": b"y"})))

    def test_clear(self) -> None:
        """
        Clearing clears the session cookie and every chunk the browser sent.
        """
        request = make_request({b"gw_session.0": b"a", b"gw_session.1": b"b", b"x": b"y"})
        self.cookie.clear(request)
        self.assertEqual(cleared(request), [b"gw_session", b"gw_session.0", b"gw_session.1"])
        self.assertEqual(set_names(request), [])

    def test_repr_hides_secrets(self) -> None:
        """
        The access token and the fingerprint stay out of the record's repr.
        """
        record, _, _ = self.login()
        self.assertNotIn("at-secret", repr(record))
        self.assertNotIn("fingerprint", repr(record))
        self.assertIn("alice", repr(record))

    def test_is_gateway_cookie(self) -> None:
        """
        The session cookie, its chunks and the login-state cookies are the gateway's.
        """
        for name, expected in (
            (b"gw_session", True),
            (b"gw_session.0", True),
            (b"gw_session.12", True),
            (b"gw_session.login.abc", True),
            (b"gw_session.login.", True),
            (b"gw_session.", False),
            (b"gw_session.x", False),
            (b"gw_session.1a", False),
            (b"gw_sessionx", False),
            (b"gw_session2", False),
            (b"GW_SESSION", False),
            (b"other", False),
            (b"", False),
        ):
            self.assertEqual(self.cookie.is_gateway_cookie(name), expected, name)

    def test_strip_gateway_cookies(self) -> None:
        """
        A forwarded Cookie header keeps the backend's cookies and loses the gateway's.
        """
        header = [b"gw_session.0=a; app=1; gw_session.login.s=b", b"gw_session=c; theme=dark"]
        self.assertEqual(
            without_cookies(header, self.cookie.is_gateway_cookie), b"app=1; theme=dark"
        )
        self.assertIsNone(without_cookies([b"gw_session=c"], self.cookie.is_gateway_cookie))
