"""Bug: ``slot_mapping`` picks the block of the *next* position (``(pos + 1) // block_size``)
while the in-block offset is right, so the last token of every block is written into the
following block.

A block-index error that only shows at block boundaries, like the interleave/owner arithmetic
of vLLM's DCP slot mapping (``virtual_block_size = block_size * dcp_world_size``), which the
``batch_metadata`` capability checks on an engine's batch builder.
"""

from _mutant_base import MutantManager, build


class WrongBlockSlots(MutantManager):
    def slot_mapping(self, request_id, start, end):
        ids, bs = self.manager.get_block_ids(request_id), self.spec.block_size
        out = []
        for pos in range(start, end):
            idx = min((pos + 1) // bs, len(ids) - 1)  # BUG: should be pos // bs
            out.append(ids[idx] * bs + pos % bs)
        return out


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_slot_wrong_block", adapter_cls=WrongBlockSlots)
