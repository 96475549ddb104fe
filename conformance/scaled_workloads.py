"""Random workloads at a design's own large block sizes.

The generated workloads (``kvcheck.conformance.workload_machine``, the sliding windows of
its layouts, ``kvcheck.conformance.layouts``, the slot-uniqueness property test) draw their
lengths for 4-token blocks: prompts of a few dozen tokens, chunks of up to 8, pools of 24 to
96 tokens. At a design's 256-token blocks those fit one block, so hits, shared blocks and
eviction would never happen. ``workload_scale`` says how many tokens each drawn token stands
for at a block size, and the workloads multiply their lengths by it after drawing them: the
Hypothesis examples are the same at every scale, and at 256 they span, share, hit and evict
the blocks they do at 4.

The scale is 1 (the workloads exactly as written) under the vLLM profiles, for a design
declaring no block sizes, and at the usual sizes (1, 2, 4, 8), as ``DeclaredSizes`` keeps the
scripted tests' sizes there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.ops import Op

if TYPE_CHECKING:
    from kvcheck.conformance.driver import StepResult
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec

__all__ = ["USUAL_BLOCK_SIZES", "WRITTEN_FOR_BLOCK_SIZE", "ScaledDriver", "scaled_tokens",
           "workload_scale"]

#: The block sizes random workloads draw when a design supports them (the first is what
#: Hypothesis shrinks towards); their lengths stay as written at each.
USUAL_BLOCK_SIZES: tuple[int, ...] = (4, 2, 8, 1)
#: The block size the workloads' lengths are written for.
WRITTEN_FOR_BLOCK_SIZE = 4


def workload_scale(block_size: int, info: ImplInfo | None, profile: str | None) -> int:
    """How many tokens each drawn token stands for at ``block_size``: 1 under the vLLM
    profiles, without ``info`` or its ``block_sizes``, and at the usual sizes; else (a
    ``generic`` design's declared size) ``block_size // 4``, at least 1 (64 at 256: prompts,
    shared prefixes, chunks, decode steps of several tokens, speculative slots, model
    lengths, pools and sliding windows 64 times as long)."""
    if (info is None or info.block_sizes is None or profile != "generic"
            or block_size in USUAL_BLOCK_SIZES):
        return 1
    return max(1, block_size // WRITTEN_FOR_BLOCK_SIZE)


def scaled_tokens(tokens: Sequence[int], scale: int) -> list[int]:
    """``tokens`` with each token repeated ``scale`` times: two prompts share a prefix of
    ``n`` tokens exactly when their scaled ones share ``n * scale``, and the token ids (every
    serialized integer width drawn) stay the same."""
    if scale == 1:
        return list(tokens)
    return [t for t in tokens for _ in range(scale)]


class ScaledDriver(Driver):
    """A ``Driver`` for ops whose lengths are drawn for 4-token blocks: where
    ``workload_scale`` of its spec is above 1, each prompt token stands for ``scale`` tokens,
    and so does each token of a prefill chunk, of speculative slots and (with
    ``multi_token_decode``) of a decode step; at scale 1 every op runs as given."""

    def __init__(self, impl: ImplHandle, spec: KVCacheSpec) -> None:
        super().__init__(impl, spec)
        self.scale = workload_scale(spec.block_size, impl.info, spec.profile)

    def apply(self, op: Op) -> StepResult:
        return super().apply(op if self.scale == 1 else self._scaled(op))

    def _scaled(self, op: Op) -> Op:
        if op["op"] == "add":
            added = op.copy()
            added["prompt"] = scaled_tokens(op["prompt"], self.scale)
            if "mm" in op:  # each item's offset and length, in tokens
                added["mm"] = [[item, int(offset) * self.scale, int(length) * self.scale]
                               for item, offset, length in op["mm"]]
            return added
        if op["op"] not in ("schedule", "decode"):
            return op
        step = op.copy()
        if "lookahead" in step:
            step["lookahead"] *= self.scale
        view = self.views.get(op["rid"])  # None: an unknown request (the driver reports it)
        # A schedule of a running request whose prompt is computed is a decode step.
        prefill = op["op"] == "schedule" and (
            view is None or op["rid"] not in self.running
            or view.num_computed_tokens < view.num_tokens)
        n = step["num_tokens"]
        if n is not None and (prefill or "multi_token_decode" in self.capabilities):
            step["num_tokens"] = n * self.scale
        return step
