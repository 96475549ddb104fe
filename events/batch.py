"""What the two releases' wire forms share: the batch envelope and the hash type.

Both 0.33.0 and 0.10.2 (``vllm/distributed/kv_events.py``) send a batch as the array ``[ts,
events, data_parallel_rank]`` (``array_like``; a trailing ``None`` rank is still written, as
msgspec writes every array field); only the events' form differs (``vllm_033`` /
``vllm_010``).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["EventBatch", "ExternalBlockHash"]

#: ``v1/core/kv_cache_utils.py``: the raw hash, or its last 8 bytes as a u64.
ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]  # Any: msgspec decodes any value here (each release narrows it)
    data_parallel_rank: int | None = None
