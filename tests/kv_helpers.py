"""Helpers shared by our own tests (importable because pyproject sets pythonpath = tests)."""

from __future__ import annotations

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request

PROFILES = ["vllm-0.33", "vllm-0.10"]


def make_manager(profile: str, num_blocks: int, block_size: int = 16, **kwargs: object) -> KVCacheManager:
    kwargs.setdefault("pythonhashseed", "0")
    return KVCacheManager(num_blocks, block_size, profile=profile, **kwargs)  # type: ignore[arg-type]


def schedule(mgr: KVCacheManager, req: Request, num_new_tokens: int | None = None) -> list[int] | None:
    """One scheduler step: look up hits for a new request, allocate, advance computed tokens.

    Returns the new block ids, or None when allocation failed (nothing advanced).
    """
    hits, num_hit = ([], 0)
    if req.request_id not in mgr.req_to_blocks:
        hits, num_hit = mgr.get_computed_blocks(req)
    if num_new_tokens is None:
        num_new_tokens = req.num_tokens - req.num_computed_tokens - num_hit
    new = mgr.allocate_slots(req, num_new_tokens, num_hit, hits)
    if new is None:
        return None
    req.num_computed_tokens += num_hit + num_new_tokens
    return [b.block_id for b in new]
