"""Whose fault it is (issue 23 item 4), by direct calls: a BaseException an adapter call
raises is the implementation's failure (``AdapterRaised``) unless the user's Ctrl-C or
pytest-timeout caused it; a spec handed to an adapter is a private copy whose mutation is
reported as such; ``--kv-timeout`` has a floor that the reference's own calls fit under, and
the oracle runs under a limit of its own (``kvcheck.conformance.interrupts``, ``spec_seal``,
``call_floor``)."""

from __future__ import annotations

import json
import signal
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kvcheck.conformance.interrupts as interrupts
from kvcheck.conformance.call_floor import (
    MIN_CALL_TIMEOUT,
    apply_floor,
    floor,
    oracle_timeout,
    slowest_reference_call,
)
from kvcheck.conformance.call_limit import DEFAULT_CALL_TIMEOUT, AdapterRaised, CallLimit
from kvcheck.conformance.differential import ConformanceMismatch, Pair
from kvcheck.conformance.guard import ProtocolViolation
from kvcheck.conformance.loader import ImplLoadError, load_impl
from kvcheck.conformance.ops import add, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec
from kvcheck.conformance.sizing_protocol import LayerKVSpec
from kvcheck.conformance.spec_seal import SpecMutated, call_with_private_args, private_copy
from kvcheck.errors import KVCheckFailure
from kvcheck.plugin.cli import main


class Boom(BaseException):
    """A BaseException of the adapter's own."""


def raising(exc: BaseException) -> Callable[[], None]:
    def call() -> None:
        raise exc
    return call


@pytest.fixture
def watched() -> Iterator[None]:
    """kvcheck's SIGINT handler installed (the plugin installs it; made sure here), and no
    Ctrl-C noted before or after the test."""
    assert interrupts.watch_user_interrupts()
    interrupts._WATCH.received = False
    yield
    interrupts._WATCH.received = False


# ------------------------------------------------------------------ BaseExceptions
@pytest.mark.parametrize("seconds", [0, 30], ids=["no-limit", "limit"])
@pytest.mark.parametrize(("exc", "words"), [
    (KeyboardInterrupt(), "raised KeyboardInterrupt, not caused by a signal"),
    (SystemExit(3), "raised SystemExit(3) (sys.exit() inside an adapter call)"),
    (GeneratorExit(), "raised GeneratorExit: an adapter call must return or raise an Exception"),
    (Boom("bang"), "raised Boom('bang') (a BaseException subclass)"),
], ids=["KeyboardInterrupt", "SystemExit", "GeneratorExit", "custom"])
def test_a_base_exception_from_a_call_is_the_implementations_failure(
        watched: None, seconds: float, exc: BaseException, words: str) -> None:
    with pytest.raises(AdapterRaised) as info:
        CallLimit(seconds, "boomimpl").call("allocate_slots", raising(exc))
    text = str(info.value)
    assert text.startswith("boomimpl.allocate_slots() ") and words in text
    assert "counts it as the implementation's failure" in text
    assert isinstance(info.value, KVCheckFailure) and isinstance(info.value, Exception)
    assert info.value.__cause__ is exc and info.value.raised_name == type(exc).__name__
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # nothing left armed


def test_a_base_exception_in_another_thread_is_converted_too(watched: None) -> None:
    caught: list[BaseException] = []

    def worker() -> None:
        try:
            CallLimit(30, "threaded").call("free", raising(SystemExit(5)))
        except BaseException as exc:  # noqa: BLE001 - the test looks at what came out
            caught.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert len(caught) == 1 and isinstance(caught[0], AdapterRaised)
    assert "threaded.free() raised SystemExit(5)" in str(caught[0])


@pytest.mark.parametrize(("call", "words"), [
    (lambda: pytest.skip("not today"), "called pytest.skip('not today')"),
    (lambda: pytest.fail("nope"), "called pytest.fail('nope')"),
    (lambda: pytest.exit("bye"), "called pytest.exit('bye')"),
], ids=["skip", "fail", "exit"])
def test_an_adapter_that_ends_the_test_itself_fails_it(
        watched: None, call: Callable[[], None], words: str) -> None:
    """A skip from inside a call would hide a failure from the verdict: it is a failure."""
    with pytest.raises(AdapterRaised) as info:
        CallLimit(0, "sly").call("allocate_slots", call)
    assert words in str(info.value) and "the factory raises UnsupportedSpec" in str(info.value)


def test_ordinary_exceptions_pass_unchanged(watched: None) -> None:
    with pytest.raises(ValueError, match="plain"):
        CallLimit(30, "x").call("f", raising(ValueError("plain")))


