"""
HTTP plumbing beneath the edge layers: the streaming request and its channel, the
one-write response head, and listen addresses.
"""
