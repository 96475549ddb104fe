"""The harness side of Mamba prefill checkpoints and sparse Mamba retention
(``kvcheck.conformance.mamba_checkpoints``): when a chunk exports a checkpoint, the layouts
drawn for a design declaring ``mamba_checkpoints``, the written-content model of a checkpoint
block (``WrittenBlocks.write_state``) and the hit law's teeth on it (a mutant keying the
checkpoint at its block's end is caught by the laws alone, without the golden answers)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.hybrid_mamba_checkpoints import CHECKPOINT_SCENARIOS
from kvcheck.conformance.laws import _placement_problems, check_laws
from kvcheck.conformance.layouts import layout_for
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.mamba_checkpoints import checkpoint_groups, checkpoint_of
from kvcheck.conformance.ops import add, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.conformance.written import WrittenBlocks

F = "full_attention"
MUTANTS_DIR = Path(__file__).resolve().parents[1] / "mutants"


def _mamba(block_size: int, alignment: int | None = 1, blocks: int = 1) -> KVCacheGroupSpec:
    return KVCacheGroupSpec("mamba", block_size, mamba_cache_mode="align",
                            num_prefill_checkpoint_blocks=blocks,
                            prefill_checkpoint_alignment=alignment)


def _spec(*groups: KVCacheGroupSpec, retention: int | None = None,
          profile: str = "vllm-0.33") -> KVCacheSpec:
    return KVCacheSpec(num_blocks=32, block_size=4, kv_cache_groups=groups, profile=profile,
                       prefix_cache_retention_interval=retention)


_VIEW22 = RequestView("a", tuple(range(22)))
_VIEW30 = RequestView("a", tuple(range(30)))


# Expected: vLLM 0.33.0's get_mamba_prefill_checkpoint_position (at the hit alignment) and
# is_mamba_prefill_checkpoint_valid, run on these chunks; the index is cdiv(end, bs) - 2.
@pytest.mark.parametrize(("spec", "view", "start", "end", "want"), [
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4)), _VIEW22, 0, 22, (20, 4)),
    # The hit alignment is the scheduler block, 8: the state at 16 in the block at index 4.
    (_spec(KVCacheGroupSpec(F, 8), _mamba(4)), _VIEW22, 0, 22, (16, 4)),
    # Fine-grained hits (Mamba 8, hash block 4): the state at 20 inside the block at index 1.
    (_spec(KVCacheGroupSpec(F, 4), _mamba(8)), _VIEW22, 0, 22, (20, 1)),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4)), _VIEW30, 12, 30, (28, 6)),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4)), _VIEW22, 8, 16, (12, 2)),
    # Off the alignment grid from the chunk start (20 % 8), too close to the start (4 + 4 >
    # 4), a chunk of one block, a start inside a hash block.
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4, 8)), _VIEW22, 0, 22, None),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4)), _VIEW22, 4, 8, None),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4)), _VIEW22, 0, 4, None),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4)), _VIEW22, 2, 22, None),
    # Retention 0: only the chunk reaching the prefill end (30).
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4), retention=0), _VIEW30, 0, 12, None),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4), retention=0), _VIEW30, 12, 30, (28, 6)),
    # No alignment (the backend exports none), no checkpoint blocks, vLLM 0.10.2.
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4, None)), _VIEW22, 0, 22, None),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4, 1, 0)), _VIEW22, 0, 22, None),
    (_spec(KVCacheGroupSpec(F, 4), _mamba(4), profile="vllm-0.10"), _VIEW22, 0, 22, None),
])
def test_checkpoint_of_is_vllms_rule(spec: KVCacheSpec, view: RequestView, start: int,
                                     end: int, want: tuple[int, int] | None) -> None:
    assert checkpoint_of(spec, len(spec.groups) - 1, view, start, end) == want


def test_checkpoint_groups() -> None:
    assert checkpoint_groups(_spec(KVCacheGroupSpec(F, 4), _mamba(4))) == {1}
    assert checkpoint_groups(_spec(KVCacheGroupSpec(F, 4), _mamba(4, None))) == set()
    assert checkpoint_groups(_spec(KVCacheGroupSpec(F, 4), _mamba(4),
                                   profile="vllm-0.10")) == set()


def test_write_state_records_the_state_at_its_position() -> None:
    """A checkpoint block written as the table's index 1 but holding the state after 12
    tokens holds request a's prefix through its block 2 (index 2 of blocks of 4), not 1."""
    written = WrittenBlocks(4, state=True)
    view = RequestView("a", tuple(range(16)))
    written.write(view, [-1, 7, 8, 9], 0, 16)
    written.write_state(view, 7, 12)
    assert written.mismatch(7, view, 2) is None
    assert written.mismatch(7, view, 1) is not None


_KINDS = (F, "sliding_window", "chunked_local_attention", "mamba")


