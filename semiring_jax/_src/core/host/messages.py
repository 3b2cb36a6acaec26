"""Pieces of error messages shared by the host-side readers (no numpy, no JAX).

Errors quote the input at fault (a line, a field, a symbol). A quoted piece
is cut to `LIMIT` characters, so that one huge line of input still makes a
short, one-line message.
"""

from __future__ import annotations

__all__ = ["LIMIT", "cut", "decode_utf8", "quote"]

LIMIT = 60
_ELLIPSIS = "\u2026"


def cut(text: str, limit: int = LIMIT) -> str:
    """`text`, or its first `limit` characters and an ellipsis if longer.

    Examples:
      >>> cut("0 1 2 3", 3)
      '0 1\u2026'
    """
    return text if len(text) <= limit else text[:limit] + _ELLIPSIS


def quote(text: str, limit: int = LIMIT) -> str:
    """The repr of `text`, cut first (see `cut`).

    Examples:
      >>> print(quote("abcdef", 4), quote("ab"))
      'abcd\u2026' 'ab'
    """
    return repr(cut(text, limit))


def decode_utf8(data: bytes, where: str) -> str:
    """`data` decoded as UTF-8; a ValueError naming `where`, the line and the
    column of the first byte that is not UTF-8.

    Examples:
      >>> decode_utf8(b"a 1\\n", "words.syms")
      'a 1\\n'
      >>> decode_utf8(b"a 1\\nb\\xff 2\\n", "words.syms")
      Traceback (most recent call last):
      ...
      ValueError: words.syms: line 2: byte 0xff at column 2 is not UTF-8; the text must be UTF-8
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(
            f"{where}: line {line}: byte 0x{data[err.start]:02x} at column {column} is not "
            f"UTF-8; the text must be UTF-8"
        ) from None
