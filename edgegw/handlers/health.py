"""
The health terminal: always 200 with C{{"status":"ok"}}.
"""

from __future__ import annotations

from twisted.web.server import Request

from edgegw.terminal.resource import TerminalResource

BODY = b'{"status":"ok"}'
_HEADERS = (
    (b"content-type", [b"application/json"]),
    (b"content-length", [b"%d" % len(BODY)]),
    (b"cache-control", [b"no-store"]),
)


class HealthHandler(TerminalResource):
    """
    Answers every request with C{200 {"status":"ok"}} (no body for HEAD).
    """

    async def respond(self, request: Request) -> None:
        """
        Write the health answer.
        """
        set_header = request.responseHeaders.setRawHeaders
        for name, value in _HEADERS:
            set_header(name, value)
        request.write(BODY)
        request.finish()

    def describe(self) -> str:
        """
        One line for the route table.
        """
        return "health"
