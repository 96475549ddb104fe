"""The per-call limit (kvcheck.conformance.call_limit): a hung adapter call fails with
AdapterTimeout naming the call and the session goes on; kvcheck arms no timer, so other SIGALRM
users keep theirs; a call that cannot be interrupted ends the process with a clear message."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kv_helpers import reference_capabilities_source

from kvcheck.conformance.call_limit import STUCK_EXIT_CODE, AdapterTimeout, CallLimit
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.errors import KVCheckFailure

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX timers")


def spin() -> None:
    while True:
        pass


def test_sleeping_call_times_out_naming_the_call_and_the_next_call_works() -> None:
    limit = CallLimit(0.2, "slowimpl")
    start = time.monotonic()
    with pytest.raises(AdapterTimeout) as info:
        limit.call("allocate_slots", time.sleep, 30)
    assert time.monotonic() - start < 5
    assert str(info.value).startswith("slowimpl.allocate_slots(30) did not return within 0.2 s")
    assert isinstance(info.value, KVCheckFailure)
    assert limit.call("free", lambda rid: rid, "a") == "a"  # the session goes on
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # nothing left armed


def test_busy_loop_times_out() -> None:
    with pytest.raises(AdapterTimeout, match=r"busy\.get_block_ids\(\) did not return"):
        CallLimit(0.2, "busy").call("get_block_ids", spin)


def test_off_means_no_limit() -> None:
    for off in (0, None):
        assert CallLimit(off, "x").call("f", lambda: time.sleep(0.3) or 7) == 7
    with pytest.raises(ValueError, match="finite number of seconds"):
        CallLimit(-1, "x")


def test_nested_call_is_covered_by_the_outer_limit() -> None:
    outer, inner = CallLimit(0.3, "outer"), CallLimit(50, "inner")
    with pytest.raises(AdapterTimeout, match=r"outer\.f"):
        outer.call("f", lambda: inner.call("g", time.sleep, 30))


def test_someone_elses_pending_timer_is_kept_and_fires_on_time() -> None:
    """pytest-timeout's signal method: a handler plus a timer. Our calls do not steal it."""
    fired: list[float] = []
    previous = signal.signal(signal.SIGALRM, lambda s, f: fired.append(time.monotonic()))
    try:
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.6)
        limit = CallLimit(5, "impl")
        for _ in range(3):
            assert limit.call("f", time.sleep, 0.05) is None
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 0 < left < 0.6
        time.sleep(1.0)
        assert len(fired) == 1 and 0.5 < fired[0] - start < 0.9
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_their_earlier_deadline_reaches_their_handler_during_our_call() -> None:
    class TheirTimeout(Exception):
        pass

    def theirs(signum: int, frame: Any) -> None:
        raise TheirTimeout("pytest-timeout fired")

    previous = signal.signal(signal.SIGALRM, theirs)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(TheirTimeout):
            CallLimit(5, "impl").call("f", time.sleep, 3)
        assert signal.getsignal(signal.SIGALRM) is theirs  # handed back
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_no_timer_is_armed_during_a_call() -> None:
    """kvcheck arms no interval timer of its own: inside a call, a pending timer of someone
    else's runs down untouched, and without one none is pending."""
    seen: list[tuple[float, float]] = []
    limit = CallLimit(5, "impl")
    limit.call("f", lambda: seen.append(signal.getitimer(signal.ITIMER_REAL)))
    previous = signal.signal(signal.SIGALRM, lambda s, f: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        limit.call("f", lambda: seen.append(signal.getitimer(signal.ITIMER_REAL)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert seen[0] == (0.0, 0.0)
    assert 29 < seen[1][0] <= 30 and seen[1][1] == 0.0


ALARM_CHILD = """
import os, signal, sys, time
from kvcheck.conformance.call_limit import AdapterTimeout, CallLimit
case = sys.argv[1]
if case == "shorter_limit_later":
    # The watchdog starts looking every 0.5 s for a limit of 5 s; a later limit of 0.1 s
    # must shorten that at once (to 0.025 s), not after the next look (0.5 s on).
    CallLimit(5, "slow").call("f", time.sleep, 0.01)
    start = time.monotonic()
    try:
        CallLimit(0.1, "fast").call("f", time.sleep, 30)
    except AdapterTimeout:
        print(f"interrupted after {time.monotonic() - start:.2f} s")
elif case == "forked_child":
    # The parent's watchdog thread is not the child's: the child's call must still end.
    CallLimit(0.2, "parent").call("f", time.sleep, 0.01)
    pid = os.fork()
    if pid == 0:
        try:
            CallLimit(0.2, "child").call("f", time.sleep, 30)
        except AdapterTimeout as exc:
            os.write(1, f"child: {exc}\\n".encode())
            os._exit(0)
        os._exit(1)
    print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
elif case == "alarm_not_ours":
    # An alarm kvcheck did not send, with no handler of anyone's: the default action ends
    # the process, as it would without kvcheck (during a call and between calls alike).
    limit = CallLimit(5, "impl")
    limit.call("f", time.sleep, 0.01)  # installs kvcheck's handler
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    limit.call("f", time.sleep, 2)
    print("survived")
"""


def _alarm_child(tmp_path: Any, case: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(ALARM_CHILD))
    return subprocess.run([sys.executable, str(script), case], capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_shorter_limit_shortens_the_watchdogs_period_at_once(tmp_path: Any) -> None:
    proc = _alarm_child(tmp_path, "shorter_limit_later")
    assert proc.returncode == 0, proc.stderr
    seconds = float(proc.stdout.split()[2])
    assert 0.09 < seconds < 0.35, proc.stdout  # without the wake-up: about 0.49 s


def test_a_forked_childs_call_still_times_out(tmp_path: Any) -> None:
    proc = _alarm_child(tmp_path, "forked_child")
    assert proc.returncode == 0, proc.stderr
    assert "child: child.f(30) did not return within 0.2 s" in proc.stdout
    assert "child exit 0" in proc.stdout


def test_an_alarm_kvcheck_did_not_send_takes_its_default_action(tmp_path: Any) -> None:
    proc = _alarm_child(tmp_path, "alarm_not_ours")
    assert proc.returncode == -signal.SIGALRM, (proc.returncode, proc.stdout, proc.stderr)
    assert "survived" not in proc.stdout


def _raised_off_the_main_thread(method: str, fn: Callable[[], object]) -> BaseException:
    """What ``CallLimit(0.2, "threaded").call(method, fn)`` raises in a worker thread."""
    got: list[BaseException] = []

    def worker() -> None:
        try:
            CallLimit(0.2, "threaded").call(method, fn)
        except BaseException as exc:  # noqa: BLE001 - handed to the test, whatever it is
            got.append(exc)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert got, f"{method} returned normally off the main thread"
    return got[0]


def test_call_off_the_main_thread_times_out() -> None:
    raised = _raised_off_the_main_thread("ref_cnt", spin)
    assert isinstance(raised, AdapterTimeout)
    assert "threaded.ref_cnt() did not return within 0.2 s" in str(raised)


class SlowFinalizer:
    """Garbage only the collector frees (it is its own cycle); its ``__del__`` takes
    ``seconds``: a collection pause longer than the call's limit."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.me = self

    def __del__(self) -> None:
        time.sleep(self.seconds)


def collect_slow_garbage(seconds: float) -> None:
    SlowFinalizer(seconds)
    gc.collect()


def test_a_garbage_collector_pause_is_not_the_calls_time() -> None:
    """A collection of 0.5 s inside a call limited to 0.2 s: the call returns, and no
    exception was raised (and lost) inside the finalizer the collector was running."""
    lost: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, lost.append
    try:
        result = CallLimit(0.2, "gcimpl").call(
            "allocate_slots", lambda: collect_slow_garbage(0.5) or "returned")
    finally:
        sys.unraisablehook = hook
    assert result == "returned"
    assert lost == []
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_hang_after_a_collection_still_times_out_later_by_the_pause() -> None:
    start = time.monotonic()
    with pytest.raises(AdapterTimeout, match=r"gcimpl\.f\(\) did not return within 0\.2 s"):
        CallLimit(0.2, "gcimpl").call("f", lambda: collect_slow_garbage(0.4) or spin())
    assert 0.6 - 0.05 < time.monotonic() - start < 5  # 0.2 s of the call's own + 0.4 s of pause


def test_an_interruption_the_call_catches_still_fails_it() -> None:
    def catching() -> str:
        with contextlib.suppress(BaseException):  # what a careless adapter does
            time.sleep(30)
        return "carried on"

    with pytest.raises(AdapterTimeout, match=(
            r"catcher\.free\(\) did not return within 0\.2 s .*: it was interrupted at the "
            r"limit, yet returned normally after 0\.2\d* s \(it caught the interruption")):
        CallLimit(0.2, "catcher").call("free", catching)


def test_an_interruption_a_threaded_call_catches_still_fails_it() -> None:
    def catching() -> str:
        with contextlib.suppress(BaseException):  # what a careless adapter does
            spin()
        return "carried on"

    raised = _raised_off_the_main_thread("free", catching)
    assert isinstance(raised, AdapterTimeout)
    assert "yet returned normally" in str(raised)


def test_factory_hang_times_out_through_the_handle() -> None:
    handle = dataclasses.replace(load_impl("reference"), call_timeout=0.2,
                                 factory=lambda spec: time.sleep(30))
    with pytest.raises(AdapterTimeout, match=r"reference\.make_kv_cache_manager\(KVCacheSpec"):
        handle.make_manager(KVCacheSpec(num_blocks=8, block_size=4))


STUCK = """
import itertools, signal, sys, time
from kvcheck.conformance.call_limit import CallLimit
limit = CallLimit(0.3, "stuckimpl", grace=0.4)
def blocked():   # signals cannot reach it (as in C code that never checks them)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)
def swallowing():  # catches the timeout and carries on
    while True:
        try:
            time.sleep(1)
        except Exception:
            pass
def gil():  # C code holding the GIL: only faulthandler can act
    return sum(itertools.repeat(1, 10**12))
kinds = {"blocked": blocked, "swallowing": swallowing, "gil": gil}
limit.call("allocate_slots", kinds[sys.argv[1]])
"""


@pytest.mark.parametrize("kind", ["blocked", "swallowing"])
def test_uninterruptible_call_ends_the_process_with_a_message(tmp_path: Any, kind: str) -> None:
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(STUCK))
    proc = subprocess.run([sys.executable, str(script), kind], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == STUCK_EXIT_CODE
    assert ("kvcheck: stuckimpl.allocate_slots() did not return within 0.3 s and could not be "
            "interrupted; ending the session: no verdict") in proc.stderr


def test_gil_holding_call_ends_the_process_via_faulthandler(tmp_path: Any) -> None:
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(STUCK))
    proc = subprocess.run([sys.executable, str(script), "gil"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode != 0
    assert "Timeout (" in proc.stderr and "in gil" in proc.stderr


_CAPS = reference_capabilities_source("_R.capabilities", drop={"block_pool"})
HANGING_IMPL = f"""
import time
from kvcheck.adapters.reference import IMPL_INFO as _R, ReferenceManager
from kvcheck.conformance.protocol import ImplInfo
IMPL_INFO = ImplInfo("hangs", "0", {_CAPS})
class M(ReferenceManager):
    def allocate_slots(self, request, *args):
        if request.num_tokens > 12:
            time.sleep(3600)
        return super().allocate_slots(request, *args)
def make_kv_cache_manager(spec):
    return M(spec)
"""


def test_hanging_adapter_fails_its_tests_and_the_session_finishes(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(hanging_impl=HANGING_IMPL)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kv-impl=hanging_impl", "--kv-timeout=0.5",
        "-k", "test_first_allocation or test_decode_within_block_allocates_nothing",
        timeout=120)
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        ("*timeout: hangs.allocate_slots(RequestView('r0', 14 tokens, num_computed_tokens=0), "
         "14, 0, []) did not return within 0.5 s*"),
    ])
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed") == 1
