"""
HTTP/2 for browsers: the server side of RFC 9113 on the C{h2} library, one
L{IClientStream<edgegw.stream.boundary.IClientStream>} per stream, so that the chain
above serves it as it serves HTTP/1.1.
"""
