"""Slot mapping and batch metadata by vLLM's worker ``BlockTable``, for
``kvcheck.adapters.vllm``.

0.10.x computes the slot mapping in numpy on the CPU; newer releases by vLLM's Triton kernel
(on a CPU-only machine in Triton's interpreter, ``TRITON_INTERPRET=1``). The positions and
request indices of a step come from the model runner's arithmetic, which cannot run without a
model (``build_batch``). ``slot_mapping_problem()`` says why the capabilities cannot be declared
here, or None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcheck.adapters.vllm_runtime import (
    BLOCK_TABLE_ERROR,
    CPU_ONLY,
    HAS_TRITON,
    VERSION,
    BlockTable,
    accepting,
    params,
    torch,
)
from kvcheck.conformance.protocol import UnsupportedSpec
from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["HAS_INTERLEAVE", "SlotMapper", "build_batch", "slot_mapping_problem"]

_SLOT_KIND: str | None = None
if BlockTable is not None:
    _bt_params = params(BlockTable.compute_slot_mapping)
    if "req_indices" in _bt_params:
        _SLOT_KIND = "numpy"  # 0.10.x: numpy on the CPU
    elif "query_start_loc" in _bt_params:
        _SLOT_KIND = "triton"  # newer: vLLM's Triton kernel


def _slot_device() -> torch.device:
    return torch.device("cpu" if CPU_ONLY else "cuda")


class SlotMapper:
    """vLLM's worker ``BlockTable`` with one row, used to map a request's positions to slots.

    vLLM's slot mapping is a pure function of the row and the range, and the differential asks
    for every running request's slots after every op, mostly for rows and ranges it asked
    before: each distinct ``(block_ids, start, end)`` is computed by vLLM once and its answer
    reused (up to ``MAX_ANSWERS`` of them), since on a CPU vLLM 0.33's Triton kernel runs in
    Triton's interpreter at tens of milliseconds a call.
    """

    MAX_ANSWERS = 1 << 16

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.table = BlockTable(**accepting(
            BlockTable.__init__, block_size=block_size, max_num_reqs=1,
            max_num_blocks_per_req=max(num_blocks, 1),
            max_num_batched_tokens=max(num_blocks * block_size, 1), pin_memory=False,
            device=_slot_device(), cp_kv_cache_interleave_size=1,
            kernel_block_size=block_size))
        self._answers: dict[tuple[tuple[int, ...], int, int], list[int]] = {}

    def __call__(self, block_ids: Sequence[int], start: int, end: int) -> list[int]:
        if end - start <= 0:
            return []
        key = (tuple(block_ids), start, end)
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= self.MAX_ANSWERS:
                self._answers.clear()
            answer = self._answers[key] = self._compute(list(block_ids), start, end)
        return list(answer)

    def _compute(self, block_ids: list[int], start: int, end: int) -> list[int]:
        n = end - start
        table = self.table
        table.add_row(block_ids, 0)  # resets the row; entries past it are never read
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


def slot_mapping_problem() -> str | None:
    """Why the slot_mapping capability cannot be declared here (None: it can)."""
    if BlockTable is None:
        return f"vLLM's BlockTable cannot be imported ({BLOCK_TABLE_ERROR})"
    if _SLOT_KIND is None:
        return "vLLM's BlockTable.compute_slot_mapping has a signature this adapter does not know"
    if _SLOT_KIND == "triton" and not HAS_TRITON:
        return ("vLLM's slot mapping is a Triton kernel and vLLM found no usable Triton here "
                "(install triton; without CUDA it runs with TRITON_INTERPRET=1)")
    try:
        got = SlotMapper(8, 4)([5, 2], 1, 6)
    except Exception as exc:  # noqa: BLE001 - reported in PROFILE_NOTE
        return f"vLLM's BlockTable slot mapping failed here ({type(exc).__name__}: {exc})"
    if got != [21, 22, 23, 8, 9]:
        return f"vLLM's BlockTable mapped rows [5, 2] positions 1-5 to {got}"
    return None


# ------------------------------------------------------------------------------ batch metadata
# 0.33 and later: the Triton kernel takes the DCP interleave size (BlockTable's constructor
# argument); 0.10.x: numpy, DCP with an interleave of one token, no interleave argument.
HAS_INTERLEAVE = BlockTable is not None and "cp_kv_cache_interleave_size" in params(
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
        if dcp_world_size > 1 and interleave > 1 and not HAS_INTERLEAVE:
            raise UnsupportedSpec(
                f"vLLM {VERSION} has no cp_kv_cache_interleave_size: its DCP deals out single "
                f"tokens (interleave 1), not chunks of {interleave}")
        width = max((len(row) for row in block_tables[:num_reqs]), default=0)
        self.table = BlockTable(**accepting(
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

    def slot_mapping(self, num_scheduled_tokens: Sequence[int],
                     req_indices: npt.NDArray[np.int64], positions: npt.NDArray[np.int64],
                     num_padded_tokens: int) -> list[int]:
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


def build_batch(block_size: int, block_tables: Sequence[Sequence[int]],
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
        raise KVCheckInputError(f"{len(block_tables)} rows, {len(num_computed_tokens)} computed "
                         f"counts and {num_reqs} scheduled counts do not match")
    scheduled = np.asarray(num_scheduled_tokens, dtype=np.int64).reshape(-1)
    computed = np.asarray(num_computed_tokens, dtype=np.int64).reshape(-1)
    num_tokens = int(scheduled.sum())
    if num_padded_tokens < num_tokens:
        raise KVCheckInputError(f"num_padded_tokens={num_padded_tokens} < {num_tokens} tokens")
    req_indices = np.repeat(np.arange(num_reqs, dtype=np.int64), scheduled)
    starts = np.cumsum(scheduled) - scheduled
    positions = computed[req_indices] + np.arange(num_tokens, dtype=np.int64) - starts[
        req_indices]
    step = _StepTable(block_size, block_tables, num_reqs, num_padded_tokens, dcp_world_size,
                      dcp_rank, interleave)
    slots = step.slot_mapping(list(scheduled), req_indices, positions, num_padded_tokens)
    return slots, [int(p) for p in positions], [int(r) for r in req_indices]

