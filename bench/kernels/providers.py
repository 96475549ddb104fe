"""Kernel providers timed side by side: the torch references, kvcheck's Triton kernels, the
implementation's ``kernels()`` set, and vLLM's / FlashInfer's kernels when importable.

``provider.prepare(inputs)`` does every per-step host preparation (index conversions,
FlashInfer's ``plan``) *outside* the timed region and returns a zero-argument call that
enqueues the kernel(s) and returns the attention output (``None`` for stores). Third-party
adapters call public APIs only; any import or call failure becomes a skip naming the provider
and the error, never a fabricated figure.

Index formats: vLLM takes kvcheck's own (NHD caches, int32 block tables, ``seq_lens``,
``query_start_loc``, int64 ``slot_mapping``); FlashInfer takes CSR page lists
(``indptr``/``indices``/``last_page_len``, int32) built here from the same block ids, and
``(k_cache, v_cache)`` NHD tuples.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvcheck.bench.errors import ProviderUnavailable
from kvcheck.bench.kernels.inputs import KernelInputs
from kvcheck.conformance.loader import ImplHandle
from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    import torch

    from kvcheck.gpu_kernels.conformance import KernelSet

__all__ = ["PROVIDERS", "Provider", "ProviderUnavailable", "make_provider"]

#: Provider names, in table order. ``impl`` is the --kv-impl implementation's kernels().
PROVIDERS = ("torch_ref", "kvcheck_triton", "impl", "vllm", "flashinfer")

# Any: what the kernel call returns: the attention output (a tensor) or None (a store); a
# third-party kernel's result is untyped
Prepared = Callable[[], Any]


@dataclass
class Provider:
    """A named set of ``prepare_<op>(inputs) -> call`` functions."""

    name: str
    label: str  # e.g. "vllm 0.11.0", shown in tables and records
    version: str
    prepare_fns: dict[str, Callable[[KernelInputs], Prepared]]
    is_reference: bool = False

    def prepare(self, inputs: KernelInputs) -> Prepared:
        fn = self.prepare_fns.get(inputs.case.op)
        if fn is None:
            raise ProviderUnavailable(f"{self.label} provides no {inputs.case.op}")
        return fn(inputs)


# ------------------------------------------------------------------------------ torch / kvcheck
def _torch_ref() -> Provider:
    from kvcheck import __version__
    from kvcheck.gpu_kernels.reference import (
        paged_attention_decode_ref,
        paged_attention_varlen_ref,
        store_kv_cache_ref,
    )

    return Provider("torch_ref", f"kvcheck torch reference {__version__}", __version__, {
        "store_kv_cache": lambda x: lambda: store_kv_cache_ref(
            x.key, x.value, x.key_cache, x.value_cache, x.slot_mapping),
        "paged_attention_decode": lambda x: lambda: paged_attention_decode_ref(
            x.query, x.key_cache, x.value_cache, x.block_table, x.seq_lens, x.scale),
        "paged_attention_varlen": lambda x: lambda: paged_attention_varlen_ref(
            x.query, x.key_cache, x.value_cache, x.block_table, x.query_start_loc, x.seq_lens,
            x.scale),
    }, is_reference=True)


def _kvcheck_triton() -> Provider:
    from kvcheck import __version__
    from kvcheck.gpu_kernels.paged_decode import paged_attention_decode
    from kvcheck.gpu_kernels.paged_varlen import paged_attention_varlen
    from kvcheck.gpu_kernels.store_kv import store_kv_cache

    # max_seq_len / max_query_len are passed so no call hides a device-to-host sync.
    return Provider("kvcheck_triton", f"kvcheck triton {__version__}", __version__, {
        "store_kv_cache": lambda x: lambda: store_kv_cache(
            x.key, x.value, x.key_cache, x.value_cache, x.slot_mapping),
        "paged_attention_decode": lambda x: lambda: paged_attention_decode(
            x.query, x.key_cache, x.value_cache, x.block_table, x.seq_lens, x.scale,
            max_seq_len=x.max_seq_len),
        "paged_attention_varlen": lambda x: lambda: paged_attention_varlen(
            x.query, x.key_cache, x.value_cache, x.block_table, x.query_start_loc, x.seq_lens,
            x.scale, max_query_len=x.max_query_len),
    })


def _impl(kernel_set: KernelSet, impl_name: str, impl_version: str) -> Provider:
    """An implementation's ``KernelSet``: callables with kvcheck's signatures (positional
    arguments only; optional keywords are never passed to third-party callables)."""
    fns: dict[str, Callable[[KernelInputs], Prepared]] = {}
    if kernel_set.store_kv_cache is not None:
        f = kernel_set.store_kv_cache
        fns["store_kv_cache"] = lambda x: lambda: f(x.key, x.value, x.key_cache, x.value_cache,
                                                    x.slot_mapping)
    if kernel_set.paged_attention_decode is not None:
        g = kernel_set.paged_attention_decode
        fns["paged_attention_decode"] = lambda x: lambda: g(
            x.query, x.key_cache, x.value_cache, x.block_table, x.seq_lens, x.scale)
    if kernel_set.paged_attention_varlen is not None:
        h = kernel_set.paged_attention_varlen
        fns["paged_attention_varlen"] = lambda x: lambda: h(
            x.query, x.key_cache, x.value_cache, x.block_table, x.query_start_loc, x.seq_lens,
            x.scale)
    return Provider("impl", f"{impl_name} {impl_version} ({kernel_set.name})", impl_version, fns)


# ---------------------------------------------------------------------------------------- vLLM
def _import_first(names: tuple[str, ...], attr: str) -> Callable[..., object]:
    errors = []
    for name in names:
        try:
            found: Callable[..., object] = getattr(importlib.import_module(name), attr)
            return found
        except (ImportError, AttributeError) as exc:
            errors.append(f"{name}.{attr}: {type(exc).__name__}: {exc}")
    raise ProviderUnavailable("; ".join(errors))


def _vllm() -> Provider:
    try:
        import vllm
    except ImportError as exc:
        raise ProviderUnavailable(f"vLLM is not installed ({exc})") from None
    import torch

    version = getattr(vllm, "__version__", "unknown")
    fns: dict[str, Callable[[KernelInputs], Prepared]] = {}
    # The store: vLLM's Triton kernel where the release ships one (0.33:
    # ``triton_reshape_and_cache_flash``, the store of its Triton attention backend), else the
    # CUDA op of the same contract (``_custom_ops.reshape_and_cache_flash``, e.g. 0.10.2).
    store_kernels = []
    for module, attr in (("vllm.v1.attention.ops.triton_reshape_and_cache_flash",
                          "triton_reshape_and_cache_flash"),
                         ("vllm.attention.ops.triton_reshape_and_cache_flash",
                          "triton_reshape_and_cache_flash"),
                         ("vllm._custom_ops", "reshape_and_cache_flash")):
        with contextlib.suppress(ProviderUnavailable):
            store_kernels.append(_import_first((module,), attr))
    if store_kernels:
        reshape_and_cache_flash = store_kernels[0]

        def store(x: KernelInputs) -> Prepared:
            one = torch.ones(1, dtype=torch.float32, device=x.key_cache.device)
            return lambda: reshape_and_cache_flash(x.key, x.value, x.key_cache, x.value_cache,
                                                   x.slot_mapping, "auto", one, one)

        fns["store_kv_cache"] = store
    try:
        unified_attention = _import_first(
            ("vllm.v1.attention.ops.triton_unified_attention",
             "vllm.attention.ops.triton_unified_attention"), "unified_attention")
    except ProviderUnavailable:
        unified_attention = None
    if unified_attention is not None:
        def attention(x: KernelInputs) -> Prepared:
            out = torch.empty_like(x.query)
            # Per-(sequence, KV head) descales of 1.0, the shape vLLM's Triton backend passes.
            descale = torch.ones(1, dtype=torch.float32, device=x.query.device).expand(
                x.case.num_seqs, x.case.num_kv_heads)

            def call() -> torch.Tensor:
                unified_attention(
                    q=x.query, k=x.key_cache, v=x.value_cache, out=out,
                    cu_seqlens_q=x.query_start_loc, max_seqlen_q=x.max_query_len,
                    seqused_k=x.seq_lens, max_seqlen_k=x.max_seq_len, softmax_scale=x.scale,
                    causal=True, window_size=(-1, -1), block_table=x.block_table, softcap=0,
                    q_descale=None, k_descale=descale, v_descale=descale)
                return out

            return call

        fns["paged_attention_decode"] = attention
        fns["paged_attention_varlen"] = attention
    if not fns:
        raise ProviderUnavailable(f"vLLM {version}: neither reshape_and_cache_flash nor "
                                  "unified_attention is importable")
    return Provider("vllm", f"vllm {version}", version, fns)


# ----------------------------------------------------------------------------------- FlashInfer
def _csr(x: KernelInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's page lists: ``indptr`` [B+1], ``indices`` (used blocks, in order) and
    ``last_page_len`` [B] in ``[1, block_size]``, int32 on the device."""
    import torch

    bs = x.case.block_size
    indptr, indices, last = [0], [], []
    for row, seq_len in zip(x.rows, x.case.seq_lens, strict=False):
        num = -(-seq_len // bs)
        indices.extend(row[:num])
        indptr.append(indptr[-1] + num)
        last.append(seq_len - (num - 1) * bs)
    dev = x.key_cache.device
    return (torch.tensor(indptr, dtype=torch.int32, device=dev),
            torch.tensor(indices, dtype=torch.int32, device=dev),
            torch.tensor(last, dtype=torch.int32, device=dev))


def _flashinfer() -> Provider:
    try:
        import flashinfer
    except ImportError as exc:
        raise ProviderUnavailable(f"FlashInfer is not installed ({exc})") from None
    import torch

    version = getattr(flashinfer, "__version__", "unknown")
    workspace: dict[str, torch.Tensor] = {}

    def buffer(device: torch.device) -> torch.Tensor:
        if "buf" not in workspace:
            workspace["buf"] = torch.zeros(128 * 2**20, dtype=torch.uint8, device=device)
        return workspace["buf"]

    def store(x: KernelInputs) -> Prepared:
        indptr, indices, last = _csr(x)
        seq_of: list[int] = []
        pos_of: list[int] = []
        for seq, (seq_len, query_len) in enumerate(zip(x.case.seq_lens, x.case.query_lens,
                                                       strict=True)):
            seq_of.extend([seq] * query_len)
            pos_of.extend(range(seq_len - query_len, seq_len))
        dev = x.key_cache.device
        batch_indices = torch.tensor(seq_of, dtype=torch.int32, device=dev)
        positions = torch.tensor(pos_of, dtype=torch.int32, device=dev)
        n = x.case.num_new_tokens  # FlashInfer has no padding tokens: pass the real ones only
        key, value = x.key[:n].contiguous(), x.value[:n].contiguous()  # copies made untimed
        return lambda: flashinfer.append_paged_kv_cache(
            key, value, batch_indices, positions, (x.key_cache, x.value_cache),
            indices, indptr, last, kv_layout="NHD")

    # Any: a FlashInfer wrapper (FlashInfer has no type information)
    def plan(wrapper: Any, args: tuple[object, ...], dtype: torch.dtype, **kw: object) -> None:
        try:
            wrapper.plan(*args, q_data_type=dtype, kv_data_type=dtype, **kw)
        except TypeError:  # releases before kv_data_type named it data_type
            wrapper.plan(*args, q_data_type=dtype, data_type=dtype, **kw)

    def decode(x: KernelInputs) -> Prepared:
        indptr, indices, last = _csr(x)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(buffer(x.query.device), "NHD")
        c = x.case
        plan(wrapper, (indptr, indices, last, c.num_heads, c.num_kv_heads, c.head_size,
                       c.block_size), x.query.dtype)
        return lambda: wrapper.run(x.query, (x.key_cache, x.value_cache))

    def varlen(x: KernelInputs) -> Prepared:
        indptr, indices, last = _csr(x)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(buffer(x.query.device), "NHD")
        c = x.case
        plan(wrapper, (x.query_start_loc, indptr, indices, last, c.num_heads, c.num_kv_heads,
                       c.head_size, c.block_size), x.query.dtype, causal=True)
        return lambda: wrapper.run(x.query, (x.key_cache, x.value_cache))

    return Provider("flashinfer", f"flashinfer {version}", version, {
        "store_kv_cache": store,
        "paged_attention_decode": decode,
        "paged_attention_varlen": varlen,
    })


def make_provider(name: str, impl: ImplHandle | None = None) -> Provider:
    """Build provider ``name`` (one of ``PROVIDERS``); ``impl`` is the ``ImplHandle`` for
    ``"impl"``.

    Raises:
        ProviderUnavailable: with the skip reason (not installed, no ``kernels`` capability,
            the same kernels as ``kvcheck_triton``...).
    """
    if name == "torch_ref":
        return _torch_ref()
    if name == "kvcheck_triton":
        try:
            return _kvcheck_triton()
        except ImportError as exc:
            raise ProviderUnavailable(f"kvcheck's Triton kernels need triton ({exc})") from None
    if name == "vllm":
        return _vllm()
    if name == "flashinfer":
        return _flashinfer()
    if name == "impl":
        if impl is None or not impl.has("kernels"):
            who = "no implementation" if impl is None else impl.name
            raise ProviderUnavailable(f"{who} does not declare the 'kernels' capability")
        try:
            kernel_set = impl.module.kernels()
        except ImportError as exc:
            raise ProviderUnavailable(f"{impl.name}.kernels() cannot be imported here "
                                      f"({exc})") from None
        if getattr(kernel_set, "name", None) == "kvcheck-triton":
            raise ProviderUnavailable(
                f"{impl.name}'s kernels() are kvcheck's own Triton kernels: see the "
                "kvcheck_triton rows")
        return _impl(kernel_set, impl.name, impl.info.version)
    raise KVCheckInputError(f"unknown provider {name!r}; one of {PROVIDERS}")
