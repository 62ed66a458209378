"""
End-to-end tests against real third-party services on loopback (an OpenID provider first).
"""
