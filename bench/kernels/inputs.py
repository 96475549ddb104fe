"""Kernel benchmark cases and their inputs: realistic batches, fragmented and non-repeating tables.

A case is a batch shape (``KernelBenchCase``); ``KernelInputPool(case, device)`` allocates one
KV pool for it and hands out fresh inputs for every round:

* block ids are a seeded random permutation of the pool (block 0, the null block, is never
  used): no block repeats within a table, no two sequences share a block, and
  ``num_input_sets`` consecutive rounds use disjoint blocks (vLLM's ``randint`` tables reuse
  blocks, FlashInfer's ``arange`` tables are contiguous; neither is what a long-running server
  sees);
* queries, new keys and values are drawn anew each round, outside the timed region;
* attention caches hold random data; store caches are zeroed once (every round writes other
  slots).

The block planning and slot arithmetic are plain numpy (tested on the CPU); tensors are only
built by ``KernelInputPool``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from kvcheck.bench.measure.metrics import (
    paged_decode_bytes,
    paged_varlen_bytes,
    store_kv_cache_bytes,
)
from kvcheck.bench.workload.scenarios import Draws
from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ITEMSIZE",
    "KERNEL_OPS",
    "KernelBenchCase",
    "KernelInputPool",
    "KernelInputs",
    "bytes_per_call",
    "kernel_cases",
    "plan_block_tables",
    "slots_of_new_tokens",
]

KERNEL_OPS = ("store_kv_cache", "paged_attention_decode", "paged_attention_varlen")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class KernelBenchCase:
    """One benchmarked call shape.

    Attributes:
        seq_lens: tokens per sequence after this step (context plus new tokens).
        query_lens: new tokens per sequence this step (decode: all 1).
        num_pad: store only: extra ``PAD_SLOT_ID`` tokens (CUDA-graph padding).
        num_input_sets: rounds before block ids repeat (disjoint sets of blocks).
    """

    name: str
    op: str
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_kv_heads: int
    queries_per_kv: int
    head_size: int
    block_size: int
    dtype: str = "bfloat16"
    num_pad: int = 0
    num_input_sets: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.op not in KERNEL_OPS:
            raise KVCheckInputError(f"unknown kernel op {self.op!r}; one of {KERNEL_OPS}")
        if len(self.seq_lens) != len(self.query_lens):
            raise KVCheckInputError(f"{self.name}: seq_lens and query_lens differ in length")
        if any(q > s or q < 0 for q, s in zip(self.query_lens, self.seq_lens, strict=True)):
            raise KVCheckInputError(
                f"{self.name}: need 0 <= query_len <= seq_len for every sequence")

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.queries_per_kv

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_new_tokens(self) -> int:
        return sum(self.query_lens)

    def describe(self) -> dict[str, object]:
        """The shape as plain data, for ``extra_info`` and records."""
        return {
            "op": self.op, "num_seqs": self.num_seqs, "num_new_tokens": self.num_new_tokens,
            "num_pad": self.num_pad, "num_kv_tokens": sum(self.seq_lens),
            "max_seq_len": max(self.seq_lens), "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads, "head_size": self.head_size,
            "block_size": self.block_size, "dtype": self.dtype, "layout": "NHD",
            "num_input_sets": self.num_input_sets, "seed": self.seed,
        }


class _Heads(TypedDict):
    """The head and block shape the cases of one device share (``KernelBenchCase`` fields)."""

    num_kv_heads: int
    queries_per_kv: int
    head_size: int
    block_size: int
    dtype: str


def _lens(label: str, count: int, lo: int, hi: int) -> tuple[int, ...]:
    return tuple(Draws(0, label).ints(lo, hi, count))


def kernel_cases(op: str, device: str) -> list[KernelBenchCase]:
    """The shipped cases of ``op``: Llama-3-8B-like heads (8 KV heads, GQA 4, head 128, bf16,
    block 16) on CUDA; tiny shapes (2 KV heads, head 64, fp32) on the CPU, where only the
    torch references run."""
    if op not in KERNEL_OPS:
        raise KVCheckInputError(f"unknown kernel op {op!r}; one of {KERNEL_OPS}")
    if device == "cpu":
        common = _Heads(num_kv_heads=2, queries_per_kv=2, head_size=64, block_size=16,
                        dtype="float32")
        if op == "store_kv_cache":
            lens = _lens("cpu-store", 16, 16, 256)
            return [KernelBenchCase("decode-b16", op, lens, (1,) * 16, num_pad=3, **common)]
        if op == "paged_attention_decode":
            lens = _lens("cpu-decode", 8, 16, 256)
            return [KernelBenchCase("b8-ctx16-256", op, lens, (1,) * 8, **common)]
        lens = (40, 64) + _lens("cpu-varlen", 6, 16, 256)
        return [KernelBenchCase("mixed-2prefill-6decode", op, lens, (40, 32) + (1,) * 6,
                                **common)]
    common = _Heads(num_kv_heads=8, queries_per_kv=4, head_size=128, block_size=16,
                    dtype="bfloat16")
    if op == "store_kv_cache":
        decode_lens = _lens("store-decode", 256, 512, 4096)
        return [
            KernelBenchCase("decode-b256-h8-d128", op, decode_lens, (1,) * 256, num_pad=16,
                            **common),
            KernelBenchCase("prefill-8x1024-h8-d128", op, (1024,) * 8, (1024,) * 8, **common),
        ]
    if op == "paged_attention_decode":
        return [
            KernelBenchCase("b256-ctx512-4k-gqa4-d128", op, _lens("decode-b256", 256, 512, 4096),
                            (1,) * 256, **common),
            KernelBenchCase("b16-ctx8k-16k-gqa4-d128", op,
                            _lens("decode-b16", 16, 8192, 16384), (1,) * 16, **common),
        ]
    contexts = _lens("varlen-prefill-ctx", 4, 0, 1024)
    decodes = _lens("varlen-decode", 124, 512, 4096)
    return [KernelBenchCase(
        "mixed-4x1k-prefill-124-decode-gqa4-d128", op,
        tuple(c + 1024 for c in contexts) + decodes, (1024,) * 4 + (1,) * 124, **common)]


def plan_block_tables(seq_lens: Sequence[int], block_size: int, num_sets: int, seed: int,
                      label: str) -> tuple[list[list[list[int]]], int]:
    """Block ids for ``num_sets`` copies of a batch, all distinct, drawn from one shuffled pool.

    Returns ``(tables, num_blocks)``: ``tables[set][seq]`` lists the ``ceil(seq_len /
    block_size)`` physical block ids of that sequence in logical order, and ``num_blocks`` is
    the pool size (the null block 0 plus every id handed out). Every id in ``1..num_blocks-1``
    appears exactly once over all sets and sequences.
    """
    need = [math.ceil(n / block_size) for n in seq_lens]
    per_set = sum(need)
    ids = (Draws(seed, label).permutation(per_set * num_sets) + 1).tolist()
    tables, pos = [], 0
    for _ in range(num_sets):
        rows = []
        for n in need:
            rows.append(ids[pos:pos + n])
            pos += n
        tables.append(rows)
    return tables, 1 + per_set * num_sets


def slots_of_new_tokens(rows: Sequence[Sequence[int]], seq_lens: Sequence[int],
                        query_lens: Sequence[int], block_size: int, num_pad: int = 0
                        ) -> list[int]:
    """``slot_mapping`` of a step: the new tokens of each sequence in order, then ``num_pad``
    ``PAD_SLOT_ID`` (-1) entries.

    Sequence ``b``'s new tokens sit at positions ``seq_len - query_len .. seq_len - 1``;
    ``slot = rows[b][pos // block_size] * block_size + pos % block_size``. E.g. rows
    ``[[7, 3]]``, seq_len 20, query_len 2, block 16: positions 18, 19 -> block 3, rows 2, 3 ->
    slots 50, 51.
    """
    slots: list[int] = []
    for row, seq_len, query_len in zip(rows, seq_lens, query_lens, strict=False):
        slots.extend(row[pos // block_size] * block_size + pos % block_size
                     for pos in range(seq_len - query_len, seq_len))
    return slots + [-1] * num_pad


def bytes_per_call(case: KernelBenchCase) -> int:
    """Compulsory bytes of one call of ``case`` (``kvcheck.bench.measure.metrics`` models): int64
    slots, int32 block tables, ``seq_lens`` and ``query_start_loc``; output in the input dtype."""
    size = ITEMSIZE[case.dtype]
    if case.op == "store_kv_cache":
        return store_kv_cache_bytes(case.num_new_tokens + case.num_pad, case.num_new_tokens,
                                    case.num_kv_heads, case.head_size, size, size)
    if case.op == "paged_attention_decode":
        return paged_decode_bytes(case.seq_lens, case.num_heads, case.num_kv_heads,
                                  case.head_size, case.block_size, size, size, size)
    return paged_varlen_bytes(case.seq_lens, case.query_lens, case.num_heads, case.num_kv_heads,
                              case.head_size, case.block_size, size, size, size) + \
        4 * (case.num_seqs + 1)  # query_start_loc


@dataclass
class KernelInputs:
    """Everything one round's call needs (tensors on the case's device).

    ``rows`` / ``seq_lens_list`` / ``query_lens_list`` are host copies for the adapters that
    need other index formats (FlashInfer's indptr form) and for the checks.
    """

    case: KernelBenchCase
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_table: torch.Tensor  # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    slot_mapping: torch.Tensor  # int64 [num_new_tokens + num_pad]
    # Any: a tensor for the ops that read it, None for the others (the providers of an op read
    # only its own inputs, so no narrowing is written there)
    query: Any  # [num_new_tokens, num_heads, head_size] (attention)
    key: Any  # Any: as query; [num_new_tokens + num_pad, num_kv_heads, head_size] (store)
    value: Any  # Any: as query; the shape of key
    rows: list[list[int]]
    set_index: int

    @property
    def scale(self) -> float:
        return float(self.case.head_size ** -0.5)

    @property
    def max_seq_len(self) -> int:
        return max(self.case.seq_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.case.query_lens)


class KernelInputPool:
    """One KV pool per case plus per-set index tensors; ``next_round()`` gives fresh inputs."""

    def __init__(self, case: KernelBenchCase, device: str) -> None:
        import torch

        self.case = case
        self.device = device
        self._torch = torch
        self._dtype = getattr(torch, case.dtype)
        self.tables, self.num_blocks = plan_block_tables(
            case.seq_lens, case.block_size, case.num_input_sets, case.seed, case.name)
        shape = (self.num_blocks, case.block_size, case.num_kv_heads, case.head_size)
        self._gen = torch.Generator(device=device).manual_seed(case.seed)
        # None once released.
        self.key_cache: torch.Tensor | None = torch.zeros(shape, dtype=self._dtype, device=device)
        self.value_cache: torch.Tensor | None = torch.zeros(shape, dtype=self._dtype,
                                                            device=device)
        if case.op != "store_kv_cache":
            # Filled in slices of at most 2**28 elements: one random call stays far from
            # 32-bit element counts whatever the pool size.
            step = max(1, 2**28 // math.prod(shape[1:]))
            for cache in (self.key_cache, self.value_cache):
                assert cache is not None  # allocated just above
                for start in range(0, self.num_blocks, step):
                    cache[start:start + step].normal_(generator=self._gen)
        width = max(len(r) for r in self.tables[0])
        self._sets = []
        qsl = np.concatenate([[0], np.cumsum(case.query_lens)]).astype(np.int32)
        for rows in self.tables:
            table = np.zeros((case.num_seqs, width), dtype=np.int32)
            for i, row in enumerate(rows):
                table[i, :len(row)] = row
            slots = slots_of_new_tokens(rows, case.seq_lens, case.query_lens, case.block_size,
                                        case.num_pad)
            self._sets.append((
                torch.from_numpy(table).to(device),
                torch.tensor(case.seq_lens, dtype=torch.int32, device=device),
                torch.from_numpy(qsl).to(device),
                torch.tensor(slots, dtype=torch.int64, device=device),
            ))
        self._round = 0

    @property
    def pool_bytes(self) -> int:
        """Bytes of the key and value caches together."""
        assert self.key_cache is not None, "the pool was released"
        return 2 * self.key_cache.numel() * self.key_cache.element_size()

    def next_round(self) -> KernelInputs:
        """Inputs of the next round: the next disjoint block set, fresh Q / K / V."""
        torch, case = self._torch, self.case
        assert self.key_cache is not None and self.value_cache is not None, (
            "the pool was released")
        index = self._round % case.num_input_sets
        self._round += 1
        block_table, seq_lens, qsl, slot_mapping = self._sets[index]
        query = key = value = None
        if case.op == "store_kv_cache":
            # Slices of a fused QKV-like tensor (strided rows), as a model produces them.
            qkv = torch.randn((case.num_new_tokens + case.num_pad, 3, case.num_kv_heads,
                               case.head_size), dtype=self._dtype, device=self.device,
                              generator=self._gen)
            key, value = qkv[:, 1], qkv[:, 2]
        else:
            query = torch.randn((case.num_new_tokens, case.num_heads, case.head_size),
                                dtype=self._dtype, device=self.device, generator=self._gen)
        return KernelInputs(case, self.key_cache, self.value_cache, block_table, seq_lens, qsl,
                            slot_mapping, query, key, value, self.tables[index], index)

    def release(self) -> None:
        """Drop the device tensors (the next case allocates its own pool)."""
        self.key_cache = self.value_cache = None
        self._sets = []
