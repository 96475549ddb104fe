"""Random workloads at a design's own large block sizes (issue 24, item 4, for the generated
workloads).

The workload machine (``kvcheck.conformance.workload_machine``), the sliding windows of its
hybrid layouts and the slot-uniqueness property test draw lengths written for 4-token blocks.
At a declared block size none of the usual ones (1, 2, 4, 8) they are scaled by
``workload_scale`` (``block_size // 4``: 64 at 256), so a design supporting only 256-token
blocks gets what a design gets at 4: requests of several blocks, shared prefixes, hits, a full
pool and eviction, instead of prompts of a few dozen tokens in a pool of 2 blocks. Under the
vLLM profiles and without declared sizes the scale is 1 and nothing changes.

Each run uses the reference with ``ImplInfo.block_sizes`` replaced; every run is derandomized
without shrinking (40 examples, the suite's default ``--kv-max-examples``, where features are
counted; fewer where ops are compared), so its examples depend only on the code.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from inner_runs import NoShrinkProfile
from kv_helpers import reference_capabilities_source

import kvcheck.conformance
import kvcheck.conformance.scaled_workloads as scaled
import kvcheck.conformance.test_slot_mapping as slot_test
import kvcheck.conformance.workload_machine as machine
from kvcheck.conformance.differential import Pair
from kvcheck.conformance.driver import Driver, StepResult
from kvcheck.conformance.groups import null_of
from kvcheck.conformance.layouts import WINDOWS, declared_kinds
from kvcheck.conformance.loader import ImplHandle, load_impl
from kvcheck.conformance.ops import Op, add, decode, schedule
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, effective_capabilities
from kvcheck.conformance.scaled_workloads import ScaledDriver, scaled_tokens, workload_scale
from kvcheck.conformance.workload_machine import (
    answer_block_ids,
    run_workload_machine,
    spec_fields,
)

pytest_plugins = ["pytester"]

INVARIANTS = kvcheck.conformance.__file__.replace("__init__.py", "test_invariants.py")


def _reference_at(block_sizes: tuple[int, ...] | None, profile: str = "generic",
                  num_blocks_range: tuple[int, int] | None = None) -> ImplHandle:
    """The reference declaring ``block_sizes`` (and a pool range) under ``profile``."""
    ref = load_impl("reference")
    return replace(ref, name="sized", info=replace(
        ref.info, name="sized", profile=profile, block_sizes=block_sizes,
        num_blocks_range=num_blocks_range))


class _RecordingPair(Pair):
    """A laws-only ``Pair`` that keeps, per op, its kind, request, the blocks it spans (an
    ``add``: all and full ones) and the block ids answered (hits, new)."""

    def __init__(self, impl: ImplHandle, spec: KVCacheSpec) -> None:
        super().__init__(impl, None, spec)
        self.answers: list[tuple[object, ...]] = []

    def apply(self, op: Op) -> StepResult:
        got = super().apply(op)
        bs = self.spec.block_size
        spans = ((-(-len(op["prompt"]) // bs), len(op["prompt"]) // bs)
                 if op["op"] == "add" else ())
        hits = got["hits"][0] if "hits" in got else None
        self.answers.append((op["op"], op.get("rid"), spans, hits, got.get("new")))
        return got


def _settings(examples: int) -> settings:
    """Derandomized, no shrinking (the examples depend only on the code and ``examples``)."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck))


def _run(impl: ImplHandle, *, extras: bool = False, profile: str = "generic",
         examples: int = 40, hybrid_layouts: bool = False,
         ) -> tuple[list[_RecordingPair], Counter[str]]:
    """The suite's laws-only random workloads on ``impl`` under ``profile`` (40 derandomized
    examples by default, no shrinking; with ``hybrid_layouts`` the hybrid test's multi-group
    layouts of the kinds ``impl`` declares): its pairs and the features reached."""
    pairs: list[_RecordingPair] = []
    stats: Counter[str] = Counter()

    def make(**fields: Any) -> Pair:
        pairs.append(_RecordingPair(impl, KVCacheSpec(profile=profile, **fields)))
        return pairs[-1]

    kinds = declared_kinds(effective_capabilities(impl.info, profile)) if hybrid_layouts else ()
    run_workload_machine(make, _settings(examples), None, extras=extras, events=False,
                         impl=impl, profile=profile, stats=stats, random_roots=True,
                         group_kinds=kinds)
    return pairs, stats


