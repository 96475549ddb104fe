"""Capturing a live KV-event stream (``kvcheck events capture``) and the capture file.

``capture`` subscribes to a publisher's PUB endpoint (vLLM's ``ZmqEventPublisher``, or any
engine publishing its frames) and, when a replay endpoint is given, first asks its ROUTER for
every buffered batch from ``seq`` 0 on (vLLM's replay protocol, either release's replies:
``kvcheck.events.frames``).
The SUB socket is connected *before* the replay request, so nothing published meanwhile is
missed; live messages the replay already delivered (same ``seq``) are dropped once.

A capture file (``.kvcap``) is one msgpack map written atomically at the end::

    {"format": "kvcheck-capture", "version": 1, "endpoint": str,
     "replay_endpoint": str | None, "topic": str, "overlap_dropped": int,
     "messages": [[source ("replay" | "live"), [frame: bin, ...]], ...]}

Each message keeps its frames exactly as received (a malformed message is kept, so that the
checker can name it), in arrival order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Final, TypeVar, overload

import msgspec

from kvcheck.atomic import write_atomic_bytes
from kvcheck.events.errors import StreamError
from kvcheck.events.frames import SEQ_BYTES, is_replay_end, replay_body, replay_request

if TYPE_CHECKING:
    import zmq

__all__ = ["CAPTURE_FORMAT", "Capture", "capture", "read_capture", "write_capture"]

CAPTURE_FORMAT: Final = "kvcheck-capture"
_VERSION: Final = 1
_SOURCES: Final = ("replay", "live")


@dataclass
class Capture:
    """Captured messages (frames as received), in arrival order, with where they came
    from (``sources[i]`` is ``"replay"`` or ``"live"``)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    messages: list[list[bytes]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    overlap_dropped: int = 0


# ---------------------------------------------------------------------------- the file
def write_capture(path: str | Path, cap: Capture) -> Path:
    """Write ``cap`` to ``path`` atomically (a reader never sees half a capture)."""
    doc = {"format": CAPTURE_FORMAT, "version": _VERSION, "endpoint": cap.endpoint,
           "replay_endpoint": cap.replay_endpoint, "topic": cap.topic,
           "overlap_dropped": cap.overlap_dropped,
           "messages": [[source, parts]
                        for source, parts in zip(cap.sources, cap.messages, strict=True)]}
    return write_atomic_bytes(path, msgspec.msgpack.encode(doc))


def read_capture(path: str | Path) -> Capture:
    """Read a capture file.

    Raises:
        StreamError: missing or unreadable, not msgpack, or not a kvcheck capture (the
            message says which field is wrong).
    """
    where = f"capture file {str(path)!r}"
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise StreamError(f"{where}: cannot read it ({error.strerror or error}); write one "
                           "with `kvcheck events capture ENDPOINT -o FILE`") from None
    try:
        doc: object = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as error:
        raise StreamError(f"{where}: not msgpack ({error}); is it a file `kvcheck events "
                           "capture` wrote?") from None
    if not isinstance(doc, dict) or doc.get("format") != CAPTURE_FORMAT:
        raise StreamError(f"{where}: not a kvcheck capture (no \"format\": "
                           f"{CAPTURE_FORMAT!r} map); write one with `kvcheck events capture`")
    if doc.get("version") != _VERSION:
        raise StreamError(f"{where}: capture version {doc.get('version')!r}; this kvcheck "
                           f"reads version {_VERSION}")
    cap = Capture(endpoint=_field(doc, "endpoint", str, where),
                  replay_endpoint=_field(doc, "replay_endpoint", (str, type(None)), where),
                  topic=_field(doc, "topic", str, where),
                  overlap_dropped=_field(doc, "overlap_dropped", int, where))
    messages = _field(doc, "messages", list, where)
    for number, entry in enumerate(messages):
        if (not isinstance(entry, list) or len(entry) != 2 or entry[0] not in _SOURCES
                or not isinstance(entry[1], list)
                or not all(isinstance(p, bytes) for p in entry[1])):
            raise StreamError(f"{where}: messages[{number}] is not [\"replay\" or \"live\", "
                               "[frame bytes, ...]]")
        cap.sources.append(entry[0])
        cap.messages.append(entry[1])
    return cap


_T = TypeVar("_T")
_U = TypeVar("_U")


@overload
def _field(doc: dict[str, object], name: str, kind: type[_T], where: str) -> _T: ...
@overload
def _field(doc: dict[str, object], name: str, kind: tuple[type[_T], type[_U]],
           where: str) -> _T | _U: ...
def _field(doc: dict[str, object], name: str, kind: type | tuple[type, ...],
           where: str) -> object:
    value = doc.get(name)
    if name not in doc or not isinstance(value, kind) or isinstance(value, bool):
        raise StreamError(f"{where}: field {name!r} is missing or a "
                           f"{type(value).__name__}")
    return value


# ----------------------------------------------------------------------------- capture
def import_zmq() -> ModuleType:
    """pyzmq, or a ``StreamError`` naming the fix (it is in the ``events`` extra)."""
    try:
        import zmq
    except ImportError:
        raise StreamError("talking to a ZMQ endpoint needs pyzmq: pip install "
                          "'kvcheck[events]'") from None
    return zmq


def capture(endpoint: str, *, replay_endpoint: str | None = None, topic: str = "",
            count: int | None = None, idle_s: float = 2.0, duration_s: float | None = None,
            bind: bool = False, replay_timeout_s: float = 5.0,
            on_message: Callable[[str, list[bytes]], None] | None = None) -> Capture:
    """Subscribe to ``endpoint`` and collect messages until ``count`` live messages came,
    none came for ``idle_s`` seconds, ``duration_s`` passed, or Ctrl-C (what came is kept).

    Args:
        endpoint: the publisher's PUB endpoint as a subscriber reaches it
            (``tcp://127.0.0.1:5557``); with ``bind`` the subscriber binds it instead (for a
            publisher that connects: vLLM's does for ``tcp://host:port`` without ``*``).
        replay_endpoint: the publisher's replay ROUTER endpoint; None: live only.
        topic: the topic prefix to subscribe to (vLLM's default ``""``: everything).
        count: stop after this many messages (replayed and live), None: no limit.
        idle_s: stop when no message came for this long (after the first one, or from the
            start when nothing comes at all).
        duration_s: stop after this long in all; None: no limit.
        replay_timeout_s: how long the replay socket may stay silent before the end marker.

    Raises:
        StreamError: a malformed endpoint, one in use (with ``bind``), or a replay endpoint
            that does not answer with vLLM's end marker in time.
    """
    zmq = import_zmq()
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    cap = Capture(endpoint=endpoint, replay_endpoint=replay_endpoint, topic=topic)
    try:
        _attach(sub, endpoint, bind, "the PUB endpoint")
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        replayed: set[int] = set()
        if replay_endpoint is not None:
            _replay(ctx, replay_endpoint, replay_timeout_s, cap, replayed, on_message)
        _live(sub, cap, replayed, count, idle_s, duration_s, on_message)
    finally:
        sub.close(0)
    return cap


def _attach(sock: zmq.SyncSocket, endpoint: str, bind: bool, what: str) -> None:
    import zmq

    try:
        (sock.bind if bind else sock.connect)(endpoint)
    except zmq.ZMQError as error:
        hint = ("another process holds it: stop it or pick another port" if
                error.errno == zmq.EADDRINUSE else
                "endpoints look like tcp://127.0.0.1:5557, ipc://kv.sock or inproc://kv")
        raise StreamError(f"{what} {endpoint!r}: cannot {'bind' if bind else 'connect'} "
                           f"({error}); {hint}") from None


def _replay(ctx: zmq.SyncContext, endpoint: str, timeout_s: float, cap: Capture, replayed: set[int],
            on_message: Callable[[str, list[bytes]], None] | None) -> None:
    import zmq

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        _attach(dealer, endpoint, False, "the replay endpoint")
        dealer.send_multipart(replay_request(0))
        while True:
            if not dealer.poll(int(timeout_s * 1000)):
                raise StreamError(
                    f"the replay endpoint {endpoint!r} sent no end marker within {timeout_s} s "
                    f"({len(replayed)} batches replayed): is it the publisher's "
                    "replay_endpoint (a ROUTER socket), and is the publisher running?")
            body = replay_body(dealer.recv_multipart())
            if is_replay_end(body):
                return
            cap.messages.append(body)
            cap.sources.append("replay")
            if len(body) >= 2 and len(body[-2]) == SEQ_BYTES:  # 0.33 [topic, seq, payload]
                replayed.add(int.from_bytes(body[-2], "big"))  # 0.10.2 [seq, payload]
            if on_message is not None:
                on_message("replay", body)
    finally:
        dealer.close(0)


def _live(sub: zmq.SyncSocket, cap: Capture, replayed: set[int], count: int | None, idle_s: float,
          duration_s: float | None, on_message: Callable[[str, list[bytes]], None] | None,
          ) -> None:
    deadline = None if duration_s is None else time.monotonic() + duration_s
    try:
        while count is None or len(cap.messages) < count:
            wait = idle_s if deadline is None else min(idle_s, deadline - time.monotonic())
            if wait <= 0 or not sub.poll(int(wait * 1000)):
                return
            parts = sub.recv_multipart()
            if (replayed and len(parts) == 3 and len(parts[1]) == SEQ_BYTES
                    and int.from_bytes(parts[1], "big") in replayed):
                # Published while the replay ran: delivered twice by design, kept once.
                replayed.discard(int.from_bytes(parts[1], "big"))
                cap.overlap_dropped += 1
                continue
            cap.messages.append(parts)
            cap.sources.append("live")
            if on_message is not None:
                on_message("live", parts)
    except KeyboardInterrupt:
        return  # Ctrl-C ends a capture; what came is kept
