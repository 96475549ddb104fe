"""The installed vLLM behind kvcheck's protocol (``--kv-impl=vllm``, ``--kv-oracle=vllm``).

It wraps vLLM's own code, built as vLLM's unit tests build it (docs/semantics.md#running-vllm): one
full-attention KV-cache group (``FullAttentionSpec(block_size, num_kv_heads=1, head_size=1,
dtype=torch.float32)``), ``KVCacheManager`` / ``BlockPool`` over ``spec.num_blocks`` blocks,
``Request`` objects hashed by ``get_request_block_hasher(block_size, hash_fn)``, and the
worker's ``BlockTable`` for ``slot_mapping``. A spec with ``kv_cache_groups`` (hybrid models:
full attention, sliding window, chunked local attention) gets vLLM's groups and coordinator
instead (``kvcheck.adapters.vllm_groups``). Constructor and signature differences between
releases (0.10.x to the newest) are handled by inspecting parameter names, and the profile is
chosen by observing behaviour (``kvcheck.adapters.vllm_features``), not by parsing the version.

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

import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from kvcheck.adapters.reference import SnapshotSync
from kvcheck.adapters.vllm_features import (
    Behaviour,
    choose_profile,
    describe_profile,
    detect_event_extra_keys,
    detect_extra_key_format,
    detect_free_order,
    detect_mm_key_format,
    detect_none_hash,
    pythonhashseed,
    release_behaviour,
)
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, RequestView, UnsupportedSpec
from kvcheck.conformance.view_sync import RequestViewSync
from kvcheck.reference_impl import events as _reference_events

__all__ = [
    "BEHAVIOUR",
    "HINT",
    "IMPL_INFO",
    "PROFILE_CHOICE",
    "PROFILE_NOTE",
    "RELEASE",
    "VERSION",
    "XFAILS_FILE",
    "VLLMBlockPool",
    "VLLMManager",
    "event_to_dict",
    "kv_block_sizes",
    "kv_cache_view_shape",
    "kv_page_size_bytes",
    "kv_sizing_plan",
    "make_block_pool",
    "make_kv_cache_manager",
    "make_native_manager",
]

HINT = ("build an environment with vLLM in it with scripts/vllm-cpu-env.sh VERSION DIR (from a "
        "kvcheck checkout; see 'Checking a patched vLLM' in README.md), then run "
        "DIR/venv/bin/pytest --kv-impl=vllm")

if importlib.util.find_spec("vllm") is None:
    raise ImportError("vLLM is not installed in this environment; " + HINT)


# ------------------------------------------------------------------------------ import vLLM
def _prepare_environment() -> bool:
    """Set the process-wide variables described in the module docstring; True on CPU only."""
    os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"
    import torch

    if torch.cuda.is_available():
        return False
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return True


@contextmanager
def _lenient_triton_check(cpu_only: bool) -> Iterator[None]:
    """vLLM disables Triton unless exactly one GPU driver is active, except when
    CUDA_VISIBLE_DEVICES is set and empty; on a CPU-only machine running Triton's interpreter,
    present it that way while vLLM is imported."""
    hide = (cpu_only and os.environ.get("TRITON_INTERPRET") == "1"
            and "CUDA_VISIBLE_DEVICES" not in os.environ)
    if hide:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if hide:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)


_CPU_ONLY = _prepare_environment()
try:
    with _lenient_triton_check(_CPU_ONLY):
        import torch
        import vllm
        # As the engine does at start-up: vLLM general plugins (entry points in the
        # ``vllm.general_plugins`` group, narrowed by VLLM_PLUGINS) may patch the KV-cache
        # classes, so they are loaded before those classes are imported and driven.
        try:
            from vllm.plugins import load_general_plugins
        except ImportError:
            load_general_plugins = None  # type: ignore[assignment]
        if load_general_plugins is not None:
            load_general_plugins()
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core import kv_cache_utils as _kcu
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec,  # noqa: F401 - for kvcheck.adapters.vllm_groups
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            SlidingWindowSpec,  # noqa: F401 - for kvcheck.adapters.vllm_groups
        )
        from vllm.v1.request import Request
        try:
            from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
        except ImportError:  # older releases: no MultiModalFeatureSpec (mm keys undeclared)
            MultiModalFeatureSpec = None  # type: ignore[assignment,misc]
            from vllm.multimodal.inputs import PlaceholderRange
        try:
            from vllm.v1.worker.block_table import BlockTable
            _BLOCK_TABLE_ERROR = None
        except Exception as exc:  # noqa: BLE001 - reported in PROFILE_NOTE
            BlockTable = None  # type: ignore[assignment,misc]
            _BLOCK_TABLE_ERROR = f"{type(exc).__name__}: {exc}"
        try:
            from vllm.triton_utils import HAS_TRITON
        except ImportError:
            HAS_TRITON = False
except ImportError as exc:
    _version = "(unknown version)"
    try:
        from importlib.metadata import version as _dist_version

        _version = _dist_version("vllm")
    except Exception:  # noqa: BLE001
        pass
    raise ImportError(
        f"vLLM {_version} is installed but its KV-cache modules cannot be imported "
        f"({type(exc).__name__}: {exc}); install the missing package, or " + HINT) from exc


def _hash_fn_lookup() -> Callable[[str], Callable[[Any], bytes]]:
    """``get_hash_fn_by_name`` wherever this release keeps it."""
    for module_name in ("vllm.utils.hashing", "vllm.utils"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        fn = getattr(module, "get_hash_fn_by_name", None)
        if fn is not None:
            return fn
    raise ImportError(
        f"vLLM {vllm.__version__} has no get_hash_fn_by_name / request block hasher (0.10.0 "
        "hashed blocks inside the manager, as integers): kvcheck's vLLM adapter supports "
        "0.10.2 and later (scripts/vllm-cpu-env.sh 0.10.2 DIR builds an environment with it)")


get_hash_fn_by_name = _hash_fn_lookup()
VERSION: str = vllm.__version__
if isinstance(getattr(_kcu, "BlockHash", None), type) and issubclass(_kcu.BlockHash, tuple):
    raise ImportError(
        f"vLLM {VERSION} hashes blocks as integers inside BlockHash named tuples (0.10.1 and "
        "older), a scheme kvcheck's profiles do not model: kvcheck's vLLM adapter supports "
        "0.10.2 and later (scripts/vllm-cpu-env.sh 0.10.2 DIR builds an environment with it)")
_ALL_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def _offered_algos() -> tuple[str, ...]:
    out = []
    for name in _ALL_ALGOS:
        try:
            get_hash_fn_by_name(name)
        except Exception:  # noqa: BLE001 - unknown name or missing optional package
            continue
        out.append(name)
    return tuple(out)


HASH_ALGOS = _offered_algos()


# ------------------------------------------------------------------------------ signatures
def _params(fn: Any) -> set[str]:
    return set(inspect.signature(fn).parameters)


def _accepting(fn: Any, **candidates: Any) -> dict[str, Any]:
    """The subset of ``candidates`` that ``fn`` takes (feature detection by name)."""
    accepted = _params(fn)
    return {k: v for k, v in candidates.items() if k in accepted}


_REQUEST_PARAMS = _params(Request.__init__)
_SAMPLING_PARAMS = _params(SamplingParams)
_MANAGER_PARAMS = _params(KVCacheManager.__init__)
_HAS_MM = MultiModalFeatureSpec is not None and "mm_features" in _REQUEST_PARAMS
_HAS_EXTRAS = {"lora_request", "cache_salt"} <= _REQUEST_PARAMS and _HAS_MM
# max_model_len when the spec sets none: far above anything a pool in the suite can hold.
_UNCAPPED_MODEL_LEN = 1 << 20
_MAX_TOKENS = 1 << 20


def _kv_cache_config(num_blocks: int, block_size: int) -> Any:
    attention = FullAttentionSpec(**_accepting(
        FullAttentionSpec, block_size=block_size, num_kv_heads=1, head_size=1,
        dtype=torch.float32, use_mla=False))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["layer.0"], attention)])


def _make_kv_cache_manager(spec: KVCacheSpec, kv_cache_config: Any | None = None,
                           block_sizes: tuple[int, int] | None = None) -> Any:
    """vLLM's ``KVCacheManager`` for ``spec`` with the arguments this release accepts:
    ``kv_cache_config`` (default: one full-attention group of ``spec.block_size``) and the
    ``(scheduler, hash)`` block sizes (default: ``spec.block_size`` for both). The single-group
    adapter, the grouped one and the benchmark hook all build their manager here."""
    if kv_cache_config is None:
        kv_cache_config = _kv_cache_config(spec.num_blocks, spec.block_size)
    scheduler, hashed = block_sizes or (spec.block_size, spec.block_size)
    return KVCacheManager(**_accepting(
        KVCacheManager.__init__,
        kv_cache_config=kv_cache_config,
        max_model_len=spec.max_model_len or _UNCAPPED_MODEL_LEN,
        scheduler_block_size=scheduler, hash_block_size=hashed,
        enable_caching=spec.enable_caching, log_stats=False,
        enable_kv_cache_events=spec.enable_kv_cache_events))


def _make_block_pool(num_blocks: int, block_size: int, enable_caching: bool,
                     enable_kv_cache_events: bool = False) -> Any:
    return BlockPool(**_accepting(
        BlockPool.__init__, num_gpu_blocks=num_blocks, enable_caching=enable_caching,
        hash_block_size=block_size, enable_kv_cache_events=enable_kv_cache_events))


def _sampling_params(skip_reading_prefix_cache: bool) -> Any:
    kwargs: dict[str, Any] = {"max_tokens": _MAX_TOKENS}
    if skip_reading_prefix_cache:
        if "skip_reading_prefix_cache" in _SAMPLING_PARAMS:
            kwargs["skip_reading_prefix_cache"] = True
        else:  # 0.10.2: prompt logprobs are what make a request skip the cache lookup
            kwargs["prompt_logprobs"] = 1
    return SamplingParams(**kwargs)


def _mm_feature(identifier: str, offset: int, length: int) -> Any:
    return MultiModalFeatureSpec(**_accepting(
        MultiModalFeatureSpec, data=None, modality="image", identifier=identifier,
        mm_position=PlaceholderRange(offset=offset, length=length), mm_hash=identifier))


def _make_request(view: RequestView, block_hasher: Any) -> Any:
    """A vLLM ``Request`` for ``view`` (prompt only; outputs are appended by the caller)."""
    extras = bool(view.lora or view.mm_features or view.cache_salt)
    if extras and not _HAS_EXTRAS:
        raise NotImplementedError(
            f"vLLM {VERSION}'s Request cannot take LoRA / multimodal / cache_salt inputs the "
            "way this adapter knows (the 'extra_keys' capability is not declared)")
    kwargs: dict[str, Any] = {
        "request_id": view.request_id,
        "prompt_token_ids": list(view.prompt_token_ids),
        "sampling_params": _sampling_params(view.skip_reading_prefix_cache),
        "pooling_params": None,
        "eos_token_id": None,
        "block_hasher": block_hasher,
    }
    if view.lora is not None:
        name, int_id, path = view.lora
        kwargs["lora_request"] = LoRARequest(lora_name=name, lora_int_id=int_id,
                                             lora_path=path)
    if view.mm_features:
        kwargs["mm_features"] = [_mm_feature(*f) for f in view.mm_features]
    if view.cache_salt is not None:
        kwargs["cache_salt"] = view.cache_salt
    return Request(**{k: v for k, v in kwargs.items() if k in _REQUEST_PARAMS})


# ------------------------------------------------------------------------------ hashing
class _Hashing:
    """The spec's hash function, block hasher and NONE_HASH, re-installed before each use."""

    def __init__(self, spec: KVCacheSpec, hash_block_size: int | None = None) -> None:
        self.fn = get_hash_fn_by_name(spec.hash_algo)
        with pythonhashseed(spec.pythonhashseed):
            _kcu.init_none_hash(self.fn)
        self.none_hash = _kcu.NONE_HASH
        self.block_hasher = _kcu.get_request_block_hasher(
            spec.block_size if hash_block_size is None else hash_block_size, self.fn)

    def install(self) -> None:
        """Make this spec's root the one vLLM's (module-global) hasher chains from."""
        _kcu.NONE_HASH = self.none_hash