def _slot_test_tables(impl: ImplHandle, profile: str, examples: int = 40,
                      ) -> list[tuple[int, Op, tuple[tuple[int, ...], ...]]]:
    """The suite's slot-uniqueness property test (``test_slots_unique_except_shared_prefix_
    blocks``, derandomized) on ``impl``: per op its block size, the op as applied and the
    block tables of the running requests after it."""
    seen: list[tuple[int, Op, tuple[tuple[int, ...], ...]]] = []
    plain_apply = Driver.apply

    def apply(driver: Driver, op: Op) -> StepResult:
        got = plain_apply(driver, op)
        seen.append((driver.spec.block_size, op, tuple(
            tuple(driver.manager.get_block_ids(r)) for r in sorted(driver.running))))
        return got

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Driver, "apply", apply)  # ScaledDriver.apply ends in it
        slot_test.test_slots_unique_except_shared_prefix_blocks(
            impl, profile, _settings(examples), None)
    return seen


def _unscaled(patch: pytest.MonkeyPatch) -> None:
    """Every random workload run as written (scale 1), whatever the design declares."""
    for module in (machine, scaled):
        patch.setattr(module, "workload_scale", lambda *args: 1)


def _most_blocks(pairs: list[_RecordingPair]) -> int:
    """The most blocks any request was answered in one admission or step, plus its table."""
    held: Counter[str] = Counter()
    most = 0
    for pair in pairs:
        held.clear()
        null = null_of(pair.spec)
        for kind, rid, _, hits, new in pair.answers:
            if kind == "free":
                held.pop(str(rid), None)
            elif kind in ("schedule", "decode") and new is not None:
                held[str(rid)] += (len(answer_block_ids(hits or (), null))
                                   + len(answer_block_ids(new, null)))
                most = max(most, held[str(rid)])
    return most


# ---------------------------------------------------------------- the scale
@pytest.mark.parametrize(("block_sizes", "profile", "block_size", "scale"), [
    (None, "generic", 4, 1),  # no declared sizes (the reference): as written
    ((256,), "vllm-0.33", 256, 1),  # the vLLM profiles: as written
    ((256,), "vllm-0.10", 256, 1),
    ((4, 256), "generic", 4, 1),  # a usual size
    ((1, 2, 4, 8), "generic", 8, 1),
    ((256,), "generic", 256, 64),
    ((256, 512, 768), "generic", 768, 192),
    ((16,), "generic", 16, 4),
    ((6,), "generic", 6, 1),  # under two 4-token blocks: as written
    ((3,), "generic", 3, 1),
])
def test_workload_scale(block_sizes: tuple[int, ...] | None, profile: str, block_size: int,
                        scale: int) -> None:
    info = ImplInfo("x", "1", block_sizes=block_sizes)
    assert workload_scale(block_size, info, profile) == scale
    assert workload_scale(block_size, None, profile) == 1  # no design: as written


def test_scaled_tokens_keep_shared_prefixes_and_token_ids() -> None:
    """Each token repeated: prompts sharing n tokens share n * scale scaled; the ids (every
    serialized integer width) are the same; scale 1 is the identity."""
    a, b = [1, 2, 2**31, 7], [1, 2, 2**31, 8, 9]
    assert scaled_tokens(a, 3) == [1, 1, 1, 2, 2, 2, 2**31, 2**31, 2**31, 7, 7, 7]
    sa, sb = scaled_tokens(a, 64), scaled_tokens(b, 64)
    common = next(i for i, (x, y) in enumerate(zip(sa, sb, strict=False)) if x != y)
    assert (len(sa), len(sb), common) == (256, 320, 3 * 64)
    assert set(sa) == set(a)
    assert scaled_tokens(a, 1) == a and scaled_tokens(a, 1) is not a


