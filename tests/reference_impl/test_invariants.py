"""check_invariants: it catches each kind of corruption, and random operation sequences on
the reference never trigger it (Hypothesis state machine, both profiles)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kv_helpers import PROFILES, make_manager

from kvcheck.reference_impl.block import make_block_hash_with_group_id
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.invariants import (
    InvariantViolation,
    check_invariants,
    check_manager_invariants,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


def test_clean_pool_passes() -> None:
    check_invariants(BlockPool(8))


def test_conservation_violation_names_every_term() -> None:
    pool = BlockPool(8)
    (b,) = pool.get_new_blocks(1)
    b.ref_cnt = 0  # a leaked block: neither free nor referenced
    with pytest.raises(InvariantViolation) as exc:
        check_invariants(pool)
    msg = str(exc.value)
    for term in ("free (6)", "evictable (0)", "referenced (0)", "total (8)", "reserved (1)"):
        assert term in msg
    assert "block 1: ref_cnt=0 but not in the free queue" in msg


def test_negative_ref_cnt_and_queued_referenced_block_are_reported() -> None:
    pool = BlockPool(4)
    pool.blocks[2].ref_cnt = -1
    with pytest.raises(InvariantViolation, match="block 2 has ref_cnt -1 < 0"):
        check_invariants(pool)


def test_counter_drift_is_reported() -> None:
    pool = BlockPool(4)
    pool.free_block_queue.num_free_blocks += 1
    with pytest.raises(InvariantViolation, match="counter is 4 but the queue holds 3"):
        check_invariants(pool)


def test_null_block_in_queue_is_reported() -> None:
    pool = BlockPool(4)
    pool.free_block_queue.append(pool.null_block)
    with pytest.raises(InvariantViolation, match="null block 0 is in the free queue"):
        check_invariants(pool)


def test_map_and_block_disagreement_is_reported() -> None:
    pool = BlockPool(4)
    key = make_block_hash_with_group_id(b"k" * 32, 0)
    pool.cached_block_hash_to_block.insert(key, pool.blocks[1])  # block carries no key
    with pytest.raises(InvariantViolation, match="points at block 1"):
        check_invariants(pool)
    pool2 = BlockPool(4)
    pool2.blocks[2].block_hash = key  # key on the block, absent from the map
    with pytest.raises(InvariantViolation, match="block 2 carries key"):
        check_invariants(pool2)


def test_manager_ref_cnt_must_match_block_tables() -> None:
    mgr = make_manager("vllm-0.33", 8)
    req = mgr.make_request("r", list(range(20)))
    mgr.allocate_slots(req, 20)
    mgr.block_pool.blocks[1].ref_cnt += 1  # a leak: one reference nobody holds
    with pytest.raises(InvariantViolation, match="block 1: ref_cnt=2 but 1 block-table"):
        check_manager_invariants(mgr)


def test_manager_tables_keep_the_group_laws() -> None:
    """Over every group's tables: no null block in a full-attention table, one group per
    block, a block's cache key names its group, and (0.33) the null block's ref_cnt is 0."""
    from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    mgr = make_manager("vllm-0.33", 8)
    req = mgr.make_request("r", list(range(20)))
    mgr.allocate_slots(req, 20)
    (full,) = mgr.coordinator.single_type_managers
    full.req_to_blocks["r"].append(mgr.block_pool.null_block)
    with pytest.raises(InvariantViolation, match="holds the null block in full-attention"):
        mgr.check_invariants()
    full.req_to_blocks["r"].pop()
    mgr.block_pool.null_block.ref_cnt = 1
    with pytest.raises(InvariantViolation, match="null block ref_cnt 1"):
        mgr.check_invariants()
    mgr.block_pool.null_block.ref_cnt = 0
    mgr.check_invariants()

    grouped = KVCacheManager(16, kv_cache_specs=[FullAttentionSpec(4), SlidingWindowSpec(4, 8)],
                             pythonhashseed="0")
    req = grouped.make_request("r", list(range(8)))
    grouped.allocate_slots(req, 8)
    full, swa = grouped.coordinator.single_type_managers
    swa.req_to_blocks["r"][0] = full.req_to_blocks["r"][0]  # one block in two groups
    with pytest.raises(InvariantViolation, match="one group per block: block 1"):
        grouped.check_invariants()


# ------------------------------------------------------------------ random operation sequences
BLOCK_SIZE = 4
# A few shared "system prompts" so random requests actually share cached prefixes.
PREFIXES = [list(range(100, 100 + n)) for n in (0, 4, 9, 16)]


class ManagerMachine(RuleBasedStateMachine):
    """Drives the reference like a scheduler (prefill, chunked prefill, decode, free, reset,
    pool pressure) and checks every pool law after every step."""

    profile = "vllm-0.33"

    @initialize(num_blocks=st.integers(2, 24), caching=st.booleans())
    def setup(self, num_blocks: int, caching: bool) -> None:
        self.mgr = make_manager(self.profile, num_blocks, BLOCK_SIZE, enable_caching=caching)
        self.running: dict[str, Request] = {}
        self.next_id = 0

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 2**31), max_size=12),
          chunk=st.integers(1, 40), skip=st.booleans())
    def add_request(self, prefix: list[int], tail: list[int], chunk: int, skip: bool) -> None:
        tokens = prefix + tail
        if not tokens:
            return
        req = self.mgr.make_request(f"r{self.next_id}", tokens, skip_reading_prefix_cache=skip)
        self.next_id += 1
        hits, num_hit = self.mgr.get_computed_blocks(req)
        assert num_hit <= req.num_tokens - 1 and num_hit % BLOCK_SIZE == 0
        assert all(not b.is_null for b in hits[0])
        num_new = min(chunk, req.num_tokens - num_hit)
        if num_new == 0 and self.profile == "vllm-0.10":
            return
        free_before = self.mgr.num_free_blocks
        new = self.mgr.allocate_slots(req, num_new, num_hit, hits)
        if new is None:
            assert self.mgr.num_free_blocks == free_before
            assert self.mgr.get_blocks(req.request_id) == ([],)
            assert not self.mgr.coordinator.is_running(req.request_id)
            return
        req.num_computed_tokens = num_hit + num_new
        self.running[req.request_id] = req

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), num_tokens=st.integers(1, 6))
    def step(self, data: st.DataObject, num_tokens: int) -> None:
        """Continue a chunked prefill, or decode `num_tokens` new tokens."""
        req = self.running[data.draw(st.sampled_from(sorted(self.running)), label="request")]
        remaining = req.num_tokens - req.num_computed_tokens
        if remaining == 0:
            req.append_output_token_ids(list(range(7, 7 + num_tokens)))
            remaining = num_tokens
        num_new = min(remaining, num_tokens)
        if self.mgr.allocate_slots(req, num_new) is not None:
            req.num_computed_tokens += num_new

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)), label="request")
        self.mgr.free(self.running.pop(rid))

    @rule()
    def reset(self) -> None:
        ok = self.mgr.reset_prefix_cache()
        assert ok == (not self.running or all(
            not self.mgr.get_blocks(r)[0] for r in self.running))

    @invariant()
    def laws_hold(self) -> None:
        check_manager_invariants(self.mgr)
        for rid in self.running:
            assert 0 not in self.mgr.get_block_ids(rid)[0]


_settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("profile", PROFILES)
def test_random_operation_sequences_keep_invariants(profile: str) -> None:
    machine = type(f"ManagerMachine_{profile}", (ManagerMachine,), {"profile": profile})
    _settings(machine).TestCase().runTest()
