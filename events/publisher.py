"""A KV-event publisher with the wire behaviour of vLLM's ``ZmqEventPublisher`` (0.33.0, or
0.10.2 with ``release="vllm-0.10"``): the frames, sequence numbers, bind / connect rule and
replay protocol a router author's consumer meets in production.

* PUB socket on ``endpoint``, bound when it has ``*`` or ``::`` or is ``ipc://`` /
  ``inproc://``, connected otherwise (vLLM's ``_is_bind_endpoint``);
* each ``publish`` sends ``[topic, seq, payload]`` with ``seq`` from 0, 8 bytes big-endian;
* with a data-parallel rank, both ports are offset by it (``offset_endpoint_port``);
* a replay ROUTER socket on ``replay_endpoint`` (always bound, as vLLM does; 0.33's send HWM
  ``2 * (buffer_steps + 1)``, so a whole replay and its end marker fit) answers
  ``[b"", start_seq]`` with ``[b"", topic, seq, payload]`` per buffered batch with
  ``seq >= start_seq``, then ``[b"", b"", END_SEQ, b""]`` (0.10.2: no topic frame, in the
  replies and the marker; ``kvcheck.events.frames``); the buffer keeps the last
  ``buffer_steps`` batches, and a request older than it silently gets what is left (vLLM's
  behaviour); a request of any other frame count is ignored.

Read from vLLM 0.33.0's ``ZmqEventPublisher`` and compared with it on loopback by
``python -m kvcheck.events.crosscheck``. One difference: vLLM binds ``tcp://*:0`` on the
node's IP (``VLLM_HOST_IP``); here it binds every interface.

The replay socket is served by a background thread; the buffer is shared under a lock.

Beyond vLLM, ``wait_for_subscribers`` lets a test publisher start when its consumers are
there: a PUB socket sends each message only to the subscriptions it already has, so a batch
published before a subscriber's SUBSCRIBE arrived is silently lost for it (ZMQ's "slow
joiner"), which a fixed sleep before the first batch only makes unlikely.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from kvcheck.events.capture import import_zmq
from kvcheck.events.errors import StreamError
from kvcheck.events.frames import END_SEQ, pack_seq

if TYPE_CHECKING:
    import zmq

__all__ = ["SUBSCRIBE_SETTLE_S", "EventPublisher", "is_bind_endpoint", "offset_endpoint_port"]

#: Seconds ``wait_for_subscribers`` waits after a subscriber's ZMTP handshake: the SUB socket
#: sends its SUBSCRIBE right after its side of the handshake, one loopback hop later, and PUB
#: has no way to say it has applied it (XPUB would, but vLLM's socket is a PUB).
SUBSCRIBE_SETTLE_S = 0.1


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind for a wildcard host or a local transport, connect otherwise."""
    return ("*" in endpoint or "::" in endpoint
            or endpoint.startswith(("ipc://", "inproc://")))


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int,
                         release: str = "vllm-0.33") -> str | None:
    """vLLM's rule for a data-parallel rank's endpoint: ``inproc://x`` gets ``_dp{rank}``, a
    tcp port is offset by the rank; rank 0 changes nothing. 0.33 leaves port 0 to the OS;
    0.10.2 offsets it too (``tcp://*:0`` at rank 2 binds port 2).

    Raises:
        StreamError: an endpoint neither inproc nor tcp with a rank > 0 (vLLM: ValueError).
    """
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" not in endpoint:
        raise StreamError(f"endpoint {endpoint!r}: with data-parallel rank "
                          f"{data_parallel_rank} it must be tcp:// or inproc:// (the port, or "
                          "the name, is offset by the rank)")
    base, colon, port = endpoint.rpartition(":")
    if not colon or not port.isdigit():
        return endpoint
    if int(port) == 0 and release == "vllm-0.33":
        return endpoint
    return f"{base}:{int(port) + data_parallel_rank}"