# ---------------------------------------------------------------- the machine at 256
def test_workloads_at_256_are_the_workloads_at_4_block_for_block() -> None:
    """A design declaring only 256 gets the examples a design declaring only 4 gets, scaled:
    the same pools, ops and requests, each prompt spanning the same blocks, every answer the
    same block ids, the same features reached (so the draws do not depend on the scale)."""
    at_4, stats_4 = _run(_reference_at((4,)), examples=20)
    at_256, stats_256 = _run(_reference_at((256,)), examples=20)
    assert [p.spec.num_blocks for p in at_256] == [p.spec.num_blocks for p in at_4]
    assert {p.spec.block_size for p in at_256} == {256}
    assert [p.spec.max_model_len for p in at_256] == [
        None if p.spec.max_model_len is None else 64 * p.spec.max_model_len for p in at_4]
    for mine, usual in zip(at_256, at_4, strict=True):
        assert mine.answers == usual.answers, (mine.ops[:20], usual.ops[:20])
    assert stats_256 == stats_4


def test_random_workloads_at_256_fill_share_hit_and_evict_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At 256 the suite's random workloads (40 examples) reach prefix hits, hits on blocks
    another running request holds, a full pool, refused allocations, preemption, eviction of
    cached blocks and hits on evicted-and-reused ones, with requests of many blocks. Unscaled
    (the workloads before), prompts of a few dozen tokens fit one block: no request ever held
    more than 2 blocks, and no block was shared."""
    impl = _reference_at((256,))
    pairs, stats = _run(impl, extras=True)
    reached = ("prefix_hit", "shared_block_hit", "full_pool", "allocation_refused",
               "preempted_for_room", "cached_block_evicted", "hit_on_evicted_and_reused_block",
               "touch_free_queue_head", "touch_free_queue_tail", "extra_keys:mm")
    assert all(stats[f] >= 5 for f in reached), {f: stats[f] for f in reached}
    assert _most_blocks(pairs) >= 8, _most_blocks(pairs)
    assert {p.spec.block_size for p in pairs} == {256}

    monkeypatch.setattr(machine, "workload_scale", lambda *args: 1)
    before, old = _run(impl, extras=True)
    assert _most_blocks(before) <= 2 and not old["shared_block_hit"], (
        _most_blocks(before), dict(old))


def test_declared_pool_range_and_several_large_sizes() -> None:
    """Sizes 256, 512 and 768 with pools of 32..64 blocks: each size is drawn, every pool is
    within the range, and hits, shared blocks, a full pool and eviction are still reached."""
    pairs, stats = _run(_reference_at((256, 512, 768), num_blocks_range=(32, 64)),
                        examples=20)
    assert {p.spec.block_size for p in pairs} == {256, 512, 768}
    assert all(32 <= p.spec.num_blocks <= 64 for p in pairs)
    reached = ("prefix_hit", "shared_block_hit", "full_pool", "cached_block_evicted")
    assert all(stats[f] for f in reached), {f: stats[f] for f in reached}


def _tables_shared(tables: tuple[tuple[int, ...], ...]) -> bool:
    """Whether a block id is in two running requests' tables (a shared prefix block)."""
    ids = [b for table in tables for b in table]
    return len(ids) != len(set(ids))


def test_hybrid_workloads_at_256_share_hit_and_evict_blocks() -> None:
    """The hybrid test's multi-group layouts at 256 (sliding windows 64 times ``WINDOWS``):
    prompts of several full blocks, prefix hits, hits on blocks another running request
    holds, a full pool and eviction of cached blocks."""
    pairs, stats = _run(_reference_at((256,)), examples=20, hybrid_layouts=True)
    assert {p.spec.block_size for p in pairs} == {256}
    assert any(len(p.spec.kv_cache_groups) > 1 for p in pairs)
    # The machine's scale reaches the layouts: windows of as many blocks as at 4.
    drawn = {g.sliding_window for p in pairs for g in p.spec.kv_cache_groups
             if g.sliding_window is not None}
    assert drawn and drawn <= {64 * w for w in WINDOWS}, drawn
    # Drawn prompts (not fill_pool's, whose lengths are in blocks already: token ids from
    # 100_000) of several full blocks.
    full_blocks = max(len(op["prompt"]) // 256 for p in pairs for op in p.ops
                      if op["op"] == "add" and max(op["prompt"]) < 100_000)
    assert full_blocks >= 4, full_blocks
    reached = ("prefix_hit", "shared_block_hit", "full_pool", "cached_block_evicted")
    assert all(stats[f] >= 5 for f in reached), {f: stats[f] for f in reached}


