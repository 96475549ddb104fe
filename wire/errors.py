"""Every error the wire protocol's client raises, in one place (each also importable from the
module that raises it).

``EngineError`` is deliberately not a ``KVCheckError``: it stands for the engine's own
exception (error code ``internal``), as an in-process adapter raising one, so the suite
treats it exactly as it treats an adapter's exception.
"""

from __future__ import annotations

from kvcheck.conformance.errors import ProtocolViolation
from kvcheck.errors import KVCheckInputError

__all__ = ["EngineError", "EngineProcessError", "WireValueError"]


class WireValueError(KVCheckInputError):
    """A value on the wire does not have the shape its method says (not hex, not an object...);
    the message names the value."""



class EngineError(Exception):
    """The engine answered a call with error code ``internal`` (or an unknown code): it failed,
    as an in-process adapter raising an exception."""



class EngineProcessError(ProtocolViolation):
    """The engine process failed a call at the process level: it exited, wrote something that
    is not one JSON answer with the request's id, or could not be started. The message names
    the call, what happened, the exit status and the last lines of its standard error."""

