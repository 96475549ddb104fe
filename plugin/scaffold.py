"""``kvcheck new-adapter NAME``: write an adapter skeleton ``NAME.py`` and a ``pytest.ini``.

The skeleton is the protocol of ``kvcheck.conformance.protocol`` spelled out as one module a
newcomer fills in: ``IMPL_INFO`` with every field explained and every capability listed (the
ones it starts with declared, the rest commented out), the factory, and every method of the
manager, the block pool and the module-level ``kernels()``, each naming the capability that
needs it and raising ``NotImplementedError`` with what to implement. The factories work from
the start (they only store the spec), so the loader's load-time probe passes and the first
``pytest`` run reports test failures, not a usage error.

``pytest.ini`` makes the folder a pytest rootdir that runs the shipped suite on the module:
``addopts = --kv-impl=NAME`` and ``pythonpath = .`` (the module is importable from there).

Nothing is ever overwritten: when ``NAME.py`` or ``pytest.ini`` exists, nothing is written.
NAME must be a module name nothing else answers to: not a keyword, not a standard-library or
installed module (``shadowed_module``: ``import NAME`` would load that one, and the scaffold
could never load), not a package already in the folder; the refusal names a free
alternative (``NAME_kv``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import keyword
import sys
from pathlib import Path

from kvcheck.conformance.protocol import MANAGER_CAPABILITIES, PROFILES
from kvcheck.plugin.errors import ScaffoldError
from kvcheck.results.io import write_atomic

__all__ = ["ScaffoldError", "render_adapter", "render_pytest_ini", "write_skeleton"]

#: The capabilities a new skeleton declares: the request-level manager and prefix caching,
#: the core every design has. The others are listed, commented out, to switch on one by one.
STARTING_CAPABILITIES = ("manager", "prefix_caching")
#: Longest NAME accepted: far above any real module name, and far below the file system's
#: 255-byte file names (NAME.py, the test ids and the repro files built on it).
MAX_NAME_LENGTH = 100


def _check_name(name: str) -> None:
    if len(name) > MAX_NAME_LENGTH:
        raise ScaffoldError(
            f"the name is {len(name)} characters long; a module name here is at most "
            f"{MAX_NAME_LENGTH}\n  Fix: pass a shorter name, e.g. myengine_adapter")
    if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        raise ScaffoldError(
            f"{name!r} is not usable as a module name (it must be an ASCII Python identifier "
            "and not a keyword)\n  Fix: pass a name such as myengine_adapter (letters, digits, "
            "underscores; not starting with a digit)")
    if name in {"kvcheck", "reference", "vllm", "pytest", "conftest", "test"} \
            or name.startswith("test_"):
        raise ScaffoldError(
            f"{name!r} would shadow or be mistaken for another module (kvcheck's aliases, "
            "pytest, or a test file pytest would collect)\n  Fix: pass a name of your own, "
            "e.g. myengine_adapter")
    if name.startswith("__") and name.endswith("__"):
        raise ScaffoldError(
            f"{name!r} is a name Python reserves for special modules (__main__, __init__...)"
            f"\n  Fix: pass a name of your own, e.g. {_free_name(name.strip('_') or 'my')}")
    shadowed = shadowed_module(name)
    if shadowed is not None:
        raise ScaffoldError(
            f"{name!r} would shadow {shadowed}: `import {name}` would load that module, "
            f"never this adapter, so the scaffold could not load\n  Fix: pass a free name, "
            f"e.g. {_free_name(name)}")


def shadowed_module(name: str) -> str | None:
    """What a top-level module ``name`` would collide with: ``"the standard-library module
    json"``, ``"the installed module numpy (PATH)"``, or None when the name is free. Found
    with ``sys.stdlib_module_names`` and ``importlib.util.find_spec`` on ``sys.path``: the
    module is located, never imported."""
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return f"the standard-library module {name}"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # in sys.modules without a spec (__main__...)
        return f"the already imported module {name}"
    if spec is None:
        return None
    where = spec.origin if spec.origin and spec.origin != "built-in" else None
    if where is None and spec.submodule_search_locations:
        where = next(iter(spec.submodule_search_locations), None)  # a namespace package
    return f"the installed module {name}" + (f" ({where})" if where else "")


def _free_name(name: str, folder: Path | None = None) -> str:
    """A name built on ``name`` that is a usable identifier, shadows nothing and has no
    ``.py`` in ``folder``: ``NAME_kv``, else ``NAME_kv2`` ... ``NAME_kv9``, else
    ``myengine_adapter`` (checked the same way)."""
    base = name if name.isidentifier() and name.isascii() else "my"
    for candidate in [f"{base}_kv", *(f"{base}_kv{i}" for i in range(2, 10)),
                      "myengine_adapter"]:
        if (not keyword.iskeyword(candidate) and len(candidate) <= MAX_NAME_LENGTH
                and shadowed_module(candidate) is None
                and not (folder is not None and (folder / f"{candidate}.py").exists())):
            return candidate
    return "myengine_adapter"  # pragma: no cover - nine of one name's variants installed


def _capability_lines() -> str:
    """One line per capability, the starting ones declared, the rest commented out."""
    lines = []
    width = max(len(c) for c in MANAGER_CAPABILITIES) + 4
    for cap, meaning in MANAGER_CAPABILITIES.items():
        entry = f'"{cap}",'.ljust(width)
        if cap in STARTING_CAPABILITIES:
            lines.append(f"        {entry}# {meaning}")
        else:
            lines.append(f"        # {entry}# {meaning}")
    return "\n".join(lines)


_ADAPTER = '''\
"""{name}: a kvcheck adapter for <your engine>'s paged KV-cache manager.

