"""End to end: the reference KVCacheManager's block tables drive the kernels.

Two requests share a 40-token system prompt. Request r0 prefills, then decodes one token;
request r1 arrives later, gets r0's two full prefix blocks as a prefix-cache hit and stores only
its own tokens. Every K/V write goes through ``slot_mapping_for_request`` and ``store_kv_cache``;
every read goes through ``paged_attention_varlen`` / ``paged_attention_decode`` with the
manager's block ids. Outputs are compared with attention over the *contiguous* sequences, built
without the cache at all, so a wrong slot, a wrong block id or a hit block holding the wrong
data shows up as a mismatch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
kv_cache_manager = pytest.importorskip("kvcheck.reference_impl.kv_cache_manager")

from kvcheck.gpu_kernels import (  # noqa: E402
    PAD_SLOT_ID,
    attention_ref,
    paged_attention_decode,
    paged_attention_varlen,
    store_kv_cache,
)
from kvcheck.gpu_kernels.conformance import assert_attention_close  # noqa: E402
from kvcheck.gpu_kernels.layout import allocate_kv_cache  # noqa: E402
from kvcheck.reference_impl.block_table import slot_mapping_for_request  # noqa: E402
from kvcheck.reference_impl.request import Request  # noqa: E402

BLOCK_SIZE, NUM_KV_HEADS, QUERIES_PER_KV, HEAD_SIZE = 16, 2, 4, 64
NUM_HEADS = NUM_KV_HEADS * QUERIES_PER_KV
VOCAB, MAX_POS = 1000, 256


class _ToyModel:
    """K/V of a token = f(token id, position): equal prefixes give equal K/V, like a real model.

    (A real model's K/V at position p depends on all tokens <= p; with a shared prefix that is
    the same thing, which is exactly what makes prefix caching valid.)
    """

    def __init__(self, device: str, dtype: torch.dtype) -> None:
        gen = torch.Generator().manual_seed(0)
        shape = (NUM_KV_HEADS, HEAD_SIZE)
        self.tok_k = torch.randn(VOCAB, *shape, generator=gen)
        self.tok_v = torch.randn(VOCAB, *shape, generator=gen)
        self.pos_k = torch.randn(MAX_POS, *shape, generator=gen) * 0.5
        self.pos_v = torch.randn(MAX_POS, *shape, generator=gen) * 0.5
        self.query = torch.randn(VOCAB, NUM_HEADS, HEAD_SIZE, generator=gen)
        self.device, self.dtype = device, dtype

    def kv(self, token_ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[len, H_kv, D]`` K and V of tokens sitting at positions ``start, start + 1, ...``."""
        ids = torch.tensor(token_ids)
        pos = torch.arange(start, start + len(token_ids))
        k = self.tok_k[ids] + self.pos_k[pos]
        v = self.tok_v[ids] + self.pos_v[pos]
        return k.to(self.device, self.dtype), v.to(self.device, self.dtype)

    def q(self, token_ids: list[int]) -> torch.Tensor:
        return self.query[torch.tensor(token_ids)].to(self.device, self.dtype)


def _store(model, cache, block_ids, token_ids, start, end, pad_to=None):
    """Write K/V of positions [start, end) through the manager's slot mapping."""
    slots = slot_mapping_for_request(block_ids, BLOCK_SIZE, start, end)
    key, value = model.kv(token_ids[start:end], start)
    if pad_to is not None:  # CUDA-graph style: padded rows with PAD_SLOT_ID write nothing
        num_pad = pad_to - len(slots)
        slots = slots + [PAD_SLOT_ID] * num_pad
        pad = torch.full((num_pad, *key.shape[1:]), float("nan"), dtype=key.dtype,
                         device=key.device)
        key, value = torch.cat([key, pad]), torch.cat([value, pad])
    store_kv_cache(key, value, cache.key_cache, cache.value_cache,
                   torch.tensor(slots, dtype=torch.int64, device=model.device),
                   layout=cache.layout)


def _table(device, *rows):
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32,
                        device=device)


