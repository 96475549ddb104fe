"""Bug: ``BlockStored`` events always carry ``parent_block_hash=None``.

A consumer rebuilding the prefix tree from events (a KV-aware router) then roots every
stored run of blocks at the top, so a chunked prefill's later chunks look like new prompts.
vLLM sets the parent to the hash of the block before the first stored one
(``request.block_hashes[num_cached - 1]`` in 0.33). Parent-chain bugs in events:
dynamo#671 / TRT-LLM#3543 (peer-systems §4 #19), sglang#13488 (#18).
"""

from dataclasses import replace

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class ParentlessEventsPool(BlockPool):
    def _block_stored_event(self, *args, **kwargs):
        event = super()._block_stored_event(*args, **kwargs)
        return replace(event, parent_block_hash=None)  # BUG: parent dropped


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_events_no_parent", pool_cls=ParentlessEventsPool)
