"""The harness side of fine-grained partial hits (``kvcheck.conformance.fine_grained``): which
layouts have them, the layouts drawn for a design declaring them, the written-content model of
a copy-on-write (``WrittenBlocks.copy`` / ``partial_mismatch``) and the guard's rules for a
copy-on-write table and the copies drained (``GuardedManager.take_kv_cache_block_copies``), on
a small scripted fake whose answers are vLLM 0.33.0's (``hybrid_fine_grained``'s
``partial_hit_copies_on_write``)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from kvcheck.conformance.differential import Pair
from kvcheck.conformance.driver import Driver
from kvcheck.conformance.fine_grained import block_copies, fine_grained_hits, hash_block_size
from kvcheck.conformance.guard import GuardedManager, ProtocolViolation
from kvcheck.conformance.hybrid_edge_golden import HYBRID_EDGE_SCENARIOS
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.layouts import layout_for
from kvcheck.conformance.loader import ImplHandle, load_impl
from kvcheck.conformance.ops import add, free, schedule
from kvcheck.conformance.protocol import ImplInfo, KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.conformance.written import WrittenBlocks

F, S, C = "full_attention", "sliding_window", "chunked_local_attention"


def _mamba(block_size: int, mode: str = "align") -> KVCacheGroupSpec:
    return KVCacheGroupSpec("mamba", block_size, mamba_cache_mode=mode)


def _spec(*groups: KVCacheGroupSpec, caching: bool = True,
          profile: str = "vllm-0.33") -> KVCacheSpec:
    return KVCacheSpec(num_blocks=24, block_size=4, enable_caching=caching, profile=profile,
                       kv_cache_groups=groups)


# What vLLM 0.33.0 answers (KVCacheCoordinator.enable_partial_hash_hits and its hash block,
# read from managers built by kvcheck's vLLM adapter for these layouts).
@pytest.mark.parametrize(("spec", "hashed", "on", "copies"), [
    (_spec(KVCacheGroupSpec(F, 4), _mamba(8)), 4, True, True),
    (_spec(KVCacheGroupSpec(F, 8), _mamba(12)), 4, True, True),
    (_spec(KVCacheGroupSpec(F, 4), KVCacheGroupSpec(S, 4, sliding_window=4), _mamba(8)), 4,
     True, True),
    # A sliding window whose block is not the hash block keeps them off; a running request's
    # tail is still copied (block_copies).
    (_spec(KVCacheGroupSpec(F, 4), KVCacheGroupSpec(S, 8, sliding_window=4), _mamba(8)), 4,
     False, True),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4)), 4, False, False),  # Mamba at the hash block
    (_spec(KVCacheGroupSpec(F, 8), _mamba(8)), 8, False, False),
    (_spec(_mamba(8)), 8, False, False),  # one group: its block is the hash block
    (_spec(KVCacheGroupSpec(F, 4), _mamba(8, "none"), caching=False), 8, False, False),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(8), profile="vllm-0.10"), 4, False, False),
])
def test_layouts_with_fine_grained_hits(spec: KVCacheSpec, hashed: int, on: bool,
                                        copies: bool) -> None:
    assert hash_block_size(spec) == hashed
    assert fine_grained_hits(spec) is on
    assert block_copies(spec) is copies


# Recorded from vLLM 0.33.0 through the vLLM adapter and the driver (the same ops): the sliding
# window of 4-token blocks turns fine-grained lookups off, yet a's prompt tail state (EAGLE's
# boundary, 12 - 1 = 11 with the hash block 1) is keyed inside its Mamba block 10 and its
# next step copies it to block 11 (a's table unchanged), a retaining both until drained.
_TAIL_COPY_SPEC = KVCacheSpec(num_blocks=32, block_size=2, prefix_match_unit=1, use_eagle=True,
                              kv_cache_groups=(KVCacheGroupSpec(F, 2),
                                               KVCacheGroupSpec(S, 4, sliding_window=8),
                                               KVCacheGroupSpec("mamba", 4,
                                                                mamba_cache_mode="align",
                                                                is_eagle_group=True)))


def test_the_driver_drains_a_tail_copy_without_fine_grained_lookups() -> None:
    """The copy of a running request's own tail is drained (and its retained blocks released)
    where fine-grained lookups are off: without the drain two blocks stay referenced by nobody
    and conservation fails (found by the 2,000-example law run on the reference)."""
    spec = _TAIL_COPY_SPEC
    assert not fine_grained_hits(spec) and block_copies(spec)
    driver = Driver(load_impl("reference"), spec)
    for op in (add("a", list(range(1, 13))), schedule("a", 11), schedule("a", 1),
               add("b", [7]), schedule("b", 1), free("a"), free("b")):
        driver.apply(op)
        assert not check_laws(driver), op
    assert driver.drained == [(10, 11)]
    assert driver.drained_offloads == [{"a": [(2, 11, 11), (2, 10, 12)]}]
    assert driver.manager.num_free_blocks() == 31


_KINDS = (F, S, C, "mamba")


def test_fine_grained_layouts_are_drawn_only_where_declared() -> None:
    """Declaring ``fine_grained_hits`` changes only Mamba draws (a quarter of the caching-on
    ones), which then include layouts with the feature on and one a window keeps off."""
    on = off = 0
    for draw in range(400):
        plain = layout_for("vllm-0.33", _KINDS, 4, draw)
        fine = layout_for("vllm-0.33", _KINDS, 4, draw, fine_grained=True)
        if draw % 4 != 3:
            assert fine == plain, draw
            continue
        spec = _spec(*fine[0])
        assert fine[1] is None
        if fine_grained_hits(spec):
            on += 1
        elif any(g.kind == "mamba" and (g.block_size or 4) > hash_block_size(spec)
                 for g in fine[0]):
            off += 1  # a larger Mamba block, the feature kept off by a window
    assert on >= 20 and off >= 5, (on, off)
    # Never drawn for a release without it, nor with caching off.
    for draw in range(200):
        for profile, caching in (("vllm-0.10", True), ("vllm-0.33", False)):
            groups, _ = layout_for(profile, _KINDS, 4, draw, enable_caching=caching,
                                   fine_grained=True)
            assert not fine_grained_hits(_spec(*groups, caching=caching, profile=profile))


def _view(rid: str, tokens: tuple[int, ...]) -> RequestView:
    return RequestView(rid, tokens)


_A = tuple(range(100, 122))


def test_a_hit_ending_inside_a_block_is_judged_on_its_first_tokens() -> None:
    written = WrittenBlocks(8, fine=True)
    written.write(_view("a", _A), [1, 2, 3], 0, 20)  # block 3 holds tokens 16..19
    sharer = _view("c", (*_A[:21], 7, 7, 7))
    assert written.partial_mismatch(3, sharer, 2, 4) is None
    other = _view("d", (*_A[:17], 5, 5, 5, 5))
    problem = written.partial_mismatch(3, other, 2, 4)
    assert problem is not None and "its first 4 tokens [116, 5, 5, 5]" in problem
    assert written.partial_mismatch(3, sharer, 2, 5) is not None  # only 4 were written


def test_a_state_is_the_one_after_exactly_its_tokens() -> None:
    written = WrittenBlocks(12, fine=True, state=True)
    written.write(_view("a", _A), [-1, 4], 0, 20)  # the state after 20 tokens in block 4
    sharer = _view("c", (*_A[:21], 7, 7, 7))
    assert written.partial_mismatch(4, sharer, 1, 8) is None
    assert written.partial_mismatch(4, sharer, 1, 4) is not None  # the state after 16: no


def test_a_copy_holds_the_source_before_this_steps_writes() -> None:
    """vLLM's worker runs the step's copies before its forward pass: a Mamba producer's own
    partial state (20 tokens) is copied to a new block as it was, though the producer's step
    goes on writing into the source; the consumer's writes into its copy continue it."""
    written = WrittenBlocks(12, fine=True, state=True)
    a = _view("a", _A)
    written.write(a, [-1, 4], 0, 20)
    written.settle()  # the step ends
    written.write(a, [-1, 4], 20, 22)  # the next step's forward writes into the source...
    written.copy(4, 5)  # ...after its copy ran
    sharer = _view("c", (*_A[:21], 7, 7, 7))
    assert written.partial_mismatch(5, sharer, 1, 8) is None
    assert written.partial_mismatch(4, sharer, 1, 8) is not None  # the source moved on
    written.settle()
    written.clear([7])
    written.write(sharer, [-1, 7], 20, 24)  # the consumer's copy-on-write block, then its copy
    written.copy(5, 7)
    assert written.mismatch(7, sharer, 1) is None  # the block full: the request's own


