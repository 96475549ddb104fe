"""The contract between kvcheck and an implementation under test.

The module named by ``--kv-impl`` defines:

* ``IMPL_INFO``: an ``ImplInfo`` (or a dict with the same fields);
* ``make_kv_cache_manager(spec: KVCacheSpec) -> KVCacheManagerAdapter``: a fresh manager over
  ``spec.num_blocks`` blocks, for the ``manager`` capability;
* optionally ``make_block_pool(spec: KVCacheSpec) -> BlockPoolAdapter`` for ``block_pool``.

Everything crossing the boundary is a primitive (``int``, ``bytes``, ``str``, lists, tuples,
dicts) or one of the frozen dataclasses below, so a third party implements the protocol
structurally, without importing or subclassing kvcheck's classes. Block ids are physical
(``0 <= block_id < spec.num_blocks``); block 0 is the reserved null block in vLLM's design
(``ImplInfo.reserved_block_ids`` says which blocks a design reserves, if any).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, get_args, runtime_checkable

from kvcheck.conformance.errors import UnsupportedSpec
from kvcheck.conformance.indexer_protocol import INDEXER_CAPABILITIES
from kvcheck.conformance.offload_protocol import OFFLOAD_CAPABILITIES
from kvcheck.conformance.sizing_protocol import SupportsSizing

__all__ = [
    "ATTENTION_KINDS",
    "CAPABILITIES",
    "CAPABILITY_METHODS",
    "CAPABILITY_PROTOCOLS",
    "DESIGN_CAPABILITIES",
    "EXTRA_KEY_KINDS",
    "HASH_ALGOS",
    "KIND_CAPABILITIES",
    "MAMBA_CACHE_MODES",
    "MANAGER_CAPABILITIES",
    "PROFILES",
    "VLLM_PROFILES",
    "AttentionKind",
    "BlockPoolAdapter",
    "ImplInfo",
    "KVCacheGroupSpec",
    "KVCacheManagerAdapter",
    "KVCacheSpec",
    "KVCacheSpecFields",
    "KVCacheSpecOptions",
    "KVEvent",
    "ManagerWithCapabilities",
    "Profile",
    "RequestView",
    "SupportsBatchMetadata",
    "SupportsBlockCopies",
    "SupportsBlockHashes",
    "SupportsBlockZeroing",
    "SupportsBoundaryStateOffloads",
    "SupportsEventWire",
    "SupportsEvents",
    "SupportsEvictBlocks",
    "SupportsExternalKV",
    "SupportsFreeQueueOrder",
    "SupportsInvariants",
    "SupportsKVCacheGroups",
    "SupportsKernels",
    "SupportsNewStep",
    "SupportsRefCounts",
    "SupportsReleaseComputed",
    "SupportsResetPrefixCache",
    "SupportsSlotMapping",
    "UnsupportedSpec",
    "effective_capabilities",
    "extra_key_kinds",
    "group_capabilities",
    "protocol_methods",
    "reserved_block_ids",
    "spec_from_dict",
    "spec_to_dict",
]

#: Capability name -> what declaring it promises. Undeclared capabilities skip their tests.
CAPABILITIES: dict[str, str] = {
    "manager": "make_kv_cache_manager(spec) with the request-level methods",
    "block_pool": "make_block_pool(spec) with the BlockPool-level methods",
    "prefix_caching": "cached full blocks are found by get_computed_blocks",
    "extra_keys": "LoRA, multimodal and cache_salt inputs change block hashes as in vLLM "
                  "(the union of lora, multimodal and cache_salt)",
    # Extra keys by kind (issue 24): a block's content key includes this part of the
    # request's context; ``extra_keys`` declares all three.
    "lora": "the LoRA adapter is part of a block's content key (no hit across adapters)",
    "multimodal": "multimodal items are part of a block's content key (no hit across items)",
    "cache_salt": "RequestView.cache_salt is part of the first blocks' key (no hit across salts)",
    "free_queue_order": "manager.free_block_ids(): the free queue, head (next allocated) first",
    "ref_counts": "manager.ref_cnt(block_id)",
    "block_hashes": "manager.block_hashes(request_id): the implementation's own hashes",
    "events": "manager.take_events(): KV events as dicts (see SupportsEvents)",
    "event_wire": "manager.take_event_batch(ts): the step's KV events as the msgpack payload "
                  "vLLM's ZMQ publisher sends (see SupportsEventWire)",
    "slot_mapping": "manager.slot_mapping(request_id, start, end): its own slot arithmetic",
    "invariants": "manager.check_invariants(): raises AssertionError naming a broken law",
    "kernels": "a module-level kernels() returning a kvcheck.gpu_kernels.conformance.KernelSet",
    "batch_metadata": "manager.build_batch/flashinfer_csr/req_to_token: batch slots, page tables",
    # Hybrid models (several KV-cache groups over one pool). Opt-in under every profile: a
    # single-group engine declares none of them and its verdict does not depend on them.
    "kv_cache_groups": "specs with kv_cache_groups: block ids as one list per group (one pool)",
    "sliding_window": "kv_cache_groups of kind sliding_window: skipped blocks become null blocks",
    "chunked_local_attention": "kv_cache_groups of kind chunked_local_attention",
    "cross_attention": "kv_cache_groups of kind cross_attention (an encoder-decoder model, "
                       "caching off): allocate_slots(..., num_encoder_tokens=E) sizes them",
    "mamba": "kv_cache_groups of kind mamba (state-space layers: mamba_cache_mode, "
             "num_speculative_blocks); manager.new_step_starts() at each scheduler step "
             "(required under vllm-0.33, see SupportsNewStep)",
    "fine_grained_hits": "vLLM 0.33's fine-grained partial hash hits (needs 'mamba'): in a "
                         "layout with a Mamba 'align' group larger than the hash block, hits "
                         "end on hash-block boundaries and a hit ending inside a block is "
                         "redirected to a private copy-on-write block; "
                         "manager.take_kv_cache_block_copies() drains the copies (required "
                         "under vllm-0.33, see SupportsBlockCopies)",
    "mamba_checkpoints": "vLLM 0.33's Mamba prefill checkpoint blocks and sparse Mamba "
                         "retention (needs 'mamba'): mamba groups with "
                         "num_prefill_checkpoint_blocks / prefill_checkpoint_alignment, and "
                         "prefix_cache_retention_interval beside a mamba group "
                         "(docs/semantics.md#mamba-prefill-checkpoints)",
    "boundary_state_offloads": "vLLM 0.33's boundary-state hand-offs for a KV connector "
                               "(needs 'mamba'): a Mamba 'align' group's keyed state blocks "
                               "and a producer's partial-tail copy, drained by "
                               "manager.take_boundary_state_offloads(), a finishing "
                               "producer's tail by manager.finalize_partial_tail_offloads("
                               "request) (required under vllm-0.33, see "
                               "SupportsBoundaryStateOffloads)",
    "dcp": "specs with dcp_world_size > 1 (decode context parallelism, with kv_cache_groups): "
           "a sharded group's block covers block_size * dcp_world_size tokens of a request "
           "for allocation, hashing and hits (KVCacheSpec.group_block_size)",
    "mamba_dcp": "kv_cache_groups of kind mamba with dcp_world_size > 1 (needs 'mamba' and "
                 "'dcp'): vLLM 0.33 does not shard a Mamba group (its block stays its own "
                 "size; with caching on a Mamba 'align' block equal to the hash block turns "
                 "fine-grained hits on), vLLM 0.10.2 scales it but adds speculative slots at "
                 "the spec's block size",
    "prefix_match_unit": "specs with prefix_match_unit (vLLM 0.33, with kv_cache_groups): "
                         "the hash block of several groups with caching on; a unit vLLM "
                         "rejects is refused (UnsupportedSpec or a misuse error)",
    "eagle": "specs with use_eagle=True (EAGLE/MTP speculative decoding, vLLM's "
             "KVCacheManager(use_eagle=True)): a prefix-cache hit drops its last block in "
             "every group (a sliding window needs one more contiguous block first)",
    "eagle_groups": "kv_cache_groups with is_eagle_group=True (vLLM 0.33's per-group EAGLE "
                    "flag, needs 'eagle'): with use_eagle only the flagged groups' hits drop "
                    "their last block (every group when none is flagged)",
    "prefill_lookahead": "specs with num_prefill_lookahead K > 1 (vLLM 0.33's multi-module "
                         "MTP, KVCacheManager(num_prefill_lookahead=K)): the last K - 1 "
                         "computed tokens are cached only once more are computed, and every "
                         "sliding window keeps K - 1 more tokens' blocks below it",
    "hash_lookahead": "specs with num_hash_lookahead_tokens L > 0 (vLLM 0.33's hash "
                      "lookahead for EAGLE/MTP, KVCacheManager(num_hash_lookahead_tokens=L) "
                      "and get_request_block_hasher(..., L)): a block is hashed, cached and "
                      "hit only once the L tokens after it exist, its hash covers them and "
                      "its BlockStored event lists them (lookahead_token_ids)",
    "mamba_shared_prefix_checkpoint": "specs with mamba_shared_prefix_checkpoint=True (vLLM "
                                      "0.33's KVCacheManager(enable_mamba_shared_prefix_"
                                      "checkpoint=True), needs 'mamba'): a Mamba 'align' "
                                      "group also keys its state where a chunk ends at the "
                                      "request's shared-prefix boundary, inside a block; "
                                      "narrowed off silently without EAGLE groups, "
                                      "fine-grained hits or with a re-prefillable tail",
    "admission_gates": "vLLM 0.33's admission gates: allocate_slots(..., "
                       "full_sequence_must_fit, reserved_blocks, has_scheduled_reqs) and specs "
                       "with watermark / max_in_flight_tokens (see KVCacheManagerAdapter."
                       "allocate_slots)",
    "block_zeroing": "vLLM 0.33's worker-side block zeroing: specs with "
                     "needs_kv_cache_zeroing, manager.take_new_block_ids() draining the "
                     "attention blocks handed out fresh since the last call, and "
                     "allocate_slots(..., skip_zeroing_group_ids) for an asynchronous "
                     "external load (see SupportsBlockZeroing)",
    "async_scheduling": "vLLM 0.33's asynchronous scheduling in the KV-cache manager: "
                        "allocate_slots(..., num_in_flight_tokens=k) and "
                        "finalize_partial_tail_offloads(request, num_in_flight_tokens=k), k "
                        "of the request's computed tokens not processed yet: windows free "
                        "their skipped blocks at computed - k tokens, and no boundary state "
                        "is finalized while k > 0 (docs/semantics.md#asynchronous-scheduling)",
    "sizing": "module-level KV-cache sizing functions (see kvcheck.conformance.sizing_protocol)",
    # Design features: vLLM has them all, so the vLLM profiles imply them (see
    # DESIGN_CAPABILITIES); under ``generic`` an implementation declares those it has.
    "reset_prefix_cache": "manager.reset_prefix_cache(): drop every cached hash when idle",
    "caching_off": "a spec with enable_caching=False is honoured (no hits, nothing cached)",
    "skip_reading_prefix_cache": "RequestView.skip_reading_prefix_cache: no hits, still caches",
    "lookahead": "allocate_slots(..., num_lookahead_tokens=k) reserves k more slots, uncached",
    "multi_token_decode": "a decode step may append several tokens (speculative decoding)",
    "caches_running_requests": "a running request's full computed blocks hit for others "
                               "before it finishes (not only once it is freed)",
    # KV from outside the pool (issue 29): a KV connector's tokens and failed loads.
    "external_kv": "allocate_slots(..., num_external_computed_tokens, delay_cache_blocks) and "
                   "cache_blocks(request, num_computed_tokens) (see SupportsExternalKV)",
    "evict_blocks": "manager.evict_blocks(block_ids): drop those blocks' cache keys, nothing "
                    "else (vLLM 0.33; see SupportsEvictBlocks)",
    # Cache designs vLLM does not have (issue 24): declared, under any profile.
    "dedup_on_insert": "a table entry may be rebound to another block of identical content "
                       "once its tokens are computed (radix / trie caches)",
    "pinning_lookup": "get_computed_blocks takes references on its hits; the suite follows "
                      "it with allocate_slots or manager.release_computed(request_id)",
    # A router's prefix index (issue 27): another kind of implementation than a manager.
    **INDEXER_CAPABILITIES,
    # A KV offload tier (issue 30): another kind again, beside a manager or alone.
    **OFFLOAD_CAPABILITIES,
}

#: The capabilities of a KV-cache manager (its adapter module, ``kvcheck new-adapter``): all
#: but the indexer's and the offload tier's.
MANAGER_CAPABILITIES: dict[str, str] = {
    cap: meaning for cap, meaning in CAPABILITIES.items()
    if cap not in INDEXER_CAPABILITIES and cap not in OFFLOAD_CAPABILITIES}

#: Features of vLLM's design that another design may lack. Every vLLM profile implies them
#: (an implementation checked against vLLM must have them); under ``generic`` only the
#: declared ones are tested.
DESIGN_CAPABILITIES: frozenset[str] = frozenset(
    {"reset_prefix_cache", "caching_off", "skip_reading_prefix_cache", "lookahead",
     "multi_token_decode", "caches_running_requests"})

#: The kinds of extra keys, each a capability, in vLLM's key order (LoRA, multimodal items,
#: cache salt). ``extra_keys`` is their union: declaring it declares all three, and declaring
#: all three implies it (``effective_capabilities``).
EXTRA_KEY_KINDS: tuple[str, ...] = ("lora", "multimodal", "cache_salt")

#: Attention kinds a ``KVCacheGroupSpec`` may name (vLLM's ``get_kv_cache_spec_kind`` names).
AttentionKind = Literal["full_attention", "sliding_window", "chunked_local_attention",
                        "cross_attention", "mamba"]
ATTENTION_KINDS: tuple[AttentionKind, ...] = get_args(AttentionKind)
#: The capability a group of each kind needs (full attention: ``kv_cache_groups`` alone).
KIND_CAPABILITIES: dict[str, str] = {
    "full_attention": "kv_cache_groups",
    "sliding_window": "sliding_window",
    "chunked_local_attention": "chunked_local_attention",
    "cross_attention": "cross_attention",
    "mamba": "mamba",
}

#: ``KVCacheGroupSpec.mamba_cache_mode`` values (vLLM 0.33's ``MambaCacheMode``; vLLM 0.10.2 has
#: no such field, its behaviour is "none").
MAMBA_CACHE_MODES: tuple[str, ...] = ("none", "align")

#: The behaviour to check against. ``generic`` checks only profile-independent laws
#: (conservation, all-or-nothing, hit correctness, hit caps...), for any design.
Profile = Literal["vllm-0.33", "vllm-0.10", "generic"]
#: Every ``Profile``, in display order (derived from the Literal, never spelled again).
PROFILES: tuple[Profile, ...] = get_args(Profile)
#: The profiles that reproduce one vLLM release line exactly.
VLLM_PROFILES: tuple[Profile, ...] = tuple(p for p in PROFILES if p != "generic")

#: vLLM's block-hash algorithms (``KVCacheSpec.hash_algo``), byte-identical in the reference.
HASH_ALGOS: tuple[str, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

#: One KV event (``SupportsEvents.take_events``): ``"type"`` plus vLLM's field names. The
#: fields and their types depend on the event type, as in vLLM's event classes.
# Any: a field's type depends on the event's "type" (hashes, token lists, ints, None...);
# the suite reads them by name, as the event type says.
KVEvent = dict[str, Any]


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """One KV-cache group of a hybrid model (vLLM's ``KVCacheGroupSpec`` with its layers'
    attention spec). All groups of a ``KVCacheSpec`` draw block ids from one pool.

    Attributes:
        kind: ``full_attention``, ``sliding_window``, ``chunked_local_attention`` or
            ``cross_attention`` (an encoder-decoder model's cross attention: its table holds
            the request's encoder tokens, ``allocate_slots(..., num_encoder_tokens=E)``;
            only with ``enable_caching=False``, as vLLM runs encoder-decoder models) or
            ``mamba`` (state-space layers, vLLM's ``MambaSpec``: a request's state after its
            last computed token; docs/semantics.md#mamba-groups).
        block_size: tokens per block of this group; None: ``KVCacheSpec.block_size``.
        sliding_window: the window in tokens (``sliding_window`` groups only).
        attention_chunk_size: the chunk in tokens (``chunked_local_attention`` only).
        mamba_cache_mode: ``mamba`` groups only: ``"none"`` (None means it too: one state per
            request, prefix caching off) or ``"align"`` (vLLM 0.33, prefix caching on: the
            state at each block end is kept and cached). ``MAMBA_CACHE_MODES``.
        num_speculative_blocks: ``mamba`` groups only: extra state blocks per request for
            speculative decoding (vLLM's ``MambaSpec.num_speculative_blocks``), 0 by default.
        num_prefill_checkpoint_blocks: ``mamba`` groups only (capability
            ``mamba_checkpoints``, vLLM 0.33's ``MambaSpec`` field): above 0, an "align"
            prefill chunk may also export the state at its checkpoint position into one more
            block (docs/semantics.md#mamba-prefill-checkpoints); 0 by default.
        prefill_checkpoint_alignment: ``mamba`` groups only (capability
            ``mamba_checkpoints``, vLLM 0.33's ``MambaSpec`` field): the token grid, from the
            chunk start, a checkpoint must be on (an int >= 1); None (the default): the
            backend exports no checkpoint.
        is_eagle_group: vLLM 0.33's ``KVCacheGroupSpec.is_eagle_group`` (capability
            ``eagle_groups``, a bool): the group holds the EAGLE drafter's layers. With
            ``use_eagle`` only flagged groups' hits drop their last block, and a spec group
            drops when any member is flagged; none flagged: every group drops (vLLM's
            fallback). False by default, and then not sent
            (docs/semantics.md#prefix-cache-hits).
    """

    kind: str = "full_attention"
    block_size: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mamba_cache_mode: str | None = None
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None
    is_eagle_group: bool = False


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """The pool a test asks for.

    Attributes:
        num_blocks: physical blocks, null block included.
        block_size: tokens per block.
        enable_caching: prefix caching on.
        hash_algo: ``sha256``, ``sha256_cbor``, ``xxhash`` or ``xxhash_cbor``.
        pythonhashseed: the PYTHONHASHSEED the NONE_HASH derives from (``None`` = unset).
            The suite pins it so hashes are comparable across processes.
        enable_kv_cache_events: record KV events.
        max_model_len: cap on slots per request, or None.
        profile: the vLLM profile the test expects (``vllm-0.33`` / ``vllm-0.10``); a
            multi-profile implementation switches behaviour on it.
        kv_cache_groups: ``()`` (the default): one full-attention group of ``block_size``,
            and the manager speaks the single-group protocol (flat lists of block ids).
            Non-empty (only with the ``kv_cache_groups`` capability): the model's groups in
            vLLM's group order, and ``get_computed_blocks``, ``allocate_slots`` and
            ``get_block_ids`` speak one list per group (``SupportsKVCacheGroups``), even for
            a single group.
        prefix_cache_retention_interval: vLLM 0.33's ``KVCacheConfig`` field of that name
            (None: every block of a sliding-window group is cached; 0: only the blocks that
            end at the prompt's last aligned boundary). Ignored by ``vllm-0.10``.
        dcp_world_size: decode context parallelism (capability ``dcp``, with
            ``kv_cache_groups``): vLLM's ``KVCacheManager(dcp_world_size=W)``. Block sizes
            stay per rank; a sharded group's block covers ``W`` times as many tokens of the
            request (``group_block_size``), as the block tables of ``build_batch`` do.
        prefix_match_unit: vLLM 0.33's ``CacheConfig.prefix_match_unit`` (capability
            ``prefix_match_unit``, with ``kv_cache_groups``): hashes every this many tokens
            with several groups and caching on (None: the gcd of the group block sizes).
        use_eagle: EAGLE/MTP speculative decoding (capability ``eagle``): vLLM's
            ``KVCacheManager(use_eagle=True)``. A hit drops its last block (0.33: one hit
            alignment unit) in every group, so the drafting head's hidden state is recomputed
            (docs/semantics.md#prefix-cache-hits); an implementation refuses it with chunked
            local attention and caching on, as vLLM asserts.
        num_prefill_lookahead: vLLM 0.33's multi-module MTP prefill lookahead ``K``
            (capability ``prefill_lookahead``; vLLM's
            ``KVCacheManager(num_prefill_lookahead=K)``, ``num_speculative_tokens``): 0 (the
            default) or 1 change nothing. Above 1 the last ``K - 1`` computed tokens may be
            re-prefilled, so they are cached only once more tokens are computed (one group:
            always; several: in EAGLE's groups, ``use_eagle``), and every sliding-window group
            frees its blocks ``K - 1`` tokens later (``extra_retained_tokens``)
            (docs/semantics.md#multi-module-mtp). With ``use_eagle`` and caching on ``K`` must
            not exceed the scheduler block size (vLLM raises ValueError); ``vllm-0.10`` has no
            such argument. Sent on the wire only when non-zero.
        num_hash_lookahead_tokens: vLLM 0.33's hash lookahead ``L`` (capability
            ``hash_lookahead``; vLLM's ``KVCacheManager(num_hash_lookahead_tokens=L)`` with
            the request hasher's ``get_request_block_hasher(..., L)``, its default for
            EAGLE-family speculative decoding with prefix caching): a block is hashed only once
            the ``L`` tokens after it exist and its hash's extra keys become ``(E, *those
            tokens)`` (``E`` over the block and them), so it is cached and hit only then; each
            ``BlockStored`` lists those tokens per block (``lookahead_token_ids``), and Mamba
            prefill checkpoints leave them after the boundary
            (docs/semantics.md#request-block-hashes). Refused (``KVCacheMisuseError``) under
            ``vllm-0.10``, with caching off and with ``use_eagle`` (vLLM's config and scheduler
            never combine them). Sent on the wire only when non-zero.
        watermark: vLLM 0.33's ``SchedulerConfig.watermark`` (capability
            ``admission_gates``; ``KVCacheManager(watermark=...)``), a fraction in ``[0, 1)``:
            an allocation for a request that holds no blocks (waiting or preempted) leaves
            ``int(watermark * num_blocks)`` blocks free while another request is scheduled
            (``allocate_slots(..., has_scheduled_reqs)``, default True)
            (docs/semantics.md#admission-gates). Sent on the wire only when non-zero.
        max_in_flight_tokens: vLLM 0.33's ``VllmConfig.max_in_flight_tokens`` (capability
            ``admission_gates``; None: ``max_model_len``): it sizes a sliding window's and a
            chunked-local group's admission cap, which ``full_sequence_must_fit`` counts
            against. Sent on the wire only when set.
        mamba_shared_prefix_checkpoint: vLLM 0.33's
            ``CacheConfig.enable_mamba_shared_prefix_checkpoint`` (capability
            ``mamba_shared_prefix_checkpoint``; ``KVCacheManager(
            enable_mamba_shared_prefix_checkpoint=True)``): a Mamba "align" group also keys
            the state at the request's shared-prefix boundary (its lookup's
            ``shared_prefix_boundary``, the Marconi junction) when an allocation's chunk ends
            exactly there inside the prompt (docs/semantics.md#the-shared-prefix-checkpoint).
            vLLM narrows it off silently (no error) unless some group is an EAGLE group
            (``is_eagle_group`` or ``use_eagle``), fine-grained partial hits are on and there
            is no re-prefillable tail (``num_prefill_lookahead`` <= 1); refused under
            ``vllm-0.10`` (no such argument). Sent on the wire only when true.
        needs_kv_cache_zeroing: vLLM 0.33's ``KVCacheConfig.needs_kv_cache_zeroing``
            (capability ``block_zeroing``; vLLM derives it from Mamba layers or a
            mixed-precision cache): the worker zeroes every attention block handed out fresh
            before its first use, so the manager records their ids for
            ``take_new_block_ids`` (``SupportsBlockZeroing``,
            docs/semantics.md#worker-side-block-zeroing). Sent on the wire only when true.
    """

    num_blocks: int
    block_size: int
    enable_caching: bool = True
    hash_algo: str = "sha256"
    pythonhashseed: str | None = "0"
    enable_kv_cache_events: bool = False
    max_model_len: int | None = None
    profile: str = "vllm-0.33"
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = ()
    prefix_cache_retention_interval: int | None = None
    dcp_world_size: int = 1
    prefix_match_unit: int | None = None
    use_eagle: bool = False
    num_prefill_lookahead: int = 0
    num_hash_lookahead_tokens: int = 0
    watermark: float = 0.0
    max_in_flight_tokens: int | None = None
    needs_kv_cache_zeroing: bool = False
    mamba_shared_prefix_checkpoint: bool = False

    def __post_init__(self) -> None:
        # Immutable all the way down: a list of groups given here becomes a tuple, so no
        # adapter can append to the groups kvcheck checks against.
        groups: object = self.kv_cache_groups
        if type(groups) is not tuple and isinstance(groups, (list, tuple)):
            object.__setattr__(self, "kv_cache_groups", tuple(groups))

    @property
    def groups(self) -> tuple[KVCacheGroupSpec, ...]:
        """The effective groups: ``kv_cache_groups``, or one full-attention group."""
        return self.kv_cache_groups or (KVCacheGroupSpec("full_attention", self.block_size),)

    def group_spec_block_size(self, group: int) -> int:
        """Group ``group``'s own block size (per rank: vLLM's ``kv_cache_spec.block_size``)."""
        size = self.groups[group].block_size
        return self.block_size if size is None else size

    def group_block_size(self, group: int) -> int:
        """Tokens of a request per block of group ``group`` (vLLM's per-group manager's
        ``block_size``): its own size, times ``dcp_world_size`` where DCP shards the group
        (``dcp_sharded``: every kind under ``vllm-0.10``, every kind but ``mamba`` else)."""
        size = self.groups[group].block_size
        size = self.block_size if size is None else size
        if self.dcp_world_size != 1 and (self.profile == "vllm-0.10"
                                         or self.groups[group].kind != "mamba"):
            return size * self.dcp_world_size
        return size


class KVCacheSpecOptions(TypedDict, total=False):
    """``KVCacheSpec``'s fields beyond its sizes and profile, as keyword arguments."""

    enable_caching: bool
    hash_algo: str
    pythonhashseed: str | None
    enable_kv_cache_events: bool
    max_model_len: int | None
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    prefix_cache_retention_interval: int | None
    dcp_world_size: int
    prefix_match_unit: int | None
    use_eagle: bool
    num_prefill_lookahead: int
    num_hash_lookahead_tokens: int
    watermark: float
    max_in_flight_tokens: int | None
    needs_kv_cache_zeroing: bool
    mamba_shared_prefix_checkpoint: bool


class _KVCacheSpecSizes(TypedDict):
    num_blocks: int
    block_size: int


class KVCacheSpecFields(_KVCacheSpecSizes, KVCacheSpecOptions, total=False):
    """``KVCacheSpec``'s fields but ``profile``, as keyword arguments."""


@dataclass(frozen=True, slots=True)
class RequestView:
    """An immutable snapshot of a request, passed on every call.

    Between calls ``output_token_ids`` may only grow (decode) and ``num_computed_tokens`` is
    advanced by the suite (the scheduler's job), never by the implementation.

    Attributes:
        mm_features: ``(identifier, offset, length)`` per multimodal item, sorted by offset.
        lora: ``(lora_name, lora_int_id, lora_path)`` or None.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...] = ()
    num_computed_tokens: int = 0
    lora: tuple[str, int, str] | None = None
    mm_features: tuple[tuple[str, int, int], ...] = ()
    cache_salt: str | None = None
    skip_reading_prefix_cache: bool = False

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Prompt then output tokens."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass(frozen=True, slots=True)
class ImplInfo:
    """What the implementation is and what it claims.

    Attributes:
        name: short display name, used in test ids and reports (printable, no spaces).
        version: the implementation's version string.
        capabilities: names from ``CAPABILITIES``.
        profile: the profile it claims to follow (default for ``--kv-profile``).
        hash_algos: vLLM hash algorithms (``HASH_ALGOS``) it reproduces byte for byte; block
            hashes are compared, and hash tests run, only for these. ``()`` for a design with
            its own hashing.
        commit: optional source revision, copied into result records.
        reserved_block_ids: block ids the pool never hands out (vLLM's null block 0). None:
            the profile's default, ``(0,)`` under the vLLM profiles and ``()`` under
            ``generic``.
        block_sizes: the block sizes (tokens) the design supports; None: any size >= 1.
        num_blocks_range: ``(min, max)`` pool sizes (blocks, reserved ones included) it
            supports, inclusive; None: any.
        ref_cnt_counts_cache: whether ``ref_cnt(block_id)`` counts the prefix cache's own
            reference (radix / trie caches: a cached block nobody holds has ref_cnt 1 and is
            still free, i.e. evictable). False: vLLM's convention, ref_cnt is the number of
            requests holding the block (see docs/generic-profile.md, "Reference counts").
            Needs the ``ref_counts`` capability.
    """

    name: str
    version: str
    capabilities: frozenset[str] = field(default_factory=frozenset)
    profile: str = "vllm-0.33"
    hash_algos: tuple[str, ...] = ("sha256",)
    commit: str | None = None
    reserved_block_ids: tuple[int, ...] | None = None
    block_sizes: tuple[int, ...] | None = None
    num_blocks_range: tuple[int, int] | None = None
    ref_cnt_counts_cache: bool = False

    def supports(self, spec: KVCacheSpec) -> bool:
        """Whether ``spec``'s block sizes (every KV-cache group's, for a multi-group spec) and
        pool size are within the declared limits (a group's own size: per rank under DCP)."""
        if self.block_sizes is not None and not all(
                spec.group_spec_block_size(g) in self.block_sizes
                for g in range(len(spec.groups))):
            return False
        if self.num_blocks_range is not None:
            low, high = self.num_blocks_range
            return low <= spec.num_blocks <= high
        return True


def extra_key_kinds(capabilities: Collection[str]) -> frozenset[str]:
    """The extra-key kinds (``EXTRA_KEY_KINDS``) ``capabilities`` declares: ``extra_keys``
    means all three, else those named one by one."""
    if "extra_keys" in capabilities:
        return frozenset(EXTRA_KEY_KINDS)
    return frozenset(k for k in EXTRA_KEY_KINDS if k in capabilities)


def effective_capabilities(info: ImplInfo, profile: str) -> frozenset[str]:
    """The capabilities tests may rely on under ``profile``: the declared ones, plus every
    ``DESIGN_CAPABILITIES`` feature under a vLLM profile (vLLM's design has them all), and
    the extra keys as the union of their kinds (``extra_keys`` adds ``lora``, ``multimodal``
    and ``cache_salt``; those three add ``extra_keys``)."""
    caps = info.capabilities
    if profile != "generic" and "manager" in caps:
        caps = caps | DESIGN_CAPABILITIES
    kinds = extra_key_kinds(caps)
    if len(kinds) == len(EXTRA_KEY_KINDS):
        return caps | kinds | {"extra_keys"}
    return caps | kinds


def group_capabilities(spec: KVCacheSpec) -> frozenset[str]:
    """The capabilities a multi-group ``spec`` needs (``kv_cache_groups`` and one per group
    kind, ``KIND_CAPABILITIES``; ``mamba_checkpoints`` for a Mamba group's prefill checkpoint
    fields or a retention interval beside one; ``eagle_groups`` for a group flagged
    ``is_eagle_group``); none for a single-group spec."""
    if not spec.kv_cache_groups:
        return frozenset()
    caps = {"kv_cache_groups"} | {KIND_CAPABILITIES.get(g.kind, g.kind)
                                  for g in spec.kv_cache_groups}
    if "mamba" in caps and (spec.prefix_cache_retention_interval is not None or any(
            g.num_prefill_checkpoint_blocks or g.prefill_checkpoint_alignment is not None
            for g in spec.kv_cache_groups)):
        caps.add("mamba_checkpoints")
    if any(g.is_eagle_group for g in spec.kv_cache_groups):
        caps.add("eagle_groups")
    if spec.mamba_shared_prefix_checkpoint:
        caps.add("mamba_shared_prefix_checkpoint")
    return frozenset(caps)


def reserved_block_ids(info: ImplInfo, profile: str) -> tuple[int, ...]:
    """Block ids never handed out: the declared ones, else the profile's default (vLLM's null
    block 0 under the vLLM profiles, none under ``generic``)."""
    if info.reserved_block_ids is not None:
        return tuple(info.reserved_block_ids)
    return () if profile == "generic" else (0,)


def spec_to_dict(spec: KVCacheSpec) -> dict[str, object]:
    """``spec`` as JSON-able primitives (traces, repro snippets). The hybrid fields are left
    out while they hold their defaults, so single-group traces read as they always did, and so
    are a group's Mamba fields (``mamba_cache_mode``, ``num_speculative_blocks``,
    ``num_prefill_checkpoint_blocks``, ``prefill_checkpoint_alignment``), its
    ``is_eagle_group``, and
    ``dcp_world_size`` / ``prefix_match_unit`` / ``use_eagle`` / ``num_prefill_lookahead`` /
    ``num_hash_lookahead_tokens`` / ``watermark`` / ``max_in_flight_tokens`` /
    ``mamba_shared_prefix_checkpoint`` (an engine that predates them never sees them)."""
    raw: dict[str, object] = {
        f: getattr(spec, f) for f in KVCacheSpec.__dataclass_fields__
        if f not in ("needs_kv_cache_zeroing",
                     "kv_cache_groups", "prefix_cache_retention_interval", "dcp_world_size",
                     "prefix_match_unit", "use_eagle", "num_prefill_lookahead",
                     "num_hash_lookahead_tokens", "watermark", "max_in_flight_tokens",
                     "mamba_shared_prefix_checkpoint")}
    if spec.kv_cache_groups:
        raw["kv_cache_groups"] = [
            {f: getattr(g, f) for f in KVCacheGroupSpec.__dataclass_fields__
             if f not in _MAMBA_FIELDS or getattr(g, f) != _MAMBA_FIELDS[f]}
            for g in spec.kv_cache_groups]
    if spec.prefix_cache_retention_interval is not None:
        raw["prefix_cache_retention_interval"] = spec.prefix_cache_retention_interval
    if spec.dcp_world_size != 1:
        raw["dcp_world_size"] = spec.dcp_world_size
    if spec.prefix_match_unit is not None:
        raw["prefix_match_unit"] = spec.prefix_match_unit
    if spec.use_eagle:
        raw["use_eagle"] = True
    if spec.num_prefill_lookahead:
        raw["num_prefill_lookahead"] = spec.num_prefill_lookahead
    if spec.num_hash_lookahead_tokens:
        raw["num_hash_lookahead_tokens"] = spec.num_hash_lookahead_tokens
    if spec.watermark:
        raw["watermark"] = spec.watermark
    if spec.max_in_flight_tokens is not None:
        raw["max_in_flight_tokens"] = spec.max_in_flight_tokens
    if spec.mamba_shared_prefix_checkpoint:
        raw["mamba_shared_prefix_checkpoint"] = True
    if spec.needs_kv_cache_zeroing:
        raw["needs_kv_cache_zeroing"] = True
    return raw


#: A group's Mamba fields and ``is_eagle_group``, with their defaults (left out of
#: ``spec_to_dict`` at them: an engine that predates them never sees them).
_MAMBA_FIELDS: dict[str, object] = {"mamba_cache_mode": None, "num_speculative_blocks": 0,
                                    "num_prefill_checkpoint_blocks": 0,
                                    "prefill_checkpoint_alignment": None,
                                    "is_eagle_group": False}


# Any: decoded JSON in spec_to_dict's form, given to the constructors as it is (a wrong or
# unknown field is their TypeError).
def spec_from_dict(raw: dict[str, Any]) -> KVCacheSpec:
    """The inverse of ``spec_to_dict`` (group dicts become ``KVCacheGroupSpec``)."""
    fields = dict(raw)
    if "kv_cache_groups" in fields:
        fields["kv_cache_groups"] = tuple(
            KVCacheGroupSpec(**g) for g in fields["kv_cache_groups"])
    return KVCacheSpec(**fields)


@runtime_checkable
class KVCacheManagerAdapter(Protocol):
    """Request-level manager (capability ``manager``), vLLM's ``KVCacheManager`` surface."""

    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        """Longest cached prefix of whole blocks: ``(block_ids, num_computed_tokens)``,
        capped at ``request.num_tokens - 1`` tokens. No side effects, unless the design
        declares ``pinning_lookup`` (``SupportsReleaseComputed``): then it may take references
        on its hits, which the next ``allocate_slots`` or ``release_computed`` of the request
        consumes."""
        ...

    def allocate_slots(
        self,
        request: RequestView,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: Sequence[int] = (),
        num_lookahead_tokens: int = 0,
        *,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: Sequence[int] = (),
        num_in_flight_tokens: int = 0,
    ) -> list[int] | None:
        """Slots for ``num_computed + num_new_computed + num_new (+ lookahead)`` tokens.

        Returns only the newly allocated block ids in block-table order, or None, with no
        state change at all, when the pool is short.

        The keyword-only arguments are passed only to an implementation declaring
        ``external_kv`` (``SupportsExternalKV``; ``num_encoder_tokens``: ``cross_attention``),
        and only when not at their default: an adapter without them keeps working unchanged.
        ``num_encoder_tokens = E`` comes with the call that schedules an encoder-decoder
        request's encoder input (its admission, as vLLM's scheduler passes it): every
        ``cross_attention`` group's table then holds ``cdiv(E, block_size)`` blocks until
        the request is freed.

        vLLM 0.33's admission gates (capability ``admission_gates``, never passed to an
        implementation without it; docs/semantics.md#admission-gates):
        ``full_sequence_must_fit=True`` answers None, before anything else, unless the
        request's full sequence (``min(request.num_tokens, max_model_len)`` tokens, this
        call's hits counted as the step counts them, each sliding-window / chunked-local
        group clamped at its admission cap from ``spec.max_in_flight_tokens``) plus the
        watermark fits the free blocks; ``reserved_blocks=R``: the step itself must fit
        ``free - R``; ``has_scheduled_reqs``: whether another request is scheduled this step.
        The watermark (``int(spec.watermark * num_blocks)`` blocks) is added to both needs
        when ``has_scheduled_reqs`` and the request is waiting or preempted, which the
        implementation tells from its own state: the request holds no blocks (never
        admitted, or freed since: a preempted request's blocks are freed). The suite passes
        them as vLLM's scheduler does: ``full_sequence_must_fit`` and ``has_scheduled_reqs``
        (whether another request holds blocks) with a waiting or preempted request's
        allocation, ``reserved_blocks`` at times with any.

        vLLM 0.33's asynchronous scheduling (capability ``async_scheduling``, passed only
        when not 0; docs/semantics.md#asynchronous-scheduling): ``num_in_flight_tokens = k``
        of ``request.num_computed_tokens`` belong to steps whose output is not processed yet
        (vLLM's ``Request.num_in_flight_tokens``; the suite passes the request's previous
        step's tokens). The blocks a sliding window or a finished chunk skips are freed at
        ``max(0, computed + hits + external - k)`` tokens, the processed basis: an in-flight
        step still reads the blocks below the optimistic count. Nothing else changes.

        ``skip_zeroing_group_ids`` (capability ``block_zeroing``, passed only when non-empty,
        with an asynchronous external load: ``delay_cache_blocks``): the groups whose
        external tokens' new blocks the load writes, so they are not recorded for zeroing
        (zeroing would race the load); every other new block of a recording group still is
        (``SupportsBlockZeroing``)."""
        ...

    def free(self, request_id: str) -> None:
        """Release the request's blocks (last block first); unknown ids are a no-op."""
        ...

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table in logical order ([] if unknown)."""
        ...

    def num_free_blocks(self) -> int:
        """Free blocks, evictable cached blocks included."""
        ...


@runtime_checkable
class SupportsResetPrefixCache(Protocol):
    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; False and no change while any block is in use. Needed only
        with the ``reset_prefix_cache`` capability (implied by the vLLM profiles)."""
        ...


@runtime_checkable
class BlockPoolAdapter(Protocol):
    """Pool-level surface (capability ``block_pool``), vLLM's ``BlockPool``."""

    def get_new_blocks(self, num_blocks: int) -> list[int]: ...
    def free_blocks(self, ordered_block_ids: Sequence[int]) -> None: ...
    def touch(self, block_ids: Sequence[int]) -> None: ...
    def cache_full_blocks(
        self, request: RequestView, block_ids: Sequence[int], num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None: ...
    def get_cached_block(self, block_hash: bytes) -> int | None: ...
    def num_free_blocks(self) -> int: ...
    def free_block_ids(self) -> list[int]: ...


@runtime_checkable
class SupportsFreeQueueOrder(Protocol):
    def free_block_ids(self) -> list[int]: ...


@runtime_checkable
class SupportsRefCounts(Protocol):
    def ref_cnt(self, block_id: int) -> int: ...


@runtime_checkable
class SupportsReleaseComputed(Protocol):
    """Capability ``pinning_lookup``: ``get_computed_blocks`` may pin its hits (take a
    reference on each, lock a radix node, touch an LRU) as real tree caches do.

    The suite then follows every lookup of a request with exactly one of
    ``allocate_slots(request, ...)`` (the pins become the request's references on the hits
    passed in; pins on looked-up blocks not passed are dropped), whether it succeeds or not
    (a refusal keeps the pins), and ``release_computed(request_id)``. It never looks a
    request up again, nor frees it, before that. Between lookup and allocation or release a
    pinned block counts as held by the request that looked it up (never free, never handed
    out anew)."""

    def release_computed(self, request_id: str) -> None:
        """Drop the pins the request's last ``get_computed_blocks`` took (after a refused
        ``allocate_slots``, or a lookup the scheduler did not follow with an allocation); a
        request without pins is a no-op."""
        ...


@runtime_checkable
class SupportsBlockHashes(Protocol):
    def block_hashes(self, request_id: str) -> list[bytes]: ...


@runtime_checkable
class SupportsEvents(Protocol):
    def take_events(self) -> list[KVEvent]:
        """Drain events, each a dict with ``"type"`` in ``BlockStored`` / ``BlockRemoved`` /
        ``AllBlocksCleared`` and vLLM's field names (``block_hashes``, ``parent_block_hash``,
        ``token_ids``, ``block_size``, ``lora_id``, ``medium``, ``group_idx``...)."""
        ...


@runtime_checkable
class SupportsEventWire(Protocol):
    def take_event_batch(self, ts: float) -> bytes:
        """Drain the KV events since the last drain and return them encoded as one
        ``KVEventBatch``: the payload frame (the third) vLLM's ``ZmqEventPublisher`` sends for
        one scheduler step, in the wire format of ``spec.profile`` (``vllm-0.33``: tagged
        maps; ``vllm-0.10``: tagged arrays; ``generic``: 0.33's), with timestamp ``ts``
        (seconds) and ``data_parallel_rank`` nil. Hashes in either form of vLLM's
        ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (full bytes, or the u64 of their last 8
        bytes), the same form in every batch. docs/events.md has the bytes."""
        ...


@runtime_checkable
class SupportsSlotMapping(Protocol):
    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]: ...


@runtime_checkable
class SupportsBatchMetadata(Protocol):
    """Capability ``batch_metadata``: the worker-side batch builder and page-table conversions
    (vLLM's ``BlockTable.compute_slot_mapping`` and model-runner input preparation; FlashInfer's
    CSR page table; SGLang's ``req_to_token``).

    The methods live on the manager because they need its ``spec.block_size`` (tokens per
    physical block on one rank), but they read no manager state: every block table is passed
    in, as rows of physical block ids in logical order (row ``r`` is request ``r``; a row may
    hold more blocks than its tokens need). A ``UnsupportedSpec`` raised by a call declines
    those arguments (e.g. a DCP interleave size the design lacks); the suite then draws others.
    """

    def build_batch(
        self,
        block_tables: Sequence[Sequence[int]],
        num_computed_tokens: Sequence[int],
        num_scheduled_tokens: Sequence[int],
        num_padded_tokens: int,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_kv_cache_interleave_size: int = 1,
    ) -> tuple[list[int], list[int], list[int]]:
        """One step's ``(slot_mapping, positions, req_indices)``.

        Request ``r`` has ``num_computed_tokens[r]`` tokens in the cache and
        ``num_scheduled_tokens[r]`` scheduled now; the step's ``num_tokens =
        sum(num_scheduled_tokens)`` tokens are laid out request by request. Token ``i`` has
        ``req_indices[i] = r`` and ``positions[i] = num_computed_tokens[r] + (i - first token
        of r)``. ``slot_mapping`` has ``num_padded_tokens >= num_tokens`` entries. With
        ``W = dcp_world_size``, ``I = cp_kv_cache_interleave_size`` (``I`` divides
        ``block_size``), ``V = block_size * W`` and ``vo = pos % V``, a token is stored on rank
        ``(pos // I) % W``; on that rank its slot is ``row[pos // V] * block_size +
        (vo // (W * I)) * I + vo % I`` (``row[pos // block_size] * block_size + pos %
        block_size`` when ``W == 1``). Every other rank, and every padding entry from
        ``num_tokens`` on, gets ``-1`` (``PAD_SLOT_ID``). ``positions`` and ``req_indices``
        have ``num_tokens`` entries. Reference:
        ``kvcheck.reference_impl.batch_metadata.build_batch``."""
        ...

    def flashinfer_csr(
        self, block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int],
    ) -> tuple[list[int], list[int], list[int]]:
        """FlashInfer's CSR page table ``(kv_indptr, kv_indices, kv_last_page_len)`` of the
        first ``len(seq_lens)`` rows (each ``seq_len >= 1``): ``kv_indptr = [0,
        cumsum(num_pages)]`` with ``num_pages = ceil(seq_len / block_size)``, ``kv_indices``
        the rows' first ``num_pages`` ids concatenated, ``kv_last_page_len = seq_len -
        (num_pages - 1) * block_size`` (in ``[1, block_size]``: a full last page is
        ``block_size``, never 0). Reference: ``kvcheck.reference_impl.page_table``."""
        ...

    def req_to_token(
        self, block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int],
    ) -> list[list[int]]:
        """SGLang's ``req_to_token`` rows: row ``b`` holds the flat slot
        ``row_b[pos // block_size] * block_size + pos % block_size`` of every position
        ``pos < seq_lens[b]`` (exactly ``seq_lens[b]`` entries). Reference:
        ``kvcheck.reference_impl.batch_metadata.req_to_token``."""
        ...


@runtime_checkable
class SupportsKVCacheGroups(Protocol):
    """Capability ``kv_cache_groups`` (with ``sliding_window`` / ``chunked_local_attention``
    for those kinds): the manager methods when ``spec.kv_cache_groups`` is non-empty.

    Every list of block ids becomes one list per group, in ``spec.kv_cache_groups`` order;
    ``0`` in a list is vLLM's null block (a position a sliding window or a finished chunk no
    longer needs: never handed out, cached or queued). The other methods keep their
    single-group form: one pool (``num_free_blocks``, ``free_block_ids``, ``ref_cnt``), one
    ``free(request_id)``, ``block_hashes`` at vLLM's hash block size, and KV events that name
    their group (``group_idx``, ``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window`` under
    ``vllm-0.33``)."""

    def get_computed_blocks(self, request: RequestView) -> tuple[list[list[int]], int]:
        """Per-group hit lists (nulls included) and the common hit length in tokens."""
        ...

    def allocate_slots(
        self,
        request: RequestView,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: Sequence[Sequence[int]] = (),
        num_lookahead_tokens: int = 0,
        *,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
    ) -> list[list[int]] | None:
        """Per-group lists of the newly allocated blocks, or None (no state change except
        vLLM's own: blocks a window skips are freed even when the allocation then fails).
        ``num_encoder_tokens`` (``cross_attention``): as ``KVCacheManagerAdapter``'s."""
        ...

    def get_block_ids(self, request_id: str) -> list[list[int]]:
        """Per-group block tables, nulls included (a list of empty lists if unknown)."""
        ...


@runtime_checkable
class SupportsExternalKV(Protocol):
    """Capability ``external_kv``: KV that a connector loads from outside the pool
    (prefill/decode disaggregation, an offload tier), vLLM's ``allocate_slots(...,
    num_external_computed_tokens, delay_cache_blocks)`` and ``cache_blocks``
    (docs/semantics.md#external-kv-connector-tokens).

    ``allocate_slots(..., num_external_computed_tokens=E)``: E tokens after the request's
    computed tokens and hits are already computed elsewhere; the request needs slots for them
    (fresh blocks, never a cache hit of its own or another request's block) but no compute.
    The answer lists every block the call added to the tables, the external tokens' blocks
    first, in table order (vLLM 0.33 returns only the blocks after them; its adapter reads
    the rest from the table). ``num_new_tokens`` may be 0 when anything is computed (an
    asynchronous load). With ``delay_cache_blocks=True`` the call caches nothing: blocks
    still being loaded must not be hit by anyone until ``cache_blocks``."""

    def cache_blocks(self, request: RequestView, num_computed_tokens: int) -> None:
        """Cache the request's blocks that are full within its first ``num_computed_tokens``
        tokens (after an asynchronous load arrived, or the valid prefix of a failed one);
        blocks already cached are unchanged."""
        ...


@runtime_checkable
class SupportsEvictBlocks(Protocol):
    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """Capability ``evict_blocks`` (vLLM 0.33, for blocks whose external load failed):
        drop every cache key of these blocks, one ``BlockRemoved`` per key; reference
        counts, free-queue order and block tables are unchanged."""
        ...


@runtime_checkable
class SupportsNewStep(Protocol):
    def new_step_starts(self) -> None:
        """A scheduler step begins (vLLM 0.33's ``KVCacheManager.new_step_starts``, which its
        scheduler calls at the start of every ``schedule``). Optional: the driver calls it at
        the start of each step of a layout with a ``mamba`` group when the manager has it;
        required of a ``mamba`` implementation under ``vllm-0.33`` (a Mamba "align" group
        refuses, answering None, a hit on a block cached in the same step; the refusal
        lifts at the next step). A no-op for every other group kind."""
        ...


@runtime_checkable
class SupportsBlockZeroing(Protocol):
    def take_new_block_ids(self) -> list[int]:
        """Capability ``block_zeroing`` (vLLM 0.33's ``KVCacheManager.take_new_block_ids``,
        which its scheduler drains every step into ``SchedulerOutput.new_block_ids_to_zero``
        for the worker to zero before the forward). Called only for a spec with
        ``needs_kv_cache_zeroing``. Drains the ids of the blocks handed out fresh since the
        last call, in vLLM's order (groups in order; within a group, the order they were
        taken): every new block of an attention group (full attention, sliding window,
        chunked local, cross attention; never a Mamba group's), the external tokens' blocks
        included unless ``allocate_slots(..., skip_zeroing_group_ids)`` named the group, and
        a copy-on-write block (``fine_grained_hits``); never a cache-hit block nor the null
        block. An id appears once per time it was handed out, freed since or not
        (docs/semantics.md#worker-side-block-zeroing)."""
        ...

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """vLLM 0.33's ``KVCacheManager.record_blocks_for_zeroing`` (its scheduler calls it
        when an asynchronous load failed past a valid prefix): records again, for the next
        ``take_new_block_ids``, the request's blocks of every recording group from token
        ``start_token`` (a multiple of each such group's block size) on, null blocks
        included where a window left them."""
        ...


@runtime_checkable
class SupportsBlockCopies(Protocol):
    def take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        """Capability ``fine_grained_hits`` (vLLM 0.33's ``KVCacheManager.
        take_kv_cache_block_copies``, then its scheduler's release of the retained blocks).
        Drains the copy-on-write copies made since the last call, as ``(src_block_id,
        dst_block_id)`` pairs in vLLM's order (groups in order; within a group, the order the
        copies were made), and releases the references the copies retained the way vLLM's
        scheduler does in its non-deferred mode: ``block_pool.free_blocks([src, dst, src,
        dst, ...])`` in that order (the free queue shows it). ``[]`` when nothing was copied.

        A copy is made by ``allocate_slots`` of a request whose hit ends inside a block (the
        hit block at that index is replaced in its table by a new private block, ``dst``,
        first of the new ids) or by a Mamba "align" group whose running request's own
        partial tail state is moved to a new block. The driver calls it in a layout with
        fine-grained hits (``kvcheck.conformance.fine_grained``) where vLLM's ``schedule()``
        drains the copies: before the next step starts and before any op that is not part
        of a schedule. Optional on the wire (answered ``[]`` when absent)."""
        ...


@runtime_checkable
class SupportsBoundaryStateOffloads(Protocol):
    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Capability ``boundary_state_offloads`` (vLLM 0.33's ``KVCacheManager.
        take_boundary_state_offloads``). Drains the hand-offs made since the last call as
        ``{request_id: [(group_id, block_id, boundary_tokens), ...]}``: requests in the order
        of their first hand-off, each request's in the order made (groups in order). Only a
        Mamba "align" group makes them: each state block ``cache_blocks`` keys (a full block
        at index ``i``: ``boundary_tokens = (i + 1) * block_size``) and, with fine-grained
        hits, the copy-on-write copy of a running request's own partial tail (its key's
        boundary, the prompt's last hash boundary). A request freed before the drain loses
        its hand-offs. ``{}`` when there are none.

        The driver calls it where vLLM's ``schedule()`` does, just before
        ``take_kv_cache_block_copies`` (``kvcheck.conformance.driver``). Optional on the
        wire (answered ``{}`` when absent)."""
        ...

    def finalize_partial_tail_offloads(self, request: RequestView, *,
                                       num_in_flight_tokens: int = 0,
                                       ) -> list[tuple[int, int, int]]:
        """Capability ``boundary_state_offloads`` (vLLM 0.33's ``KVCacheManager.
        finalize_partial_tail_offloads``, called by its scheduler for a KV producer whose
        request finishes, before it is freed): per Mamba "align" group that keyed
        ``request``'s own partial tail and has not copied it yet, ``(group_id, block_id,
        boundary_tokens)`` of its table block when ``request.num_computed_tokens`` equals
        ``boundary_tokens`` (no later token computed into it) and no token is in flight
        (``num_in_flight_tokens``: capability ``async_scheduling``, passed only when not 0;
        an in-flight step may still write the state); ``[]`` otherwise. Consumes the tail
        either way. The driver calls it before each ``free``. Optional on the wire
        (answered ``[]`` when absent)."""
        ...


@runtime_checkable
class SupportsInvariants(Protocol):
    def check_invariants(self) -> None: ...


@runtime_checkable
class SupportsKernels(Protocol):
    def kernels(self) -> object:
        """A ``kvcheck.gpu_kernels.conformance.KernelSet`` (checked when the kernel tests
        run)."""
        ...


class ManagerWithCapabilities(
    KVCacheManagerAdapter, SupportsResetPrefixCache, SupportsFreeQueueOrder, SupportsRefCounts,
    SupportsBlockHashes, SupportsEvents, SupportsEventWire, SupportsSlotMapping, SupportsInvariants,
    SupportsBatchMetadata, SupportsReleaseComputed, SupportsExternalKV, SupportsEvictBlocks,
    SupportsNewStep, SupportsBlockCopies, SupportsBoundaryStateOffloads, SupportsBlockZeroing,
    Protocol,
):
    """A loaded manager as the suite sees it (``ImplHandle.make_manager``): every
    manager-level method; a test calls a capability's methods only when the implementation
    declares that capability."""


#: Capability -> the Protocol whose methods declaring it requires: on the manager, on the
#: block pool (``block_pool``) or on the module (``kernels``). Capabilities missing here
#: (``prefix_caching``, ``extra_keys``, the design ones but ``reset_prefix_cache``) promise
#: behaviour, not methods.
CAPABILITY_PROTOCOLS: dict[str, type] = {
    "manager": KVCacheManagerAdapter,
    "block_pool": BlockPoolAdapter,
    "kernels": SupportsKernels,
    "reset_prefix_cache": SupportsResetPrefixCache,
    "free_queue_order": SupportsFreeQueueOrder,
    "ref_counts": SupportsRefCounts,
    "block_hashes": SupportsBlockHashes,
    "events": SupportsEvents,
    "event_wire": SupportsEventWire,
    "slot_mapping": SupportsSlotMapping,
    "invariants": SupportsInvariants,
    "batch_metadata": SupportsBatchMetadata,
    "kv_cache_groups": SupportsKVCacheGroups,
    "sizing": SupportsSizing,
    "pinning_lookup": SupportsReleaseComputed,
    "external_kv": SupportsExternalKV,
    "evict_blocks": SupportsEvictBlocks,
    "block_zeroing": SupportsBlockZeroing,
}


def protocol_methods(protocol: type) -> tuple[str, ...]:
    """The public methods a Protocol class declares, its bases' included, in definition
    order (``typing.get_protocol_members`` exists only from Python 3.13)."""
    names: dict[str, None] = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and callable(value):
                names[name] = None
    return tuple(names)


#: Capability -> method names it requires, derived from ``CAPABILITY_PROTOCOLS`` (the
#: Protocol classes are the one place the methods are written down).
CAPABILITY_METHODS: dict[str, tuple[str, ...]] = {
    cap: protocol_methods(proto) for cap, proto in CAPABILITY_PROTOCOLS.items()}
