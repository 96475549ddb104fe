"""Requests are hashed without their LoRA adapter, so a LoRA request matches the base
model's blocks and the other way round (dynamo PR #6517)."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer


class LoraNotHashed(KVIndexer):
    def request_hashes(self, token_ids, *, lora=None, cache_salt=None,  # type: ignore[no-untyped-def]
                       mm_features=()):
        return super().request_hashes(token_ids, cache_salt=cache_salt,
                                      mm_features=mm_features)


IMPL_INFO, make_indexer = serve("mut_idx_lora_not_hashed", LoraNotHashed)
