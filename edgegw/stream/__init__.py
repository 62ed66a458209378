"""
The protocol boundary: the client side of a request, as every layer above the server
reaches it (L{edgegw.stream.boundary}), and the response's headers and filter, which
the server writes and the layers above set.
"""
