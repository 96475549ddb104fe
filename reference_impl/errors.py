"""Errors the reference raises where vLLM silently corrupts its state."""

from __future__ import annotations

from kvcheck.errors import KVCheckInputError

__all__ = ["FreeQueueMisuseError", "KVCacheMisuseError", "OffloadMisuseError"]


class KVCacheMisuseError(KVCheckInputError):
    """A call that vLLM accepts but that breaks the pool's bookkeeping.

    Examples: freeing a block whose ``ref_cnt`` is already 0 (double free), listing a block
    twice in one ``free_blocks`` call, negative token counts. vLLM drives ``ref_cnt`` negative
    or enqueues a block twice (vllm#42571); the reference refuses and changes nothing, so the
    conformance suite never mistakes corrupted state for expected behaviour.
    """


class FreeQueueMisuseError(KVCacheMisuseError, RuntimeError):
    """A free-queue link operation on a block in the wrong state: removing a block that is not
    queued, or enqueuing one that already is (or twice in one call).

    Also a ``RuntimeError``: vLLM's ``FreeKVCacheBlockQueue.remove`` raises that type for the
    same call, so code written against vLLM catches this one too.
    """


class OffloadMisuseError(KVCacheMisuseError):
    """A call on the offload tier that vLLM's scheduler never makes: loading a key that is
    absent or still being written, completing a load or a store that was never prepared, an
    offer that lists a key twice, a key of the wrong width, new keys for a finished request.

    vLLM asserts on some of these and silently ignores others; the reference refuses every one
    with the key and the rule, and changes nothing.
    """
