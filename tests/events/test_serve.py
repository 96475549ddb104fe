"""``kvcheck events serve`` on loopback sockets: the reference engine's stream holds every law
end to end, and each fault option is what the checker reports (a gap, a duplicate, a
restart, a replay that starts late), in both releases."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from kvcheck.events.capture import Capture, capture
from kvcheck.events.publisher import EventPublisher
from kvcheck.events.serve import Faults, serve
from kvcheck.events.stream_check import StreamReport, check_stream
from kvcheck.plugin.cli import main

BATCHES = 40


def _serve_and_capture(release: str = "vllm-0.33", faults: Faults | None = None, *,
                       expect: int = BATCHES, replay: bool = False, buffer_steps: int = 10_000,
                       int_hashes: bool = True) -> tuple[Capture, StreamReport]:
    """Serve ``BATCHES`` batches while a subscriber captures live; with ``replay``, capture
    only afterwards, by replay from 0 (what a consumer restarting late sees). The capture
    ends at the ``expect``-th message (or after 5 s without one, when fewer came)."""
    with EventPublisher("tcp://*:0", replay_endpoint="tcp://*:0", buffer_steps=buffer_steps,
                        release=release, topic="kv@pod") as pub:
        def run() -> None:
            if not replay:  # the subscriber connects first
                assert pub.wait_for_subscribers(1, 30) == 1
            serve(pub, release=release, batches=BATCHES,  # type: ignore[arg-type]
                  int_hashes=int_hashes, faults=faults or Faults())
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        if replay:
            thread.join()
        cap = capture(pub.endpoint, replay_endpoint=pub.replay_endpoint if replay else None,
                      count=expect, idle_s=5)
        thread.join()
    return cap, check_stream(cap.messages, release,  # type: ignore[arg-type]
                             sources=cap.sources)


def _rules(report: StreamReport) -> list[str]:
    return [finding.rule for finding in report.findings]


@pytest.mark.parametrize(("release", "int_hashes"), [("vllm-0.33", True),
                                                     ("vllm-0.10", False)])
def test_a_fault_free_stream_holds_every_law(release: str, int_hashes: bool) -> None:
    cap, report = _serve_and_capture(release, int_hashes=int_hashes)
    assert len(cap.messages) == BATCHES and report.runs == [[0, BATCHES - 1]]
    assert report.ok and report.not_checkable == 0, report.render()
    assert report.hash_form == ("int" if int_hashes else "bytes")
    assert report.events_per_kind["BlockRemoved"] > 0


def test_a_dropped_batch_is_a_gap_live_but_replay_still_has_it() -> None:
    _, live = _serve_and_capture(faults=Faults(drop=frozenset({7})), expect=BATCHES - 1)
    assert _rules(live) == ["sequence-gap"] and live.gaps == [(7, 7)]
    cap, replayed = _serve_and_capture(faults=Faults(drop=frozenset({7})), replay=True)
    assert cap.sources == ["replay"] * BATCHES and replayed.ok, replayed.render()


def test_a_duplicated_batch_is_reported_once() -> None:
    _, report = _serve_and_capture(faults=Faults(duplicate=frozenset({3, 11})),
                                   expect=BATCHES + 2)
    assert _rules(report) == ["sequence-duplicate", "sequence-duplicate"]
    assert [f.seq for f in report.findings] == [3, 11]


def test_a_restart_is_a_new_engine_with_an_empty_cache() -> None:
    _, report = _serve_and_capture(faults=Faults(restart_at=25))
    # Only the restart: the new engine's removals are all of blocks it stored itself.
    assert _rules(report) == ["sequence-restart"], report.render()
    assert report.runs == [[0, 24], [0, BATCHES - 26]]


def test_vllm_010s_replay_has_no_topic_frame_and_is_checked_as_such() -> None:
    cap, report = _serve_and_capture("vllm-0.10", replay=True)
    assert all(len(parts) == 2 for parts in cap.messages)  # [seq, payload] (vLLM #45174)
    assert report.ok and report.runs == [[0, BATCHES - 1]], report.render()
    wrong = check_stream(cap.messages, "vllm-0.33", sources=cap.sources)
    assert set(_rules(wrong)) == {"frame"}
    assert ("without its topic frame: vLLM 0.10.2's form, vLLM #45174; check it with "
            "--format vllm-0.10") in wrong.findings[0].detail


def test_a_replay_from_0_older_than_the_buffer_starts_late_without_blame() -> None:
    cap, report = _serve_and_capture(replay=True, buffer_steps=10, expect=10)
    assert len(cap.messages) == 10 and report.first_seq == BATCHES - 10
    assert report.ok, report.render()


def test_serve_and_check_end_to_end_from_the_command_line(tmp_path: Path) -> None:
    import zmq

    ports = [zmq.Context.instance().socket(zmq.PUB) for _ in range(2)]
    numbers = [s.bind_to_random_port("tcp://127.0.0.1") for s in ports]
    for s in ports:
        s.close(0)  # free again: serve binds them (a race with other users is unlikely)
    pub, rep = numbers
    server = subprocess.Popen(
        [sys.executable, "-m", "kvcheck.plugin.cli", "events", "serve",
         "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{rep}",
         "--batches", "30", "--drop", "4", "--subscribers", "1", "--linger", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = tmp_path / "s.kvcap"
        done = subprocess.run(
            [sys.executable, "-m", "kvcheck.plugin.cli", "events", "check",
             f"tcp://127.0.0.1:{pub}", "--format", "vllm-0.33", "--count", "29", "--idle",
             "10"],
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "message 4 (seq 5): [sequence-gap] seq 4..4 missing (1 batch lost" in done.stdout
        # Replayed afterwards, the stream is whole: the drop happened on the live socket only.
        done = subprocess.run(
            [sys.executable, "-m", "kvcheck.plugin.cli", "events", "capture",
             f"tcp://127.0.0.1:{pub}", "--replay-endpoint", f"tcp://127.0.0.1:{rep}",
             "--count", "30", "--idle", "5", "-o", str(out)], capture_output=True, text=True,
            timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert "30 messages (30 replayed" in done.stdout
    finally:
        server.send_signal(signal.SIGINT)  # ends the linger early, cleanly
        stdout, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr
    assert "30 batches" in stdout and "faults: dropped batch(es) [4]" in stdout
    assert main(["events", "check", str(out), "--format", "vllm-0.33"]) == 0


def test_serve_waits_for_its_subscribers_and_says_when_they_do_not_come(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "serve", "--endpoint", "tcp://*:0", "--batches", "3",
                 "--subscribers", "2", "--wait", "0.2"]) == 0
    out, err = capsys.readouterr()
    assert "first batch when 2 subscriber(s) connected (at most 0.2 s)" in out
    assert "only 0 of 2 subscriber(s) connected in 0.2 s (--wait); publishing anyway" in err
    assert "3 batches" in out
    with pytest.raises(SystemExit) as stop:
        main(["events", "serve", "--batches", "3", "--subscribers", "0"])
    assert stop.value.code == 2
    assert "--subscribers: 0: an integer must be at least 1" in capsys.readouterr().err


def test_serve_refuses_faults_beyond_the_stream_and_an_endpoint_in_use(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "serve", "--batches", "10", "--drop", "10"]) == 2
    assert "names batch 10, but only 10 are published" in capsys.readouterr().err
    with EventPublisher("tcp://*:0") as held:
        port = held.endpoint.rsplit(":", 1)[1]
        assert main(["events", "serve", "--endpoint", f"tcp://*:{port}"]) == 2
        assert "cannot bind" in capsys.readouterr().err
