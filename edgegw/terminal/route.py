"""
The compiled form of a route: everything the hot path needs, computed once at load.
"""

from __future__ import annotations

import attrs

from edgegw.config.effective import EffectiveRoute


@attrs.frozen
class CompiledRoute:
    """
    A route ready to serve.

    @ivar name: The Route's C{metadata.name}.
    @ivar pattern: The C{match} pattern, as written.
    @ivar effective: The route with its groups and defaults applied.
    @ivar handler_description: One line describing the terminal, for the route table.
    """

    name: str
    pattern: str
    effective: EffectiveRoute
    handler_description: str

    @property
    def type(self) -> str:
        """
        C{app} or C{service}.
        """
        return self.effective.type

    @property
    def auth(self) -> str:
        """
        C{required} or C{public}.
        """
        return self.effective.auth
