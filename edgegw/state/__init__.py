"""
Server-side state shared by gateway processes: the L{IStateStore} interface, the state
providers found through package entry points (L{edgegw.state.providers}) and the shipped
C{kvstore} provider (Redis, L{edgegw.state.kvstore}).
"""
