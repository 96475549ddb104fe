"""``python -m kvcheck.bench.event_serve``: any implementation's events over a scenario, a request
trace or a recorded trace, published on real loopback sockets and checked; its own
``event_wire`` bytes or its ``take_events`` encoded by kvcheck; the flood fault that makes a
slow subscriber lose batches past the high-water mark; and every bad combination refused."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from kvcheck.bench.event_serve import impl_source, main
from kvcheck.bench.workload.request_trace import dump_workload
from kvcheck.bench.workload.source import resolve_workload
from kvcheck.conformance.loader import load_impl
from kvcheck.errors import KVCheckInputError
from kvcheck.events.capture import Capture, capture
from kvcheck.events.codec import decode_batch, encode_batch
from kvcheck.events.publisher import EventPublisher
from kvcheck.events.serve import Faults, serve
from kvcheck.events.sources import BatchSource, with_rank
from kvcheck.events.stream_check import StreamReport, check_stream
from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved

CORPUS = Path(__file__).resolve().parents[2] / "conformance" / "corpus"
SCENARIO = "eviction_pressure"

_DICTS_ONLY = '''
from dataclasses import replace
from kvcheck.adapters import reference as _ref
IMPL_INFO = replace(_ref.IMPL_INFO, name="dicts-only",
                    capabilities=_ref.IMPL_INFO.capabilities - {"event_wire", "block_pool",
                                                                  "kernels", "sizing",
                                                                  "offload"{extra}})
make_kv_cache_manager = _ref.make_kv_cache_manager
'''


def _impl(tmp_path: Path, drop: str = "") -> object:
    """The reference without ``event_wire`` (and without ``drop`` too): a module on disk."""
    name = "dicts_only" + ("_none" if drop else "")
    extra = f', "{drop}"' if drop else ""
    (tmp_path / f"{name}.py").write_text(_DICTS_ONLY.replace("{extra}", extra))
    return load_impl(name, search=[tmp_path], call_timeout=None)


def _payloads(impl: object, workload: str, **options: object) -> list[bytes]:
    source = impl_source(impl, resolve_workload(workload), data_parallel_rank=0, **options)
    return [batch.payload for batch in source(0)]


def test_own_bytes_equal_kvcheck_s_encoding_of_the_same_events(tmp_path: Path) -> None:
    reference = load_impl("reference", call_timeout=None)
    own = _payloads(reference, SCENARIO, release="vllm-0.33", int_hashes=None)
    encoded = _payloads(reference, SCENARIO, release="vllm-0.33", int_hashes=False)
    dicts_only = _payloads(_impl(tmp_path), SCENARIO, release="vllm-0.33", int_hashes=None)
    assert len(own) > 100 and own == encoded
    # Only take_events: kvcheck encodes it, in vLLM's default int form; same events.
    assert len(dicts_only) == len(own) and dicts_only != own
    as_ints = [decode_batch(p, int_hashes=True).events for p in dicts_only]
    as_bytes = [decode_batch(p, int_hashes=False).events for p in own]
    assert [len(e) for e in as_ints] == [len(e) for e in as_bytes]
    assert [type(e).__name__ for b in as_ints for e in b] == [
        type(e).__name__ for b in as_bytes for e in b]
    # No step without events is published, and the stream holds BlockRemoved too.
    assert all(as_bytes) and any(isinstance(e, BlockRemoved) for b in as_bytes for e in b)


def test_a_rank_is_set_without_touching_another_byte() -> None:
    from kvcheck.events.workload import random_batches

    for batch in random_batches("vllm-0.33", 3, 20):
        bare = encode_batch(batch.events, ts=7.0, int_hashes=False,
                            group_metadata=batch.group_metadata)
        ranked = encode_batch(batch.events, ts=7.0, int_hashes=False, data_parallel_rank=3,
                              group_metadata=batch.group_metadata)
        assert with_rank(bare, 3, "vllm-0.33", 0).payload == ranked
        assert with_rank(bare, None, "vllm-0.33", 0).payload == bare
        assert with_rank(bare, 3, "vllm-0.33", 0).events == len(batch.events)


@pytest.mark.parametrize(("payload", "needle"), [
    (b"\x93\xcb", "is not one msgpack value: Input data was truncated"),
    (b"\x92\xcb" + b"\x00" * 8 + b"\x91\x81\xa1x\x01",  # an event map with no "type"
     "event 0: Object missing required field `type`"),
])
def test_bytes_no_consumer_could_read_stop_the_serve(payload: bytes, needle: str) -> None:
    with pytest.raises(KVCheckInputError) as caught:
        with_rank(payload, 0, "vllm-0.33", 4)
    message = str(caught.value)
    assert "batch 4: take_event_batch returned bytes that are not a vllm-0.33" in message
    assert needle in message
    assert "fix the implementation's encoder" in message


def test_a_request_trace_file_serves_and_holds_every_law(tmp_path: Path) -> None:
    trace = dump_workload(resolve_workload("multi_turn_chat", seed=2, scale=0.3),
                          tmp_path / "chat.jsonl")
    impl = load_impl("reference", call_timeout=None)
    source = impl_source(impl, resolve_workload(f"trace:{trace}"), release="vllm-0.10",
                         int_hashes=True, data_parallel_rank=0)
    cap, report = _serve_live(source, "vllm-0.10")
    assert len(cap.messages) > 20 and report.ok, report.render()
    assert report.hash_form == "int"


def _serve_live(source: BatchSource, release: str) -> tuple[Capture, StreamReport]:
    """Serve every batch of ``source`` to a live subscriber and check what it captured. The
    batches are drawn first, so that the capture ends at the last one."""
    batches = list(source(0))
    with EventPublisher("tcp://*:0", release=release) as pub:
        def run() -> None:
            assert pub.wait_for_subscribers(1, 30) == 1  # the subscriber connects first
            serve(pub, release=release, batches=None,  # type: ignore[arg-type]
                  source=lambda _restart: iter(batches))
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        cap = capture(pub.endpoint, count=len(batches), idle_s=5)
        thread.join()
    return cap, check_stream(cap.messages, release,  # type: ignore[arg-type]
                             sources=cap.sources)


@pytest.mark.parametrize("release", ["vllm-0.33", "vllm-0.10"])
def test_a_recorded_trace_serves_and_holds_every_law(release: str) -> None:
    corpus = resolve_workload(f"trace:{CORPUS / (release + '.cbor.xz')}")
    impl = load_impl("reference", call_timeout=None)
    source = impl_source(impl, corpus, release=release,  # type: ignore[arg-type]
                         int_hashes=None, data_parallel_rank=0, trace="t07-mixed-bs2-events")
    cap, report = _serve_live(source, release)
    assert len(cap.messages) > 5 and report.ok, report.render()
    assert report.hash_form == "bytes"  # the reference adapter's own form


def test_a_slow_subscriber_past_the_high_water_mark_sees_gaps(tmp_path: Path) -> None:
    import zmq

    impl = load_impl("reference", call_timeout=None)
    source = impl_source(impl, resolve_workload("uniform_random", scale=0.5),
                         release="vllm-0.33", int_hashes=True, data_parallel_rank=0)
    endpoint = f"ipc://{tmp_path / 'kv.sock'}"  # small kernel buffers: the HWM decides
    with EventPublisher(endpoint, release="vllm-0.33", hwm=4) as pub:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 4)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        assert pub.wait_for_subscribers(1, 30) == 1
        messages: list[list[bytes]] = []
        last = encode_batch([AllBlocksCleared()], ts=0.0, data_parallel_rank=0)

        def read_slowly() -> None:  # a consumer that spends 5 ms on every batch
            while sub.poll(5000):
                messages.append(sub.recv_multipart())
                if messages[-1][-1] == last:
                    return
                time.sleep(0.005)
        reader = threading.Thread(target=read_slowly, daemon=True)
        reader.start()
        # Paced for the first 5 batches (the consumer keeps up), then the flood.
        summary = serve(pub, release="vllm-0.33", batches=None, source=source,
                        interval_s=0.01, faults=Faults(flood_from=5))
        time.sleep(0.5)  # the consumer works through what reached it; then the engine goes on
        pub.publish(last)
        reader.join()
        sub.close(0)
    report = check_stream(messages, "vllm-0.33")
    assert summary.batches > 200 and len(messages) < summary.batches + 1
    assert "sequence-gap" in [f.rule for f in report.findings] and report.gaps
    assert report.gaps[0][0] >= 5 and not report.ok  # none while paced


def test_an_implementation_without_events_is_refused(tmp_path: Path) -> None:
    impl = _impl(tmp_path, drop="events")
    with pytest.raises(KVCheckInputError, match="declares neither 'event_wire' nor 'events'"):
        impl_source(impl, resolve_workload(SCENARIO), release="vllm-0.33", int_hashes=None,
                    data_parallel_rank=0)
    with pytest.raises(KVCheckInputError, match=r"does not declare 'events'.*drop --hashes"):
        impl_source(impl, resolve_workload(SCENARIO), release="vllm-0.33", int_hashes=True,
                    data_parallel_rank=0)


def _serve_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        code = main(["--endpoint", "tcp://*:0", "--wait", "0", *args])
    except SystemExit as exit_:  # argparse: a missing or malformed option
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out + err


def test_serve_cli_workload_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _serve_cli(capsys, "--workload", SCENARIO, "--hashes", "int")
    assert code == 0
    assert f"(reference on {SCENARIO}, its take_events encoded by kvcheck, int hashes)" in text
    code, text = _serve_cli(capsys, "--kv-impl", "reference")
    assert code == 2 and "the following arguments are required: --workload" in text
    code, text = _serve_cli(capsys, "--workload", SCENARIO, "--trace", "t00")
    assert code == 2 and "is not one: drop --trace" in text
    code, text = _serve_cli(capsys, "--workload", "no-such-scenario")
    assert code == 2 and "unknown workload 'no-such-scenario'" in text
    corpus = f"trace:{CORPUS / 'vllm-0.10.cbor.xz'}"
    code, text = _serve_cli(capsys, "--workload", corpus)
    assert code == 2 and "was recorded under vllm-0.10: serve it with --format vllm-0.10" in text
    code, text = _serve_cli(capsys, "--workload", corpus, "--format", "vllm-0.10", "--trace", "x")
    assert code == 2 and "has no trace 'x': give one of t00-chat-bs4-events" in text
    # A trace the op-by-op replay does not model (encoder tokens) is refused, saying why.
    code, text = _serve_cli(capsys, "--workload", corpus, "--format", "vllm-0.10", "--trace",
                            "t74-cross-pressure-bs2-nocache-events")
    assert code == 2 and ("trace t74-cross-pressure-bs2-nocache-events of " in text
                          and "is a cross_attention layout (the benchmark's replay passes no "
                          "encoder tokens), which the op-by-op replay does not model; give "
                          "another --trace" in text)
    code, text = _serve_cli(capsys, "--workload", corpus, "--format", "vllm-0.10",
                            "--drop", "100000")
    assert code == 2 and "so the fault at batch 100000 never happened" in text
