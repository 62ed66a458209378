"""
How configuration values appear in problem messages: on one line, with characters that
cannot be seen named.
"""

from __future__ import annotations

__all__ = ["describe_char", "show"]


def show(value: str) -> str:
    """
    C{value} for a message: characters that cannot be printed are escaped as in Python,
    so that every problem stays on one line.
    """
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in value
    )


def describe_char(char: str) -> str:
    """
    One character for a message: C{a space}, C{"["}, C{"ä" (U+00E4)} or C{U+000D}.
    """
    if char == " ":
        return "a space"
    if char.isascii() and char.isprintable():
        return f'"{char}"'
    if char.isprintable():
        return f'"{char}" (U+{ord(char):04X})'
    return f"U+{ord(char):04X}"