Generated by `kvcheck new-adapter {name}`. kvcheck drives your manager through this module
only: `IMPL_INFO` says what it is and claims, `make_kv_cache_manager(spec)` builds a fresh
manager for each test, and the suite calls the methods below with plain values (ints, lists,
the frozen `RequestView` / `KVCacheSpec` dataclasses). The contract of each method is in
`kvcheck.conformance.protocol` and in docs/writing-an-adapter.md.

Every method raises NotImplementedError until you implement it. Run `pytest -x` in this folder
(pytest.ini passes --kv-impl={name}): the first failure names the method to write next.

Capabilities: declare in IMPL_INFO only what you implement; an undeclared capability's tests
are skipped ("not applicable"). Under a vLLM profile (`vllm-0.33`, `vllm-0.10`) the design
capabilities (reset_prefix_cache, caching_off, skip_reading_prefix_cache, lookahead,
multi_token_decode) are implied: vLLM has them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, RequestView
from kvcheck.conformance.protocol import UnsupportedSpec  # noqa: F401  (raise it to decline a spec)

IMPL_INFO = ImplInfo(
    name="{name}",          # shown in test ids, verdicts and records (printable, no spaces)
    version="0.0.1",        # your engine's version
    capabilities=frozenset({{
{capabilities}
    }}),
    # generic: the laws any design must keep (conservation, all-or-nothing, hit correctness);
    # vllm-0.33 / vllm-0.10: exactly vLLM's behaviour (free order, hashes, events...).
    profile="{profile}",
    # vLLM hash algorithms ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor") your block hashes
    # reproduce byte for byte; () for a design with its own hashing (then hashes are never
    # compared, only what your hits point at).
    hash_algos={hash_algos},
    # Block ids your pool never hands out. None: the profile's default, (0,) (vLLM's null
    # block) under the vLLM profiles, () under generic.
    reserved_block_ids=None,
    # Block sizes (tokens per block) your design supports, e.g. (16, 32); None: any size >= 1.
    block_sizes=None,
    # (min, max) pool sizes in blocks (reserved ones included) you support; None: any.
    num_blocks_range=None,
    # True if ref_cnt(block_id) counts your prefix cache's own reference (a radix / trie
    # cache: a cached block nobody holds has ref_cnt 1); False: vLLM's convention, ref_cnt is
    # the number of requests holding the block. Needs "ref_counts".
    ref_cnt_counts_cache=False,
    commit=None,            # your source revision (e.g. a git sha), copied into records
)


