"""Real ZMQ sockets on loopback: kvcheck's publisher speaks vLLM's framing and replay
protocol (the frames are compared with the spec's bytes), ``kvcheck events capture`` gets a
whole stream with replay, ``kvcheck events check`` judges captured and live streams end to
end, and bad endpoints and capture files are clear errors."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

import zmq

from kvcheck.errors import KVCheckInputError
from kvcheck.events import encode_batch
from kvcheck.events.capture import Capture, capture, read_capture, write_capture
from kvcheck.events.frames import END_SEQ, replay_request
from kvcheck.events.publisher import EventPublisher, is_bind_endpoint
from kvcheck.events.stream_check import check_stream
from kvcheck.events.workload import manager_streams
from kvcheck.plugin.cli import main


@pytest.fixture(scope="module")
def payloads() -> list[bytes]:
    """One reference engine's whole stream (vLLM 0.33 bytes, int hashes), 20+ batches."""
    for stream in manager_streams("vllm-0.33", 5):
        batches = list(stream)
        if len(batches) >= 20:
            return [encode_batch(b.events, ts=float(n), data_parallel_rank=0,
                                 group_metadata=b.group_metadata)
                    for n, b in enumerate(batches)]
    raise AssertionError("unreachable: manager_streams is endless")


@pytest.fixture
def publisher() -> Iterator[EventPublisher]:
    with EventPublisher("tcp://*:0", replay_endpoint="tcp://*:0") as pub:
        yield pub


def _publish_when_subscribed(pub: EventPublisher, payloads: list[bytes]) -> threading.Thread:
    """Publish ``payloads`` from a thread once a subscriber is connected (a PUB socket drops
    what nobody hears)."""
    def run() -> None:
        assert pub.wait_for_subscribers(1, 30) == 1
        for payload in payloads:
            pub.publish(payload)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_bind_rule_is_vllms() -> None:
    assert is_bind_endpoint("tcp://*:5557")
    assert is_bind_endpoint("tcp://[::]:5557")
    assert is_bind_endpoint("ipc://kv.sock") and is_bind_endpoint("inproc://kv")
    assert not is_bind_endpoint("tcp://127.0.0.1:5557")  # vLLM's publisher connects here
    assert not is_bind_endpoint("tcp://router.local:5557")


