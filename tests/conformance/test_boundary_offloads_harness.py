"""The harness side of the boundary-state hand-offs (``kvcheck.conformance.boundary_offloads``):
which layouts make them, the two-Mamba-group layouts drawn only for a design declaring them,
the guard's shape checks (``GuardedManager.take_boundary_state_offloads`` /
``finalize_partial_tail_offloads``), the laws on a driven reference (each broken on purpose),
and the loader naming the missing methods."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from kvcheck.conformance.boundary_offloads import (
    boundary_state_offloads,
    offload_problems,
    tail_problems,
)
from kvcheck.conformance.driver import Driver
from kvcheck.conformance.guard import GuardedManager, ProtocolViolation
from kvcheck.conformance.layouts import layout_for
from kvcheck.conformance.loader import ImplHandle, load_impl
from kvcheck.conformance.ops import add, schedule
from kvcheck.conformance.protocol import ImplInfo, KVCacheGroupSpec, KVCacheSpec, RequestView

F = "full_attention"


def _mamba(block_size: int, mode: str = "align") -> KVCacheGroupSpec:
    return KVCacheGroupSpec("mamba", block_size, mamba_cache_mode=mode)


def _spec(*groups: KVCacheGroupSpec, caching: bool = True, profile: str = "vllm-0.33",
          num_blocks: int = 16) -> KVCacheSpec:
    return KVCacheSpec(num_blocks=num_blocks, block_size=4, enable_caching=caching,
                       profile=profile, kv_cache_groups=groups)


@pytest.mark.parametrize(("spec", "on"), [
    (_spec(_mamba(4)), True),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(8)), True),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4, "none"), caching=False), False),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4), caching=False), False),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4), profile="vllm-0.10"), False),
    (_spec(KVCacheGroupSpec(F, 4)), False),
])
def test_layouts_that_make_hand_offs(spec: KVCacheSpec, on: bool) -> None:
    assert boundary_state_offloads(spec) is on


def test_two_mamba_group_layouts_are_appended_only_where_declared() -> None:
    """Declaring the capability adds layouts after the others: every draw that picked one of
    the other layouts picks the same one, and some draws reach two Mamba groups."""
    kinds = (F, "sliding_window", "chunked_local_attention", "mamba")
    two = 0
    for fine in (False, True):
        for draw in range(400):
            plain = layout_for("vllm-0.33", kinds, 4, draw, fine_grained=fine)
            more = layout_for("vllm-0.33", kinds, 4, draw, fine_grained=fine, offloads=True)
            mambas = sum(g.kind == "mamba" for g in more[0])
            assert mambas <= 2
            if mambas == 2:
                two += 1
                assert all(g.mamba_cache_mode == "align" for g in more[0] if g.kind == "mamba")
            elif sum(g.kind == "mamba" for g in plain[0]) < 2 and draw % 4 != 3:
                assert plain == more, draw  # not a Mamba draw: unchanged
    assert two > 10


# ---------------------------------------------------------------------- the guard
class _Fake:
    """A manager answering whatever the test puts in ``offloads`` / ``tails``."""

    def __init__(self) -> None:
        self.offloads: Any = {}
        self.tails: Any = []

    def take_boundary_state_offloads(self) -> Any:
        return self.offloads

    def finalize_partial_tail_offloads(self, request: RequestView) -> Any:
        return self.tails

    def num_free_blocks(self) -> int:
        return 15


_GUARD_SPEC = _spec(KVCacheGroupSpec(F, 4), _mamba(8))


def _guarded(fake: _Fake) -> GuardedManager:
    module = ModuleType("fake_offloads")
    info = ImplInfo(name="offloads", version="0", capabilities=frozenset(
        {"manager", "kv_cache_groups", "mamba", "boundary_state_offloads"}), hash_algos=())
    handle = ImplHandle(info.name, module.__name__, module, info, lambda spec: fake, None,
                        call_timeout=None)
    mgr = handle.make_manager(_GUARD_SPEC)
    assert isinstance(mgr, GuardedManager)
    return mgr


def test_the_guard_passes_well_formed_hand_offs() -> None:
    fake = _Fake()
    mgr = _guarded(fake)
    fake.offloads = {"a": [[1, 6, 12]], "b": [(1, 9, 16), (1, 10, 24)]}  # arrays: the wire's
    assert mgr.take_boundary_state_offloads() == {"a": [(1, 6, 12)],
                                                  "b": [(1, 9, 16), (1, 10, 24)]}
    fake.tails = [[1, 4, 12]]
    assert mgr.finalize_partial_tail_offloads(RequestView("a", (1, 2))) == [(1, 4, 12)]


@pytest.mark.parametrize(("offloads", "words"), [
    ([(1, 6, 12)], "must be a dict {request_id: [(group_id, block_id, boundary_tokens)"),
    ({3: [(1, 6, 12)]}, "key 3 is not a request id (str)"),
    ({"a": 5}, "5 is not a list of (group_id, block_id, boundary_tokens) triples"),
    ({"a": [(1, 6)]}, "is not a (group_id, block_id, boundary_tokens) triple"),
    ({"a": [(2, 6, 12)]}, "a group index in [0, 2)"),
    ({"a": [(1, 16, 12)]}, "a block id in [0, num_blocks=16) not reserved"),
    ({"a": [(1, 0, 12)]}, "not reserved"),  # vLLM's null block
    ({"a": [(1, 6, 0)]}, "a positive token count"),
    ({"a": [(1, 6, True)]}, "is not a (group_id, block_id, boundary_tokens) triple"),
    ({"a": [(1, 6, 12)] * 17}, "more than the 16 possible"),
])
def test_the_guard_refuses_malformed_hand_offs(offloads: Any, words: str) -> None:
    fake = _Fake()
    mgr = _guarded(fake)
    fake.offloads = offloads
    with pytest.raises(ProtocolViolation) as refused:
        mgr.take_boundary_state_offloads()
    assert words in str(refused.value), refused.value


@pytest.mark.parametrize(("tails", "words"), [
    ({"a": 1}, "is not a list of (group_id, block_id, boundary_tokens) triples"),
    ([(1, 4, 12), (1, 5, 12)], "group 1 hands off two partial tails"),
    ([(1, 4, -1)], "a positive token count"),
])
def test_the_guard_refuses_malformed_tails(tails: Any, words: str) -> None:
    fake = _Fake()
    mgr = _guarded(fake)
    fake.tails = tails
    with pytest.raises(ProtocolViolation) as refused:
        mgr.finalize_partial_tail_offloads(RequestView("a", (1, 2)))
    assert words in str(refused.value), refused.value


def test_a_design_without_the_methods_hands_nothing_off() -> None:
    class Bare:
        def num_free_blocks(self) -> int:
            return 15

    mgr = _guarded(Bare())  # type: ignore[arg-type]
    assert mgr.take_boundary_state_offloads() == {}
    assert mgr.finalize_partial_tail_offloads(RequestView("a", (1,))) == []


# ---------------------------------------------------------------------- the laws
_P14 = tuple(range(100, 114))


def _driven() -> Driver:
    """The reference, a at 12 of 14 tokens (its partial tail keyed at 12 in Mamba block 1,
    block 4), then 2 more tokens (its state copied to block 6, handed off at 12)."""
    d = Driver(load_impl("reference"), _GUARD_SPEC)
    for op in (add("a", _P14), schedule("a", 12), schedule("a", 2)):
        d.apply(op)
    d.new_step()
    assert d.drained_offloads == [{"a": [(1, 6, 12)]}], d.drained_offloads
    assert not d.take_law_problems()
    return d


def _problems(d: Driver, offloads: dict[str, list[tuple[int, int, int]]],
              copies: tuple[tuple[int, int], ...] = ()) -> list[str]:
    tables = {rid: d.manager.get_block_ids_per_group(rid) for rid in d.running}
    return offload_problems(d.spec, d.written, d.views, d.running, tables, offloads,
                            list(copies))


def test_the_laws_accept_what_vllm_hands_off() -> None:
    d = _driven()
    assert _problems(d, {"a": [(1, 6, 12)]}, ((4, 6),)) == []


@pytest.mark.parametrize(("offloads", "copies", "words"), [
    ({"a": [(0, 1, 4)]}, (), "group 0 is 'full_attention', not a Mamba 'align' group"),
    ({"a": [(1, 6, 12)]}, (), "is neither in the request's table of group 1"),
    ({"a": [(1, 4, 12)]}, (), "must hold the state after exactly 12 tokens"),  # overwritten
    ({"a": [(1, 4, 16)]}, (), "the request computed only 14 tokens"),
    ({"z": [(1, 4, 12)]}, (), "for request 'z', which holds no blocks"),
])
def test_the_laws_refuse_a_wrong_hand_off(offloads: dict[str, list[tuple[int, int, int]]],
                                          copies: tuple[tuple[int, int], ...],
                                          words: str) -> None:
    d = _driven()
    problems = _problems(d, offloads, copies)
    assert any(words in p for p in problems), problems


def test_the_laws_judge_a_partial_tail() -> None:
    d = Driver(load_impl("reference"), _GUARD_SPEC)
    for op in (add("a", _P14), schedule("a", 12)):
        d.apply(op)
    view = d.views["a"]
    table = d.manager.get_block_ids_per_group("a")
    assert table == [[1, 2, 3], [0, 4]]
    assert tail_problems(d.spec, d.written, view, table, [(1, 4, 12)]) == []
    wrong = tail_problems(d.spec, d.written, view, table, [(1, 4, 8)])
    assert any("is not at the request's 12 computed tokens" in p for p in wrong), wrong
    assert any("must hold the state after exactly 8 tokens" in p for p in wrong), wrong


# ---------------------------------------------------------------------- the loader
def test_the_loader_names_what_boundary_state_offloads_needs(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Declaring ``boundary_state_offloads`` under vllm-0.33 needs both methods: the loader
    names the missing one and the fix."""
    from kvcheck.conformance.loader import ImplLoadError

    (tmp_path / "nooffloads_adapter.py").write_text(
        "from kvcheck.adapters.reference import IMPL_INFO as _REF\n"
        "from kvcheck.adapters.reference import make_kv_cache_manager as _make\n"
        "from dataclasses import replace\n"
        "IMPL_INFO = replace(_REF, name='nooffloads', capabilities=_REF.capabilities\n"
        "                    - {'block_pool', 'kernels', 'sizing'})\n"
        "assert 'boundary_state_offloads' in IMPL_INFO.capabilities\n"
        "class Manager:\n"
        "    def __init__(self, inner):\n"
        "        self._inner = inner\n"
        "    def __getattr__(self, name):\n"
        "        if name == 'finalize_partial_tail_offloads':\n"
        "            raise AttributeError(name)\n"
        "        return getattr(self._inner, name)\n"
        "def make_kv_cache_manager(spec):\n"
        "    return Manager(_make(spec))\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplLoadError) as info:
        load_impl("nooffloads_adapter")
    text = str(info.value)
    assert "lacks finalize_partial_tail_offloads() (SupportsBoundaryStateOffloads" in text, text
    assert "or remove 'boundary_state_offloads' from IMPL_INFO.capabilities" in text, text
