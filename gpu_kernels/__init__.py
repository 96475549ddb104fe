"""kvcheck.gpu_kernels: Triton kernels for the paged KV cache, references and conformance checks.

Needs the ``kernels`` extra (torch + triton). Public names are loaded lazily so that importing
``kvcheck.gpu_kernels`` (or only ``layout``) does not decorate the Triton kernels yet: Triton
reads ``TRITON_INTERPRET`` when a kernel module is imported, so a test ``conftest.py`` can still
switch CPU runs to the interpreter after this package was imported.

* ``store_kv_cache``: K/V into the paged cache (vLLM ``reshape_and_cache_flash``).
* ``paged_attention_decode``: one query token per sequence, GQA, split-KV.
* ``paged_attention_varlen``: mixed prefill / extend / decode (vLLM unified attention).
* ``copy_blocks``, ``gather_kv``: block copies and paged -> contiguous.
* ``*_ref``: fp32 loop references; ``conformance``: sweeps and checks; ``layout``: shapes.
* ``null_pad_block_table``, ``slot_mapping_from_block_table``: sliding-window groups' tables,
  whose entries before the window are the null block 0 (``null_blocks``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = [
    "NULL_BLOCK_ID",
    "PAD_SLOT_ID",
    "KernelSet",
    "attention_ref",
    "choose_num_splits",
    "copy_blocks",
    "copy_blocks_ref",
    "gather_kv",
    "gather_kv_ref",
    "kvcheck_kernel_set",
    "null_pad_block_table",
    "paged_attention_decode",
    "paged_attention_decode_ref",
    "paged_attention_varlen",
    "paged_attention_varlen_ref",
    "slot_mapping_from_block_table",
    "store_kv_cache",
    "store_kv_cache_ref",
]

_LAZY = {
    "store_kv_cache": "store_kv",
    "paged_attention_decode": "paged_decode",
    "choose_num_splits": "paged_decode",
    "paged_attention_varlen": "paged_varlen",
    "copy_blocks": "block_copy",
    "gather_kv": "block_copy",
    "store_kv_cache_ref": "reference",
    "attention_ref": "reference",
    "paged_attention_decode_ref": "reference",
    "paged_attention_varlen_ref": "reference",
    "copy_blocks_ref": "reference",
    "gather_kv_ref": "reference",
    "PAD_SLOT_ID": "layout",
    "KernelSet": "conformance",
    "kvcheck_kernel_set": "conformance",
    "NULL_BLOCK_ID": "null_blocks",
    "null_pad_block_table": "null_blocks",
    "slot_mapping_from_block_table": "null_blocks",
}

if TYPE_CHECKING:
    from kvcheck.gpu_kernels.block_copy import copy_blocks, gather_kv
    from kvcheck.gpu_kernels.conformance import KernelSet, kvcheck_kernel_set
    from kvcheck.gpu_kernels.layout import PAD_SLOT_ID
    from kvcheck.gpu_kernels.null_blocks import (
        NULL_BLOCK_ID,
        null_pad_block_table,
        slot_mapping_from_block_table,
    )
    from kvcheck.gpu_kernels.paged_decode import choose_num_splits, paged_attention_decode
    from kvcheck.gpu_kernels.paged_varlen import paged_attention_varlen
    from kvcheck.gpu_kernels.reference import (
        attention_ref,
        copy_blocks_ref,
        gather_kv_ref,
        paged_attention_decode_ref,
        paged_attention_varlen_ref,
        store_kv_cache_ref,
    )
    from kvcheck.gpu_kernels.store_kv import store_kv_cache


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvcheck.gpu_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kvcheck.gpu_kernels.{module}"), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
