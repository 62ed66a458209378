"""
Load-time assembly: a loaded configuration becomes a running L{Gateway
<edgegw.assembly.assemble.Gateway>} (terminals, per-route chains, the mux, identity, the
Site), everything computed once before the first request.
"""
