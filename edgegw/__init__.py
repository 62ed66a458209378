"""edgegw: an HTTP edge gateway for single-page apps and backend APIs, on Twisted."""

__version__ = "0.1.0"
