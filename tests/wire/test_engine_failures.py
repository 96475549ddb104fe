"""What kvcheck does when a wire engine misbehaves (docs/wire-protocol.md, "What fails a
test"): every case is a clear failure of the call that met it, naming the call, what happened,
the exit status or signal and the engine's last stderr lines, the process is killed, and the
next factory call gets a fresh process. Nothing hangs: every case ends within the call limit
plus the kill's few seconds."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kvcheck.conformance.call_limit import AdapterTimeout
from kvcheck.conformance.loader import ImplHandle, ImplLoadError, load_impl
from kvcheck.conformance.protocol import KVCacheSpec, RequestView, UnsupportedSpec
from kvcheck.wire.client import EngineError
from kvcheck.wire.engine import EngineProcessError

HOSTILE = Path(__file__).with_name("hostile_engine.py")
SPEC = KVCacheSpec(num_blocks=16, block_size=4)
REQUEST = RequestView("r1", tuple(range(10)))


def _target(mode: str, method: str = "init", nth: int = 1) -> str:
    return f"exec:{sys.executable} {HOSTILE} {mode} {method} {nth}"


def _engine(mode: str, method: str, nth: int = 1, timeout: float = 20) -> ImplHandle:
    return load_impl(_target(mode, method, nth), call_timeout=timeout)


def _allocate(handle: ImplHandle) -> object:
    manager = handle.make_manager(SPEC)
    manager.get_computed_blocks(REQUEST)
    return manager.allocate_slots(REQUEST, 10)


@pytest.mark.parametrize(("mode", "said"), [
    ("wrong_id", "answered with id"),
    ("partial_exit", "after a partial line"),
    ("non_utf8", "not UTF-8"),
    ("huge_line", "a line is at most 16 MiB"),
    ("log_stdout", "logs go to standard error"),
    ("exit", "exited with status 3"),
    ("sigkill", "was killed by SIGKILL"),
    ("both", "exactly one of 'result' and 'error'"),
])
def test_a_broken_answer_fails_the_call_naming_it(mode: str, said: str) -> None:
    handle = _engine(mode, "allocate_slots")
    with pytest.raises(EngineProcessError) as info:
        _allocate(handle)
    text = str(info.value)
    assert "reference.allocate_slots" in text and said in text, text
    process = handle.module.__wire_session__.process
    assert process.killed and not process.alive
    if mode == "exit":
        assert "engine: cannot go on, giving up" in text  # its last stderr line
    handle.close()


def test_a_hang_is_cut_by_the_call_limit_even_ignoring_sigterm() -> None:
    handle = _engine("hang_ignore_term", "allocate_slots", timeout=1.5)
    start = time.monotonic()
    with pytest.raises(AdapterTimeout) as info:
        _allocate(handle)
    assert time.monotonic() - start < 1.5 + 5, "the kill must not wait on the engine"
    text = str(info.value)
    assert "allocate_slots" in text and "was killed" in text, text
    assert not handle.module.__wire_session__.process.alive
    handle.close()


def test_the_next_factory_call_starts_a_fresh_process() -> None:
    handle = _engine("exit", "allocate_slots")
    session = handle.module.__wire_session__
    first_pid = session.process.pid
    old = handle.make_manager(SPEC)
    with pytest.raises(EngineProcessError):
        old.allocate_slots(REQUEST, 10)
    fresh = handle.make_manager(SPEC)  # a new process: its first allocate_slots fails again
    assert session.process.pid != first_pid and session.process.alive
    assert fresh.num_free_blocks() == 15
    with pytest.raises(EngineProcessError, match="killed after an earlier failure"):
        old.num_free_blocks()  # the old object died with its process
    handle.close()


@pytest.mark.parametrize(("mode", "said"), [
    ("hang", "did not answer init"),
    ("exit", "exited with status 3"),
    ("wrong_id", "answered with id"),
    ("bad_protocol", "speaks protocol 2"),
    ("no_impl_info", "impl_info"),
    ("kernels", "cannot cross the wire"),
    ("offload", "protocol v1 does not carry yet"),
    ("error:internal", "answered init with an error"),
])
def test_an_engine_that_fails_init_is_a_usage_error(mode: str, said: str) -> None:
    with pytest.raises(ImplLoadError) as info:
        load_impl(_target(mode, "init"), call_timeout=2)
    text = str(info.value)
    assert said in text and "Fix:" in text, text


@pytest.mark.parametrize(("target", "said"), [
    ("exec:", "needs a command"),
    ("exec:'unbalanced", "balance the quotes"),
    ("exec:./no-such-engine --x", "cannot start"),
])
def test_a_bad_command_is_a_usage_error(target: str, said: str) -> None:
    with pytest.raises(ImplLoadError, match=said):
        load_impl(target, call_timeout=5)


@pytest.mark.parametrize(("code", "raised"), [
    ("not_supported", UnsupportedSpec),
    ("invalid_argument", ValueError),
    ("violation", AssertionError),
    ("internal", EngineError),
    ("no_such_code", EngineError),
])
def test_error_codes_raise_what_an_in_process_adapter_would(code: str,
                                                            raised: type[Exception]) -> None:
    handle = _engine(f"error:{code}", "make_kv_cache_manager", nth=2)  # 1: the load probe
    with pytest.raises(raised) as info:
        handle.make_manager(SPEC)
    assert f"refused by mode error:{code}" in str(info.value)
    if code == "no_such_code":
        assert "unknown error code 'no_such_code'" in str(info.value)
    # An error answer is a normal answer: the process lives on and serves the next call.
    assert handle.make_manager(SPEC).num_free_blocks() == 15
    handle.close()


def test_close_ends_the_process(tmp_path: Path) -> None:
    handle = load_impl(f"exec:{sys.executable} -m kvcheck.wire.serve", call_timeout=20)
    process = handle.module.__wire_session__.process
    handle.close()
    assert process.proc.returncode == 0  # it answered shutdown and exited by itself


def test_the_session_ends_with_failures_named_and_nothing_left_running(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A whole area over a crashing engine: the one test whose call met the crash fails
    naming it, the tests after it pass on a fresh process, and the session ends with no
    engine left running."""
    once = tmp_path / "crashed"
    os.environ["HOSTILE_ONCE"] = str(once)
    try:
        ini = pytester.makeini("[pytest]\n")
        area = Path(__file__).resolve().parents[2] / "conformance" / "test_allocation.py"
        result = pytester.runpytest_subprocess(
            f"--kv-impl={_target('exit', 'allocate_slots', 3)}", "-p", "no:cacheprovider",
            "-c", str(ini), str(area), timeout=600)
    finally:
        del os.environ["HOSTILE_ONCE"]
    text = result.stdout.str()
    assert once.exists()
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed", 0) >= 5, text
    assert "exited with status 3" in text and "engine: cannot go on, giving up" in text
    assert "does NOT conform" in text
    assert "still running" not in text, text
