"""
Response compression: the content codings the gateway encodes with (L{codings}), the
client's C{Accept-Encoding} read with its q-values (L{accept}), and the response-side
stage that decides, as a response's head goes out, whether its body is compressed on the
fly (L{response_coding}), and the static files it compresses once per version and coding
(L{static_cache}). The static handler's precompressed sidecar files use the first two.
"""