def test_slot_property_test_at_256_spans_and_shares_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The slot-uniqueness property test at 256 (``ScaledDriver``) runs requests of several
    blocks whose full prefix blocks are shared; unscaled, its prompts of up to 22 tokens fit
    one block and no block is ever shared."""
    tables = _slot_test_tables(_reference_at((256,)), "generic")
    assert {bs for bs, _, _ in tables} == {256}
    most = max((len(t) for _, _, running in tables for t in running), default=0)
    assert most >= 4, most
    assert sum(_tables_shared(running) for _, _, running in tables) >= 10

    _unscaled(monkeypatch)
    tables = _slot_test_tables(_reference_at((256,)), "generic")
    most = max((len(t) for _, _, running in tables for t in running), default=0)
    assert most <= 1 and not any(_tables_shared(running) for _, _, running in tables), most


@pytest.mark.parametrize(("profile", "block_sizes"), [
    ("vllm-0.33", (256,)), ("vllm-0.10", (256, 512)), ("generic", (1, 2, 4, 8))])
def test_vllm_profiles_and_usual_sizes_run_every_op_as_written(
        profile: str, block_sizes: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a vLLM profile (a generic design declaring 256-token blocks, run with
    ``--kv-profile=vllm-*``) and at the usual sizes, the machine, its hybrid layouts and the
    slot test run exactly the ops they run with the scaling taken out: the same specs (block
    sizes, pools, windows), ops, lengths and answers. So the examples of the vLLM profiles,
    and of designs without large declared sizes, are those of the workloads as written."""
    impl = _reference_at(block_sizes)

    def workloads() -> tuple[list[tuple[KVCacheSpec, list[Op], list[tuple[object, ...]]]],
                             list[tuple[int, Op, tuple[tuple[int, ...], ...]]]]:
        pairs = _run(impl, profile=profile, examples=12)[0] + _run(
            impl, profile=profile, examples=8, hybrid_layouts=True)[0]
        return ([(p.spec, list(p.ops), p.answers) for p in pairs],
                _slot_test_tables(impl, profile, examples=20))

    scaled_ops, scaled_slots = workloads()
    # The sizes at which generic would scale (all of them drawn) and the usual ones.
    assert {spec.block_size for spec, _, _ in scaled_ops} == set(block_sizes)
    _unscaled(monkeypatch)
    as_written_ops, as_written_slots = workloads()
    assert scaled_ops == as_written_ops
    assert scaled_slots == as_written_slots


# ---------------------------------------------------------------- a bug only large requests show
_LEAKY = """
from dataclasses import replace
import kvcheck.adapters.reference as _ref
from kvcheck.conformance.protocol import UnsupportedSpec

IMPL_INFO = replace(_ref.IMPL_INFO, name="leak_256", profile="generic", block_sizes=(256,),
                    capabilities={capabilities})


class LeakyManager(_ref.ReferenceManager):
    # BUG: freeing a request that held 3 blocks or more keeps a reference on its last block,
    # which is then never free again.
    def free(self, request_id):
        ids = self.manager.get_block_ids(request_id)[0]  # the one group's table
        if len(ids) >= {threshold}:
            self.manager.block_pool.blocks[ids[-1]].ref_cnt += 1
        super().free(request_id)


def make_kv_cache_manager(spec):
    if spec.block_size != 256:
        raise UnsupportedSpec("leak_256 supports 256-token blocks only")
    return LeakyManager(spec)
"""


def _laws_test(pytester: pytest.Pytester, threshold: int) -> pytest.HookRecorder:
    """``test_laws_hold_under_random_workloads`` in-process (generic, the default
    --kv-max-examples, no shrinking) on a reference that leaks a block when freeing a request
    of ``threshold`` blocks or more (its own invariant checker left out: the laws must see
    it)."""
    caps = reference_capabilities_source("_ref.IMPL_INFO.capabilities",
                                         drop=["block_pool", "invariants"])
    pytester.makepyfile(leak_256=_LEAKY.format(capabilities=caps, threshold=threshold))
    pytester.syspathinsert()
    ini = pytester.makeini("[pytest]\n")
    with pytest.MonkeyPatch.context() as patch:
        # The child pytest counting the whole suite for a partial run's verdict: only the
        # outcome is read.
        for name, module in list(sys.modules.items()):
            if name.startswith("kvcheck.plugin") and hasattr(module, "inventory_subprocess"):
                patch.setattr(module, "inventory_subprocess", lambda *a, **k: None)
        return pytester.inline_run(
            "--kv-impl=leak_256", "--kv-profile=generic", "-p", "no:cacheprovider",
            "-p", "no:terminal", "-c", str(ini), f"{INVARIANTS}::"
            "test_laws_hold_under_random_workloads", plugins=[NoShrinkProfile()])