@pytest.mark.parametrize("form", ["nhd", "hnd", "packed_kv"])
def test_shared_prefix_workload_round_trip(device, form):
    """Manager block tables + slot mappings + kernels == attention over contiguous sequences."""
    model = _ToyModel(device, torch.float16)
    mgr = kv_cache_manager.KVCacheManager(num_blocks=64, block_size=BLOCK_SIZE,
                                          enable_caching=True)
    cache = allocate_kv_cache(form, 64, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, torch.float16,
                              device)
    cache.key_cache.fill_(float("nan"))  # unwritten slots poison any wrong read
    cache.value_cache.fill_(float("nan"))
    system = [(7 * i + 3) % VOCAB for i in range(40)]  # 2.5 blocks of shared prompt
    prompt0 = system + [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]  # 53 tokens
    prompt1 = system + [(5 * i + 1) % VOCAB for i in range(21)]  # 61 tokens

    # -- r0: prefill (no hit), stored with a padded slot mapping.
    r0 = Request("r0", prompt0, block_hasher=mgr.block_hasher)
    blocks, num_hit = mgr.get_computed_blocks(r0)
    assert (blocks, num_hit) == (([],), 0)  # one list per KV-cache group
    assert mgr.allocate_slots(r0, num_new_tokens=len(prompt0), num_new_computed_tokens=0,
                              new_computed_blocks=blocks) is not None
    (ids0,) = mgr.get_block_ids("r0")
    _store(model, cache, ids0, prompt0, 0, len(prompt0), pad_to=64)
    r0.num_computed_tokens = len(prompt0)

    # -- r0 decodes one token (a new slot in its last block).
    r0.append_output_token_ids(999)
    assert mgr.allocate_slots(r0, num_new_tokens=1) is not None
    (ids0,) = mgr.get_block_ids("r0")
    tokens0 = r0.all_token_ids
    _store(model, cache, ids0, tokens0, len(prompt0), len(tokens0))
    r0.num_computed_tokens = len(tokens0)

    # -- r1 arrives: its first two blocks (32 tokens) are r0's cached prefix blocks.
    r1 = Request("r1", prompt1, block_hasher=mgr.block_hasher)
    blocks, num_hit = mgr.get_computed_blocks(r1)
    assert num_hit == 32, "a 40-token shared prompt gives two full-block hits"
    assert mgr.allocate_slots(r1, num_new_tokens=len(prompt1) - num_hit,
                              num_new_computed_tokens=num_hit,
                              new_computed_blocks=blocks) is not None
    (ids1,) = mgr.get_block_ids("r1")
    assert ids1[:2] == ids0[:2] and not set(ids1[2:]) & set(ids0)
    _store(model, cache, ids1, prompt1, num_hit, len(prompt1))  # only r1's own tokens

    # Contiguous truth, computed without the cache.
    def truth(token_ids, query_tokens):
        k, v = model.kv(token_ids, 0)
        return attention_ref(model.q(query_tokens), k, v, HEAD_SIZE**-0.5)

    # -- one mixed batch: r1's extend (29 tokens at positions 32..60) + r0's decode token.
    query = torch.cat([model.q(prompt1[num_hit:]), model.q(tokens0[-1:])])
    out = paged_attention_varlen(
        query, cache.key_cache, cache.value_cache, _table(device, ids1, ids0),
        torch.tensor([0, len(prompt1) - num_hit, len(query)], dtype=torch.int32, device=device),
        torch.tensor([len(prompt1), len(tokens0)], dtype=torch.int32, device=device),
        HEAD_SIZE**-0.5, layout=cache.layout)
    want = torch.cat([truth(prompt1, prompt1[num_hit:]), truth(tokens0, tokens0[-1:])])
    assert_attention_close("paged_attention_varlen", f"shared-prefix-{form}", out, want,
                           "float16", ("token", "head", "dim"))

    # -- and both requests' next-token decode through the decode kernel (split and not).
    for num_splits in (1, 3):
        out = paged_attention_decode(
            torch.cat([model.q(prompt1[-1:]), model.q(tokens0[-1:])]),
            cache.key_cache, cache.value_cache, _table(device, ids1, ids0),
            torch.tensor([len(prompt1), len(tokens0)], dtype=torch.int32, device=device),
            HEAD_SIZE**-0.5, layout=cache.layout, num_splits=num_splits,
            max_seq_len=len(prompt1))
        want = torch.cat([truth(prompt1, prompt1[-1:]), truth(tokens0, tokens0[-1:])])
        assert_attention_close("paged_attention_decode", f"shared-prefix-{form}-{num_splits}",
                               out, want, "float16", ("seq", "head", "dim"))
