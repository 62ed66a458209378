"""
Go's C{strconv.Quote}, so that messages about patterns and origins read exactly as Go's.
"""

from __future__ import annotations

from edgegw.routing.paths import to_bytes

__all__ = ["go_quote"]

_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(text: str) -> str:
    """
    C{text} as Go's C{%q} (C{strconv.Quote}) writes it: double-quoted, with backslash
    escapes for quotes, backslashes and unprintable characters. Surrogate escapes of raw
    bytes come out as C{\\xNN}, like invalid UTF-8 in Go.
    """
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = ['"']
    for c in text:
        escaped = _GO_ESCAPES.get(c)
        if escaped is not None:
            out.append(escaped)
            continue
        code = ord(c)
        if 0xD800 <= code <= 0xDFFF:
            out.extend(f"\\x{b:02x}" for b in to_bytes(c))
        elif c.isprintable():
            out.append(c)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)