def test_laws_catch_a_leak_only_requests_of_3_blocks_show_at_256(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's random-workload laws test fails the leak at the default settings, naming
    conservation and the lost block; the workloads before (unscaled: a request rarely spans
    more than 2 blocks of 256 tokens) passed it."""
    passed, _, failed = _laws_test(pytester, 3).listoutcomes()
    assert not passed and len(failed) == 1, (passed, failed)
    text = str(failed[0].longrepr)
    assert "conservation: num_free_blocks()" in text and "(a block was lost)" in text, (
        text[-2000:])

    monkeypatch.setattr(machine, "workload_scale", lambda *args: 1)
    passed, _, failed = _laws_test(pytester, 3).listoutcomes()
    assert len(passed) == 1 and not failed, [str(r.longrepr)[-800:] for r in failed]


# ---------------------------------------------------------------- hybrid windows, slot test
def test_hybrid_windows_scale_with_the_workloads() -> None:
    """A hybrid design declaring only 256 gets sliding windows 64 times ``WINDOWS`` (as many
    blocks as at 4); under the vLLM profiles, or without declared sizes, the windows drawn."""
    kinds = ("full_attention", "sliding_window")

    def windows(block_size: int, info: ImplInfo, profile: str) -> set[int]:
        scale = workload_scale(block_size, info, profile)
        made = [spec_fields(num_blocks, block_size, group_kinds=kinds, profile=profile,
                            scale=scale) for num_blocks in range(4, 40)]
        return {g.sliding_window for f in made for g in f["kv_cache_groups"]
                if g.sliding_window is not None}

    caps = frozenset({"manager", "kv_cache_groups", "sliding_window"})
    large = ImplInfo("x", "1", capabilities=caps, block_sizes=(256, 512, 1024))
    assert windows(256, large, "generic") == {64 * w for w in WINDOWS}
    assert windows(256, large, "vllm-0.33") == set(WINDOWS)
    assert windows(4, ImplInfo("y", "1", capabilities=caps), "generic") == set(WINDOWS)


def test_slot_test_driver_scales_ops_only_at_large_declared_sizes() -> None:
    """The slot-uniqueness test's driver runs its ops as given at scale 1 (the same calls as
    a plain driver) and at 256 scales prompts and prefill chunks, and decode steps only for
    a design with multi_token_decode: two prompts sharing 8 drawn tokens share two full
    blocks of 256."""
    ops: list[Op] = [add("a", range(1, 11)), schedule("a", 3), schedule("a"), decode("a", 2),
                     add("b", [*range(1, 9), 40]), schedule("b")]
    usual = ScaledDriver(_reference_at(None), KVCacheSpec(16, 4, profile="generic"))
    usual.run(ops)
    assert usual.scale == 1 and usual.views["a"].num_tokens == 12
    assert usual.views["b"].num_computed_tokens == 9

    big = ScaledDriver(_reference_at((256,)), KVCacheSpec(16, 256, profile="generic"))
    big.run(ops)
    assert big.scale == 64
    assert big.views["a"].num_tokens == 64 * 10 + 128  # a 2-token decode step, scaled
    assert big.views["b"].num_computed_tokens == 64 * 9
    table_a, table_b = (big.manager.get_block_ids(r) for r in "ab")
    assert table_a[:2] == table_b[:2] and len(table_b) == 3, (table_a, table_b)
    one_token = replace(_reference_at((256,)), info=replace(
        _reference_at((256,)).info,
        capabilities=_reference_at((256,)).info.capabilities - {"multi_token_decode"}))
    plain = ScaledDriver(one_token, KVCacheSpec(16, 256, profile="generic"))
    plain.run(ops[:3] + [decode("a", 1)])
    assert plain.views["a"].num_tokens == 64 * 10 + 1  # one token per decode step
