"""Every error the KV-event layer raises: a payload that is not a release's wire format, an
unusable endpoint or capture, and no vLLM to cross-check against."""

from __future__ import annotations

from kvcheck.errors import KVCheckInputError

__all__ = ["NoVLLMError", "StreamError", "WireFormatError"]


class WireFormatError(KVCheckInputError):
    """A payload that is not one event batch in a release's exact form, or an event that
    release cannot carry.

    The message names the problem, where it is (``event_index``, ``field``: ``None`` when
    the whole batch is at fault) and, where one is known, the fix (e.g. the other release).
    """

    def __init__(self, message: str, *, event_index: int | None = None,
                 field: str | None = None) -> None:
        where = []
        if event_index is not None:
            where.append(f"event {event_index}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.event_index = event_index
        self.field = field


class StreamError(KVCheckInputError):
    """A ZMQ endpoint that cannot be used (in use, malformed, silent) or a capture file that
    is not one; the message names the fix."""


class NoVLLMError(KVCheckInputError):
    """vLLM is not installed, or is a release without a wire form here."""

