"""Host-side helpers shared by the kernel wrappers: input validation, dtype and scale handling.

Every check raises ``KVCheckInputError`` (a ``ValueError``) naming the argument, what was wrong
and how to fix it, so that a bad call fails in Python instead of as a silent wrong answer or an
illegal memory access.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvcheck.errors import KVCheckInputError

__all__ = [
    "FLOAT_DTYPES",
    "FP8_KV_CACHE_DTYPES",
    "KV_CACHE_DTYPES",
    "PagedAttentionArgs",
    "check_device_runnable",
    "check_head_dim_contiguous",
    "check_index_tensor",
    "check_paged_attention_args",
    "check_rank",
    "check_same_device",
    "is_interpreted",
    "resolve_kv_cache",
    "resolve_scale",
]

#: Activation / "auto" cache dtypes the kernels accept.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: ``kv_cache_dtype`` strings meaning "fp8 e4m3 with per-tensor scales" (vLLM's spellings).
FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")
KV_CACHE_DTYPES = ("auto", *FP8_KV_CACHE_DTYPES)


def is_interpreted(kernel: object) -> bool:
    """True when ``kernel`` was decorated under ``TRITON_INTERPRET=1`` (runs on CPU tensors)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_device_runnable(kernel: object, tensor: torch.Tensor) -> None:
    """Refuse CPU tensors unless the Triton interpreter is active for ``kernel``.

    Triton decides at ``@triton.jit`` decoration time whether a function is interpreted
    (``TRITON_INTERPRET=1`` read when the module is imported; ``triton.language``'s helpers
    when triton is imported), so setting the variable later has no effect; the messages say so.
    """
    if tensor.device.type == "cuda":
        return
    if tensor.device.type == "cpu" and is_interpreted(kernel):
        import triton.language as tl

        if not is_interpreted(tl.zeros):
            raise KVCheckInputError(
                "TRITON_INTERPRET=1 was set after `import triton`: kvcheck's kernels are "
                "interpreted but triton.language's own helpers (tl.zeros, tl.cdiv) were "
                "compiled at import and cannot run on CPU tensors; set TRITON_INTERPRET=1 before "
                "anything imports triton (e.g. at the top of conftest.py, or in the environment)"
            )
        return
    if tensor.device.type == "cpu":
        raise KVCheckInputError(
            "got CPU tensors but the Triton kernels were compiled for a GPU; set "
            "TRITON_INTERPRET=1 in the environment before importing triton to run them in "
            "Triton's interpreter, or move the tensors to a CUDA device"
        )
    raise KVCheckInputError(
        f"unsupported device {tensor.device}; use a CUDA device (or CPU with the interpreter)"
    )


