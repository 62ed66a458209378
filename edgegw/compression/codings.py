"""
The content codings the gateway compresses with: C{zstd} (zstandard), C{br} (brotli) and
C{gzip} (zlib), each as a streaming L{Encoder} and as a one-shot function for a whole
body.

Levels (docs/performance.md, "Compression"): gzip 5 and brotli 4, each the last level
before its cost jumps; zstd 6, which sends fewer bytes than either for less CPU than
either (on the benchmark's single-page app and on API JSON), where zstd's default 3 sent
more than both and made page loads slower than nginx's gzip 5.

A streaming encoder flushes what it has after every piece it is given, so that every
write of the response's producer puts bytes on the connection: a pull producer is asked
for more only once those are sent, and a slow stream (a backend trickling JSON lines)
reaches the client as it comes. Pieces are what the terminals write (at most 64 KiB from
a file or a backend read), so the flushes cost little ratio; the encoder's own state is
bounded (the window: 32 KiB for gzip, at most 512 KiB for brotli and zstd streams).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final, Protocol

import attrs
import brotli  # type: ignore[import-untyped]
import zstandard

__all__ = [
    "CODINGS",
    "CODING_NAMES",
    "Coding",
    "Encoder",
]

GZIP_LEVEL: Final = 5
BROTLI_QUALITY: Final = 4
ZSTD_LEVEL: Final = 6

_BROTLI_MAX_WINDOW: Final = 22
_BROTLI_MIN_WINDOW: Final = 10
_STREAM_WINDOW: Final = 19
# A streamed body's encoder lives as long as its download: its window is held to
# 512 KiB (measured per stream: brotli 4 holds 1.8 MiB with it, 11 MiB with its own
# default of 4 MiB; zstd 6 about 3.2 MiB, its tables included), for 0.7-0.9 % more
# bytes on the benchmark app's scripts over 64 KiB.
_ZSTD_STREAM_PARAMETERS: Final = zstandard.ZstdCompressionParameters.from_level(
    ZSTD_LEVEL, window_log=_STREAM_WINDOW
)


class Encoder(Protocol):
    """
    Compresses one response body piece by piece.
    """

    def compress(self, data: bytes) -> bytes:
        """
        Compress C{data} and return everything encoded so far (flushed).
        """

    def finish(self) -> bytes:
        """
        End the stream: the encoded bytes that complete it.
        """


class _Gzip:
    __slots__ = ("_z",)

    def __init__(self, size: int | None = None) -> None:
        self._z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)

    def compress(self, data: bytes) -> bytes:
        z = self._z
        return z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        return self._z.flush(zlib.Z_FINISH)


class _Brotli:
    __slots__ = ("_c",)

    def __init__(self, size: int | None = None) -> None:
        window = _STREAM_WINDOW if size is None else min(_STREAM_WINDOW, _brotli_window(size))
        self._c = brotli.Compressor(quality=BROTLI_QUALITY, lgwin=window)

    def compress(self, data: bytes) -> bytes:
        c = self._c
        out: bytes = c.process(data) + c.flush()
        return out

    def finish(self) -> bytes:
        out: bytes = self._c.finish()
        return out


class _Zstd:
    __slots__ = ("_z",)

    def __init__(self, size: int | None = None) -> None:
        # A compressor's compression objects share its context: each stream needs a
        # compressor of its own (making one, its context included, costs ~12 µs: this
        # is for bodies streamed, over 256 KiB or of unknown length). None is kept for
        # later: a finished one would hold its ~3 MiB for nothing.
        compressor = zstandard.ZstdCompressor(compression_params=_ZSTD_STREAM_PARAMETERS)
        self._z = compressor.compressobj()

    def compress(self, data: bytes) -> bytes:
        z = self._z
        return z.compress(data) + z.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)

    def finish(self) -> bytes:
        return self._z.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)


def _gzip_whole(body: bytes) -> bytes:
    return zlib.compress(body, GZIP_LEVEL, 31)


def _brotli_window(size: int) -> int:
    # The smallest window that holds the whole body: the encoder's memory is sized by it.
    return max(_BROTLI_MIN_WINDOW, min(_BROTLI_MAX_WINDOW, size.bit_length()))


def _brotli_whole(body: bytes) -> bytes:
    out: bytes = brotli.compress(body, quality=BROTLI_QUALITY, lgwin=_brotli_window(len(body)))
    return out


_zstd_whole = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress


@attrs.frozen
class Coding:
    """
    One content coding.

    @ivar name: Its token in C{Accept-Encoding} and C{Content-Encoding}.
    @ivar token: C{name} as bytes, the C{Content-Encoding} value.
    @ivar sidecar: The suffix of its precompressed files (C{app.js.br}).
    @ivar etag_suffix: What goes before the closing quote of a strong entity tag of a
        body compressed on the fly (C{"abc"} -> C{"abc-br"}).
    @ivar encoder: A new streaming encoder, given the body's length when it is known
        (brotli's window is sized to it); its window is at most 512 KiB.
    @ivar whole: Compresses a whole body at once.
    """

    name: str
    token: bytes
    sidecar: str
    etag_suffix: bytes
    encoder: Callable[[int | None], Encoder]
    whole: Callable[[bytes], bytes]


CODINGS: Final[dict[str, Coding]] = {
    "zstd": Coding("zstd", b"zstd", ".zst", b"-zstd", _Zstd, _zstd_whole),
    "br": Coding("br", b"br", ".br", b"-br", _Brotli, _brotli_whole),
    "gzip": Coding("gzip", b"gzip", ".gz", b"-gzip", _Gzip, _gzip_whole),
}
"""The codings by name."""

CODING_NAMES: Final = tuple(CODINGS)
"""Their names, in the gateway's default order of preference."""