class Manager:
    """Request-level manager (capability "manager"), vLLM's KVCacheManager surface.

    Block ids are physical: 0 <= block_id < spec.num_blocks.
    """

    def __init__(self, spec: KVCacheSpec) -> None:
        # spec.num_blocks (reserved blocks included), spec.block_size (tokens per block),
        # spec.enable_caching, spec.hash_algo, spec.enable_kv_cache_events,
        # spec.max_model_len, spec.profile. Raise UnsupportedSpec("why") to decline a spec
        # your design cannot serve (the test is then skipped as not applicable).
        self.spec = spec

    # ------------------------------------------------------------ capability "manager"

    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        """The longest cached prefix of whole blocks: (block_ids, num_computed_tokens), at
        most request.num_tokens - 1 tokens. No side effects (nothing is allocated or
        touched), unless you declare "pinning_lookup": then it may take a reference on each
        hit (see release_computed). ([], 0) when nothing is cached (or without
        prefix_caching)."""
        raise NotImplementedError(
            "{name}.Manager.get_computed_blocks: return (cached block ids, their token count) "
            "for the request's longest cached prefix, or ([], 0)")

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        """Make room for request.num_computed_tokens + num_new_computed_tokens +
        num_new_tokens (+ num_lookahead_tokens) tokens. new_computed_block_ids are the hits
        get_computed_blocks returned (now held by this request too). Return only the newly
        allocated block ids, in block-table order; or None with no state change at all when
        the pool is short (all or nothing). Full blocks become findable by
        get_computed_blocks as soon as this returns (with prefix_caching)."""
        raise NotImplementedError(
            "{name}.Manager.allocate_slots: allocate the blocks the request's tokens need and "
            "return the new block ids, or None (changing nothing) when the pool is short")

    def free(self, request_id: str) -> None:
        """Release the request's blocks (last block first); cached blocks stay findable until
        reused. An unknown request id is a no-op."""
        raise NotImplementedError(
            "{name}.Manager.free: release the request's blocks (an unknown id is a no-op)")

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table in logical order; [] for an unknown request."""
        raise NotImplementedError(
            "{name}.Manager.get_block_ids: return the request's block table ([] if unknown)")

    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now, evictable cached blocks included (reserved
        blocks excluded)."""
        raise NotImplementedError(
            "{name}.Manager.num_free_blocks: return how many blocks can be handed out now")

    # ------------------------------------------------------------ capability "pinning_lookup"

    def release_computed(self, request_id: str) -> None:
        """Drop the references get_computed_blocks took on the request's hits. kvcheck follows
        every lookup with allocate_slots for that request (your pins become its references;
        a refusal keeps them) or with this call (after a refusal, or a lookup it does not
        follow with an allocation). A request without pins: a no-op."""
        raise NotImplementedError(
            "{name}.Manager.release_computed: drop the references the request's last "
            "get_computed_blocks took")

    # ------------------------------------------------------------ capability "external_kv"

    def cache_blocks(self, request: RequestView, num_computed_tokens: int) -> None:
        """Cache the request's blocks that are full within its first num_computed_tokens
        tokens (after an asynchronous external load arrived). With external_kv,
        allocate_slots also takes num_external_computed_tokens and delay_cache_blocks
        (keyword arguments; see kvcheck.conformance.protocol.SupportsExternalKV)."""
        raise NotImplementedError(
            "{name}.Manager.cache_blocks: cache the request's full blocks within its first "
            "num_computed_tokens tokens")

    # ------------------------------------------------------------ capability "evict_blocks"

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop every cache key of these blocks; ref counts, the free queue and tables stay."""
        raise NotImplementedError(
            "{name}.Manager.evict_blocks: drop the cache keys of block_ids, nothing else")

    # ------------------------------------------------------------ capability "block_zeroing"
    # vLLM 0.33's worker-side block zeroing: a spec with needs_kv_cache_zeroing, and
    # allocate_slots may get skip_zeroing_group_ids (keyword, only when non-empty, with
    # delay_cache_blocks) (docs/semantics.md#worker-side-block-zeroing).

    def take_new_block_ids(self) -> list[int]:
        """Drain the ids of the attention blocks handed out fresh since the last call (not
        Mamba's, not hits; a group named in skip_zeroing_group_ids: not its external
        tokens' blocks), group by group, for the worker to zero before their first use."""
        raise NotImplementedError(
            "{name}.Manager.take_new_block_ids: drain the fresh attention blocks to zero")

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record again the request's blocks from token start_token on (a failed load)."""
        raise NotImplementedError(
            "{name}.Manager.record_blocks_for_zeroing: record the request's blocks from "
            "start_token on for zeroing")

    # ------------------------------------------------------------ capability "reset_prefix_cache"

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block hash; return False and change nothing while any request
        holds blocks. (Implied by the vLLM profiles.)"""
        raise NotImplementedError(
            "{name}.Manager.reset_prefix_cache: drop every cached hash when no block is in use "
            "and return True; else return False")

    # ------------------------------------------------------------ capability "free_queue_order"

    def free_block_ids(self) -> list[int]:
        """The free queue, head (the next block handed out) first."""
        raise NotImplementedError(
            "{name}.Manager.free_block_ids: return the free block ids, next-allocated first")

    # ------------------------------------------------------------ capability "ref_counts"

    def ref_cnt(self, block_id: int) -> int:
        """How many live requests hold block_id (plus the lookups pinning it, with
        pinning_lookup; plus 1 while it is cached, with IMPL_INFO.ref_cnt_counts_cache)."""
        raise NotImplementedError(
            "{name}.Manager.ref_cnt: return how many requests hold the block")

    # ------------------------------------------------------------ capability "block_hashes"

    def block_hashes(self, request_id: str) -> list[bytes]:
        """Your hashes of the request's full blocks, in order (compared with vLLM's only for
        the algorithms in IMPL_INFO.hash_algos)."""
        raise NotImplementedError(
            "{name}.Manager.block_hashes: return the hashes of the request's full blocks")

    # ------------------------------------------------------------ capability "events"

    def take_events(self) -> list[dict[str, Any]]:
        """Drain KV events: dicts with "type" BlockStored / BlockRemoved / AllBlocksCleared
        and vLLM's field names (block_hashes, parent_block_hash, token_ids, block_size,
        lora_id, medium, group_idx...)."""
        raise NotImplementedError(
            "{name}.Manager.take_events: return and clear the KV events since the last call")

    # ------------------------------------------------------------ capability "event_wire"

    def take_event_batch(self, ts: float) -> bytes:
        """Drain KV events as the bytes your publisher sends: one msgpack KVEventBatch (the
        payload frame), in vLLM's format for the spec's profile, timestamp ts, dp rank nil
        (docs/events.md; kvcheck.events.encode_batch writes it from reference events)."""
        raise NotImplementedError(
            "{name}.Manager.take_event_batch: return the encoded batch of the KV events "
            "since the last call")

    # ------------------------------------------------------------ capability "slot_mapping"

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """Slots of the request's token positions start..end-1:
        block_table[pos // block_size] * block_size + pos % block_size."""
        raise NotImplementedError(
            "{name}.Manager.slot_mapping: return the slots of positions start..end-1")

    # ------------------------------------------------------------ capability "invariants"

    def check_invariants(self) -> None:
        """Check your own internal consistency; raise AssertionError naming a broken law."""
        raise NotImplementedError(
            "{name}.Manager.check_invariants: assert your internal invariants")

    # ------------------------------------------------------------ capability "kv_cache_groups"
    # Hybrid models ("kv_cache_groups", with "sliding_window" / "chunked_local_attention" /
    # "cross_attention" / "mamba" for those kinds): when spec.kv_cache_groups is non-empty,
    # get_computed_blocks, allocate_slots and get_block_ids above take and return one list of
    # block ids per group (block 0 = the null block), as
    # kvcheck.conformance.protocol.SupportsKVCacheGroups says. With "cross_attention" (an
    # encoder-decoder model, caching off), allocate_slots also takes the keyword argument
    # num_encoder_tokens=E at a request's admission: the cross-attention groups then hold
    # cdiv(E, block_size) blocks until the request is freed. With "mamba" (state-space
    # layers: a group's mamba_cache_mode and num_speculative_blocks) define new_step_starts(self)
    # -> None (kvcheck calls it at each scheduler step of a Mamba layout; required under
    # vllm-0.33), and a Mamba group's allocate_slots answer may hold null blocks. With
    # "fine_grained_hits" (needs "mamba"; vLLM 0.33's sub-block hits beside a Mamba "align"
    # group larger than the hash block) define take_kv_cache_block_copies(self) ->
    # list[tuple[int, int]]: the (src, dst) copy-on-write copies made since the last call,
    # the references they retained released (SupportsBlockCopies). With
    # "boundary_state_offloads" (needs "mamba"; vLLM 0.33's hand-offs of Mamba "align" states to
    # a KV connector) define take_boundary_state_offloads(self) -> dict[str, list[tuple[int,
    # int, int]]] and finalize_partial_tail_offloads(self, request) -> list[tuple[int, int,
    # int]] ((group_id, block_id, boundary_tokens); SupportsBoundaryStateOffloads). With
    # "mamba_checkpoints" (needs "mamba"; vLLM 0.33's Mamba prefill checkpoint blocks and sparse
    # retention) a Mamba group may carry num_prefill_checkpoint_blocks and
    # prefill_checkpoint_alignment, and the spec a prefix_cache_retention_interval beside it.
    # With "dcp" / "prefix_match_unit" a spec may carry dcp_world_size > 1 (a sharded group's
    # block covers block_size * dcp_world_size tokens: spec.group_block_size(g)) or vLLM 0.33's
    # prefix_match_unit (the hash block of several groups with caching on).
    # No other method: declare the capability once your methods speak both forms.
    # Capability "eagle" (EAGLE/MTP, any spec): spec.use_eagle=True asks that a prefix-cache hit
    # drop the last block it matched (docs/semantics.md#prefix-cache-hits); no other method.
    # Capability "eagle_groups" (needs "eagle"; vLLM 0.33's per-group flag): a group may carry
    # is_eagle_group=True, and then only the flagged groups drop; no other method.
    # Capability "prefill_lookahead" (vLLM 0.33's multi-module MTP, any spec):
    # spec.num_prefill_lookahead = K > 1 leaves the last K - 1 computed tokens uncached until
    # more are computed and makes sliding windows free K - 1 tokens later
    # (docs/semantics.md#multi-module-mtp); no other method.
    # Capability "hash_lookahead" (vLLM 0.33's hash lookahead, any spec):
    # spec.num_hash_lookahead_tokens = L > 0 hashes a block only once the L tokens after it
    # exist, with them in its key ((E, *tokens)), and each BlockStored event lists them
    # (lookahead_token_ids) (docs/semantics.md#request-block-hashes); no other method.
    # Capability "admission_gates" (vLLM 0.33's admission gates, any spec): allocate_slots may
    # get full_sequence_must_fit=True, reserved_blocks=R and has_scheduled_reqs=False (each
    # only when not at its default: add them as keyword parameters), and the spec a
    # watermark and max_in_flight_tokens (docs/semantics.md#admission-gates); no other method.
    # Capability "async_scheduling" (vLLM 0.33's asynchronous scheduling, any spec):
    # allocate_slots may get num_in_flight_tokens=k (only when not 0: add it as a keyword
    # parameter), k of the request's computed tokens not processed yet: free the blocks a
    # window skips at computed - k tokens; finalize_partial_tail_offloads may get it too, and
    # then finalizes nothing (docs/semantics.md#asynchronous-scheduling); no other method.
    # Capability "mamba_shared_prefix_checkpoint" (needs "mamba"; vLLM 0.33's
    # enable_mamba_shared_prefix_checkpoint): spec.mamba_shared_prefix_checkpoint=True asks a
    # Mamba "align" group to key its state where a chunk ends at the request's shared-prefix
    # boundary (its lookup's junction) inside the prompt, kept only with an EAGLE group,
    # fine-grained hits and no re-prefillable tail, silently dropped otherwise
    # (docs/semantics.md#the-shared-prefix-checkpoint); no other method.

    # ------------------------------------------------------------ capability "batch_metadata"
    # Your worker's batch builder and page-table conversions. They use no manager state: the
    # block tables (rows of block ids, row r = request r) come in as arguments.

    def build_batch(self, block_tables: Sequence[Sequence[int]],
                    num_computed_tokens: Sequence[int], num_scheduled_tokens: Sequence[int],
                    num_padded_tokens: int, dcp_world_size: int = 1, dcp_rank: int = 0,
                    cp_kv_cache_interleave_size: int = 1) -> tuple[list[int], list[int],
                                                                   list[int]]:
        """One step's (slot_mapping, positions, req_indices). Request r's tokens are
        positions num_computed_tokens[r] .. + num_scheduled_tokens[r] - 1, laid out request
        by request. slot_mapping has num_padded_tokens entries: -1 (PAD_SLOT_ID) past the
        real tokens and for tokens another DCP rank stores (position p lives on rank
        (p // cp_kv_cache_interleave_size) % dcp_world_size; one row entry covers
        block_size * dcp_world_size positions). Raise UnsupportedSpec for DCP settings you
        do not support."""
        raise NotImplementedError(
            "{name}.Manager.build_batch: return (slot_mapping padded with -1, positions, "
            "req_indices) for the step")

    def flashinfer_csr(self, block_tables: Sequence[Sequence[int]],
                       seq_lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        """FlashInfer's (kv_indptr, kv_indices, kv_last_page_len) of the first len(seq_lens)
        rows; kv_last_page_len in [1, block_size] (a full last page is block_size). Raise
        UnsupportedSpec if you do not build FlashInfer page tables."""
        raise NotImplementedError(
            "{name}.Manager.flashinfer_csr: return the CSR page table of the rows")

    def req_to_token(self, block_tables: Sequence[Sequence[int]],
                     seq_lens: Sequence[int]) -> list[list[int]]:
        """SGLang's req_to_token rows: the flat slot of every position < seq_lens[b]. Raise
        UnsupportedSpec if you do not build it."""
        raise NotImplementedError(
            "{name}.Manager.req_to_token: return each row's per-position slots")


def make_kv_cache_manager(spec: KVCacheSpec) -> Manager:
    """A fresh manager over spec.num_blocks blocks (capability "manager"); called once per
    test and once when kvcheck loads this module (to check the methods exist)."""
    return Manager(spec)


class BlockPool:
    """Pool-level surface (capability "block_pool"), vLLM's BlockPool. Optional: most
    adapters declare only "manager"."""

    def __init__(self, spec: KVCacheSpec) -> None:
        self.spec = spec

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        raise NotImplementedError("{name}.BlockPool.get_new_blocks: pop num_blocks free blocks")

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> None:
        raise NotImplementedError(
            "{name}.BlockPool.free_blocks: drop one reference of each block, in this order")

    def touch(self, block_ids: Sequence[int]) -> None:
        raise NotImplementedError(
            "{name}.BlockPool.touch: take a reference on cached blocks (a prefix hit)")

    def cache_full_blocks(self, request: RequestView, block_ids: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        raise NotImplementedError(
            "{name}.BlockPool.cache_full_blocks: hash and cache blocks "
            "num_cached_blocks..num_full_blocks-1 of the request")

    def get_cached_block(self, block_hash: bytes) -> int | None:
        raise NotImplementedError(
            "{name}.BlockPool.get_cached_block: the block cached under block_hash, or None")

    def num_free_blocks(self) -> int:
        raise NotImplementedError("{name}.BlockPool.num_free_blocks: count the free blocks")

    def free_block_ids(self) -> list[int]:
        raise NotImplementedError(
            "{name}.BlockPool.free_block_ids: the free queue, next-allocated first")


def make_block_pool(spec: KVCacheSpec) -> BlockPool:
    """A fresh block pool (capability "block_pool")."""
    return BlockPool(spec)


def kernels() -> Any:
    """Capability "kernels": a kvcheck.gpu_kernels.conformance.KernelSet of your K/V store and
    paged-attention kernels (needs torch and triton: pip install 'kvcheck[kernels]')."""
    raise NotImplementedError("{name}.kernels: return a KernelSet of your kernels")


# ---------------------------------------------------------------- capability "sizing"
# Module-level KV-cache sizing (kvcheck.conformance.sizing_protocol: LayerKVSpec in,
# KVSizingPlan out). Each takes the profile whose vLLM release the answer must match.
# Optional: kv_feature_defaults(model: KVModelFacts, profile) -> KVFeatureDefaults, the prefix
# caching / chunked prefill a model runs with (its tests skip, naming it, until you define it).

def kv_page_size_bytes(spec: Any, profile: str) -> int:
    """Bytes one block of one layer takes (vLLM's page_size_bytes), padding included."""
    raise NotImplementedError("{name}.kv_page_size_bytes: return the layer's page size")


def kv_sizing_plan(layers: Any, available_memory: int, profile: str,
                   num_gpu_blocks_override: int | None) -> Any:
    """The KV-cache groups, num_blocks and tensors of a model (a KVSizingPlan)."""
    raise NotImplementedError("{name}.kv_sizing_plan: return a KVSizingPlan")


def kv_cache_view_shape(spec: Any, num_blocks: int, layout: str,
                        profile: str) -> tuple[int, ...]:
    """One attention layer's cache view shape for layout "NHD" or "HND"."""
    raise NotImplementedError("{name}.kv_cache_view_shape: return the view shape")


def kv_block_sizes(groups: Any, enable_prefix_caching: bool, prefix_match_unit: int | None,
                   profile: str) -> tuple[int, int]:
    """(scheduler_block_size, hash_block_size) of KV-cache groups with these specs."""
    raise NotImplementedError("{name}.kv_block_sizes: return the two block sizes")


__all__ = ["IMPL_INFO", "BlockPool", "Manager", "kernels", "kv_block_sizes",
           "kv_cache_view_shape", "kv_page_size_bytes", "kv_sizing_plan", "make_block_pool",
           "make_kv_cache_manager"]
'''

_PYTEST_INI = """\
# Written by `kvcheck new-adapter {name}`: `pytest` in this folder runs kvcheck's conformance
# suite on {name}.py. Add options after it, e.g. `pytest -x`, `pytest --kv-max-examples=200`,
# `pytest --kv-report=results.jsonl`, `pytest --kv-profile=vllm-0.33`.
[pytest]
addopts = --kv-impl={name}
# The adapter module sits in this folder: make it importable whatever folder pytest runs from.
pythonpath = .
"""


def render_adapter(name: str, profile: str = "generic") -> str:
    """The text of the skeleton module ``NAME.py``."""
    _check_name(name)
    if profile not in PROFILES:
        raise ScaffoldError(f"unknown profile {profile!r}\n  Fix: use one of {list(PROFILES)}")
    hash_algos = "()" if profile == "generic" else '("sha256",)'
    return _ADAPTER.format(name=name, profile=profile, hash_algos=hash_algos,
                           capabilities=_capability_lines())


def render_pytest_ini(name: str) -> str:
    """The text of ``pytest.ini``: ``--kv-impl=NAME`` and ``pythonpath = .``."""
    _check_name(name)
    return _PYTEST_INI.format(name=name)


def write_skeleton(name: str, directory: str | Path = ".", *,
                   profile: str = "generic") -> list[Path]:
    """Write ``NAME.py`` and ``pytest.ini`` into ``directory`` (each atomically) and return
    their paths.

    Raises:
        ScaffoldError: ``name`` is not a usable module name, ``profile`` is unknown,
            ``directory`` is not a folder, or either file already exists; nothing is written.
    """
    files = {f"{name}.py": render_adapter(name, profile), "pytest.ini": render_pytest_ini(name)}
    folder = Path(directory)
    if not folder.is_dir():
        raise ScaffoldError(f"{folder} is not a folder\n  Fix: create it first, or pass "
                            "--dir with an existing folder")
    existing = [folder / f for f in files if (folder / f).exists()]
    if existing:
        raise ScaffoldError(
            f"{', '.join(map(str, existing))} already exist{'s' if len(existing) == 1 else ''}"
            "; nothing was written\n  Fix: pick another NAME or folder (--dir), or move the "
            "existing file(s) away first")
    local = importlib.machinery.PathFinder.find_spec(name, [str(folder)])
    if local is not None and local.origin not in (None, "namespace"):
        # A package NAME/ (or NAME.so) in the folder is imported before NAME.py.
        raise ScaffoldError(
            f"{folder} already holds a module {name!r} ({local.origin}), which `import "
            f"{name}` would load instead of {name}.py; nothing was written\n  Fix: pass "
            f"another name, e.g. {_free_name(name, folder)}, or another folder (--dir)")
    written = []
    for filename, text in files.items():
        try:
            written.append(write_atomic(folder / filename, text))
        except OSError as exc:
            for path in written:  # no half-written skeleton
                path.unlink(missing_ok=True)
            raise ScaffoldError(f"cannot write {folder / filename} ({exc})\n  Fix: pass a "
                                "writable folder with --dir") from None
    return written
