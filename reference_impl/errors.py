"""Every error the reference raises: misuse vLLM would let corrupt its state (input errors),
and a broken pool law (``InvariantViolation``, a failure)."""

from __future__ import annotations

from kvcheck.errors import KVCheckFailure, KVCheckInputError

__all__ = ["FreeQueueMisuseError", "IndexerInputError", "InvariantViolation", "KVCacheConfigError",
           "KVCacheMisuseError", "OffloadMisuseError"]


class KVCacheMisuseError(KVCheckInputError):
    """A call that vLLM accepts but that breaks the pool's bookkeeping.

    Examples: freeing a block whose ``ref_cnt`` is already 0 (double free), listing a block
    twice in one ``free_blocks`` call, negative token counts. vLLM drives ``ref_cnt`` negative
    or enqueues a block twice (vllm#42571); the reference refuses and changes nothing, so the
    conformance suite never mistakes corrupted state for expected behaviour.
    """


class KVCacheConfigError(KVCheckInputError):
    """A KV-cache configuration vLLM itself refuses with a ``ValueError`` (a block size its
    attention backend cannot use, a ``prefix_match_unit`` that does not divide the groups'
    block sizes...); this class is also a ``ValueError``, so code written against vLLM catches
    it, and the message follows vLLM's."""


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


class IndexerInputError(KVCacheMisuseError):
    """A batch the index cannot apply without guessing (a store of blocks of another size
    than the index's in the group it matches on); the message names the worker, the
    sequence and the fix."""



class InvariantViolation(KVCheckFailure):
    """A pool law is broken; the message names every term of the failed law."""

