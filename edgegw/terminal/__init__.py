"""
What a route's chain and its terminal share: the per-request L{Exchange}, the terminal
contract (L{TerminalResource}), the compiled route, the types of stages, and the
gateway's own short answers. Beneath the chain and the terminals both, so that the
terminals (handlers) implement the contract without importing the chain.
"""
