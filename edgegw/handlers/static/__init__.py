"""
The C{static} terminal: a file server for single-page applications.

Lookup
======

The lookup path is the raw (percent-encoded) request path, less C{stripPrefix} when the
path starts with it (a plain byte-prefix match, as Go's C{http.StripPrefix}; stripping
the whole path leaves C{/}). Each segment is percent-decoded once as UTF-8. A segment
that starts with C{.} (C{.}, C{..}, C{.env}, C{%2e%2e}, C{%2Eenv}), decodes to invalid
UTF-8, or contains C{/}, C{\\} or NUL after decoding is rejected with 404 before the
filesystem is touched, and never falls back to the index. Symbolic links are followed
only while the real path stays inside the real root; the root itself is resolved once,
at load, so re-pointing a symlinked root (an atomic deploy) takes effect on reload.

A directory (C{/}, C{/docs}, C{/docs/}) serves its own index file, without a redirect.
A path with a trailing slash must name a directory. Anything else that is not a regular
file is a miss: with C{spaFallback} and a last segment without C{.} the root index is
served (200), otherwise 404.

Responses
=========

Only C{GET} and C{HEAD} are answered (405 with C{Allow: GET, HEAD} otherwise). Every file
named like the index (served directly, as a directory index or as the fallback) carries
C{Cache-Control: no-cache}; other files carry C{cacheControl} when configured. Files
carry a strong C{ETag}, C{Last-Modified} and C{Accept-Ranges: bytes}. The C{ETag} is the
same on every host that serves the same file (nothing local such as the inode is in it):
size and a BLAKE2b hash of the content for files up to L{ETAG_HASH_LIMIT} bytes (hashed
once per file version and process; a deployment that gives the copies different
modification times still revalidates), size and modification time for larger ones.

Preconditions follow RFC 9110 section 13.2.2: C{If-Match} and C{If-Unmodified-Since}
(412), then C{If-None-Match} (weak comparison, C{*}) or else C{If-Modified-Since} (304).
A single byte range (C{a-b}, C{a-}, C{-n}) is answered with 206, an unsatisfiable one
with 416 and C{Content-Range: bytes */size}; a syntactically invalid C{Range} is ignored.
A request for several ranges is answered with the whole file (200), which RFC 9110
permits, rather than a C{multipart/byteranges} body. C{If-Range} (entity tag, strong
comparison, or the exact C{Last-Modified} date) that does not match also gives the whole
file. C{HEAD} gets exactly the headers C{GET} would get, ranges included.

Files up to L{SMALL_FILE_LIMIT} bytes are read and written at once; larger bodies are
streamed by a pull producer, so memory stays bounded whatever the file size. If a file
shrinks while it is being sent, the connection is closed after the bytes that exist so
that the client sees a truncated transfer instead of a short body it would trust.

Modules: L{handler<edgegw.handlers.static.handler>} (L{StaticHandler}: the order of the
steps), L{lookup<edgegw.handlers.static.lookup>} (path to open file),
L{conditional<edgegw.handlers.static.conditional>} (preconditions and ranges),
L{file_body<edgegw.handlers.static.file_body>} (entity tag, reading and streaming),
L{content_types<edgegw.handlers.static.content_types>} (the extension table). Why this
is not built on C{twisted.web.static.File}: docs/architecture.md, "Decisions".
"""

from edgegw.handlers.static.file_body import ETAG_HASH_LIMIT, SMALL_FILE_LIMIT
from edgegw.handlers.static.handler import StaticHandler

__all__ = ["ETAG_HASH_LIMIT", "SMALL_FILE_LIMIT", "StaticHandler"]