# ---------------------------------------------------------------------- the guard
SPEC = _spec(KVCacheGroupSpec(F, 8), _mamba(12))


class ScriptedFine:
    """vLLM 0.33.0's answers of ``partial_hit_copies_on_write``'s requests 'a' and 'c'; the
    tables and copies each test sets are the ones its adapter shows."""

    def __init__(self, spec: KVCacheSpec) -> None:
        self.tables: dict[str, list[list[int]]] = {}
        self.answers = {"a": [[1, 2, 3], [0, 4]], "c": [[6], [7]]}
        self.cow = True
        self.copies: list[Any] = []

    def get_computed_blocks(self, request: RequestView) -> tuple[list[list[int]], int]:
        if request.request_id == "c":
            return [[1, 2, 3], [0, 5]], 20
        return [[], []], 0

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0, new_computed_block_ids: Any = (),
                       num_lookahead_tokens: int = 0) -> list[list[int]]:
        rid = request.request_id
        new = self.answers[rid]
        hits = [list(h) for h in new_computed_block_ids] or [[], []]
        if self.cow and rid == "c":
            self.tables[rid] = [h[:-1] + n for h, n in zip(hits, new, strict=True)]
        else:
            self.tables[rid] = [h + n for h, n in zip(hits, new, strict=True)]
        return new

    def get_block_ids(self, request_id: str) -> list[list[int]]:
        return [list(t) for t in self.tables.get(request_id, [[], []])]

    def take_kv_cache_block_copies(self) -> list[Any]:
        copies, self.copies = self.copies, []
        return copies

    def num_free_blocks(self) -> int:
        return 10


