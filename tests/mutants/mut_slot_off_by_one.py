"""Bug: ``slot_mapping`` is off by one within the block (``+ 1``, a 1-based offset).

Every token's K/V lands one slot late; the last token of a block spills into the first slot
of the next physical block, which may belong to another request. The correct formula is
``block_ids[pos // block_size] * block_size + pos % block_size`` (vLLM's block table).
"""

from _mutant_base import MutantManager, build


class OffByOneSlots(MutantManager):
    def slot_mapping(self, request_id, start, end):
        ids, bs = self.manager.get_block_ids(request_id), self.spec.block_size
        return [ids[pos // bs] * bs + pos % bs + 1 for pos in range(start, end)]  # BUG: + 1


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_slot_off_by_one", adapter_cls=OffByOneSlots)
