"""Checking a Lance SQL filter before it reaches Lance.

Lance parses only the first statement of a filter and silently ignores
everything after a ``;``, and it refuses an empty filter; :func:`checked_filter`
turns both into what a caller means.
"""

from __future__ import annotations


def checked_filter(filter: str | None) -> str | None:
    """``filter`` ready for Lance: ``None`` for no filter (``None``, empty or whitespace).

    Raises
    ------
    ValueError
        If the filter holds a ``;`` outside a string literal (Lance would
        ignore everything after it).
    """
    if filter is None or not filter.strip():
        return None
    quote: str | None = None
    for position, char in enumerate(filter):
        if quote is not None:
            quote = None if char == quote else quote  # '' inside a literal closes and reopens it
        elif char in "'\"":
            quote = char
        elif char == ";":
            raise ValueError(
                f"filter {filter!r} has a ';' at position {position}: a filter is one expression, "
                "and Lance would ignore everything after the ';'"
            )
    return filter.strip()