def _reachable(sock: zmq.SyncSocket, endpoint: str) -> str:
    import zmq

    if not endpoint.startswith("tcp://") or not is_bind_endpoint(endpoint):
        return endpoint
    raw = sock.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(raw, bytes)  # LAST_ENDPOINT is a string option: zmq returns bytes
    bound = str(raw.decode())
    return bound.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:").replace("tcp://[::]:",
                                                                         "tcp://[::1]:")


class EventPublisher:
    """Publish payloads (``kvcheck.events.encode_batch``'s bytes) as vLLM does.

    Args:
        endpoint: the PUB endpoint (default vLLM's ``tcp://*:5557``).
        replay_endpoint: the replay ROUTER endpoint, bound; None: no replay.
        buffer_steps: batches kept for replay (vLLM's default 10 000).
        hwm: the PUB socket's send high-water mark (vLLM's default 100 000): past it, PUB
            drops messages for a slow subscriber without telling anyone.
        topic: the topic frame (vLLM's default ``""``).
        data_parallel_rank: offsets both endpoints as vLLM does (``offset_endpoint_port``).
        release: whose replay replies to send (``"vllm-0.33"`` or ``"vllm-0.10"``).

    Raises:
        StreamError: an endpoint that cannot be bound or connected (in use, malformed).
    """

    #: The PUB socket's connection events, read by ``wait_for_subscribers``; None once closed.
    _monitor: zmq.SyncSocket | None

    def __init__(self, endpoint: str = "tcp://*:5557", *, replay_endpoint: str | None = None,
                 buffer_steps: int = 10_000, hwm: int = 100_000, topic: str = "",
                 data_parallel_rank: int = 0, release: str = "vllm-0.33") -> None:
        zmq = import_zmq()
        if buffer_steps < 1:
            raise StreamError(f"buffer_steps {buffer_steps}: must be at least 1")
        if release not in ("vllm-0.33", "vllm-0.10"):
            raise StreamError(f"unknown release {release!r}: 'vllm-0.33' or 'vllm-0.10'")
        self._topic_in_replay = release == "vllm-0.33"
        self._ctx = zmq.Context.instance()
        self._topic = topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        endpoint = offset_endpoint_port(endpoint, data_parallel_rank, release) or endpoint
        replay_endpoint = offset_endpoint_port(replay_endpoint, data_parallel_rank, release)
        self._monitor = None  # the PUB socket's connection events (set by _socket)
        # Any: the PUB socket, None once closed (a publish after close fails on None)
        self._pub: Any = self._socket(zmq.PUB, endpoint, is_bind_endpoint(endpoint), hwm,
                                      monitor=True)
        self._connecting: list[int] = []  # connections (file descriptors) before handshake
        self._peers: set[int] = set()  # connections whose ZMTP handshake succeeded
        self._replay_thread: threading.Thread | None = None
        #: Where a local subscriber reaches the sockets (the bound port, for ``:0``; a
        #: wildcard host as loopback).
        self.endpoint = _reachable(self._pub, endpoint)
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            # 0.10.2 leaves the ROUTER's send HWM at ZMQ's default (1000).
            router = self._socket(zmq.ROUTER, replay_endpoint, True,
                                  2 * (buffer_steps + 1) if self._topic_in_replay else 1000)
            self.replay_endpoint = _reachable(router, replay_endpoint)
            self._replay_thread = threading.Thread(target=self._serve_replay, args=(router,),
                                                   name="kvcheck-replay", daemon=True)
            self._replay_thread.start()

    def _socket(self, kind: int, endpoint: str, bind: bool, hwm: int, *,
                monitor: bool = False) -> zmq.SyncSocket:
        import zmq

        sock: zmq.SyncSocket = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, hwm)
        if monitor:  # for wait_for_subscribers: attached before the socket can connect, so
            # that no subscriber's connection or handshake is missed
            self._monitor = sock.get_monitor_socket(
                zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                | zmq.EVENT_DISCONNECTED)
        try:
            (sock.bind if bind else sock.connect)(endpoint)
        except zmq.ZMQError as error:
            if self._monitor is not None:
                sock.disable_monitor()
                self._monitor.close(0)
                self._monitor = None
            sock.close(0)
            self.close()
            hint = ("another process holds it: stop it or pick another port"
                    if error.errno == zmq.EADDRINUSE else "endpoints look like "
                    "tcp://*:5557, tcp://127.0.0.1:5557 or ipc://kv.sock")
            raise StreamError(f"endpoint {endpoint!r}: cannot {'bind' if bind else 'connect'}"
                               f" ({error}); {hint}") from None
        return sock

    @property
    def next_seq(self) -> int:
        """The sequence number the next ``publish`` sends."""
        return self._seq

    def publish(self, payload: bytes, *, copies: int = 1) -> int:
        """Buffer one batch for replay and send it ``copies`` times on the PUB socket (1, as
        vLLM; 0 or 2 for ``kvcheck events serve``'s drop and duplicate faults). Returns
        its sequence number."""
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            for _ in range(copies):
                self._pub.send_multipart([self._topic, pack_seq(seq), payload])
        return seq

    def wait_for_subscribers(self, count: int, timeout_s: float) -> int:
        """Block until ``count`` subscribers are connected to the PUB socket, or ``timeout_s``
        seconds passed; returns how many are connected (possibly fewer than ``count``).

        A subscriber counts once its ZMTP handshake with the PUB socket succeeded, plus
        ``SUBSCRIBE_SETTLE_S`` for its SUBSCRIBE to arrive; one that disconnected no longer
        counts. Call it from the thread that publishes.
        """
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        monitor = self._monitor
        if monitor is None:
            raise StreamError("wait_for_subscribers on a closed publisher")
        deadline = time.monotonic() + timeout_s
        joined = False
        while True:
            wait_ms = 0 if len(self._peers) >= count else max(
                0, int((deadline - time.monotonic()) * 1000))
            if not monitor.poll(wait_ms):
                break
            event = parse_monitor_message(monitor.recv_multipart())
            # ACCEPTED / CONNECTED / DISCONNECTED carry the connection's file descriptor;
            # HANDSHAKE_SUCCEEDED carries none: it is the oldest connection still waiting.
            kind, fd = event["event"], int(event["value"])
            if kind in (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED):
                self._connecting.append(fd)
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED and self._connecting:
                self._peers.add(self._connecting.pop(0))
                joined = True
            elif kind == zmq.EVENT_DISCONNECTED:
                self._peers.discard(fd)
                if fd in self._connecting:
                    self._connecting.remove(fd)
        if joined:
            time.sleep(SUBSCRIBE_SETTLE_S)
        return len(self._peers)

    def restart(self) -> None:
        """Behave as a new publisher process: sequence numbers from 0, an empty replay
        buffer (the sockets stay, so subscribers keep their connection)."""
        with self._lock:
            self._seq = 0
            self._buffer.clear()

    def _serve_replay(self, router: zmq.SyncSocket) -> None:
        try:
            while not self._stop.is_set():
                if not router.poll(50):
                    continue
                parts = router.recv_multipart()
                # [client_id, b"", start_seq]; vLLM warns about and ignores any other count.
                if len(parts) != 3:
                    continue
                client, start = parts[0], int.from_bytes(parts[2], "big")
                with self._lock:
                    buffered = [entry for entry in self._buffer if entry[0] >= start]
                topic = [self._topic] if self._topic_in_replay else []
                for seq, payload in buffered:
                    router.send_multipart([client, b"", *topic, pack_seq(seq), payload])
                end = [b""] if self._topic_in_replay else []
                router.send_multipart([client, b"", *end, pack_seq(END_SEQ), b""])
        finally:
            router.close(0)

    def close(self) -> None:
        """Stop the replay thread and close the sockets (idempotent)."""
        self._stop.set()
        if getattr(self, "_replay_thread", None) is not None:
            self._replay_thread.join(5)  # type: ignore[union-attr]
            self._replay_thread = None
        pub = getattr(self, "_pub", None)
        if pub is not None:
            if self._monitor is not None:
                pub.disable_monitor()
                self._monitor.close(0)
                self._monitor = None
            pub.close(0)
            self._pub = None

    def __enter__(self) -> EventPublisher:  # noqa: PYI034 (Self is Python 3.11+)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
