"""nano_kv mutant: a lookup matches every full block of the prompt and caps only the tokens at
``num_tokens - 1``, so a block-aligned prompt keeps its last matched block as a hit and the
forward pass recomputes the last token into it, while another request holds that block (the
defect found in a trie-cache design: a write into a shared block)."""

from __future__ import annotations

from dataclasses import replace

from nano_kv import IMPL_INFO as _NANO_INFO
from nano_kv import NanoManager

from kvcheck.conformance.protocol import KVCacheSpec, RequestView

IMPL_INFO = replace(_NANO_INFO, name="mut_shared_write")


class SharedWriteManager(NanoManager):
    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        bs = self.block_size
        tokens = request.token_ids
        ids: list[int] = []
        key = b""
        for i in range(len(tokens) // bs):  # BUG: nano stops at (len - 1) // bs blocks
            key = self.key_of(key, tokens[i * bs:(i + 1) * bs])
            block_id = self.lookup(key)
            if block_id is None:
                break
            ids.append(block_id)
        # The last token is recomputed, but inside the last matched block.
        return ids, min(len(ids) * bs, len(tokens) - 1)


def make_kv_cache_manager(spec: KVCacheSpec) -> SharedWriteManager:
    return SharedWriteManager(spec)
