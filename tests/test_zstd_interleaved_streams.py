"""
Two zstd response bodies compressed at the same time, piece by piece in turn, as an
HTTP/2 connection's streams (or two HTTP/1.1 connections) interleave their writes: each
must decode, with the zstandard library, to its own bytes.

Found by C{python -m bench pageload}: Chromium loading the single-page app from edgegw
over HTTP/2 failed a handful of scripts with C{net::ERR_CONTENT_DECODING_FAILED}, each
of which decodes when asked for alone. C{edgegw.compression.codings._Zstd} takes every
stream's C{compressobj()} from one class-level C{ZstdCompressor}, and python-zstandard's
compression objects share their compressor's context.
"""

from __future__ import annotations

import random

import zstandard
from twisted.trial.unittest import SynchronousTestCase

from edgegw.compression.codings import CODINGS


def _text(seed: int, size: int) -> bytes:
    rng = random.Random(seed)
    words = [b"const", b"function", b"return", b"import", b"export", b"=>", b"{", b"}"]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + b" " + b"%x" % rng.getrandbits(24) + b";\n"
    return bytes(out[:size])


class InterleavedStreamsTests(SynchronousTestCase):
    def test_two_zstd_streams_at_once(self) -> None:
        """
        Each of two zstd encoders fed in turn produces its own valid stream.
        """
        bodies = [_text(1, 200_000), _text(2, 200_000)]
        encoders = [CODINGS["zstd"].encoder(), CODINGS["zstd"].encoder()]
        outputs: list[list[bytes]] = [[], []]
        piece = 16_384
        for start in range(0, len(bodies[0]), piece):
            for body, encoder, out in zip(bodies, encoders, outputs, strict=True):
                out.append(encoder.compress(body[start : start + piece]))
        for encoder, out in zip(encoders, outputs, strict=True):
            out.append(encoder.finish())
        for body, out in zip(bodies, outputs, strict=True):
            decoded = zstandard.ZstdDecompressor().decompressobj().decompress(b"".join(out))
            self.assertEqual(decoded, body)
