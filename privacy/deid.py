"""De-identification: replace detected spans by category placeholders such as ``[PER]``.

This is the ``deid`` baseline. It protects nothing formally (missed spans leak, and context can
re-identify), so its epsilon is infinite; it is here because practitioners use it and the comparison
must show what it does and does not buy.
"""

from __future__ import annotations

from collections.abc import Sequence


def redact(text: str, spans: Sequence[tuple[int, int, str]]) -> str:
    """Replace each ``(start, end, category)`` span of ``text`` by ``[CATEGORY]``; overlaps merge."""
    out: list[str] = []
    cursor = 0
    for start, end, category in sorted(spans):
        if start < cursor:  # overlapping span: extend the previous replacement
            cursor = max(cursor, end)
            continue
        out.append(text[cursor:start])
        out.append(f"[{category}]")
        cursor = end
    out.append(text[cursor:])
    return "".join(out)
