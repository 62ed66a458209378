"""
The requests open for each server-side session in this process, so that ending a
session (a logout here, a back-channel logout in any process sharing the store) also
closes its live streams: a server-sent event response, a WebSocket tunnel.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twisted.web.server import Request

from edgegw.stream.boundary import client_closer

__all__ = ["OpenRequests"]


class OpenRequests:
    """
    The open requests of each session id, each forgotten when it finishes.
    """

    def __init__(self) -> None:
        self._by_session: dict[str, dict[int, Any]] = {}

    def __len__(self) -> int:
        return sum(len(requests) for requests in self._by_session.values())

    def track(self, session_id: str, request: Request) -> None:
        """
        Remember C{request} (its client connection) under C{session_id} until it finishes.
        """
        # What closes the connection, not the request: a WebSocket tunnel takes the
        # connection over from the HTTP channel, and this closes either.
        closer = client_closer(request)
        if closer is None:
            return
        open_ = self._by_session.setdefault(session_id, {})
        key = id(request)
        open_[key] = closer

        def finished(result: object) -> None:
            requests = self._by_session.get(session_id)
            if requests is not None:
                requests.pop(key, None)
                if not requests:
                    del self._by_session[session_id]

        request.notifyFinish().addBoth(finished)

    def close(self, session_ids: Iterable[str]) -> int:
        """
        Drop the client connection of every open request of these sessions.

        @return: How many connections were dropped.
        """
        closed = 0
        for session_id in session_ids:
            requests = self._by_session.pop(session_id, None)
            if not requests:
                continue
            for close in requests.values():
                # Abort, not a graceful close: an SSE response or a tunnel never ends
                # by itself, and nothing more of it may reach the logged-out browser.
                close()
                closed += 1
        return closed