def check_rank(tensor: torch.Tensor, rank: int, name: str, shape_doc: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise KVCheckInputError(
            f"{name} must be a torch.Tensor {shape_doc}, got {type(tensor).__name__}")
    if tensor.dim() != rank:
        raise KVCheckInputError(
            f"{name} must be {rank}-D {shape_doc}, got shape {tuple(tensor.shape)}")


def check_head_dim_contiguous(tensor: torch.Tensor, name: str) -> None:
    # Why: the kernels vectorise loads along head_size; any other stride may be arbitrary.
    if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise KVCheckInputError(
            f"{name} must have a contiguous head dimension (stride(-1) == 1), got strides "
            f"{tuple(tensor.stride())}; pass a view whose last dim is contiguous, or "
            f"call .contiguous() on it"
        )


def check_index_tensor(
    tensor: torch.Tensor, name: str, rank: int, shape_doc: str, dtypes: tuple[torch.dtype, ...]
) -> None:
    check_rank(tensor, rank, name, shape_doc)
    if tensor.dtype not in dtypes:
        wanted = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise KVCheckInputError(
            f"{name} must be {wanted}, got {tensor.dtype}; convert it with "
            f".to(torch.{str(dtypes[0]).removeprefix('torch.')})"
        )
    if rank == 2 and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise KVCheckInputError(
            f"{name} rows must be contiguous (stride(-1) == 1), got {tensor.stride()}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise KVCheckInputError(f"all tensors must be on one device, got {listing}")


def resolve_kv_cache(
    key_cache: torch.Tensor, value_cache: torch.Tensor, kv_cache_dtype: str
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Check the cache dtypes against ``kv_cache_dtype``; return views the kernels can use.

    Returns ``(key_cache, value_cache, is_fp8)``. A uint8-allocated fp8 cache (vLLM allocates
    fp8 caches as uint8) is reinterpreted as ``torch.float8_e4m3fn`` without a copy.
    """
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise KVCheckInputError(
            f"unsupported kv_cache_dtype {kv_cache_dtype!r}; supported: {KV_CACHE_DTYPES} "
            f"('fp8' means e4m3 with per-tensor float32 scales; e5m2 is not implemented)"
        )
    if key_cache.dtype != value_cache.dtype:
        raise KVCheckInputError(
            f"key_cache and value_cache must share a dtype, got {key_cache.dtype} and "
            f"{value_cache.dtype}"
        )
    if kv_cache_dtype == "auto":
        if key_cache.dtype not in FLOAT_DTYPES:
            raise KVCheckInputError(
                f"kv_cache_dtype='auto' needs a float32/float16/bfloat16 cache, got "
                f"{key_cache.dtype}; for an fp8 (or uint8-allocated fp8) cache pass "
                f"kv_cache_dtype='fp8' and k_scale/v_scale"
            )
        return key_cache, value_cache, False
    if key_cache.dtype == torch.uint8:
        return key_cache.view(torch.float8_e4m3fn), value_cache.view(torch.float8_e4m3fn), True
    if key_cache.dtype != torch.float8_e4m3fn:
        raise KVCheckInputError(
            f"kv_cache_dtype={kv_cache_dtype!r} needs a torch.float8_e4m3fn (or uint8) cache, "
            f"got {key_cache.dtype}; allocate the cache in fp8 or pass kv_cache_dtype='auto'"
        )
    return key_cache, value_cache, True


def resolve_scale(
    scale: torch.Tensor | float | None, name: str, device: torch.device
) -> torch.Tensor:
    """A per-tensor fp8 scale as a 1-element float32 tensor on ``device`` (None means 1.0).

    vLLM passes scales as float32 tensors loaded through a pointer, so a scale that changes
    between calls (calibration) never forces a recompile; floats are accepted for convenience.
    """
    if scale is None:
        scale = 1.0
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor([float(scale)], dtype=torch.float32, device=device)
    if scale.numel() != 1:
        raise KVCheckInputError(
            f"{name} must be a per-tensor scale with exactly one element, got shape "
            f"{tuple(scale.shape)}; per-head scales are not supported"
        )
    if scale.dtype != torch.float32:
        raise KVCheckInputError(f"{name} must be float32, got {scale.dtype}; use .float()")
    if scale.device != device:
        raise KVCheckInputError(f"{name} is on {scale.device} but the cache is on {device}")
    return scale.reshape(1)


class PagedAttentionArgs(NamedTuple):
    """Validated, normalised paged-attention inputs (see ``check_paged_attention_args``)."""

    key_cache: torch.Tensor  # NHD view (fp8 view for uint8 caches)
    value_cache: torch.Tensor
    k_scale: torch.Tensor  # [1] float32
    v_scale: torch.Tensor
    is_fp8: bool
    block_size: int
    num_kv_heads: int
    head_size: int
    queries_per_kv: int


def check_paged_attention_args(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    num_seqs: int,
    layout: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor | float | None,
    v_scale: torch.Tensor | float | None,
    sliding_window: int | None,
    softcap: float | None,
    query_doc: str,
) -> PagedAttentionArgs:
    """Shared validation of the decode and varlen wrappers; raises KVCheckInputError naming the
    fix."""
    from kvcheck.gpu_kernels.layout import as_nhd  # local: layout imports nothing from here

    check_rank(query, 3, "query", query_doc)
    if query.dtype not in FLOAT_DTYPES:
        raise KVCheckInputError(f"query must be float32/float16/bfloat16, got {query.dtype}")
    cache_doc = f"[num_blocks, ...] ({layout})"
    check_rank(key_cache, 4, "key_cache", cache_doc)
    check_rank(value_cache, 4, "value_cache", cache_doc)
    if key_cache.shape != value_cache.shape:
        raise KVCheckInputError(
            f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} "
            f"shapes differ"
        )
    k_nhd, v_nhd = as_nhd(key_cache, layout), as_nhd(value_cache, layout)
    _, block_size, num_kv_heads, head_size = k_nhd.shape
    num_heads = query.shape[1]
    if query.shape[2] != head_size:
        raise KVCheckInputError(
            f"query head_size {query.shape[2]} != cache head_size {head_size} (layout={layout})"
        )
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise KVCheckInputError(
            f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads} (GQA); "
            f"check layout= (NHD caches are [blocks, block_size, kv_heads, dim], HND "
            f"[blocks, kv_heads, block_size, dim])"
        )
    for name, tensor in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        check_head_dim_contiguous(tensor, name)
    check_index_tensor(
        block_table, "block_table", 2, "[num_seqs, max_num_blocks_per_seq]",
        (torch.int32, torch.int64),
    )
    check_index_tensor(seq_lens, "seq_lens", 1, "[num_seqs]", (torch.int32, torch.int64))
    if seq_lens.shape[0] != num_seqs:
        raise KVCheckInputError(
            f"seq_lens has {seq_lens.shape[0]} entries, expected num_seqs={num_seqs}")
    if block_table.shape[0] < num_seqs:
        raise KVCheckInputError(
            f"block_table has {block_table.shape[0]} rows, need num_seqs={num_seqs}")
    if sliding_window is not None and (int(sliding_window) != sliding_window or sliding_window < 1):
        raise KVCheckInputError(
            f"sliding_window must be None or an int >= 1 (keys visible: q_pos - key_pos < "
            f"sliding_window), got {sliding_window!r}"
        )
    if softcap is not None and not softcap > 0:
        raise KVCheckInputError(f"softcap must be None (off) or > 0, got {softcap!r}")
    check_same_device(
        query=query, key_cache=key_cache, value_cache=value_cache, block_table=block_table,
        seq_lens=seq_lens,
    )
    k_nhd, v_nhd, is_fp8 = resolve_kv_cache(k_nhd, v_nhd, kv_cache_dtype)
    if not is_fp8 and k_nhd.dtype != query.dtype:
        raise KVCheckInputError(
            f"query is {query.dtype} but the cache is {k_nhd.dtype}; with kv_cache_dtype='auto' "
            f"they must match (cast the query, or store the cache in the query dtype)"
        )
    return PagedAttentionArgs(
        key_cache=k_nhd,
        value_cache=v_nhd,
        k_scale=resolve_scale(k_scale, "k_scale", query.device),
        v_scale=resolve_scale(v_scale, "v_scale", query.device),
        is_fp8=is_fp8,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        queries_per_kv=num_heads // num_kv_heads,
    )
