"""
The state store's command encoding (L{edgegw.seam.LeanRedisCommands}): byte for byte
what txredisapi would send, for every kind of argument.
"""

from __future__ import annotations

from typing import Any

import txredisapi  # type: ignore[import-untyped]
from twisted.trial.unittest import SynchronousTestCase

from edgegw.state.kvstore import _Protocol, _Subscriber

CASES: list[tuple[Any, ...]] = [
    ("GET", b"t:k"),
    ("SET", b"t:k", b"v\r\n$3\r\n", "PX", 30000, "NX"),
    ("EVALSHA", b"0123abcd", 1, b"plugin:limit:\x00\xff", 100000, 0),
    ("EVAL", b"return 1", 0),
    ("SET", "é", -5, 0, 10**20),
    ("X", b""),
    # Kinds txredisapi encodes its own way: left to it.
    ("INCRBYFLOAT", b"k", 1.5),
    ("SET", b"k", True),
    ("SET", b"k", bytearray(b"ab")),
]


class EncodingTests(SynchronousTestCase):
    def test_same_bytes_as_txredisapi(self) -> None:
        for kind in (_Protocol, _Subscriber):
            ours = kind(charset=None)
            theirs = txredisapi.BaseRedisProtocol(charset=None)
            for args in CASES:
                self.assertEqual(
                    ours._build_command(*args), theirs._build_command(*args), (kind, args)
                )

    def test_wire_format(self) -> None:
        self.assertEqual(
            _Protocol(charset=None)._build_command("EVALSHA", b"ab", 1, b"k", 7),
            b"*5\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n$1\r\n7\r\n",
        )
