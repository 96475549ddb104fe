"""paged_attention_varlen (Triton): mixed prefill / extend / decode batches vs references."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvcheck.gpu_kernels import (  # noqa: E402
    attention_ref,
    gather_kv,
    paged_attention_decode,
    paged_attention_varlen,
)
from kvcheck.gpu_kernels.cases import AttentionCase, build_attention_inputs  # noqa: E402
from kvcheck.gpu_kernels.conformance import (  # noqa: E402
    assert_attention_close,
    check_paged_attention_varlen,
)


def test_varlen_matches_reference(varlen_case):
    """Every varlen case: prefill, decode, extends across block edges, empty queries, features."""
    check_paged_attention_varlen(paged_attention_varlen, varlen_case)


def _mixed(device: str, **kw) -> AttentionCase:
    return AttentionCase("mixed", device, block_size=16, num_kv_heads=2, queries_per_kv=4,
                         head_size=64, seq_lens=(17, 33, 40, 5), query_lens=(17, 1, 9, 0),
                         dtype="float32", shared_blocks=1, **kw)


def _varlen(inputs, **kw):
    cache = inputs["cache"]
    return paged_attention_varlen(
        inputs["query"], cache.key_cache, cache.value_cache, inputs["block_table"],
        inputs["query_start_loc"], inputs["seq_lens"], inputs["scale"],
        **{**inputs["kwargs"], **kw})


def test_causal_relative_to_cached_context(device):
    """Query i of a sequence sits at context_len + i: compare per sequence with attention_ref
    over K/V gathered contiguously (an independent path: gather_kv, no block table logic)."""
    inputs = build_attention_inputs(_mixed(device, sliding_window=6))
    out = _varlen(inputs)
    cache = inputs["cache"]
    keys, values = gather_kv(cache.key_cache, cache.value_cache, inputs["block_table"],
                             inputs["seq_lens"])
    qsl = inputs["query_start_loc"].tolist()
    kv_start = 0
    for seq, seq_len in enumerate(inputs["seq_lens"].tolist()):
        q = inputs["query"][qsl[seq]:qsl[seq + 1]]
        ref = attention_ref(q, keys[kv_start:kv_start + seq_len],
                            values[kv_start:kv_start + seq_len], inputs["scale"],
                            sliding_window=6)
        assert_attention_close("paged_attention_varlen", f"mixed-seq{seq}",
                               out[qsl[seq]:qsl[seq + 1]], ref, "float32",
                               ("token", "head", "dim"))
        kv_start += seq_len


def test_all_decode_batch_equals_decode_kernel(device):
    """A varlen batch of one-token queries is a decode batch: both kernels agree."""
    case = AttentionCase("as-decode", device, block_size=16, num_kv_heads=2, queries_per_kv=8,
                         head_size=128, seq_lens=(1, 16, 17, 53), query_lens=(1, 1, 1, 1),
                         dtype="float32", shared_blocks=1)
    inputs = build_attention_inputs(case)
    cache = inputs["cache"]
    decode = paged_attention_decode(inputs["query"], cache.key_cache, cache.value_cache,
                                    inputs["block_table"], inputs["seq_lens"], inputs["scale"],
                                    num_splits=1)
    torch.testing.assert_close(_varlen(inputs), decode, atol=2e-6, rtol=2e-6)


def test_every_block_n_and_max_query_len(device):
    """KV tiles 16/32/64 and an explicit max_query_len give the same answer."""
    inputs = build_attention_inputs(_mixed(device, softcap=5.0))
    base = _varlen(inputs)
    for block_n in (16, 64):
        torch.testing.assert_close(_varlen(inputs, block_n=block_n, max_query_len=17), base,
                                   atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"query_start_loc": torch.tensor([0, 3], dtype=torch.float32)}, "query_start_loc"),
        ({"query_start_loc": torch.tensor([[0, 3]], dtype=torch.int32)}, "1-D"),
        ({"seq_lens": torch.tensor([5, 6], dtype=torch.int32)}, "num_seqs=1"),
        ({"query": torch.randn(3, 7, 64)}, "multiple of num_kv_heads"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, match):
    """Host validation names the problem and the fix."""
    args = dict(query=torch.randn(3, 8, 64), key_cache=torch.zeros(4, 16, 2, 64),
                value_cache=torch.zeros(4, 16, 2, 64),
                block_table=torch.tensor([[1, 2]], dtype=torch.int32),
                query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
                seq_lens=torch.tensor([20], dtype=torch.int32), scale=0.125)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        paged_attention_varlen(*args.values())
