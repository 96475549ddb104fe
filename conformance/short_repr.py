"""Bounded reprs of untrusted values, for failure messages (issue 23 item 3).

``short_repr(value, limit)`` costs time and memory that grow with ``limit``, never with the
size of ``value``: an adapter answer of 10^7 block ids is shown as its first few ids and its
length (``[5, 5, 5, ... (10000000 items)]``), where ``repr`` would build an 80 MB string first
and cut it afterwards. Lists, tuples, sets, dicts (and their subclasses that keep the builtin
``__repr__``), strings and bytes are rendered piece by piece, at most ``limit`` elements and
six levels deep; an int of more than 256 bits is named by its size (``repr`` of a 5000-digit
int raises); anything else is ``repr``'d (a repr that raises is named, not propagated) and
cut.
"""

from __future__ import annotations

from itertools import islice

__all__ = ["short_repr"]

_MAX_DEPTH = 6
_BIG_INT_BITS = 256
#: Characters kept free for the ``... (N items)`` of a container that is cut.
_COUNT_ROOM = 24
#: Container type -> (opening, closing) of its builtin repr.
_BRACKETS: dict[type, tuple[str, str]] = {
    list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}"), frozenset: ("frozenset({", "})"),
}
_BUILTIN_REPRS = {list.__repr__, tuple.__repr__, set.__repr__, frozenset.__repr__,
                  dict.__repr__}


def short_repr(value: object, limit: int = 120) -> str:
    """``value`` as ``repr`` shows it, at most ``limit`` characters (``...`` where cut), built
    in time and memory bounded by ``limit`` for the builtin containers, strings and bytes."""
    text = _render(value, max(limit, 8), 0)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ must not hide the real problem
        return f"<{type(value).__name__} (repr raised {type(exc).__name__})>"


def _render(value: object, budget: int, depth: int) -> str:
    kind = type(value)
    if kind is bool:
        return "True" if value else "False"
    if isinstance(value, int):
        bits = value.bit_length()
        return f"<int of {bits} bits>" if bits > _BIG_INT_BITS else _plain_repr(value)
    if isinstance(value, (str, bytes, bytearray)):
        if len(value) <= budget:
            return _plain_repr(value)
        return f"{_plain_repr(value[:budget])}... ({len(value)} characters)"
    if depth >= _MAX_DEPTH:
        return "..."
    builtin = getattr(kind, "__repr__", None) in _BUILTIN_REPRS
    if builtin and isinstance(value, dict):
        return _wrapped(kind, dict, _items(value, budget, depth), "{", "}")
    if builtin and isinstance(value, (list, tuple, set, frozenset)):
        base = next(t for t in _BRACKETS if isinstance(value, t))
        opening, closing = _BRACKETS[base]
        body = _elements(value, budget, depth)
        if base is tuple and len(value) == 1:
            body += ","
        if base in (set, frozenset) and not value:
            return f"{kind.__name__}()"
        return _wrapped(kind, base, body, opening, closing)
    text = _plain_repr(value)
    return text if len(text) <= budget else text[: budget - 3] + "..."


def _wrapped(kind: type, base: type, body: str, opening: str, closing: str) -> str:
    """``body`` in its brackets, inside ``Kind(...)`` for a subclass."""
    text = f"{opening}{body}{closing}"
    return text if kind is base else f"{kind.__name__}({text})"


def _elements(value: list[object] | tuple[object, ...] | set[object] | frozenset[object],
              budget: int, depth: int) -> str:
    parts: list[str] = []
    used = 0
    for item in islice(value, budget):
        room = budget - used - _COUNT_ROOM
        if parts and room < 8:
            break
        part = _render(item, max(room, 8), depth + 1)
        parts.append(part)
        used += len(part) + 2
    return _joined(parts, len(value))


def _items(value: dict[object, object], budget: int, depth: int) -> str:
    parts: list[str] = []
    used = 0
    for key, item in islice(value.items(), budget):
        room = budget - used - _COUNT_ROOM
        if parts and room < 8:
            break
        shown_key = _render(key, max(room // 2, 8), depth + 1)
        part = f"{shown_key}: {_render(item, max(room - len(shown_key) - 2, 8), depth + 1)}"
        parts.append(part)
        used += len(part) + 2
    return _joined(parts, len(value))


def _joined(parts: list[str], total: int) -> str:
    if len(parts) < total:
        return ", ".join(parts) + f", ... ({total} items)"
    return ", ".join(parts)
