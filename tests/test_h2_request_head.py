"""
L{edgegw.server.h2.request_head}: an HTTP/2 request's header list read as the gateway
reads an HTTP/1.1 head (RFC 9113 sections 8.1.1, 8.2 and 8.3).
"""

from __future__ import annotations

from collections.abc import Iterable

from twisted.trial.unittest import SynchronousTestCase

from edgegw.server.h2.request_head import (
    HeaderListTooLargeError,
    MalformedRequestError,
    RequestHead,
    read_request_head,
)

Fields = list[tuple[bytes, bytes]]

BIG = 16384
MANY = 500

GET: Fields = [
    (b":method", b"GET"),
    (b":scheme", b"https"),
    (b":authority", b"example.com"),
    (b":path", b"/p?q=1"),
]


def read(fields: Iterable[tuple[bytes, bytes]], size: int = BIG, count: int = MANY) -> RequestHead:
    return read_request_head(fields, size, count)


def get(*regular: tuple[bytes, bytes]) -> Fields:
    return [*GET, *regular]


def without(name: bytes, fields: Fields = GET) -> Fields:
    return [(n, v) for n, v in fields if n != name]


def replaced(name: bytes, value: bytes, fields: Fields = GET) -> Fields:
    return [(n, value if n == name else v) for n, v in fields]


class WellFormedTests(SynchronousTestCase):
    """
    What a browser sends is read whole.
    """

    def test_get(self) -> None:
        head = read(get((b"accept", b"text/html"), (b"x-a", b"1")))
        self.assertEqual((head.method, head.target), (b"GET", b"/p?q=1"))
        self.assertEqual(
            head.fields, [(b"accept", b"text/html"), (b"x-a", b"1"), (b"host", b"example.com")]
        )
        self.assertIsNone(head.content_length)

    def test_http_scheme(self) -> None:
        self.assertEqual(read(replaced(b":scheme", b"http")).target, b"/p?q=1")

    def test_options_asterisk(self) -> None:
        fields = replaced(b":path", b"*", replaced(b":method", b"OPTIONS"))
        self.assertEqual(read(fields).target, b"*")

    def test_te_trailers(self) -> None:
        """
        C{te: trailers} is the one C{te} allowed (any case).
        """
        self.assertIn((b"te", b"trailers"), read(get((b"te", b"trailers"))).fields)
        read(get((b"te", b"Trailers")))

    def test_content_length(self) -> None:
        head = read(get((b"content-length", b"42")))
        self.assertEqual(head.content_length, 42)
        self.assertIn((b"content-length", b"42"), head.fields)

    def test_content_length_repeated_same(self) -> None:
        """
        The same length twice is one length (RFC 9110 section 8.6), forwarded once.
        """
        head = read(get((b"content-length", b"7"), (b"content-length", b"7")))
        self.assertEqual(head.content_length, 7)
        self.assertEqual([v for n, v in head.fields if n == b"content-length"], [b"7"])

    def test_content_length_fifteen_digits(self) -> None:
        self.assertEqual(read(get((b"content-length", b"9" * 15))).content_length, 10**15 - 1)

    def test_inner_whitespace_and_obs_text(self) -> None:
        """
        Spaces, tabs and bytes above 0x7f inside a value are data (as on HTTP/1.1).
        """
        head = read(get((b"x-a", b"a b\tc\xe9")))
        self.assertIn((b"x-a", b"a b\tc\xe9"), head.fields)


class PseudoHeaderTests(SynchronousTestCase):
    """
    RFC 9113 section 8.3: the pseudo-headers of a request, once each, before every
    regular field, none other.
    """

    def assertMalformed(self, fields: Fields) -> None:
        self.assertRaises(MalformedRequestError, read, fields)

    def test_missing(self) -> None:
        for name in (b":method", b":scheme", b":path"):
            with self.subTest(name=name):
                self.assertMalformed(without(name))

    def test_empty_method(self) -> None:
        self.assertMalformed(replaced(b":method", b""))

    def test_empty_path(self) -> None:
        """
        RFC 9113 section 8.3.1: C{:path} of an http or https URI is never empty.
        """
        self.assertMalformed(replaced(b":path", b""))

    def test_duplicate(self) -> None:
        for name, value in GET:
            with self.subTest(name=name):
                self.assertMalformed([*GET, (name, value)])

    def test_duplicate_same_value_anywhere(self) -> None:
        self.assertMalformed([GET[0], GET[0], *GET[1:]])

    def test_unknown(self) -> None:
        for name in (b":status", b":protocol", b":foo", b":"):
            with self.subTest(name=name):
                self.assertMalformed([*GET, (name, b"x")])
                self.assertMalformed([(name, b"x"), *GET])

    def test_after_regular(self) -> None:
        self.assertMalformed([GET[0], GET[1], (b"accept", b"*/*"), GET[2], GET[3]])

    def test_after_cookie_or_host(self) -> None:
        self.assertMalformed([*GET[:3], (b"cookie", b"a=1"), GET[3]])
        self.assertMalformed([*GET[:3], (b"host", b"example.com"), GET[3]])

    def test_scheme(self) -> None:
        for scheme in (b"ftp", b"", b"https:", b"javascript"):
            with self.subTest(scheme=scheme):
                self.assertMalformed(replaced(b":scheme", scheme))

    def test_path_forms(self) -> None:
        """
        Only the origin form, and C{*} for OPTIONS: no absolute or authority form,
        nothing relative.
        """
        for path in (b"http://evil.test/x", b"example.com:443", b"x/y", b"?q", b"*"):
            with self.subTest(path=path):
                self.assertMalformed(replaced(b":path", path))

    def test_method_not_a_token(self) -> None:
        """
        C{:method} is a token (RFC 9110 section 9.1): a method with a space or a
        separator would rewrite the HTTP/1.1 request line the upstream reads (request
        line injection, an h2-to-h1 desync).
        """
        for method in (b"GET /admin HTTP/1.1", b"GET\t/x", b"G(T", b"GET ", b"GE\x7fT"):
            with self.subTest(method=method):
                self.assertMalformed(replaced(b":method", method))


