"""vLLM 0.33's admission gates in the reference (docs/semantics.md#admission-gates):
``allocate_slots(..., full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)`` and the
``KVCacheManager(watermark=..., max_in_flight_tokens=...)`` they read, replayed call by call
against what vLLM 0.33.0's own ``KVCacheManager`` answered.

The scenarios, how their expected values were recorded from vLLM 0.33.0's own
``KVCacheManager`` and what each shows: ``kvcheck.conformance.admission_golden``. Replayed
here on the reference's manager itself; ``check_invariants`` must hold after every op.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvcheck.conformance.admission_golden import RECORDED, SCENARIOS, scenario_knobs, toks
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


def _spec(kind: str, block_size: int, size: int | None) -> KVCacheSpec:
    if kind == "full":
        return FullAttentionSpec(block_size)
    if kind == "window":
        assert size is not None
        return SlidingWindowSpec(block_size, sliding_window=size)
    assert size is not None
    return ChunkedLocalAttentionSpec(block_size, attention_chunk_size=size)


def build(name: str) -> tuple[KVCacheManager, list[tuple[Any, ...]]]:
    """The reference manager of scenario ``name`` (0.33, PYTHONHASHSEED 0) and its ops."""
    num_blocks, groups, max_model_len, watermark, max_in_flight, ops = SCENARIOS[name][:6]
    m = KVCacheManager(num_blocks, kv_cache_specs=[_spec(*g) for g in groups],
                       max_model_len=max_model_len, profile="vllm-0.33", pythonhashseed="0",
                       watermark=watermark, max_in_flight_tokens=max_in_flight,
                       **scenario_knobs(name))
    return m, ops


def replay(m: KVCacheManager, ops: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The ops run as the recording ran them on vLLM (see the module docstring); one answer
    per allocation."""
    reqs: dict[str, Request] = {}
    running: set[str] = set()
    out: list[tuple[Any, ...]] = []
    for op in ops:
        if op[0] == "req":
            reqs[op[1]] = m.make_request(op[1], op[2])
        elif op[0] == "free":
            m.free(reqs[op[1]])
            running.discard(op[1])
            reqs[op[1]].num_computed_tokens = 0
        else:
            req = reqs[op[1]]
            hits, n = None, 0
            if op[0] == "decode":
                req.append_output_token_ids([9999])
                num_new, gates = 1, op[2]
            else:
                num_new, gates = op[2], op[3]
                if op[1] not in running:
                    blocks, n = m.get_computed_blocks(req)
                    hits = blocks if n else None
            new = m.allocate_slots(req, num_new, n, hits, **gates)
            ids = None if new is None else [[b.block_id for b in g] for g in new]
            if new is not None:
                req.num_computed_tokens += n + num_new
                running.add(op[1])
            out.append((op[1], n, ids, m.num_free_blocks))
        m.check_invariants()
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_admission_gates_match_vllm(name: str) -> None:
    m, ops = build(name)
    assert replay(m, ops) == RECORDED[name]


def test_a_refused_gate_changes_nothing() -> None:
    """The full-sequence gate refuses before a window's skipped blocks are freed: the tables,
    the free queue and every reference count stay as they were; the same step without the
    gate frees them first and fits."""
    def state(m: KVCacheManager) -> tuple[Any, ...]:
        return ({r: m.get_block_ids(r) for r in ("a", "c")},
                [b.block_id for b in m.block_pool.free_block_queue],
                [b.ref_cnt for b in m.block_pool.blocks])

    for gated in (True, False):
        m = KVCacheManager(8, kv_cache_specs=[SlidingWindowSpec(4, sliding_window=8)],
                           max_model_len=1024, profile="vllm-0.33", pythonhashseed="0",
                           max_in_flight_tokens=8)
        assert m.coordinator.single_type_managers[0].max_admission_blocks_per_request == 5
        a = m.make_request("a", toks(0, 64))
        for _ in range(2):
            assert m.allocate_slots(a, 8) is not None
            a.num_computed_tokens += 8
        assert m.get_block_ids("a") == ([1, 2, 3, 4],)  # nothing skipped at 8 computed
        c = m.make_request("c", toks(100, 12))
        assert m.allocate_slots(c, 12) is not None  # the pool is full
        assert m.num_free_blocks == 0
        before = state(m)
        # The full sequence (16 blocks, capped at 5) needs 1 more than a's 4 entries.
        new = m.allocate_slots(a, 8, full_sequence_must_fit=gated)
        if gated:
            assert new is None
            assert state(m) == before
        else:  # blocks 1 and 2 leave the window (16 computed tokens), freed last first,
            # and hold the chunk
            assert new is not None and [b.block_id for b in new[0]] == [2, 1]
            assert m.get_block_ids("a") == ([0, 0, 3, 4, 2, 1],)


