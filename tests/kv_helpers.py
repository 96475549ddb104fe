"""Helpers shared by our own tests (importable because pyproject sets pythonpath = tests)."""

from __future__ import annotations

import textwrap

import pytest

from kvcheck.conformance.protocol import VLLM_PROFILES
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request

#: The reference's release profiles (the protocol's Literal spells the names once).
PROFILES = list(VLLM_PROFILES)


def make_manager(profile: str, num_blocks: int, block_size: int = 16,
                 **kwargs: object) -> KVCacheManager:
    kwargs.setdefault("pythonhashseed", "0")
    return KVCacheManager(num_blocks, block_size, profile=profile, **kwargs)  # type: ignore[arg-type]


def schedule(mgr: KVCacheManager, req: Request,
             num_new_tokens: int | None = None) -> list[int] | None:
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


# ------------------------------------------------------------------------- pytester adapters
REF_NO_KERNELS = """
from dataclasses import replace
import kvcheck.adapters.reference as _ref
IMPL_INFO = replace(_ref.IMPL_INFO, name={name!r},
                    capabilities=_ref.IMPL_INFO.capabilities - {{"kernels", "sizing"}})
make_block_pool = _ref.make_block_pool
{body}
"""
PLAIN_FACTORY = "make_kv_cache_manager = _ref.make_kv_cache_manager\n"


def make_ref(pytester: pytest.Pytester, module: str = "refnk", name: str = "ref",
             body: str = PLAIN_FACTORY) -> str:
    """Write a module wrapping kvcheck's reference without the (slow, interpreted) kernel
    area, so a whole-suite run takes seconds; ``body`` defines its factory. Returns the
    ``--kv-impl=`` option naming it."""
    pytester.makepyfile(**{module: REF_NO_KERNELS.format(name=name, body=textwrap.dedent(body))})
    pytester.syspathinsert()
    return f"--kv-impl={module}"
