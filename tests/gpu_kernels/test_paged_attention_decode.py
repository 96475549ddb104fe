"""paged_attention_decode (Triton) against its reference and against itself (split-KV)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvcheck.gpu_kernels import (  # noqa: E402
    choose_num_splits,
    paged_attention_decode,
    paged_attention_decode_ref,
    store_kv_cache,
)
from kvcheck.gpu_kernels.cases import AttentionCase, build_attention_inputs  # noqa: E402
from kvcheck.gpu_kernels.conformance import (  # noqa: E402
    assert_attention_close,
    check_paged_attention_decode,
)


def test_decode_matches_reference(decode_case):
    """Every decode case (ragged lengths, GQA, forms, window, softcap, fp8, splits)."""
    check_paged_attention_decode(paged_attention_decode, decode_case)


def _long_case(device: str, dtype: str = "float32", **kw) -> AttentionCase:
    lens = (1, 31, 32, 33, 97, 300) if device == "cpu" else (1, 31, 32, 33, 1021, 4099, 2500)
    return AttentionCase("split-vs-single", device, block_size=16, num_kv_heads=2,
                         queries_per_kv=4, head_size=64, seq_lens=lens, dtype=dtype,
                         shared_blocks=2, **kw)


def _run(inputs, **kw):
    cache = inputs["cache"]
    return paged_attention_decode(
        inputs["query"], cache.key_cache, cache.value_cache, inputs["block_table"],
        inputs["seq_lens"], inputs["scale"], **{**inputs["kwargs"], **kw})


@pytest.mark.parametrize("num_splits", [2, 3, 5, 16])
def test_split_kv_equals_single_pass(device, num_splits):
    """Flash-decoding splits + reduce give the single-pass result (fp32: to ~1e-6)."""
    inputs = build_attention_inputs(_long_case(device))
    single = _run(inputs, num_splits=1)
    split = _run(inputs, num_splits=num_splits)
    torch.testing.assert_close(split, single, atol=2e-6, rtol=2e-6)


def test_split_kv_with_window_and_empty_splits(device):
    """Splits wholly outside the window or past a short sequence contribute nothing (no NaN)."""
    inputs = build_attention_inputs(_long_case(device, dtype="float16", sliding_window=9))
    single = _run(inputs, num_splits=1)
    split = _run(inputs, num_splits=8)
    assert not bool(torch.isnan(split).any())
    # fp16 outputs of two summation orders: within one fp16 rounding of each other.
    torch.testing.assert_close(split, single, atol=2e-3, rtol=2e-3)


def test_auto_splits_and_every_block_n(device):
    """num_splits=None (heuristic) and KV tiles of 16/32/64 all agree with the reference."""
    case = _long_case(device, dtype="float16")
    inputs = build_attention_inputs(case)
    cache = inputs["cache"]
    ref = paged_attention_decode_ref(
        inputs["query"], cache.key_cache, cache.value_cache, inputs["block_table"],
        inputs["seq_lens"], inputs["scale"])
    for block_n in (16, 32, 64):
        for num_splits in (None, 1, 4):
            out = _run(inputs, block_n=block_n, num_splits=num_splits,
                       max_seq_len=max(case.seq_lens) if num_splits else None)
            assert_attention_close("paged_attention_decode",
                                   f"{case.name}-block_n{block_n}-splits{num_splits}",
                                   out, ref, "float16", ("seq", "head", "dim"))


def test_choose_num_splits_heuristic():
    """Splits only long contexts with few (seq, KV head) programs; capped at 16."""
    assert choose_num_splits(1, 8, 4096) == 16
    assert choose_num_splits(64, 8, 4096) == 1
    assert choose_num_splits(1, 8, 100) == 1
    assert choose_num_splits(2, 2, 1024) == 4


def test_zero_length_sequence_gives_zeros(device):
    """seq_len 0 (a padded batch row) yields a zero row, never NaN; other rows unaffected."""
    case = AttentionCase("zero-len", device, block_size=16, num_kv_heads=1, queries_per_kv=4,
                         head_size=64, seq_lens=(5, 20), dtype="float32")
    inputs = build_attention_inputs(case)
    inputs["seq_lens"][0] = 0
    for num_splits in (1, 2):
        out = _run(inputs, num_splits=num_splits, max_seq_len=20)
        assert bool((out[0] == 0).all())
        assert not bool(torch.isnan(out).any())


def test_out_argument_is_filled_and_returned(device):
    """A caller-provided `out` (strided rows allowed) receives the result."""
    case = AttentionCase("out-arg", device, block_size=16, num_kv_heads=2, queries_per_kv=2,
                         head_size=64, seq_lens=(3, 17, 40), dtype="float32")
    inputs = build_attention_inputs(case)
    buffer = torch.zeros(3, 6, 64, device=device)
    out = buffer[:, 1:5]  # strided seq dimension, contiguous head dim
    result = _run(inputs, out=out)
    assert result.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, _run(inputs), atol=0, rtol=0)
    assert bool((buffer[:, 0] == 0).all()) and bool((buffer[:, 5] == 0).all())


def test_64bit_block_offsets(device):
    """Blocks past 2**31 elements are read correctly: store then decode through the last blocks."""
    block_size, num_kv_heads, head_size = 16, 8, 128
    num_blocks = 2**31 // (block_size * num_kv_heads * head_size) + 4
    key_cache = torch.empty(num_blocks, block_size, num_kv_heads, head_size,
                            dtype=torch.uint8, device=device)
    value_cache = torch.empty_like(key_cache)
    assert key_cache.numel() > 2**31
    gen = torch.Generator().manual_seed(3)
    seq_len = 2 * block_size + 5
    block_ids = [num_blocks - 1, 7, num_blocks - 3]  # far, near, far
    slots = torch.tensor([block_ids[p // block_size] * block_size + p % block_size
                          for p in range(seq_len)], device=device)
    key = torch.randn(seq_len, num_kv_heads, head_size, generator=gen).to(device)
    value = torch.randn(seq_len, num_kv_heads, head_size, generator=gen).to(device)
    # Stored values are what both sides read, so fp8 rounding does not matter here.
    store_kv_cache(key, value, key_cache, value_cache, slots, "fp8", 0.125, 0.125)
    query = torch.randn(1, num_kv_heads * 2, head_size, generator=gen).to(device)
    block_table = torch.tensor([block_ids], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=device)
    kw = dict(kv_cache_dtype="fp8", k_scale=0.125, v_scale=0.125)
    out = paged_attention_decode(query, key_cache, value_cache, block_table, seq_lens,
                                 head_size**-0.5, **kw)
    ref = paged_attention_decode_ref(query, key_cache, value_cache, block_table, seq_lens,
                                     head_size**-0.5, **kw)
    assert_attention_close("paged_attention_decode", "64bit", out, ref, "float32",
                           ("seq", "head", "dim"), "fp8")


def _valid_args():
    return dict(
        query=torch.randn(2, 8, 64), key_cache=torch.zeros(4, 16, 2, 64),
        value_cache=torch.zeros(4, 16, 2, 64),
        block_table=torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
        seq_lens=torch.tensor([20, 3], dtype=torch.int32), scale=0.125,
    )


@pytest.mark.parametrize(
    ("mutate", "kwargs", "match"),
    [
        (lambda a: a.update(query=a["query"][0]), {}, "query must be 3-D"),
        (lambda a: a.update(query=torch.randn(2, 7, 64)), {}, "multiple of num_kv_heads"),
        (lambda a: a.update(query=torch.randn(2, 8, 32)), {}, "head_size"),
        (lambda a: a.update(key_cache=torch.zeros(4, 16, 2, 64).half(),
                            value_cache=torch.zeros(4, 16, 2, 64).half()), {}, "must match"),
        (lambda a: a.update(block_table=a["block_table"].float()), {}, "block_table must be"),
        (lambda a: a.update(seq_lens=torch.tensor([20, 3, 1])), {}, "num_seqs=2"),
        (lambda a: a.update(block_table=a["block_table"][:1]), {}, "need num_seqs=2"),
        (lambda a: None, {"sliding_window": 0}, "sliding_window"),
        (lambda a: None, {"softcap": -1.0}, "softcap"),
        (lambda a: None, {"num_splits": 0}, "num_splits"),
        (lambda a: None, {"block_n": 24}, "block_n"),
        (lambda a: None, {"kv_cache_dtype": "int8"}, "unsupported kv_cache_dtype"),
        (lambda a: None, {"layout": "HND"}, "multiple of num_kv_heads|head_size"),
        (lambda a: None, {"out": torch.empty(2, 8, 64).half()}, "out must match query"),
        (lambda a: None, {"k_scale": torch.ones(2)}, "exactly one element"),
    ],
)
def test_bad_inputs_raise_clear_errors(mutate, kwargs, match):
    """Host validation names the problem and the fix."""
    args = _valid_args()
    mutate(args)
    if "k_scale" in kwargs:
        args["key_cache"] = args["key_cache"].to(torch.float8_e4m3fn)
        args["value_cache"] = args["value_cache"].to(torch.float8_e4m3fn)
        kwargs = {**kwargs, "kv_cache_dtype": "fp8"}
    with pytest.raises(ValueError, match=match):
        paged_attention_decode(*args.values(), **kwargs)

