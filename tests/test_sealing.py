"""
Tests for L{edgegw.identity.sealing}.
"""

from __future__ import annotations

from base64 import urlsafe_b64decode, urlsafe_b64encode

from twisted.trial.unittest import SynchronousTestCase

from edgegw.identity.sealing import (
    LOGIN_STATE_AAD,
    SESSION_AAD,
    Sealer,
    b64url,
    b64url_decode,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
PLAINTEXT = b'{"v":1,"s":"alice"}'


def raw(sealed: str) -> bytes:
    """
    The bytes under a sealed value.
    """
    return urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4))


def encode(data: bytes) -> str:
    return urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class SealerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sealer = Sealer(KEY)

    def test_key_size(self) -> None:
        """
        Only a 32-byte key is accepted.
        """
        for size in (0, 16, 24, 31, 33, 64):
            with self.assertRaises(ValueError):
                Sealer(b"k" * size)

    def test_round_trip(self) -> None:
        """
        A sealed value opens to its plaintext with the same key and associated data, as
        str or as bytes.
        """
        sealed = self.sealer.seal(PLAINTEXT, SESSION_AAD)
        self.assertEqual(self.sealer.unseal(sealed, SESSION_AAD), PLAINTEXT)
        self.assertEqual(self.sealer.unseal(sealed.encode("ascii"), SESSION_AAD), PLAINTEXT)
        self.assertEqual(Sealer(KEY).unseal(sealed, SESSION_AAD), PLAINTEXT)

    def test_empty_plaintext(self) -> None:
        """
        An empty plaintext seals to nonce and tag only, and opens to C{b""}.
        """
        sealed = self.sealer.seal(b"", SESSION_AAD)
        self.assertEqual(len(raw(sealed)), 12 + 16)
        self.assertEqual(self.sealer.unseal(sealed, SESSION_AAD), b"")

    def test_layout(self) -> None:
        """
        The value is unpadded base64url of a 12-byte nonce, the ciphertext (as long as the
        plaintext) and a 16-byte tag; every seal uses a fresh nonce.
        """
        first = self.sealer.seal(PLAINTEXT, SESSION_AAD)
        second = self.sealer.seal(PLAINTEXT, SESSION_AAD)
        self.assertNotIn("=", first)
        self.assertTrue(
            set(first) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        )
        self.assertEqual(len(raw(first)), 12 + len(PLAINTEXT) + 16)
        self.assertNotEqual(raw(first)[:12], raw(second)[:12])
        self.assertNotEqual(first, second)

    def test_tamper_every_byte(self) -> None:
        """
        Flipping a bit anywhere (nonce, ciphertext or tag) makes the value unopenable.
        """
        data = raw(self.sealer.seal(PLAINTEXT, SESSION_AAD))
        for index in range(len(data)):
            tampered = bytearray(data)
            tampered[index] ^= 0x01
            self.assertIsNone(self.sealer.unseal(encode(bytes(tampered)), SESSION_AAD), index)

    def test_tamper_regions(self) -> None:
        """
        Replacing the whole nonce, ciphertext or tag makes the value unopenable.
        """
        data = raw(self.sealer.seal(PLAINTEXT, SESSION_AAD))
        end = len(data) - 16
        for start, stop in ((0, 12), (12, end), (end, len(data))):
            tampered = data[:start] + bytes(stop - start) + data[stop:]
            self.assertIsNone(self.sealer.unseal(encode(tampered), SESSION_AAD))

    def test_truncation(self) -> None:
        """
        Every truncation of the value, and of the bytes under it, is rejected.
        """
        sealed = self.sealer.seal(PLAINTEXT, SESSION_AAD)
        for length in range(len(sealed)):
            self.assertIsNone(self.sealer.unseal(sealed[:length], SESSION_AAD), length)
        data = raw(sealed)
        for length in range(len(data)):
            self.assertIsNone(self.sealer.unseal(encode(data[:length]), SESSION_AAD), length)

    def test_appended(self) -> None:
        """
        Extra bytes after the tag are rejected.
        """
        data = raw(self.sealer.seal(PLAINTEXT, SESSION_AAD))
        self.assertIsNone(self.sealer.unseal(encode(data + b"\x00"), SESSION_AAD))

    def test_wrong_key(self) -> None:
        """
        A value sealed under another key does not open.
        """
        sealed = Sealer(OTHER_KEY).seal(PLAINTEXT, SESSION_AAD)
        self.assertIsNone(self.sealer.unseal(sealed, SESSION_AAD))

    def test_wrong_aad(self) -> None:
        """
        A login state never opens as a session, nor the other way round.
        """
        login = self.sealer.seal(PLAINTEXT, LOGIN_STATE_AAD)
        session = self.sealer.seal(PLAINTEXT, SESSION_AAD)
        self.assertIsNone(self.sealer.unseal(login, SESSION_AAD))
        self.assertIsNone(self.sealer.unseal(session, LOGIN_STATE_AAD))
        self.assertIsNone(self.sealer.unseal(session, b""))

    def test_garbage(self) -> None:
        """
        Values that are not base64url, or too short, are rejected without raising.
        """
        sealed = self.sealer.seal(PLAINTEXT, SESSION_AAD)
        standard = sealed.replace("-", "+").replace("_", "/")
        for value in (
            "",
            "A",
            "AAAA",
            "x" * 37,
            "!" * 40,
            sealed + "!",
            sealed[:10] + " " + sealed[10:],
            sealed[:10] + "\n" + sealed[10:],
            sealed[:10] + "é" + sealed[10:],
            sealed[:10] + "\x00" + sealed[10:],
            "\udcff" + sealed,
            b"\xff" + sealed.encode("ascii"),
        ):
            self.assertIsNone(self.sealer.unseal(value, SESSION_AAD), repr(value))
        if standard != sealed:
            self.assertIsNone(self.sealer.unseal(standard, SESSION_AAD))

    def test_standard_alphabet(self) -> None:
        """
        C{+} and C{/} (the standard alphabet) are not base64url.
        """
        self.assertIsNone(b64url_decode(b"+/+/"))
        self.assertEqual(b64url_decode(b"-_-_"), b"\xfb\xff\xbf")

    def test_padding(self) -> None:
        """
        A padded value is rejected, even though it decodes to the same bytes.
        """
        for plaintext in (b"", b"a", b"ab", b"abc"):
            sealed = self.sealer.seal(plaintext, SESSION_AAD)
            padded = sealed + "=" * (-len(sealed) % 4)
            if padded == sealed:
                padded += "===="
            self.assertIsNone(self.sealer.unseal(padded, SESSION_AAD))
            self.assertEqual(self.sealer.unseal(sealed, SESSION_AAD), plaintext)

    def test_non_canonical_last_character(self) -> None:
        """
        A last character whose unused bits are set is rejected: each sealed value has
        exactly one spelling.
        """
        self.assertEqual(b64url_decode(b"QQ"), b"A")
        self.assertIsNone(b64url_decode(b"QR"))
        self.assertEqual(b64url_decode(b"QUI"), b"AB")
        self.assertIsNone(b64url_decode(b"QUJ"))
        for plaintext in (b"", b"a", b"ab"):
            sealed = self.sealer.seal(plaintext, SESSION_AAD)
            if len(sealed) % 4 == 0:
                continue
            alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
            last = alphabet.index(sealed[-1])
            twin = sealed[:-1] + alphabet[last + 1]
            self.assertEqual(raw(twin), raw(sealed))
            self.assertIsNone(self.sealer.unseal(twin, SESSION_AAD))

    def test_impossible_length(self) -> None:
        """
        A length of 4n+1 characters is never valid base64.
        """
        self.assertIsNone(b64url_decode(b"AAAAA"))

    def test_b64url(self) -> None:
        """
        L{b64url} is unpadded base64url.
        """
        self.assertEqual(b64url(b"\xfb\xff"), "-_8")
        self.assertEqual(b64url(b""), "")