def test_mamba_admission_records_no_checkpoint() -> None:
    """vLLM 0.33 records a Mamba prefill checkpoint only outside the admission count
    (``apply_admission_cap`` skips ``_checkpoints``): the gate leaves it unrecorded."""
    m = KVCacheManager(64, kv_cache_specs=[
        FullAttentionSpec(4), MambaSpec(4, mamba_cache_mode="align",
                                        num_prefill_checkpoint_blocks=1,
                                        prefill_checkpoint_alignment=4)],
        profile="vllm-0.33", pythonhashseed="0")
    mamba = m.coordinator.single_type_managers[1]
    coordinator = m.coordinator
    req = m.make_request("a", toks(0, 40))
    blocks, _ = m.get_computed_blocks(req)
    full = coordinator.get_num_admission_blocks("a", 40, blocks, 0, 0, 0, 39)
    assert "a" not in mamba._checkpoints
    # The step's own count of the same 40 tokens records the checkpoint, one block more than
    # 10 attention blocks and Mamba's running state; the admission count leaves it as it is.
    assert coordinator.get_num_blocks_to_allocate_main("a", 40, blocks, 0, 40, 0, 39) == full
    recorded = dict(mamba._checkpoints)
    assert "a" in recorded
    assert coordinator.get_num_admission_blocks("a", 40, blocks, 0, 0, 0, 39) == full
    assert mamba._checkpoints == recorded


@pytest.mark.parametrize("kwargs", [{"full_sequence_must_fit": True}, {"reserved_blocks": 1}])
def test_vllm_010_has_no_gates(kwargs: dict[str, Any]) -> None:
    m = KVCacheManager(8, 4, profile="vllm-0.10", pythonhashseed="0")
    with pytest.raises(KVCacheMisuseError, match=r"0\.10\.2's allocate_slots has no admission"):
        m.allocate_slots(m.make_request("a", toks(0, 8)), 8, **kwargs)
    with pytest.raises(KVCacheMisuseError, match="no admission gates"):
        KVCacheManager(8, 4, profile="vllm-0.10", watermark=0.1)
    with pytest.raises(KVCacheMisuseError, match="no admission gates"):
        KVCacheManager(8, 4, profile="vllm-0.10", max_in_flight_tokens=8)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"watermark": 1.0}, "watermark must be a float in"),
    ({"watermark": -0.1}, "watermark must be a float in"),
    ({"watermark": "0.1"}, "watermark must be a float in"),
    ({"max_in_flight_tokens": 0}, "max_in_flight_tokens must be an int >= 1"),
    ({"max_in_flight_tokens": 2.5}, "max_in_flight_tokens must be an int >= 1"),
])
def test_bad_gate_settings_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(KVCacheMisuseError, match=match):
        KVCacheManager(8, 4, profile="vllm-0.33", **kwargs)


def test_bad_reserved_blocks_is_refused() -> None:
    m = KVCacheManager(8, 4, profile="vllm-0.33", pythonhashseed="0")
    with pytest.raises(KVCacheMisuseError, match="reserved_blocks must be an int >= 0"):
        m.allocate_slots(m.make_request("a", toks(0, 8)), 8, reserved_blocks=-1)
    assert m.num_free_blocks == 7
