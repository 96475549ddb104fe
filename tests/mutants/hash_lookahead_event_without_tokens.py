"""Bug: with hash lookahead (``num_hash_lookahead_tokens=L``) ``BlockStored`` leaves out the
lookahead tokens (``lookahead_token_ids`` None) while the hashes cover them.

vLLM 0.33's ``BlockPool`` lists, per stored block, the ``L`` tokens after it that its hash
covers (docs/semantics.md#kv-events): without them a router rebuilding the cache tree from the
events cannot recompute or match the hashes.
"""

from __future__ import annotations

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class EventsWithoutLookahead(BlockPool):
    def _block_stored_event(self, *args, **kwargs):
        kwargs.pop("lookahead_token_ids", None)
        if len(args) > 9:
            args = args[:9]  # BUG: the lookahead tokens never reach the event
        return super()._block_stored_event(*args, **kwargs)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "hash_lookahead_event_without_tokens", pool_cls=EventsWithoutLookahead,
    keep=frozenset({"hash_lookahead"}))