def test_a_real_sigint_stops_the_run(watched: None) -> None:
    """The SIGINT handler notes the signal, then raises KeyboardInterrupt as Python's
    default handler does: it passes through the call untouched. (The installed handler is
    called as the interpreter calls it: a signal raised with ``signal.raise_signal`` may be
    handled inside a weakref callback, where its KeyboardInterrupt is lost.)"""
    handler = signal.getsignal(signal.SIGINT)
    assert callable(handler)
    with pytest.raises(KeyboardInterrupt) as info:
        CallLimit(30, "x").call("allocate_slots", handler, signal.SIGINT, None)
    assert type(info.value) is KeyboardInterrupt and interrupts.user_interrupted()


def test_without_the_handler_every_keyboard_interrupt_is_the_users(
        watched: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where kvcheck cannot tell (its handler was replaced), a KeyboardInterrupt is never
    blamed on the implementation."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            CallLimit(0, "x").call("f", raising(KeyboardInterrupt()))
    finally:
        signal.signal(signal.SIGINT, previous)


def test_pytest_timeouts_failure_passes_through(watched: None) -> None:
    """pytest-timeout's alarm fails the test from inside whatever call is running: not the
    implementation's doing (kvcheck.plugin.outcomes counts it as a timeout)."""
    namespace: dict[str, Any] = {"__name__": "pytest_timeout", "pytest": pytest}
    exec("def timeout_sigalrm():\n    pytest.fail('Timeout (>1.0s) from pytest-timeout.')",
         namespace)
    with pytest.raises(pytest.fail.Exception, match="from pytest-timeout"):
        CallLimit(0, "x").call("allocate_slots", namespace["timeout_sigalrm"])


# ------------------------------------------------------------------ load time
# (impl_module: tests/conftest.py)
REF_HEAD = """
from dataclasses import replace
import kvcheck.adapters.reference as _ref
from kvcheck.adapters.reference import ReferenceManager
IMPL_INFO = replace(_ref.IMPL_INFO, name={name!r}, capabilities=_ref.IMPL_INFO.capabilities
                    - {{"kernels", "sizing", "block_pool", "offload"}})
"""


def adapter(name: str, body: str) -> str:
    return REF_HEAD.format(name=name) + textwrap.dedent(body)


def test_a_factory_exiting_at_load_time_is_a_usage_error(watched: None, impl_module: Any) -> None:
    target = impl_module("exits_at_probe", adapter("exits", """
        def make_kv_cache_manager(spec):
            raise SystemExit(4)
    """))
    with pytest.raises(ImplLoadError) as info:
        load_impl(target)
    text = str(info.value)
    assert text.startswith("kvcheck: --kv-impl=exits_at_probe: exits.make_kv_cache_manager(")
    assert "raised SystemExit(4)" in text and "  Fix: the factory must build" in text


def test_a_module_raising_a_base_exception_at_import_is_a_usage_error(
        watched: None, impl_module: Any) -> None:
    target = impl_module("booms_at_import", "class Boom(BaseException):\n    pass\n"
                                            "raise Boom('at import')\n")
    with pytest.raises(ImplLoadError) as info:
        load_impl(target)
    assert ("importing 'booms_at_import' raised Boom (a BaseException, not an Exception): "
            "at import") in str(info.value)
    assert "  Fix: fix the error in that module's import-time code" in str(info.value)


def test_a_base_exception_during_a_pair_run_fails_with_op_and_repro(
        watched: None, impl_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    impl = load_impl(impl_module("genexit_impl", adapter("genexit", """
        class M(ReferenceManager):
            def allocate_slots(self, request, *args):
                raise GeneratorExit
        def make_kv_cache_manager(spec):
            return M(spec)
    """)))
    pair = Pair(impl, load_impl("reference"), KVCacheSpec(num_blocks=10, block_size=4))
    pair.trace_name = "genexit-case"
    with pytest.raises(ConformanceMismatch) as info:
        pair.run([add("r0", range(6)), schedule("r0")])
    text = str(info.value)
    assert text.startswith("after op #2 {'op': 'schedule', 'rid': 'r0', 'num_tokens': None}: "
                           "BaseException from the implementation: genexit.allocate_slots(")
    assert "raised GeneratorExit" in text
    assert "m.allocate_slots(views['r0'], 6, 0, [])  # raised GeneratorExit" in text
    assert (tmp_path / ".kvcheck" / "repro" / "genexit-case.json").is_file()
    assert (tmp_path / ".kvcheck" / "repro" / "genexit-case.py").is_file()


# ------------------------------------------------------------------ specs
MUTATES_LATER = """
class M(ReferenceManager):
    def __init__(self, spec):
        super().__init__(spec)
        self.given = spec
    def allocate_slots(self, request, *args):
        {write}
        return super().allocate_slots(request, *args)
def make_kv_cache_manager(spec):
    return M(spec)
"""


def test_a_factory_writing_to_its_spec_is_reported_as_a_mutation(
        impl_module: Any) -> None:
    impl = load_impl(impl_module("mutates_factory", adapter("mutf", """
        calls = []
        def make_kv_cache_manager(spec):
            calls.append(spec)
            if len(calls) > 1:  # not at the load-time probe
                object.__setattr__(spec, "num_blocks", spec.num_blocks * 10)
            return ReferenceManager(spec)
    """)))
    spec = KVCacheSpec(num_blocks=10, block_size=4)
    with pytest.raises(SpecMutated) as info:
        impl.make_manager(spec)
    text = str(info.value)
    assert text.startswith("mutf.make_kv_cache_manager(KVCacheSpec(")
    assert ("the adapter mutated the KVCacheSpec it was given: field num_blocks before 10, "
            "after 100") in text
    assert isinstance(info.value, ProtocolViolation)
    assert spec.num_blocks == 10  # the harness's spec never changed: the factory had a copy
    assert impl.module.calls[-1] is not spec


def test_a_write_during_a_call_is_reported_at_that_call(impl_module: Any) -> None:
    impl = load_impl(impl_module("mutates_call", adapter("mutc", MUTATES_LATER.format(
        write='object.__setattr__(self.given, "enable_caching", False)'))))
    spec = KVCacheSpec(num_blocks=10, block_size=4)
    pair = Pair(impl, load_impl("reference"), spec)
    with pytest.raises(ConformanceMismatch) as info:
        pair.run([add("r0", range(6)), schedule("r0")])
    text = str(info.value)
    assert ("after op #2 {'op': 'schedule', 'rid': 'r0', 'num_tokens': None}: protocol "
            "violation: mutc.allocate_slots(RequestView('r0', 6 tokens, num_computed_tokens=0)"
            ", 6, 0, []): the adapter mutated the KVCacheSpec it was given: field "
            "enable_caching before True, after False") in text
    assert "num_free_blocks" not in text.partition("\n")[0]
    assert spec.enable_caching is True


def test_groups_are_a_tuple_so_an_append_cannot_change_them(impl_module: Any) -> None:
    groups = [KVCacheGroupSpec("full_attention", 4)]
    spec = KVCacheSpec(num_blocks=10, block_size=4, kv_cache_groups=groups)  # type: ignore[arg-type]
    assert type(spec.kv_cache_groups) is tuple
    groups.append(KVCacheGroupSpec("sliding_window", 4, sliding_window=8))
    assert len(spec.kv_cache_groups) == 1  # the caller's list is not the spec's
    with pytest.raises(AttributeError):
        spec.kv_cache_groups.append(groups[1])  # type: ignore[attr-defined]


def test_swapping_in_a_list_and_appending_is_reported(impl_module: Any) -> None:
    impl = load_impl(impl_module("mutates_groups", adapter("mutg", MUTATES_LATER.format(
        write='object.__setattr__(self.given, "kv_cache_groups", '
              'list(self.given.kv_cache_groups)); '
              'self.given.kv_cache_groups.append("extra")'))))
    manager = impl.make_manager(KVCacheSpec(num_blocks=10, block_size=4))
    view = add("r0", range(6))
    from kvcheck.conformance.driver import view_from_add

    with pytest.raises(SpecMutated, match=r"field kv_cache_groups before \(\), after \['extra'\] "
                                          r"\(a list, was a tuple\)"):
        manager.allocate_slots(view_from_add(view), 6)


def test_a_hybrid_groups_field_written_in_place_is_reported(impl_module: Any) -> None:
    impl = load_impl(impl_module("mutates_window", adapter("mutw", MUTATES_LATER.replace(
        "M(spec)", "M(spec) if spec.kv_cache_groups else ReferenceManager(spec)").format(
        write='object.__setattr__(self.given.kv_cache_groups[1], "sliding_window", 64)'))))
    spec = KVCacheSpec(num_blocks=16, block_size=4, kv_cache_groups=(
        KVCacheGroupSpec("full_attention"), KVCacheGroupSpec("sliding_window",
                                                             sliding_window=8)))
    pair = Pair(impl, load_impl("reference"), spec)
    with pytest.raises(ConformanceMismatch) as info:
        pair.run([add("r0", range(6)), schedule("r0")])
    assert ("the adapter mutated the KVCacheSpec it was given: field "
            "kv_cache_groups[1].sliding_window before 8, after 64") in str(info.value)
    assert spec.kv_cache_groups[1].sliding_window == 8


def test_a_block_pool_factory_writing_to_its_spec_is_reported(impl_module: Any) -> None:
    impl = load_impl(impl_module("mutates_pool", """
        from dataclasses import replace
        import kvcheck.adapters.reference as _ref
        IMPL_INFO = replace(_ref.IMPL_INFO, name="mutp", capabilities=frozenset({"block_pool"}))
        seen = []
        def make_block_pool(spec):
            seen.append(spec)
            if len(seen) > 1:
                object.__setattr__(spec, "block_size", 16)
            return _ref.make_block_pool(spec)
    """))
    with pytest.raises(SpecMutated, match=r"mutp\.make_block_pool.*field block_size before 4, "
                                          r"after 16"):
        impl.make_block_pool(KVCacheSpec(num_blocks=10, block_size=4))


def test_private_copies_share_nothing() -> None:
    spec = KVCacheSpec(num_blocks=10, block_size=4, kv_cache_groups=(
        KVCacheGroupSpec("sliding_window", sliding_window=4),))
    copy = private_copy(spec)
    assert copy == spec and copy is not spec
    assert copy.kv_cache_groups[0] is not spec.kv_cache_groups[0]


def test_a_sizing_function_writing_to_its_layer_spec_is_reported() -> None:
    spec = LayerKVSpec("full_attention", 16, 8, 128, "bfloat16")
    layers = {"l0": spec}

    def plan(given: dict[str, LayerKVSpec], memory: int) -> int:
        object.__setattr__(given["l0"], "head_size", 64)
        return memory

    with pytest.raises(SpecMutated) as info:
        call_with_private_args(CallLimit(0, "sizer"), "kv_sizing_plan", plan, layers, 1 << 20)
    assert ("sizer.kv_sizing_plan({'l0': LayerKVSpec(kind='full_attention', block_size=16, "
            "..., 1048576): the adapter mutated the LayerKVSpec it was given: argument 1['l0']"
            ".head_size before 128, after 64") in str(info.value)
    assert spec.head_size == 128 and layers == {"l0": spec}  # the originals never changed


# ------------------------------------------------------------------ the floor
def test_a_limit_below_the_floor_is_raised_to_it_saying_so() -> None:
    least = floor()
    assert least >= MIN_CALL_TIMEOUT
    assert least >= 10 * slowest_reference_call() > 0
    used, note = apply_floor(0.001)
    assert used == least and note is not None
    assert note.startswith(f"--kv-timeout=0.001 is below the floor of this machine, {least:.3g} s")
    assert "slowest call of kvcheck's reference" in note and "0 = no limit" in note
    assert apply_floor(least) == (least, None)
    assert apply_floor(0) == (0, None)  # no limit stays no limit
    assert apply_floor(DEFAULT_CALL_TIMEOUT) == (DEFAULT_CALL_TIMEOUT, None)


def test_the_oracle_runs_under_its_own_limit() -> None:
    assert oracle_timeout(0.3) == DEFAULT_CALL_TIMEOUT
    assert oracle_timeout(120) == 120
    assert oracle_timeout(0) == 0 and oracle_timeout(None) == 0


# ------------------------------------------------------------------ kvcheck replay
def write_trace_file(tmp_path: Path, impl: str) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({
        "trace_version": 1, "impl": impl, "spec": {"num_blocks": 8, "block_size": 4},
        "ops": [add("a", range(10)), schedule("a")]}))
    return path


def test_replay_raises_a_tiny_timeout_to_the_floor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", str(write_trace_file(tmp_path, "reference")), "--kv-timeout=0.001"])
    out, err = capsys.readouterr()
    assert code == 0 and "2 ops on reference (compared with reference): no divergence" in out
    assert "kvcheck replay: --kv-timeout=0.001 is below the floor of this machine" in err


def test_replay_of_an_adapter_raising_system_exit_fails_it(
        watched: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        impl_module: Any) -> None:
    target = impl_module("exits_in_replay", adapter("exits", """
        class M(ReferenceManager):
            def allocate_slots(self, request, *args):
                raise SystemExit(3)
        def make_kv_cache_manager(spec):
            return M(spec)
    """))
    code = main(["replay", str(write_trace_file(tmp_path, target))])
    out, _ = capsys.readouterr()
    assert code == 1 and "kvcheck replay: exits diverges" in out
    assert ("after op #2 {'op': 'schedule', 'rid': 'a', 'num_tokens': None}: BaseException "
            "from the implementation: exits.allocate_slots(") in out
    assert "raised SystemExit(3)" in out


def test_replay_of_a_factory_raising_a_base_exception_fails_it(
        watched: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        impl_module: Any) -> None:
    target = impl_module("booms_in_replay", adapter("booms", """
        class Boom(BaseException):
            pass
        made = []
        def make_kv_cache_manager(spec):
            made.append(spec)
            if len(made) > 1:
                raise Boom("factory")
            return ReferenceManager(spec)
    """))
    code = main(["replay", str(write_trace_file(tmp_path, target))])
    out, _ = capsys.readouterr()
    assert code == 1 and "kvcheck replay: booms fails before the first op: " in out
    assert "booms.make_kv_cache_manager(KVCacheSpec(" in out
    assert "raised Boom('factory') (a BaseException subclass)" in out
