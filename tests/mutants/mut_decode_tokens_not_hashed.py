"""Bug (request.py): ``append_output_token_ids`` appends the sampled tokens but does not hash
the blocks they complete.

Prompt blocks are hashed at construction, so prefix caching of prompts works; blocks filled
during decode never get a hash, so they are never cached: a multi-turn conversation whose next
prompt repeats the previous answer recomputes all of it, and a preempted request re-admitted
mid-decode hits only its prompt. vLLM 0.33 hashes new full blocks on every
``append_output_token_ids`` (``v1/request.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from _mutant_base import build

from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.request import Request


class UnhashedDecodeRequest(Request):
    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        new = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        if any(t < 0 for t in new):
            raise KVCacheMisuseError(f"request {self.request_id!r}: token ids must be >= 0")
        self.all_token_ids.extend(new)
        # BUG: missing self.update_block_hashes()


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_decode_tokens_not_hashed", request_cls=UnhashedDecodeRequest)