def _guarded(fake: ScriptedFine) -> GuardedManager:
    module = ModuleType("fake_fine")
    info = ImplInfo(name="fine", version="0", capabilities=frozenset(
        {"manager", "kv_cache_groups", "mamba", "fine_grained_hits"}), hash_algos=())
    handle = ImplHandle(info.name, module.__name__, module, info, lambda spec: fake, None,
                        call_timeout=None)
    mgr = handle.make_manager(SPEC)
    assert isinstance(mgr, GuardedManager)
    return mgr


def _admit_both(mgr: GuardedManager) -> None:
    a = _view("a", _A)
    mgr.allocate_slots(a, 20, 0, [[], []])
    c = _view("c", (*_A[:21], 7, 7, 7))
    hits, num = mgr.get_computed_blocks(c)
    assert num == 20  # a hit at hash-block granularity: 3 blocks of 8, 2 of 12
    mgr.allocate_slots(c, 4, num, hits)


def test_the_guard_follows_a_copy_on_write_and_its_copies() -> None:
    fake = ScriptedFine(SPEC)
    mgr = _guarded(fake)
    _admit_both(mgr)
    assert mgr.copy_on_writes == [("c", 0, 2, 3, 6), ("c", 1, 1, 5, 7)]
    assert mgr.get_block_ids("c") == [[1, 2, 6], [0, 7]]
    fake.copies = [[3, 6], [5, 7]]  # as the wire answers them: arrays
    assert mgr.take_kv_cache_block_copies() == [(3, 6), (5, 7)]
    assert mgr.copy_on_writes == []
    assert mgr.take_kv_cache_block_copies() == []


def test_a_copy_on_write_drained_again_is_refused() -> None:
    fake = ScriptedFine(SPEC)
    mgr = _guarded(fake)
    _admit_both(mgr)
    fake.copies = [(3, 6), (5, 7)]
    mgr.take_kv_cache_block_copies()
    fake.copies = [(3, 6)]
    with pytest.raises(ProtocolViolation, match="matches no copy-on-write seen in a table"):
        mgr.take_kv_cache_block_copies()


def test_a_table_without_copy_on_write_is_left_to_the_laws() -> None:
    fake = ScriptedFine(SPEC)
    fake.cow, fake.answers["c"] = False, [[6], [7]]
    mgr = _guarded(fake)
    _admit_both(mgr)
    assert mgr.copy_on_writes == [] and mgr.get_block_ids("c") == [[1, 2, 3, 6], [0, 5, 7]]


