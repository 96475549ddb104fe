"""Bug (invariants.py): the conservation law counts an in-use block once per holder
(``sum(ref_cnt)``) instead of once, so the engine's own invariant check fails whenever a prefix
block is shared.

The pool is fine; its self-check is wrong, and a debug build that asserts it crashes on the
first shared prefix. It is sglang#35270 (peer-systems §4 #14): ``evictable_size`` double-counted
shared pages, so the idle-time invariant raised.
"""

from __future__ import annotations

from _mutant_base import MutantManager, build

from kvcheck.reference_impl.invariants import InvariantViolation, check_manager_invariants


class DoubleCountingCheck(MutantManager):
    def check_invariants(self) -> None:
        check_manager_invariants(self.manager)
        pool = self.manager.block_pool
        queued = {b.block_id for b in pool.free_block_queue}
        num_free = sum(1 for b in pool.blocks if b.block_id in queued)
        # BUG: a block held by n requests counts n times (should be: ref_cnt > 0 counts once)
        num_referenced = sum(b.ref_cnt for b in pool.blocks if not b.is_null)
        if num_free + num_referenced != pool.num_gpu_blocks - 1:
            raise InvariantViolation(
                f"conservation: free ({num_free}) + referenced ({num_referenced}) != total "
                f"({pool.num_gpu_blocks}) - reserved (1)")


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_invariants_count_shared_twice", adapter_cls=DoubleCountingCheck)
