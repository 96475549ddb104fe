"""Loading an offload tier (capability ``offload``, issue 30 item 6): a module may declare
``offload`` alone; every way a module can fail to be a tier is an ``ImplLoadError`` naming
the problem and the fix (``kvcheck.conformance.loader._offload_factory``), decided at load time
by a probe tier (LRU, 8 chunks; ARC when LRU is declined)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvcheck.conformance.loader import ImplHandle, ImplLoadError, load_impl
from kvcheck.conformance.offload_guard import GuardedOffloadingManager
from kvcheck.conformance.offload_protocol import OffloadSpec
from kvcheck.conformance.protocol import UnsupportedSpec
from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.offload_policy import make_offload_key

HEADER = """\
import time
from kvcheck.adapters.reference import make_offloading_manager as _reference
from kvcheck.conformance.protocol import ImplInfo, UnsupportedSpec
"""
OFFLOAD_ONLY = 'IMPL_INFO = ImplInfo("tier", "1", frozenset({"offload"}))\n'
KEY = make_offload_key(b"\x01" * 32, 0)


def offload_only(code: str) -> str:
    """A module body declaring only ``offload``, then ``code`` (dedented)."""
    return OFFLOAD_ONLY + textwrap.dedent(code)


#: The ``load`` fixture: ``load(body, timeout=...)`` -> the loaded module's handle.
Load = Callable[..., ImplHandle]


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Load]:
    """``load(body, timeout=...)``: write a module (``HEADER`` + ``body``) and load it; the
    module leaves ``sys.modules`` afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def load_module(body: str, *, timeout: float | None = 10) -> ImplHandle:
        name = f"offload_impl_{len(names)}_{tmp_path.name}"
        names.append(name)
        (tmp_path / f"{name}.py").write_text(HEADER + body, encoding="utf-8")
        return load_impl(name, call_timeout=timeout, search=(tmp_path,))

    yield load_module
    for name in names:
        sys.modules.pop(name, None)


def usage_error(load: Load, body: str, problem: str, fix: str, **kwargs: object) -> str:
    """``body`` fails to load with ``problem`` in the problem line and ``fix`` in the fix."""
    with pytest.raises(ImplLoadError) as info:
        load(body, **kwargs)
    message = str(info.value)
    assert isinstance(info.value, KVCheckInputError)
    problem_text, _, fix_text = message.partition("\n  Fix: ")
    assert problem_text.startswith("kvcheck: --kv-impl=offload_impl_"), message
    assert problem in problem_text and fix in fix_text, message
    return message


def test_a_module_declaring_only_offload_loads(load: Load) -> None:
    handle = load(OFFLOAD_ONLY + "make_offloading_manager = _reference\n")
    assert handle.has("offload") and not handle.has("manager")
    assert handle.factory is None and handle.pool_factory is None
    tier = handle.make_offloading_manager(OffloadSpec(num_chunks=4, cache_policy="arc"))
    assert isinstance(tier, GuardedOffloadingManager) and tier.impl == "tier"
    tier.on_new_request("a")
    assert tier.prepare_store([KEY], "a") == {"keys_to_store": [KEY], "evicted_keys": [],
                                              "chunk_ids": [0]}
    assert tier.lookup(KEY, "a") == "HIT_PENDING"
    with pytest.raises(KVCheckInputError, match="tier declares no manager capability"):
        handle.make_manager(None)  # type: ignore[arg-type]


def test_a_module_without_offload_makes_no_tier(load: Load) -> None:
    handle = load('IMPL_INFO = ImplInfo("pool", "1", frozenset({"manager"}))\n'
                  "from kvcheck.adapters.reference import make_kv_cache_manager\n")
    with pytest.raises(KVCheckInputError, match="pool declares no offload capability"):
        handle.make_offloading_manager(OffloadSpec(num_chunks=4))


def test_a_tier_declining_one_policy_loads_and_declines_it_later(load: Load) -> None:
    handle = load(offload_only("""
        def make_offloading_manager(spec):
            if spec.cache_policy != "arc":
                raise UnsupportedSpec("ARC only")
            return _reference(spec)
    """))
    assert handle.make_offloading_manager(OffloadSpec(num_chunks=4, cache_policy="arc"))
    with pytest.raises(UnsupportedSpec, match="ARC only"):
        handle.make_offloading_manager(OffloadSpec(num_chunks=4))


def test_no_factory(load: Load) -> None:
    usage_error(load, OFFLOAD_ONLY,
                "capability 'offload' is declared but the module has no "
                "make_offloading_manager",
                "define def make_offloading_manager(spec: OffloadSpec) returning the tier "
                "(kvcheck.conformance.offload_protocol), or drop 'offload'")


