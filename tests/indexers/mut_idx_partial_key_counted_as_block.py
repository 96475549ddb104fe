"""A partial-block key is taken for the block it lives in: a block counts as held when any
hash-block boundary inside it is a key of the group, not only its last (vLLM 0.33 keys the
block holding a prompt's last boundary by that boundary too, and keeps only that key when
the block's full key was dropped while its request ran), so a request that diverges after
the boundary, or a block whose full key is gone, over-matches."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer


class PartialKeyCountedAsBlock(KVIndexer):
    def match(self, token_ids, *, lora=None, cache_salt=None, mm_features=()):  # type: ignore[no-untyped-def]
        scale, self._scale = self._scale, 1  # every hash-block hash of the request
        try:
            hashes = self.request_hashes(token_ids, lora=lora, cache_salt=cache_salt,
                                         mm_features=mm_features)
        finally:
            self._scale = scale
        blocks = [hashes[i:i + scale] for i in range(0, len(hashes) - scale + 1, scale)]
        out = {}
        for worker_id, worker in self.workers.items():
            count = 0
            for block in blocks:
                if not any((self.match_group, h) in worker.copies for h in block):
                    break
                count += 1
            if count:
                out[worker_id] = count
        return out


IMPL_INFO, make_indexer = serve("mut_idx_partial_key_counted_as_block", PartialKeyCountedAsBlock)
