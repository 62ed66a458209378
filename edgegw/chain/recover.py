"""
The recover stage: an error anywhere later in the chain becomes a logged 500.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure

from edgegw.terminal.answers import report_failure
from edgegw.terminal.exchange import Exchange, Handler


async def recover(exchange: Exchange, next: Handler) -> None:
    """
    Run the rest of the chain; turn an unexpected exception into a 500.

    The traceback goes to the log with the request id (and the trace and span ids when a
    span is recording), never to the client. When the response had already started, the
    connection is aborted instead, so the client cannot mistake a truncated body for a
    complete one. A cancellation (the client went away) is not an error.
    """
    try:
        await next(exchange)
    except CancelledError:
        raise
    except Exception:
        report_failure(Failure(), exchange.request, exchange)