def test_a_factory_of_another_kind_does_not_count(load: Load) -> None:
    """A manager factory is not a tier factory: ``offload`` still needs its own."""
    usage_error(load, 'IMPL_INFO = ImplInfo("t", "1", frozenset({"manager", "offload"}))\n'
                "from kvcheck.adapters.reference import make_kv_cache_manager\n",
                "the module has no make_offloading_manager", "or drop 'offload'")


@pytest.mark.parametrize("signature", ["()", "(spec, policy)", "(*, spec)"])
def test_a_factory_with_the_wrong_signature(load: Load, signature: str) -> None:
    usage_error(load, OFFLOAD_ONLY + f"def make_offloading_manager{signature}:\n"
                "    return _reference(spec)\n",
                f"make_offloading_manager{signature} cannot be called as "
                "make_offloading_manager(spec)", "make it take exactly one argument")


def test_a_factory_that_is_not_callable(load: Load) -> None:
    usage_error(load, OFFLOAD_ONLY + "make_offloading_manager = 5\n",
                "make_offloading_manager is not callable", "define def make_offloading_manager(")


def test_a_factory_that_raises(load: Load) -> None:
    usage_error(load, offload_only("""
        def make_offloading_manager(spec):
            raise RuntimeError("no CPU buffer")
    """), "make_offloading_manager(OffloadSpec(num_chunks=8, cache_policy='lru'",
                "make_offloading_manager must build a tier for any spec it supports (raise "
                "UnsupportedSpec for the others)")
    with pytest.raises(ImplLoadError, match=r"\) raised RuntimeError: no CPU buffer\n"):
        load(OFFLOAD_ONLY + "def make_offloading_manager(spec):\n"
             "    raise RuntimeError('no CPU buffer')\n")


def test_a_factory_that_hangs(load: Load) -> None:
    usage_error(load, offload_only("""
        def make_offloading_manager(spec):
            time.sleep(60)
    """), "tier.make_offloading_manager(OffloadSpec(num_chunks=8", "make_offloading_manager "
                "must return a tier promptly for a small spec", timeout=0.3)


def test_a_factory_declining_both_policies(load: Load) -> None:
    usage_error(load, offload_only("""
        def make_offloading_manager(spec):
            raise UnsupportedSpec(f"no {spec.cache_policy} here")
    """), "make_offloading_manager declined both policies: lru: no lru here; arc: no arc here",
                "support at least one of cache_policy 'lru' and 'arc', or drop 'offload'")


def test_a_tier_lacking_protocol_methods(load: Load) -> None:
    message = usage_error(load, offload_only("""
        class Partial:
            def __init__(self, spec):
                self._tier = _reference(spec)
            def __getattr__(self, name):
                if name in ("take_events", "reset_cache"):
                    raise AttributeError(name)
                return getattr(self._tier, name)
        def make_offloading_manager(spec):
            return Partial(spec)
    """), "capability 'offload' is declared but the offload tier (Partial) lacks take_events, "
         "reset_cache", "implement take_events, reset_cache or remove 'offload' from "
                        "IMPL_INFO.capabilities")
    assert "lookup" not in message


def test_a_tier_whose_method_is_not_callable(load: Load) -> None:
    usage_error(load, offload_only("""
        def make_offloading_manager(spec):
            tier = _reference(spec)
            tier.lookup = "HIT"
            return tier
    """), "the offload tier (OffloadTier) lacks lookup", "implement lookup")


def test_a_module_declaring_nothing_to_drive_mentions_offload(load: Load) -> None:
    usage_error(load, 'IMPL_INFO = ImplInfo("idle", "1", frozenset())\n',
                "IMPL_INFO declares none of 'manager', 'block_pool', 'indexer' and 'offload'",
                "or 'offload' (make_offloading_manager) for a KV offload tier")


# --- a factory answering None; the fix naming the offload spec --------------------------------

def test_a_factory_returning_none(load: Load) -> None:
    message = usage_error(load, OFFLOAD_ONLY + "def make_offloading_manager(spec):\n"
                          "    pass\n", "make_offloading_manager", "")
    assert "declined" not in message and "None" in message, message


def test_the_signature_fix_names_the_offload_spec(load: Load) -> None:
    message = usage_error(load, OFFLOAD_ONLY + "def make_offloading_manager():\n    pass\n",
                          "cannot be called", "make it take exactly one argument")
    assert "OffloadSpec" in message and "KVCacheSpec" not in message, message
