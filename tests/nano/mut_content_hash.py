"""nano_kv mutant: a block's key is a hash of its own tokens only, not chained to its parent's
key, so a block hits wherever the same tokens appear (after any prefix, at any position)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from nano_kv import IMPL_INFO as _NANO_INFO
from nano_kv import NanoManager, chain_hash

from kvcheck.conformance.protocol import KVCacheSpec

IMPL_INFO = replace(_NANO_INFO, name="mut_content_hash")


class ContentHashManager(NanoManager):
    def key_of(self, parent: bytes, tokens: Sequence[int]) -> bytes:
        return chain_hash(b"", tokens)  # BUG: the parent key is dropped


def make_kv_cache_manager(spec: KVCacheSpec) -> ContentHashManager:
    return ContentHashManager(spec)