class ConnectTests(SynchronousTestCase):
    """
    RFC 9113 section 8.5: CONNECT names only C{:method} and C{:authority}.
    """

    def test_connect(self) -> None:
        head = read([(b":method", b"CONNECT"), (b":authority", b"example.com:443")])
        self.assertEqual((head.method, head.target), (b"CONNECT", b"example.com:443"))

    def test_connect_without_authority(self) -> None:
        self.assertRaises(MalformedRequestError, read, [(b":method", b"CONNECT")])

    def test_connect_with_scheme_or_path(self) -> None:
        base = [(b":method", b"CONNECT"), (b":authority", b"example.com:443")]
        self.assertRaises(MalformedRequestError, read, [*base, (b":scheme", b"https")])
        self.assertRaises(MalformedRequestError, read, [*base, (b":path", b"/")])

    def test_extended_connect(self) -> None:
        """
        No extended CONNECT (RFC 8441; WebSockets stay on HTTP/1.1): C{:protocol} is an
        unknown pseudo-header.
        """
        fields = [*replaced(b":method", b"CONNECT"), (b":protocol", b"websocket")]
        self.assertRaises(MalformedRequestError, read, fields)


class FieldTests(SynchronousTestCase):
    """
    RFC 9113 section 8.2: field names and values.
    """

    def assertMalformed(self, fields: Fields) -> None:
        self.assertRaises(MalformedRequestError, read, fields)

    def test_uppercase_name(self) -> None:
        for name in (b"Accept", b"X-FOO", b"aCCEPT"):
            with self.subTest(name=name):
                self.assertMalformed(get((name, b"x")))

    def test_invalid_name(self) -> None:
        for name in (b"a b", b"a:b", b"", b"a\x00", b"a\r", b"a\n", b"a(b", b"\xe9"):
            with self.subTest(name=name):
                self.assertMalformed(get((name, b"x")))

    def test_connection_specific(self) -> None:
        for name, value in (
            (b"connection", b"close"),
            (b"connection", b"keep-alive"),
            (b"keep-alive", b"300"),
            (b"proxy-connection", b"keep-alive"),
            (b"transfer-encoding", b"chunked"),
            (b"transfer-encoding", b"identity"),
            (b"upgrade", b"h2c"),
            (b"upgrade", b"websocket"),
        ):
            with self.subTest(name=name, value=value):
                self.assertMalformed(get((name, value)))

    def test_te_other_than_trailers(self) -> None:
        for value in (b"gzip", b"trailers, gzip", b"chunked", b"", b"trailers;q=1"):
            with self.subTest(value=value):
                self.assertMalformed(get((b"te", value)))

    def test_cr_lf_nul_in_values(self) -> None:
        for value in (b"a\rb", b"a\nb", b"a\x00b", b"a\r\nx-injected: 1", b"\r", b"\n"):
            with self.subTest(value=value):
                self.assertMalformed(get((b"x-a", value)))

    def test_cr_lf_nul_in_pseudo_values(self) -> None:
        for name in (b":method", b":path", b":authority", b":scheme"):
            with self.subTest(name=name):
                self.assertMalformed(replaced(name, b"/a\r\nx: 1"))
                self.assertMalformed(replaced(name, b"/a\x00"))

    def test_edge_whitespace(self) -> None:
        """
        RFC 9113 section 8.2.1: no leading or trailing space or tab.
        """
        for value in (b" a", b"a ", b"\ta", b"a\t"):
            with self.subTest(value=value):
                self.assertMalformed(get((b"x-a", value)))