def _request_sync(hashing: _Hashing) -> RequestViewSync[Any]:
    """One vLLM ``Request`` per request id, kept in step with the immutable views; the
    spec's NONE_HASH is reinstalled before vLLM hashes new blocks."""
    return SnapshotSync(lambda view: _make_request(view, hashing.block_hasher),
                        before_hashing=hashing.install)


# ------------------------------------------------------------------------------ events
_EVENT_FIELDS: dict[str, list[tuple[str, Any]]] = {
    cls.__name__: [(f.name, None if f.default is MISSING else f.default) for f in fields(cls)]
    for cls in (_reference_events.BlockStored, _reference_events.BlockRemoved,
                _reference_events.AllBlocksCleared)
}


def _hash_bytes(value: Any) -> Any:
    if value is None or isinstance(value, (bytes, bytearray)):
        return None if value is None else bytes(value)
    raise TypeError(
        f"vLLM published the block hash {value!r} as {type(value).__name__}, not bytes: "
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES must be 0 before vLLM reads it")


def event_to_dict(event: Any) -> dict[str, Any]:
    """A vLLM KV event as the protocol's dict: ``"type"`` plus exactly the fields of
    ``kvcheck.reference_impl.events`` (fields an older vLLM lacks get the reference's
    default), hashes as bytes."""
    name = type(event).__name__
    out: dict[str, Any] = {"type": name}
    for field_name, default in _EVENT_FIELDS.get(name, []):
        value = getattr(event, field_name, default)
        if field_name == "block_hashes":
            value = [_hash_bytes(h) for h in value]
        elif field_name == "parent_block_hash":
            value = _hash_bytes(value)
        elif field_name == "group_idx" and value is None:
            value = default
        out[field_name] = value
    return out


# ------------------------------------------------------------------------------ slot mapping
_SLOT_KIND: str | None = None
if BlockTable is not None:
    _bt_params = _params(BlockTable.compute_slot_mapping)
    if "req_indices" in _bt_params:
        _SLOT_KIND = "numpy"  # 0.10.x: numpy on the CPU
    elif "query_start_loc" in _bt_params:
        _SLOT_KIND = "triton"  # newer: vLLM's Triton kernel


def _slot_device() -> Any:
    return torch.device("cpu" if _CPU_ONLY else "cuda")


class _SlotMapper:
    """vLLM's worker ``BlockTable`` with one row, used to map a request's positions to slots."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.table = BlockTable(**_accepting(
            BlockTable.__init__, block_size=block_size, max_num_reqs=1,
            max_num_blocks_per_req=max(num_blocks, 1),
            max_num_batched_tokens=max(num_blocks * block_size, 1), pin_memory=False,
            device=_slot_device(), cp_kv_cache_interleave_size=1,
            kernel_block_size=block_size))

    def __call__(self, block_ids: Sequence[int], start: int, end: int) -> list[int]:
        n = end - start
        if n <= 0:
            return []
        table = self.table
        table.add_row(list(block_ids), 0)  # resets the row; entries past it are never read
        if _SLOT_KIND == "numpy":
            import numpy as np

            table.compute_slot_mapping(np.zeros(n, dtype=np.int64),
                                       np.arange(start, end, dtype=np.int64))
            return [int(s) for s in table.slot_mapping_np[:n]]
        device = _slot_device()
        table.commit_block_table(1)
        table.compute_slot_mapping(1, torch.tensor([0, n], dtype=torch.int32, device=device),
                                   torch.arange(start, end, dtype=torch.int64, device=device))
        return [int(s) for s in table.slot_mapping.gpu[:n].tolist()]


def _slot_mapping_problem() -> str | None:
    """Why the slot_mapping capability cannot be declared here (None: it can)."""
    if BlockTable is None:
        return f"vLLM's BlockTable cannot be imported ({_BLOCK_TABLE_ERROR})"
    if _SLOT_KIND is None:
        return "vLLM's BlockTable.compute_slot_mapping has a signature this adapter does not know"
    if _SLOT_KIND == "triton" and not HAS_TRITON:
        return ("vLLM's slot mapping is a Triton kernel and vLLM found no usable Triton here "
                "(install triton; without CUDA it runs with TRITON_INTERPRET=1)")
    try:
        got = _SlotMapper(8, 4)([5, 2], 1, 6)
    except Exception as exc:  # noqa: BLE001 - reported in PROFILE_NOTE
        return f"vLLM's BlockTable slot mapping failed here ({type(exc).__name__}: {exc})"
    if got != [21, 22, 23, 8, 9]:
        return f"vLLM's BlockTable mapped rows [5, 2] positions 1-5 to {got}"
    return None


# ------------------------------------------------------------------------------ batch metadata
# 0.33 and later: the Triton kernel takes the DCP interleave size (BlockTable's constructor
# argument); 0.10.x: numpy, DCP with an interleave of one token, no interleave argument.
_HAS_INTERLEAVE = BlockTable is not None and "cp_kv_cache_interleave_size" in _params(
    BlockTable.__init__)


class _StepTable:
    """vLLM's worker ``BlockTable`` sized for one step: one row per request, and
    ``max_num_batched_tokens`` = the padded batch size (what 0.33's kernel pads up to).

    The DCP world size and rank are set on the table after construction: ``BlockTable``
    reads them from vLLM's DCP process group, which a single CPU process does not have (it then
    falls back to 1 and 0, as vLLM's own unit tests rely on).
    """

    def __init__(self, block_size: int, block_tables: Sequence[Sequence[int]], num_reqs: int,
                 num_padded_tokens: int, dcp_world_size: int, dcp_rank: int,
                 interleave: int) -> None:
        if dcp_world_size > 1 and interleave > 1 and not _HAS_INTERLEAVE:
            raise UnsupportedSpec(
                f"vLLM {VERSION} has no cp_kv_cache_interleave_size: its DCP deals out single "
                f"tokens (interleave 1), not chunks of {interleave}")
        width = max((len(row) for row in block_tables[:num_reqs]), default=0)
        self.table = BlockTable(**_accepting(
            BlockTable.__init__, block_size=block_size, max_num_reqs=max(num_reqs, 1),
            max_num_blocks_per_req=max(width, 1),
            max_num_batched_tokens=max(num_padded_tokens, 1), pin_memory=False,
            device=_slot_device(), cp_kv_cache_interleave_size=interleave,
            kernel_block_size=block_size))
        if dcp_world_size > 1 and not hasattr(self.table, "dcp_rank"):
            raise UnsupportedSpec(f"vLLM {VERSION}'s BlockTable has no decode context "
                                  "parallelism (dcp_world_size)")
        if hasattr(self.table, "dcp_rank"):
            self.table.dcp_world_size = dcp_world_size
            self.table.dcp_rank = dcp_rank
        for row_idx, row in enumerate(block_tables[:num_reqs]):
            self.table.add_row([int(b) for b in row], row_idx)

    def slot_mapping(self, num_scheduled_tokens: Sequence[int], req_indices: Any,
                     positions: Any, num_padded_tokens: int) -> list[int]:
        """vLLM's slot mapping of the step, ``num_padded_tokens`` entries."""
        import numpy as np

        table, num_tokens = self.table, len(positions)
        if _SLOT_KIND == "numpy":
            # 0.10.x: numpy on the CPU, then the model runner copies it to the device buffer
            # and fills the rest with -1 (GPUModelRunner._prepare_inputs, "Fill unused with
            # -1. Needed for reshape_and_cache in full cuda graph mode").
            table.compute_slot_mapping(req_indices, positions)
            table.commit_slot_mapping(num_tokens)
            table.slot_mapping[num_tokens:].fill_(-1)
            return [int(s) for s in table.slot_mapping[:num_padded_tokens].tolist()]
        device = _slot_device()
        qsl = np.zeros(len(num_scheduled_tokens) + 1, dtype=np.int32)
        np.cumsum(num_scheduled_tokens, out=qsl[1:])
        table.commit_block_table(len(num_scheduled_tokens))
        # The kernel pads [num_tokens, max_num_batched_tokens) with PAD_SLOT_ID itself.
        table.compute_slot_mapping(len(num_scheduled_tokens),
                                   torch.from_numpy(qsl).to(device),
                                   torch.from_numpy(positions).to(device))
        return [int(s) for s in table.slot_mapping.gpu[:num_padded_tokens].tolist()]


def _build_batch(block_size: int, block_tables: Sequence[Sequence[int]],
                 num_computed_tokens: Sequence[int], num_scheduled_tokens: Sequence[int],
                 num_padded_tokens: int, dcp_world_size: int = 1, dcp_rank: int = 0,
                 interleave: int = 1) -> tuple[list[int], list[int], list[int]]:
    """``(slot_mapping, positions, req_indices)``: the slots from vLLM's ``BlockTable``; the
    request indices and positions by the model runner's arithmetic (``np.repeat`` of the
    request indices, ``num_computed_tokens[req] + offset in the request``), which lives in
    ``GPUModelRunner._prepare_inputs`` and cannot run without a model."""
    import numpy as np

    num_reqs = len(num_scheduled_tokens)
    if len(num_computed_tokens) != num_reqs or num_reqs > len(block_tables):
        raise ValueError(f"{len(block_tables)} rows, {len(num_computed_tokens)} computed "
                         f"counts and {num_reqs} scheduled counts do not match")
    scheduled = np.asarray(num_scheduled_tokens, dtype=np.int64).reshape(-1)
    computed = np.asarray(num_computed_tokens, dtype=np.int64).reshape(-1)
    num_tokens = int(scheduled.sum())
    if num_padded_tokens < num_tokens:
        raise ValueError(f"num_padded_tokens={num_padded_tokens} < {num_tokens} tokens")
    req_indices = np.repeat(np.arange(num_reqs, dtype=np.int64), scheduled)
    starts = np.cumsum(scheduled) - scheduled
    positions = computed[req_indices] + np.arange(num_tokens, dtype=np.int64) - starts[
        req_indices]
    step = _StepTable(block_size, block_tables, num_reqs, num_padded_tokens, dcp_world_size,
                      dcp_rank, interleave)
    slots = step.slot_mapping(list(scheduled), req_indices, positions, num_padded_tokens)
    return slots, [int(p) for p in positions], [int(r) for r in req_indices]


# ------------------------------------------------------------------------------ the adapters
class VLLMManager:
    """``KVCacheManagerAdapter`` over vLLM's ``KVCacheManager`` (one full-attention group)."""

    def __init__(self, spec: KVCacheSpec) -> None:
        self.spec = spec
        self.hashing = _Hashing(spec)
        self.manager = _make_kv_cache_manager(spec)
        self.pool = self.manager.block_pool
        self._requests = _request_sync(self.hashing)
        self._slots: _SlotMapper | None = None

    # -- manager
    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        result = self.manager.get_computed_blocks(self._requests.sync(request))
        blocks, num_tokens = result[0], result[1]  # 0.33 adds a third element
        return [b.block_id for b in blocks.blocks[0]], int(num_tokens)

    def allocate_slots(
        self,
        request: RequestView,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: Sequence[int] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        req = self._requests.sync(request)
        hits = None
        if new_computed_block_ids:
            blocks = self.pool.blocks
            hits = KVCacheBlocks(([blocks[i] for i in new_computed_block_ids],))
        new = self.manager.allocate_slots(
            req, num_new_tokens=num_new_tokens, num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=hits, num_lookahead_tokens=num_lookahead_tokens)
        if new is None:
            return None
        new_blocks = new.blocks[0]
        return [b.block_id for b in new_blocks] if new_blocks else []

    def free(self, request_id: str) -> None:
        req = self._requests.pop(request_id)
        if req is not None:  # vLLM never saw a request the adapter has no Request for
            self.manager.free(req)

    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.manager.get_block_ids(request_id)[0])

    def reset_prefix_cache(self) -> bool:
        return bool(self.manager.reset_prefix_cache())

    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    # -- observations
    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]

    def ref_cnt(self, block_id: int) -> int:
        return self.pool.blocks[block_id].ref_cnt

    def block_hashes(self, request_id: str) -> list[bytes]:
        req = self._requests.get(request_id)
        return [] if req is None else [bytes(h) for h in req.block_hashes]

    def take_events(self) -> list[dict[str, Any]]:
        return [event_to_dict(e) for e in self.manager.take_events()]

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        if self._slots is None:
            self._slots = _SlotMapper(self.spec.num_blocks, self.spec.block_size)
        return self._slots(self.get_block_ids(request_id), start, end)

    # -- batch metadata: vLLM's worker BlockTable (stateless; the tables are arguments)
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
        return _build_batch(self.spec.block_size, block_tables, num_computed_tokens,
                            num_scheduled_tokens, num_padded_tokens, dcp_world_size,
                            dcp_rank, cp_kv_cache_interleave_size)

    def flashinfer_csr(self, block_tables: Sequence[Sequence[int]],
                       seq_lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        # vLLM builds the CSR inside FlashInferMetadataBuilder, which needs a whole VllmConfig
        # and the flashinfer package; the adapter does not drive it.
        raise UnsupportedSpec(
            "vLLM builds FlashInfer's CSR page table only inside its FlashInfer attention "
            "backend (a VllmConfig and the flashinfer package); the adapter does not drive it")

    def req_to_token(self, block_tables: Sequence[Sequence[int]],
                     seq_lens: Sequence[int]) -> list[list[int]]:
        # SGLang's req_to_token[b, pos] is the slot of every position: vLLM's slot mapping of
        # a step that schedules each request's whole sequence.
        lens = [int(n) for n in seq_lens]
        slots, _, _ = _build_batch(self.spec.block_size, block_tables, [0] * len(lens), lens,
                                   sum(lens))
        out, start = [], 0
        for n in lens:
            out.append(slots[start:start + n])
            start += n
        return out


class VLLMBlockPool:
    """``BlockPoolAdapter`` over vLLM's ``BlockPool`` (block ids in, block ids out)."""

    def __init__(self, spec: KVCacheSpec) -> None:
        self.spec = spec
        self.pool = _make_block_pool(spec.num_blocks, spec.block_size, spec.enable_caching,
                                     spec.enable_kv_cache_events)
        self._requests = _request_sync(_Hashing(spec))

    def _blocks(self, block_ids: Sequence[int]) -> list[Any]:
        return [self.pool.blocks[i] for i in block_ids]

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        return [b.block_id for b in self.pool.get_new_blocks(num_blocks)]

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> None:
        self.pool.free_blocks(self._blocks(ordered_block_ids))

    def touch(self, block_ids: Sequence[int]) -> None:
        blocks = self._blocks(block_ids)
        self.pool.touch((blocks,) if _TOUCH_TAKES_GROUPS else blocks)

    def cache_full_blocks(self, request: RequestView, block_ids: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        self.pool.cache_full_blocks(self._requests.sync(request), self._blocks(block_ids),
                                    num_cached_blocks, num_full_blocks, self.spec.block_size, 0)

    def get_cached_block(self, block_hash: bytes) -> int | None:
        hit = self.pool.get_cached_block(block_hash, [0])
        return None if hit is None else hit[0].block_id

    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]


def make_kv_cache_manager(spec: KVCacheSpec) -> VLLMManager:
    """A fresh vLLM ``KVCacheManager`` for ``spec``: one full-attention group, or, for a spec
    with ``kv_cache_groups``, vLLM's groups speaking the per-group protocol
    (``kvcheck.adapters.vllm_groups``; ``UnsupportedSpec`` for groups this release refuses)."""
    if spec.kv_cache_groups:
        from kvcheck.adapters.vllm_groups import VLLMGroupedManager

        return VLLMGroupedManager(spec)
    return VLLMManager(spec)


def make_block_pool(spec: KVCacheSpec) -> VLLMBlockPool:
    """A fresh vLLM ``BlockPool`` for ``spec``."""
    return VLLMBlockPool(spec)


# ------------------------------------------------------------------------------ detection
def _detect_touch_takes_groups() -> bool:
    """0.10.2's ``BlockPool.touch`` takes a tuple of per-group lists; newer ones a flat list."""
    pool = _make_block_pool(4, 4, True)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    try:
        pool.touch([block])
    except (TypeError, AttributeError):
        return True
    return False


def _probe_extra_keys(**extras: Any) -> Callable[[], Any]:
    """The extra keys vLLM generates for block 0 of a probe request with ``extras``."""
    def keys() -> Any:
        hashing = _Hashing(KVCacheSpec(num_blocks=4, block_size=4))
        view = RequestView("kvcheck-probe", (1, 2, 3, 4, 5), **extras)
        req = _make_request(view, hashing.block_hasher)
        return _kcu.generate_block_hash_extra_keys(req, 0, 4, 0)[0]
    return keys


def _block_stored_fields() -> Any:
    try:
        from vllm.distributed.kv_events import BlockStored
    except ImportError:
        return None
    return getattr(BlockStored, "__struct_fields__", None)


def _detect() -> Behaviour:
    unhashed, caching_off = detect_free_order(lambda caching: _make_block_pool(10, 4, caching))
    saved = _kcu.NONE_HASH if hasattr(_kcu, "NONE_HASH") else None
    try:
        lora = mm = None
        if _HAS_EXTRAS:
            lora = detect_extra_key_format(
                _probe_extra_keys(lora=("kvcheck-probe", 7, "/kvcheck/probe")))
            mm = detect_mm_key_format(_probe_extra_keys(mm_features=(("kvcheck-img", 1, 2),)))
    finally:
        _kcu.NONE_HASH = saved
    return Behaviour(free_unhashed=unhashed, free_caching_off=caching_off,
                     none_hash=detect_none_hash(_kcu, get_hash_fn_by_name("sha256")),
                     extra_keys=lora, mm_keys=mm,
                     event_extra_keys=detect_event_extra_keys(_block_stored_fields()))


_TOUCH_TAKES_GROUPS = _detect_touch_takes_groups()
BEHAVIOUR: Behaviour = _detect()
_SLOT_PROBLEM = _slot_mapping_problem()

_capabilities = {"manager", "block_pool", "prefix_caching", "free_queue_order", "ref_counts",
                 "block_hashes", "events",
                 # vLLM's design features: implied by the vLLM profiles, declared so that
                 # --kv-profile=generic tests them too.
                 "reset_prefix_cache", "caching_off", "skip_reading_prefix_cache",
                 "lookahead", "multi_token_decode"}
_notes = []
# KV-cache groups (kvcheck.adapters.vllm_groups): every supported release has vLLM's hybrid
# coordinator and the sliding-window and chunked-local specs; the configurations a release
# refuses are declined per spec (UnsupportedSpec).
_capabilities.update({"kv_cache_groups", "sliding_window", "chunked_local_attention"})
if "hash_block_size" not in _MANAGER_PARAMS:
    _notes.append("kv_cache_groups: this release's hybrid coordinator takes one full-attention "
                  "and one other spec of one block size with prefix caching on; other layouts "
                  "are declined (skipped).")
if _HAS_EXTRAS:
    _capabilities.add("extra_keys")
else:
    _notes.append("extra_keys not declared: this release's Request takes LoRA / multimodal / "
                  "cache_salt inputs in a form the adapter does not know.")
if _SLOT_PROBLEM is None:
    _capabilities.update({"slot_mapping", "batch_metadata"})
    _notes.append("batch_metadata: slots from vLLM's BlockTable"
                  + ("" if _HAS_INTERLEAVE else " (DCP without interleave size: interleaved "
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


# Module-level hooks: KV-cache sizing computed by this vLLM's own functions (capability
# "sizing", for the profile the release answers) and the manager-level benchmark hook.
from kvcheck.adapters import vllm_sizing as _vllm_sizing  # noqa: E402
from kvcheck.adapters.vllm_native import make_native_manager  # noqa: E402
from kvcheck.adapters.vllm_sizing import (  # noqa: E402
    kv_block_sizes,
    kv_cache_view_shape,
    kv_page_size_bytes,
    kv_sizing_plan,
)

if _vllm_sizing.SIZING_PROFILE == _PROFILE:
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