def test_live_frames_and_the_replay_protocol_are_vllms_bytes() -> None:
    with EventPublisher("tcp://*:0", replay_endpoint="tcp://*:0", topic="kv@pod",
                        buffer_steps=3) as pub:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.connect(pub.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        assert pub.wait_for_subscribers(1, 30) == 1  # its subscription reached the socket
        for n in range(5):
            assert pub.publish(b"p%d" % n) == n
        live = []
        for _ in range(5):
            assert sub.poll(5000), "the PUB socket sent nothing"
            live.append(sub.recv_multipart())
        sub.close(0)
        assert live[0] == [b"kv@pod", b"\x00" * 8, b"p0"]
        assert live[4] == [b"kv@pod", b"\x00" * 7 + b"\x04", b"p4"]

        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.connect(pub.replay_endpoint)
        dealer.send_multipart([b"", b"not", b"a request"])  # 4 frames: ignored, as vLLM does
        dealer.send_multipart(replay_request(0))  # older than the 3-batch buffer
        replies = []
        while not replies or replies[-1][2] != b"\xff" * 8:
            assert dealer.poll(5000), "the replay socket did not answer"
            replies.append(dealer.recv_multipart())
        dealer.close(0)
    # What is left of the buffer, silently (no gap marker), then vLLM's end marker.
    assert replies == [[b"", b"kv@pod", b"\x00" * 7 + bytes([n]), b"p%d" % n]
                       for n in (2, 3, 4)] + [[b"", b"", b"\xff" * 8, b""]]
    assert END_SEQ.to_bytes(8, "big") == b"\xff" * 8


def test_wait_for_subscribers_counts_handshakes_and_forgets_who_left(tmp_path: Path) -> None:
    """Nobody there: the wait ends at its timeout with 0. Two subscribers (one through each
    of vLLM's two modes: connecting to a bound PUB, and bound for a PUB that connects): each
    counts once its handshake is done, and a message published right after the wait reaches
    it (its subscription arrived). One that left no longer counts."""
    ctx = zmq.Context.instance()
    with EventPublisher("tcp://*:0") as pub:
        assert pub.wait_for_subscribers(1, 0.2) == 0
        first = ctx.socket(zmq.SUB)
        first.setsockopt(zmq.SUBSCRIBE, b"")
        first.connect(pub.endpoint)
        second = ctx.socket(zmq.SUB)
        second.setsockopt(zmq.SUBSCRIBE, b"")
        second.connect(pub.endpoint)
        assert pub.wait_for_subscribers(2, 30) == 2
        pub.publish(b"p0")
        for sub in (first, second):
            assert sub.poll(5000) and sub.recv_multipart()[-1] == b"p0"
        first.close(0)
        # Asked for more than can be there, the wait reads the monitor for its whole second,
        # the disconnect (which arrives within milliseconds) included. (Asked for 2, it may
        # return at once, the count still 2, before the disconnect reaches the monitor: it
        # did once in a loaded run.)
        assert pub.wait_for_subscribers(3, 1.0) == 1
        second.close(0)
    # A publisher that connects (an endpoint without '*'), as vLLM's does to a router that
    # binds: the handshake is seen from that side too. (A separate process: a SUB bound in
    # this process is not delivered to by a PUB connecting from it, pyzmq 27 / libzmq 4.3.5.)
    script = tmp_path / "bound_sub.py"
    script.write_text("import sys, zmq\nsub = zmq.Context().socket(zmq.SUB)\n"
                      "sub.setsockopt(zmq.SUBSCRIBE, b'')\n"
                      "port = sub.bind_to_random_port('tcp://127.0.0.1')\n"
                      "print(port, flush=True)\n"
                      "print(sub.poll(30000) and sub.recv_multipart()[-1].decode(), flush=True)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        with EventPublisher(f"tcp://127.0.0.1:{port}") as pub:
            assert pub.wait_for_subscribers(1, 30) == 1
            pub.publish(b"p1")
            assert proc.stdout.readline().strip() == "p1"  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()


def test_vllm_010s_replay_replies_carry_no_topic() -> None:
    # Read in vLLM 0.10.2's ZmqEventPublisher._service_replay: [id, b"", seq, payload], then
    # [id, b"", END_SEQ, b""]; live messages keep their topic.
    with EventPublisher("tcp://*:0", replay_endpoint="tcp://*:0", topic="kv@pod",
                        release="vllm-0.10") as pub:
        pub.publish(b"p0")
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.connect(pub.replay_endpoint)
        dealer.send_multipart(replay_request(0))
        replies = []
        for _ in range(2):
            assert dealer.poll(5000), "the replay socket did not answer"
            replies.append(dealer.recv_multipart())
        dealer.close(0)
    assert replies == [[b"", b"\x00" * 8, b"p0"], [b"", b"\xff" * 8, b""]]


def test_capture_with_replay_gets_the_whole_stream_once(publisher: EventPublisher,
                                                        payloads: list[bytes]) -> None:
    for payload in payloads[:10]:  # published before anyone subscribed: only replay has them
        publisher.publish(payload)
    thread = _publish_when_subscribed(publisher, payloads[10:])
    cap = capture(publisher.endpoint, replay_endpoint=publisher.replay_endpoint,
                  count=len(payloads), idle_s=5)
    thread.join()
    # The ten published before anyone subscribed came by replay (later ones may have too,
    # when published before the replay request was served: each is kept once).
    assert cap.sources[:10] == ["replay"] * 10
    seqs = [int.from_bytes(parts[1], "big") for parts in cap.messages]
    assert seqs == list(range(len(payloads)))
    report = check_stream(cap.messages, "vllm-0.33", sources=cap.sources)
    assert report.ok and report.not_checkable == 0, report.render()


def test_a_capture_joined_late_without_replay_is_checked_without_blame(
        publisher: EventPublisher, payloads: list[bytes]) -> None:
    for payload in payloads[:5]:
        publisher.publish(payload)  # nobody listens: lost to a live-only subscriber
    thread = _publish_when_subscribed(publisher, payloads[5:])
    cap = capture(publisher.endpoint, count=len(payloads) - 5, idle_s=5)
    thread.join()
    report = check_stream(cap.messages, "vllm-0.33", sources=cap.sources)
    assert report.first_seq is not None and report.first_seq >= 5  # 0-4 were never seen
    assert report.last_seq == len(payloads) - 1
    assert report.ok and report.not_checkable > 0, report.render()


def test_the_cli_captures_then_checks_and_names_a_lost_batch(
        publisher: EventPublisher, payloads: list[bytes], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    thread = _publish_when_subscribed(publisher, payloads)
    out = tmp_path / "s.kvcap"
    assert main(["events", "capture", publisher.endpoint, "--replay-endpoint",
                 str(publisher.replay_endpoint), "--count", str(len(payloads)), "--idle", "5",
                 "-o", str(out)]) == 0
    thread.join()
    assert f"{len(payloads)} messages" in capsys.readouterr().out
    assert main(["events", "check", str(out), "--format", "vllm-0.33"]) == 0
    text = capsys.readouterr().out
    assert f"{len(payloads)} messages ({len(payloads)} batches decoded), seq 0.." in text
    assert "stream laws: all hold" in text

    cap = read_capture(out)
    del cap.messages[3], cap.sources[3]  # a batch lost on the way
    write_capture(out, cap)
    assert main(["events", "check", str(out), "--format", "vllm-0.33"]) == 1
    text = capsys.readouterr().out
    assert "message 3 (seq 4): [sequence-gap] seq 3..3 missing (1 batch lost" in text
    # The other release's decoder refuses every payload, naming the form it found.
    assert main(["events", "check", str(out), "--format", "vllm-0.10"]) == 1
    assert "[payload]" in capsys.readouterr().out


def test_the_cli_checks_a_live_endpoint(publisher: EventPublisher, payloads: list[bytes],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    thread = _publish_when_subscribed(publisher, payloads)
    assert main(["events", "check", publisher.endpoint, "--replay-endpoint",
                 str(publisher.replay_endpoint), "--count", str(len(payloads)), "--idle", "5",
                 "--format",
                 "vllm-0.33", "--hashes", "int", "--dp-rank", "0"]) == 0
    thread.join()
    assert "stream laws: all hold" in capsys.readouterr().out


def test_nothing_published_is_no_verdict(publisher: EventPublisher,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "check", publisher.endpoint, "--idle", "0.3", "--format",
                 "vllm-0.33"]) == 2
    assert "no message to check" in capsys.readouterr().err


def test_an_endpoint_in_use_a_malformed_one_and_a_silent_replay_socket() -> None:
    with EventPublisher("tcp://*:0") as pub:
        port = pub.endpoint.rsplit(":", 1)[1]
        with pytest.raises(KVCheckInputError, match=r"cannot bind .*another process holds it"):
            EventPublisher(f"tcp://*:{port}")
    with pytest.raises(KVCheckInputError, match=r"'nonsense': cannot connect .*endpoints "
                                                r"look like tcp://127.0.0.1:5557"):
        capture("nonsense", idle_s=0.1)
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # never answers
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(KVCheckInputError, match=r"sent no end marker within 0.3 s .*is "
                                                    r"it the publisher's replay_endpoint"):
            capture("tcp://127.0.0.1:1", replay_endpoint=f"tcp://127.0.0.1:{port}",
                    replay_timeout_s=0.3, idle_s=0.1)
    finally:
        silent.close(0)


def test_capture_files_round_trip_and_bad_ones_are_named(tmp_path: Path) -> None:
    cap = Capture("tcp://127.0.0.1:5557", None, "", [[b"", b"\x00" * 8, b"x"], [b"odd"]],
                  ["live", "live"])
    path = write_capture(tmp_path / "c.kvcap", cap)
    assert read_capture(path) == cap  # a malformed message is kept for the checker
    bad = tmp_path / "bad.kvcap"
    cases = {b"\xc1": "not msgpack",
             b"\x81\xa1a\x01": "not a kvcheck capture",
             path.read_bytes().replace(b"\xa7version\x01", b"\xa7version\x07"):
                 "capture version 7; this kvcheck reads version 1",
             path.read_bytes().replace(b"\xa4live", b"\xa4lost"):
                 r"messages\[0\] is not \[\"replay\" or \"live\""}
    for data, message in cases.items():
        bad.write_bytes(data)
        with pytest.raises(KVCheckInputError, match=message):
            read_capture(bad)
    with pytest.raises(KVCheckInputError, match=r"cannot read it .*kvcheck events capture"):
        read_capture(tmp_path / "missing.kvcap")


def test_a_missing_events_extra_names_the_install(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['msgspec'] = None; from kvcheck.plugin.cli import main; "
            "sys.exit(main(['events', 'check', 'x.kvcap', '--format', 'vllm-0.33']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2
    assert "pip install 'kvcheck[events]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_data_parallel_rank_offsets_the_ports_as_vllm_does() -> None:
    from kvcheck.events.publisher import offset_endpoint_port

    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint_port("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert offset_endpoint_port("tcp://*:0", 2) == "tcp://*:0"  # 0.33: left to the OS
    assert offset_endpoint_port("tcp://*:0", 2, "vllm-0.10") == "tcp://*:2"  # 0.10.2's code
    assert offset_endpoint_port("inproc://kv", 2) == "inproc://kv_dp2"
    assert offset_endpoint_port(None, 2) is None
    with pytest.raises(KVCheckInputError, match="must be tcp:// or inproc://"):
        offset_endpoint_port("ipc://kv.sock", 1)
    with EventPublisher("inproc://kv-offset", data_parallel_rank=2) as pub:
        assert pub.endpoint == "inproc://kv-offset_dp2"