def test_checkpoint_layouts_are_drawn_only_where_declared() -> None:
    """Declaring ``mamba_checkpoints`` adds checkpoint fields (and a retention interval) to
    some caching-on Mamba draws and changes nothing else: the same groups otherwise."""
    drawn = retained = 0
    for block_size in (1, 2, 4, 8):
        for draw in range(200):
            plain = layout_for("vllm-0.33", _KINDS, block_size, draw, fine_grained=True)
            with_ = layout_for("vllm-0.33", _KINDS, block_size, draw, fine_grained=True,
                               checkpoints=True)
            cleared = tuple(dataclasses.replace(g, num_prefill_checkpoint_blocks=0,
                                                prefill_checkpoint_alignment=None)
                            for g in with_[0])
            assert cleared == plain[0], (block_size, draw)
            if with_ != plain:
                assert any(g.kind == "mamba" for g in with_[0])
                drawn += 1
                retained += with_[1] is not None
            assert layout_for("vllm-0.10", _KINDS, block_size, draw,
                              checkpoints=True) == layout_for("vllm-0.10", _KINDS, block_size,
                                                              draw)
    assert drawn > 50 and retained > 20, (drawn, retained)


def test_reference_keeps_the_laws_on_the_golden_scenarios() -> None:
    impl = load_impl("reference")
    for sc in CHECKPOINT_SCENARIOS:
        spec = KVCacheSpec(num_blocks=sc.num_blocks, block_size=4, kv_cache_groups=sc.groups,
                           prefix_cache_retention_interval=sc.retention)
        driver = Driver(impl, spec)
        for op in sc.ops:
            driver.apply(op)
            assert not check_laws(driver), (sc.name, op)


def test_hit_law_catches_a_checkpoint_keyed_at_its_block_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant keys the checkpoint at 20 (fine-grained: inside the block at index 1) at
    16, its block's end: the request sharing 21 tokens hits 16 tokens on a block holding the
    state after 20, which the hit law reports (no golden answer involved)."""
    monkeypatch.syspath_prepend(str(MUTANTS_DIR))
    impl = load_impl("hybrid_checkpoint_keyed_at_block_end")
    sc = next(s for s in CHECKPOINT_SCENARIOS if s.name == "checkpoint_inside_a_block")
    spec = KVCacheSpec(num_blocks=sc.num_blocks, block_size=4, kv_cache_groups=sc.groups)
    driver = Driver(impl, spec)
    problems: list[str] = []
    for op in sc.ops:
        driver.apply(op)
        problems += check_laws(driver)
    assert any(p.startswith("hit correctness") for p in problems), problems
    sys.modules.pop("hybrid_checkpoint_keyed_at_block_end", None)


# Recorded from vLLM 0.33.0 through the vLLM adapter and the driver (the same ops): r0's
# checkpoint of the state after p = 16 - L = 14 tokens sits at its column cdiv(16, 1) - 2 = 14
# (block 1; block 19 in the second Mamba group), and r1, sharing the prompt, hits it at the
# state's own index p - 1 = 13. Found by the seed-1 2,000-example multi-group differential.
_LOOKAHEAD_CHECKPOINT_TABLES = {
    "r0": [[0] * 14 + [1, 2], list(range(3, 19)), [0] * 14 + [19, 20]],
    "r1": [[0] * 13 + [1, 0, 21], list(range(3, 17)) + [22, 23], [0] * 13 + [19, 0, 24]],
}


def test_a_checkpoint_under_hash_lookahead_is_shared_at_two_indices() -> None:
    """Under hash lookahead 2 vLLM 0.33.0 holds a prefill checkpoint block at its producer's
    column and at a hit's lower state index: the placement law allows that in a checkpoint
    group (the hit law still judges the content), and reports the same placement in a group
    without checkpoint blocks."""
    spec = KVCacheSpec(num_blocks=64, block_size=1, num_hash_lookahead_tokens=2,
                       kv_cache_groups=(_mamba(1), KVCacheGroupSpec(F, 1), _mamba(1)))
    driver = Driver(load_impl("reference"), spec)
    prompt = list(range(1, 17))
    # r1's first try shares r0's step (refused: r0's states are not written yet); the next
    # step admits it on the 14-token hit.
    for op in (add("r0", prompt), schedule("r0", 16), add("r1", prompt), schedule("r1"),
               schedule("r1")):
        driver.apply(op)
        assert not check_laws(driver), op
    assert driver.tables() == _LOOKAHEAD_CHECKPOINT_TABLES
    where = {1: [("r0", 0, 14), ("r1", 0, 13)]}
    assert _placement_problems(where, checkpoint_groups(spec)) == []
    plain = dataclasses.replace(spec, kv_cache_groups=(
        _mamba(1, None, 0), KVCacheGroupSpec(F, 1), _mamba(1, None, 0)))
    assert _placement_problems(where, checkpoint_groups(plain)) != []
    assert _placement_problems({1: [("r0", 0, 14), ("r1", 2, 13)]},
                               checkpoint_groups(spec)) != []  # another group: never
