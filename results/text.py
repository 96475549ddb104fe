"""Untrusted record text made inert for display: control and format characters shown as
escapes.

Record strings (implementation names, verdicts, test ids, file names) come from whoever wrote
the record. Besides markup (which each renderer escapes for its format), invisible characters
can lie: a right-to-left override (U+202E) in a name reverses the rest of the line, so
``"mine\\u202e mrofnoc TON seod"`` *displays* as a verdict it is not; a newline or carriage
return forges a new line in a terminal or log; a zero-width character makes two names look
equal. ``visible`` replaces every such character with a visible escape, so what is shown is
what the record holds.
"""

from __future__ import annotations

import unicodedata

__all__ = ["visible"]

# Unicode categories that never print as themselves: controls (Cc: C0/C1, newline, ESC),
# format characters (Cf: bidi overrides and isolates, zero-width joiners, soft hyphen), line
# and paragraph separators (Zl, Zp), surrogates (Cs) and unassigned code points (Cn).
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def visible(text: object) -> str:
    """``str(text)`` with every control, format, separator, surrogate or unassigned character
    replaced by a visible escape (``\\u202e``, ``\\n``...). Printable text, accents and
    symbols such as ✓ are kept; ASCII-only text is returned unchanged (the fast path)."""
    s = str(text)
    if s.isascii() and s.isprintable():
        return s
    return "".join(_escape(ch) if unicodedata.category(ch) in _HIDDEN else ch for ch in s)