class AuthorityTests(SynchronousTestCase):
    """
    RFC 9113 section 8.3.1: C{:authority}, C{host}, or both when they agree.
    """

    def test_only_authority(self) -> None:
        self.assertIn((b"host", b"example.com"), read(GET).fields)

    def test_only_host(self) -> None:
        head = read([*without(b":authority"), (b"host", b"example.com")])
        self.assertEqual([v for n, v in head.fields if n == b"host"], [b"example.com"])

    def test_neither(self) -> None:
        """
        No host at all: read (the edge answers 400, as for HTTP/1.1 without Host).
        """
        head = read(without(b":authority"))
        self.assertNotIn(b"host", [n for n, _ in head.fields])

    def test_same(self) -> None:
        head = read(get((b"host", b"example.com")))
        self.assertEqual([v for n, v in head.fields if n == b"host"], [b"example.com"])

    def test_different(self) -> None:
        self.assertRaises(MalformedRequestError, read, get((b"host", b"evil.test")))
        self.assertRaises(MalformedRequestError, read, get((b"host", b"example.com:8443")))

    def test_host_repeated(self) -> None:
        fields = [*without(b":authority"), (b"host", b"a.test"), (b"host", b"b.test")]
        self.assertRaises(MalformedRequestError, read, fields)
        self.assertRaises(
            MalformedRequestError,
            read,
            get((b"host", b"example.com"), (b"host", b"example.com")),
        )

    def test_same_host_other_case(self) -> None:
        """
        RFC 9113 section 8.3.1 compares the two normalised (RFC 3986 section 6.2.2.1:
        a host is case-insensitive): the same host in another case is the same entity.
        """
        head = read(get((b"host", b"EXAMPLE.com")))
        self.assertEqual(head.target, b"/p?q=1")


class CookieTests(SynchronousTestCase):
    """
    RFC 9113 section 8.2.3: cookie crumbs are joined with C{"; "}.
    """

    def test_crumbs_joined(self) -> None:
        head = read(get((b"cookie", b"a=1"), (b"accept", b"*/*"), (b"cookie", b"b=2")))
        self.assertEqual([v for n, v in head.fields if n == b"cookie"], [b"a=1; b=2"])

    def test_one_cookie(self) -> None:
        head = read(get((b"cookie", b"a=1; b=2")))
        self.assertEqual([v for n, v in head.fields if n == b"cookie"], [b"a=1; b=2"])


class ContentLengthTests(SynchronousTestCase):
    """
    C{content-length}: digits only, at most 15 of them, one value.
    """

    def test_not_digits(self) -> None:
        for value in (b"", b"-1", b"+1", b"1.0", b"0x10", b"1 2", b"\xd9\xa1", b"1,1"):
            with self.subTest(value=value):
                self.assertRaises(MalformedRequestError, read, get((b"content-length", value)))

    def test_too_many_digits(self) -> None:
        self.assertRaises(MalformedRequestError, read, get((b"content-length", b"1" * 16)))
        self.assertRaises(MalformedRequestError, read, get((b"content-length", b"0" * 20 + b"1")))

    def test_repeated_different(self) -> None:
        fields = get((b"content-length", b"1"), (b"content-length", b"2"))
        self.assertRaises(MalformedRequestError, read, fields)


class BoundTests(SynchronousTestCase):
    """
    The list's size (RFC 9113 section 6.5.2: names, values and 32 per field) and count.
    """

    def size(self, fields: Fields) -> int:
        return sum(len(n) + len(v) + 32 for n, v in fields)

    def test_size_at_the_bound(self) -> None:
        fields = get((b"x-big", b"a" * 100))
        read(fields, size=self.size(fields))

    def test_size_over(self) -> None:
        fields = get((b"x-big", b"a" * 100))
        self.assertRaises(HeaderListTooLargeError, read, fields, self.size(fields) - 1)

    def test_many_small_fields(self) -> None:
        fields = get(*[(b"x-%d" % i, b"") for i in range(600)])
        self.assertRaises(HeaderListTooLargeError, read, fields, 1 << 20, 500)
        read(fields[:500], 1 << 20, 500)

    def test_cookies_count(self) -> None:
        """
        Cookie crumbs count, each, before they are joined.
        """
        fields = get(*[(b"cookie", b"c%d=1" % i) for i in range(600)])
        self.assertRaises(HeaderListTooLargeError, read, fields, 1 << 20, 500)

    def test_too_large_before_malformed(self) -> None:
        """
        A list that is too large is too large, whatever follows.
        """
        fields = get((b"x-big", b"a" * 20000), (b"connection", b"close"))
        self.assertRaises(HeaderListTooLargeError, read, fields)

    def test_stops_reading(self) -> None:
        """
        The list is read lazily and no further than the bound: an endless iterable is
        refused.
        """

        def endless() -> Iterable[tuple[bytes, bytes]]:
            yield from GET
            while True:
                yield (b"x-a", b"b" * 100)

        self.assertRaises(HeaderListTooLargeError, read, endless())
