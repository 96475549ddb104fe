"""The installed vLLM behind kvcheck's protocol (``--kv-impl=vllm``, ``--kv-oracle=vllm``).

It wraps vLLM's own code, built as vLLM's unit tests build it (docs/semantics.md#running-vllm):
``KVCacheManager`` / ``BlockPool`` over ``spec.num_blocks`` blocks with vLLM's own
``KVCacheConfig`` of the spec's groups (``kvcheck.adapters.vllm_kv_config``: one full-attention
group ``FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)`` for a
spec without ``kv_cache_groups``; one group per entry for hybrid models: full attention, sliding
window, chunked local attention), ``Request`` objects hashed by
``get_request_block_hasher(block_size, hash_fn)`` (``kvcheck.adapters.vllm_requests``), and the
worker's ``BlockTable`` for ``slot_mapping`` (``kvcheck.adapters.vllm_slots``). One manager class
answers both protocols (``kvcheck.adapters.vllm_manager``). Constructor and signature
differences between releases (0.10.x to the newest) are handled by inspecting parameter names
(``kvcheck.adapters.vllm_runtime``), and the profile is chosen by observing behaviour
(``kvcheck.adapters.vllm_features``), not by parsing the version.

Process-wide settings made at import (documented in the README):

* ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``: KV events carry the full hash bytes (kvcheck's
  protocol) instead of vLLM's default 64-bit integers;
* vLLM's general plugins are loaded first, as the engine does (``VLLM_PLUGINS`` selects them), so
  a plugin that patches ``BlockPool`` / ``KVCacheManager`` is what gets checked;
* without CUDA: ``VLLM_TARGET_DEVICE=cpu`` and ``TRITON_INTERPRET=1`` (unless already set), so
  newer releases' Triton slot-mapping kernel runs in Triton's interpreter; ``CUDA_VISIBLE_DEVICES``
  is set to ``""`` only while vLLM is imported (its Triton check otherwise disables Triton on a
  machine with no GPU driver) and restored afterwards.

vLLM's ``NONE_HASH`` is a module global derived from ``PYTHONHASHSEED`` by ``init_none_hash``;
each manager computes its own (with the spec's seed put into ``os.environ`` for the call, then
restored) and re-installs it before every hashing call, so managers with different algorithms
or seeds can coexist in one process.

Known vLLM bugs hit by the suite are listed in ``vllm-<version>.xfails`` beside this module
(``XFAILS_FILE`` names the one for the installed release, or is None); pass it with
``--kv-xfails-file``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from kvcheck.adapters import vllm_runtime
from kvcheck.adapters.vllm_feature_defaults import kv_feature_defaults
from kvcheck.adapters.vllm_features import (
    Behaviour,
    choose_profile,
    describe_profile,
    detect_event_extra_keys,
    detect_extra_key_format,
    detect_free_order,
    detect_mm_key_format,
    detect_none_hash,
    release_behaviour,
)
from kvcheck.adapters.vllm_kv_config import (
    HAS_ADMISSION_GATES,
    HAS_BLOCK_ZEROING,
    HAS_EAGLE_GROUPS,
    HAS_HASH_LOOKAHEAD,
    HAS_MAMBA_CHECKPOINTS,
    HAS_PREFILL_LOOKAHEAD,
    HAS_SHARED_PREFIX_CHECKPOINT,
    LEGACY_HYBRID,
)
from kvcheck.adapters.vllm_manager import (
    HAS_BLOCK_COPIES,
    HAS_BOUNDARY_STATE_OFFLOADS,
    HAS_EVICT_BLOCKS,
    HAS_IN_FLIGHT_TOKENS,
    VLLMBlockPool,
    VLLMManager,
    event_to_dict,
)
from kvcheck.adapters.vllm_manager import make_block_pool as make_pool
from kvcheck.adapters.vllm_native import make_native_manager
from kvcheck.adapters.vllm_offload import HAS_OFFLOAD, make_offloading_manager
from kvcheck.adapters.vllm_requests import HAS_EXTRAS, Hashing, make_request
from kvcheck.adapters.vllm_runtime import HASH_ALGOS, HINT, VERSION, get_hash_fn_by_name, kcu
from kvcheck.adapters.vllm_sizing import (
    SIZING_PROFILE,
    kv_block_sizes,
    kv_cache_view_shape,
    kv_page_size_bytes,
    kv_sizing_plan,
)
from kvcheck.adapters.vllm_slots import HAS_INTERLEAVE, slot_mapping_problem
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, RequestView

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["BEHAVIOUR", "HINT", "IMPL_INFO", "PROFILE_CHOICE", "PROFILE_NOTE", "RELEASE",
           "VERSION", "XFAILS_FILE", "VLLMBlockPool", "VLLMManager", "decode_event_batch",
           "event_to_dict",
           "kv_block_sizes", "kv_cache_view_shape", "kv_feature_defaults", "kv_page_size_bytes",
           "kv_sizing_plan",
           "make_block_pool", "make_kv_cache_manager", "make_native_manager",
           "make_offloading_manager"]

# vllm_runtime raises this when it is first imported; checked again for a process that
# imported it before vLLM went missing (tests hide vLLM that way).
if (_missing := vllm_runtime.not_installed()) is not None:
    raise _missing


def make_kv_cache_manager(spec: KVCacheSpec) -> VLLMManager:
    """A fresh vLLM ``KVCacheManager`` for ``spec``: one full-attention group answering flat
    lists, or, for a spec with ``kv_cache_groups``, vLLM's groups speaking the per-group
    protocol (``UnsupportedSpec`` for groups this release refuses)."""
    return VLLMManager(spec)


def make_block_pool(spec: KVCacheSpec) -> VLLMBlockPool:
    """A fresh vLLM ``BlockPool`` for ``spec``."""
    return VLLMBlockPool(spec)


def decode_event_batch(payload: bytes, release: str) -> object:
    """Benchmark hook (``kvcheck.bench.kinds.event_wire.EventDecodeBench``): vLLM's own
    decoder of its ``KVEventBatch`` (``release`` is the installed one's), as a consumer
    written against vLLM decodes a payload."""
    if _EVENT_DECODE is None:
        raise ImportError("vllm.distributed.kv_events (and msgspec) could not be imported")
    return _EVENT_DECODE(payload)


def _event_decode() -> Callable[[bytes], object] | None:
    try:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch
    except ImportError:
        return None
    decode: Callable[[bytes], object] = msgspec.msgpack.Decoder(KVEventBatch).decode
    return decode


_EVENT_DECODE = _event_decode()


# ------------------------------------------------------------------------------ detection
class _ProbeExtras(TypedDict, total=False):
    lora: tuple[str, int, str]
    mm_features: tuple[tuple[str, int, int], ...]


def _probe_extra_keys(**extras: Unpack[_ProbeExtras]) -> Callable[[], Sequence[object] | None]:
    """The extra keys vLLM generates for block 0 of a probe request with ``extras``."""
    def keys() -> Sequence[object] | None:
        hashing = Hashing(KVCacheSpec(num_blocks=4, block_size=4))
        view = RequestView("kvcheck-probe", (1, 2, 3, 4, 5), **extras)
        req = make_request(view, hashing.block_hasher)
        extra_keys: Sequence[object] | None = kcu.generate_block_hash_extra_keys(req, 0, 4, 0)[0]
        return extra_keys
    return keys


def _block_stored_fields() -> tuple[str, ...] | None:
    try:
        from vllm.distributed.kv_events import BlockStored
    except ImportError:
        return None
    fields: tuple[str, ...] | None = getattr(BlockStored, "__struct_fields__", None)
    return fields


def _detect() -> Behaviour:
    unhashed, caching_off = detect_free_order(lambda caching: make_pool(10, 4, caching))
    saved = kcu.NONE_HASH if hasattr(kcu, "NONE_HASH") else None
    try:
        lora = mm = None
        if HAS_EXTRAS:
            lora = detect_extra_key_format(
                _probe_extra_keys(lora=("kvcheck-probe", 7, "/kvcheck/probe")))
            mm = detect_mm_key_format(_probe_extra_keys(mm_features=(("kvcheck-img", 1, 2),)))
    finally:
        kcu.NONE_HASH = saved
    return Behaviour(free_unhashed=unhashed, free_caching_off=caching_off,
                     none_hash=detect_none_hash(kcu, get_hash_fn_by_name("sha256")),
                     extra_keys=lora, mm_keys=mm,
                     event_extra_keys=detect_event_extra_keys(_block_stored_fields()))


BEHAVIOUR: Behaviour = _detect()
_SLOT_PROBLEM = slot_mapping_problem()

_capabilities = {"manager", "block_pool", "prefix_caching", "free_queue_order", "ref_counts",
                 "block_hashes", "events",
                 # KVEventBatch encoded by msgspec's encoder, as vLLM's ZmqEventPublisher
                 # does (VLLMManager.take_event_batch).
                 "event_wire",
                 # vLLM's design features: implied by the vLLM profiles, declared so that
                 # --kv-profile=generic tests them too.
                 "reset_prefix_cache", "caching_off", "skip_reading_prefix_cache",
                 "lookahead", "multi_token_decode"}
_notes = []
# KV from outside the pool: every supported release has allocate_slots' delay_cache_blocks and
# cache_blocks (0.10.2 takes external tokens as new ones, as its scheduler passes them);
# evict_blocks only where the manager has it.
_capabilities.add("external_kv")
if HAS_EVICT_BLOCKS:
    _capabilities.add("evict_blocks")
else:
    _notes.append("evict_blocks not declared: this release's KVCacheManager has none.")
# The offload tier: vLLM's own CPUOffloadingManager where the release ships one.
if HAS_OFFLOAD:
    _capabilities.add("offload")
else:
    _notes.append("offload not declared: this release has no vllm.v1.kv_offload.")
# KV-cache groups (kvcheck.adapters.vllm_kv_config): every supported release has vLLM's hybrid
# coordinator and the sliding-window and chunked-local specs; the configurations a release
# refuses are declined per spec (UnsupportedSpec).
_capabilities.update({"kv_cache_groups", "sliding_window", "chunked_local_attention",
                      "cross_attention", "mamba"})
# EAGLE/MTP (KVCacheManager(use_eagle=True)): every supported release takes it.
_capabilities.add("eagle")
#: The features only some releases have: (present in this one, capability, note when absent).
_RELEASE_FEATURES: tuple[tuple[bool, str, str], ...] = (
    # vLLM 0.33's fine-grained partial hash hits beside a Mamba "align" group larger than
    # the hash block, with their copy-on-write copies (VLLMManager.take_kv_cache_block_copies).
    (HAS_BLOCK_COPIES, "fine_grained_hits",
     ("this release's KVCacheManager has no take_kv_cache_block_copies (no fine-grained "
      "partial hash hits).")),
    # vLLM 0.33's boundary-state hand-offs of Mamba "align" states to a KV connector
    # (VLLMManager.take_boundary_state_offloads, finalize_partial_tail_offloads).
    (HAS_BOUNDARY_STATE_OFFLOADS, "boundary_state_offloads",
     ("this release's KVCacheManager has no take_boundary_state_offloads (no Mamba prefix "
      "caching).")),
    # vLLM 0.33's Mamba prefill checkpoint blocks (MambaSpec.num_prefill_checkpoint_blocks)
    # and sparse Mamba retention (prefix_cache_retention_interval beside a Mamba group).
    (HAS_MAMBA_CHECKPOINTS, "mamba_checkpoints",
     "this release's MambaSpec has no prefill checkpoint blocks (no Mamba prefix caching)."),
    # vLLM 0.33's per-group EAGLE flag (KVCacheGroupSpec.is_eagle_group).
    (HAS_EAGLE_GROUPS, "eagle_groups",
     ("this release's KVCacheGroupSpec has no is_eagle_group (with use_eagle every group "
      "drops).")),
    # vLLM 0.33's multi-module MTP (KVCacheManager(num_prefill_lookahead=K), a sliding
    # window's extra_retained_tokens).
    (HAS_PREFILL_LOOKAHEAD, "prefill_lookahead",
     ("this release's KVCacheManager has no num_prefill_lookahead (vLLM 0.33's multi-module "
      "MTP).")),
    # vLLM 0.33's hash lookahead (KVCacheManager(num_hash_lookahead_tokens=L) and the request
    # hasher's lookahead): EAGLE-family speculative decoding's default with prefix caching.
    (HAS_HASH_LOOKAHEAD, "hash_lookahead",
     ("this release's KVCacheManager has no num_hash_lookahead_tokens (vLLM 0.33's lookahead "
      "block hashes); specs with it are declined (skipped).")),
    # vLLM 0.33's admission gates (allocate_slots' full_sequence_must_fit, reserved_blocks,
    # has_scheduled_reqs; KVCacheManager's watermark and max_in_flight_tokens).
    (HAS_ADMISSION_GATES, "admission_gates",
     ("this release's KVCacheManager has no watermark and its allocate_slots no "
      "full_sequence_must_fit / reserved_blocks (vLLM 0.33's admission gates).")),
    # vLLM 0.33's asynchronous scheduling in the KV-cache manager (Request.
    # num_in_flight_tokens: allocate_slots frees windows on the processed-token basis).
    (HAS_IN_FLIGHT_TOKENS, "async_scheduling",
     ("this release's KVCacheManager reads no Request.num_in_flight_tokens (vLLM 0.33's "
      "asynchronous scheduling).")),
    # vLLM 0.33's Mamba shared-prefix checkpoint
    # (KVCacheManager(enable_mamba_shared_prefix_checkpoint=True)).
    (HAS_SHARED_PREFIX_CHECKPOINT, "mamba_shared_prefix_checkpoint",
     ("this release's KVCacheManager has no enable_mamba_shared_prefix_checkpoint (vLLM "
      "0.33's Mamba shared-prefix checkpoint).")),
    # vLLM 0.33's worker-side block zeroing (KVCacheConfig.needs_kv_cache_zeroing; the
    # manager's take_new_block_ids, allocate_slots' skip_zeroing_group_ids).
    (HAS_BLOCK_ZEROING, "block_zeroing",
     ("this release's KVCacheConfig has no needs_kv_cache_zeroing (vLLM 0.33's worker-side "
      "block zeroing).")),
)
for _present, _capability, _why_absent in _RELEASE_FEATURES:
    if _present:
        _capabilities.add(_capability)
    else:
        _notes.append(f"{_capability} not declared: {_why_absent}")
# Decode context parallelism (KVCacheManager(dcp_world_size=W)): every supported release; and
# vLLM 0.33's CacheConfig.prefix_match_unit (its resolve_kv_cache_block_sizes), not in 0.10.2.
_capabilities.add("dcp")
# A Mamba group under DCP: every supported release builds one (0.33 leaves it unsharded, 0.10.2
# scales it; with caching on 0.10.2 refuses Mamba whatever the DCP).
_capabilities.add("mamba_dcp")
if not LEGACY_HYBRID:
    _capabilities.add("prefix_match_unit")
else:
    _notes.append("prefix_match_unit not declared: a vLLM 0.33 CacheConfig field this release "
                  "lacks (hashes are at the block size).")
if LEGACY_HYBRID:
    _notes.append("kv_cache_groups: this release's hybrid coordinator takes one full-attention "
                  "and one other spec of one block size with prefix caching on; other layouts "
                  "are declined (skipped).")
if HAS_EXTRAS:
    _capabilities.add("extra_keys")
else:
    _notes.append("extra_keys not declared: this release's Request takes LoRA / multimodal / "
                  "cache_salt inputs in a form the adapter does not know.")
if _SLOT_PROBLEM is None:
    _capabilities.update({"slot_mapping", "batch_metadata"})
    _notes.append("batch_metadata: slots from vLLM's BlockTable"
                  + ("" if HAS_INTERLEAVE else " (DCP without interleave size: interleaved "
                     "batches are declined)")
                  + "; FlashInfer CSR not checked (vLLM builds it only inside its FlashInfer "
                  "backend).")
else:
    _notes.append(f"slot_mapping and batch_metadata not declared: {_SLOT_PROBLEM}.")


def _release_version() -> str:
    """The release to hold this vLLM to: its version, or, for a source checkout reporting
    "dev" (no ``_version.py``), the version of the vllm dist-info found on the path."""
    if release_behaviour(VERSION) is not None:
        return VERSION
    try:
        from importlib.metadata import version as dist_version

        return dist_version("vllm")
    except Exception:  # noqa: BLE001 - no dist-info: nothing to compare with
        return VERSION


#: The release this vLLM is compared with (``VERSION``, or a checkout's dist-info version).
RELEASE: str = _release_version()
if RELEASE != VERSION:
    _notes.append(f"vllm.__version__ is {VERSION!r}; the vllm dist-info on the path is "
                  f"{RELEASE}, the release this checkout is compared with.")
PROFILE_CHOICE = choose_profile(BEHAVIOUR, RELEASE)
_PROFILE = PROFILE_CHOICE.profile

#: Shown in the pytest header: which profile was chosen and how this vLLM relates to it.
PROFILE_NOTE: str = describe_profile(VERSION, PROFILE_CHOICE, _notes, RELEASE)


def _commit() -> str | None:
    try:
        from vllm import _version
    except ImportError:
        return None
    commit = getattr(_version, "__commit_id__", None) or getattr(_version, "commit_id", None)
    return str(commit) if commit else None


# KV-cache sizing computed by this vLLM's own functions (kvcheck.adapters.vllm_sizing), for
# the profile the release answers.
if SIZING_PROFILE == _PROFILE:
    _capabilities.add("sizing")

IMPL_INFO = ImplInfo(
    name="vllm",
    version=VERSION,
    capabilities=frozenset(_capabilities),
    profile=_PROFILE,
    hash_algos=HASH_ALGOS,
    commit=_commit(),
    reserved_block_ids=(0,),  # vLLM's null block, under every profile
)


def _xfails_file() -> Path | None:
    path = Path(__file__).with_name(f"vllm-{VERSION}.xfails")
    return path if path.is_file() else None


#: Known vLLM bugs the suite hits on this release (``--kv-xfails-file``), or None.
XFAILS_FILE: Path | None = _xfails_file()