@pytest.mark.parametrize(("copies", "words"), [
    ([(3, 6)], "the copies drained lack (5, 7)"),
    ([(3, 6), (5, 7), (3, 6)], "the destination of two copies"),
    ([(5, 7), (3, 6)], "the copies come from groups [1, 0] in that order"),
    ([(3, 6), (5, 7), (4, 1)], "which request(s) ['a', 'c'] hold"),
    ([(3, 6), (5, 7), (4, 0)], "not a (src_block_id, dst_block_id) pair"),
    ([(3, 6, 1)], "not a (src_block_id, dst_block_id) pair"),
    ("copies", "must be a list of (src_block_id, dst_block_id) pairs"),
])
def test_the_guard_refuses_wrong_copies(copies: Any, words: str) -> None:
    fake = ScriptedFine(SPEC)
    mgr = _guarded(fake)
    _admit_both(mgr)
    fake.copies = copies
    with pytest.raises(ProtocolViolation) as refused:
        mgr.take_kv_cache_block_copies()
    assert words in str(refused.value), refused.value


def test_a_mamba_state_copy_is_accepted_once_per_answer() -> None:
    """A copy of a running request's own Mamba state (its table unchanged, the destination
    held by nobody) is accepted; its destination twice in one answer is not (a copy takes a
    new block: drained once). The destination may come back in a later drain: it went back
    to the free queue and was handed out again for another copy, unseen in any table."""
    fake = ScriptedFine(SPEC)
    mgr = _guarded(fake)
    mgr.allocate_slots(_view("a", _A), 20, 0, [[], []])
    fake.copies = [(4, 5)]
    assert mgr.take_kv_cache_block_copies() == [(4, 5)]
    fake.copies = [(4, 5)]
    assert mgr.take_kv_cache_block_copies() == [(4, 5)]
    fake.copies = [(4, 5), (4, 5)]
    with pytest.raises(ProtocolViolation, match="the destination of two copies"):
        mgr.take_kv_cache_block_copies()


# ---------------------------------------------------------------------- the loader
@pytest.mark.parametrize(("module", "extra", "words"), [
    ("nocopies_adapter", "", "lacks take_kv_cache_block_copies() (SupportsBlockCopies"),
    ("nomamba_adapter",
     "IMPL_INFO = replace(IMPL_INFO, capabilities=IMPL_INFO.capabilities - {'mamba'})\n",
     "IMPL_INFO declares 'fine_grained_hits' without 'mamba'"),
])
def test_the_loader_names_what_fine_grained_hits_needs(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, module: str, extra: str,
        words: str) -> None:
    """Declaring ``fine_grained_hits`` under vllm-0.33 needs ``take_kv_cache_block_copies``
    (vLLM's scheduler drains the copies there) and the ``mamba`` kind: the loader names the
    missing piece and the fix."""
    from kvcheck.conformance.loader import ImplLoadError, load_impl

    (tmp_path / f"{module}.py").write_text(
        "from kvcheck.adapters.reference import IMPL_INFO as _REF\n"
        "from kvcheck.adapters.reference import make_kv_cache_manager as _make\n"
        "from dataclasses import replace\n"
        "IMPL_INFO = replace(_REF, name='nocopies', capabilities=_REF.capabilities\n"
        "                    - {'block_pool', 'kernels', 'sizing'})\n"
        "assert 'fine_grained_hits' in IMPL_INFO.capabilities\n"
        + extra +
        "class Manager:\n"
        "    def __init__(self, inner):\n"
        "        self._inner = inner\n"
        "    def __getattr__(self, name):\n"
        "        if name == 'take_kv_cache_block_copies':\n"
        "            raise AttributeError(name)\n"
        "        return getattr(self._inner, name)\n"
        "def make_kv_cache_manager(spec):\n"
        "    return Manager(_make(spec))\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplLoadError) as info:
        load_impl(module)
    assert words in str(info.value), info.value


def test_a_hit_block_handed_out_anew_in_the_same_admission_is_the_requests_own() -> None:
    """A new request's first Mamba group releases its hit block (external tokens carry the
    state past it) and the second group gets that block as a new one in the same admission,
    as vLLM 0.33.0 answers (``hybrid_edge_golden``'s ``gated_async_load_two_mamba_groups``):
    the copy-on-write law no longer counts it as a read-only hit, while every other law and the
    oracle comparison still run."""
    sc = next(s for s in HYBRID_EDGE_SCENARIOS if s.name == "gated_async_load_two_mamba_groups")
    reference = load_impl("reference")
    pair = Pair(reference, reference, sc.spec())
    answers = [pair.apply(op) for op in sc.ops]
    c_hits, c_new = answers[9]["hits"][0], answers[9]["new"]
    released = set(c_hits[1]) & set(c_new[2])  # group 1's hit, group 2's new block
    assert released, f"the scenario no longer hands a hit block out anew: {answers[9]}"
    assert answers == list(sc.recorded.answers)
