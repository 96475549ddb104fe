"""store_kv_cache (Triton) vs store_kv_cache_ref: layouts, dtypes, fp8, padding, 64-bit offsets."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvcheck.gpu_kernels import PAD_SLOT_ID, store_kv_cache, store_kv_cache_ref  # noqa: E402
from kvcheck.gpu_kernels.conformance import check_store_kv_cache  # noqa: E402
from kvcheck.gpu_kernels.layout import allocate_kv_cache  # noqa: E402


def test_store_matches_reference(store_case):
    """Every store case: the cache equals the reference bit for bit (fp8: within one step)."""
    check_store_kv_cache(store_kv_cache, store_case)


def test_negative_slots_leave_cache_bit_identical(device):
    """Tokens with PAD_SLOT_ID (and any negative slot) write nothing, NaN payloads included."""
    gen = torch.Generator().manual_seed(0)
    pair = allocate_kv_cache("packed_kv", 4, 16, 2, 64, torch.float16, device)
    # Random bits, NaNs with payloads included: any stray write would change some of them.
    pair.storage.view(torch.int16).copy_(
        torch.randint(-(2**15), 2**15, tuple(pair.storage.shape), generator=gen,
                      dtype=torch.int16)
    )
    before = pair.storage.clone()
    key = torch.randn(5, 2, 64, generator=gen).to(device, torch.float16)
    slots = torch.tensor([PAD_SLOT_ID, -1, -7, -(2**40), PAD_SLOT_ID], device=device)
    store_kv_cache(key, key, pair.key_cache, pair.value_cache, slots)
    assert torch.equal(pair.storage.view(torch.int16), before.view(torch.int16))


def test_only_mapped_slots_change(device):
    """With slots [5, -1, 14] exactly two token rows change (vLLM's own example)."""
    pair = allocate_kv_cache("nhd", 2, 16, 2, 64, torch.float32, device)
    pair.key_cache.zero_()
    pair.value_cache.zero_()
    key = torch.ones(3, 2, 64, device=device)
    store_kv_cache(key, key * 2, pair.key_cache, pair.value_cache,
                   torch.tensor([5, -1, 14], device=device))
    changed = (pair.key_cache != 0).any(dim=(2, 3)).nonzero().tolist()
    assert changed == [[0, 5], [0, 14]]
    assert bool((pair.value_cache[0, 14] == 2).all())


def test_int32_slot_mapping_and_extra_key_rows(device):
    """int32 slot_mapping works; key rows past len(slot_mapping) (graph padding) are ignored."""
    gen = torch.Generator().manual_seed(1)
    key = torch.randn(6, 1, 64, generator=gen).to(device)
    for dtype in (torch.int32, torch.int64):
        got = allocate_kv_cache("hnd", 3, 16, 1, 64, torch.float32, device)
        want = allocate_kv_cache("hnd", 3, 16, 1, 64, torch.float32, device)
        for p in (got, want):
            p.key_cache.zero_()
            p.value_cache.zero_()
        slots = torch.tensor([47, 0, 20, -1], dtype=dtype, device=device)  # 47 = 2 * 16 + 15
        store_kv_cache(key, key, got.key_cache, got.value_cache, slots, layout="HND")
        store_kv_cache_ref(key, key, want.key_cache, want.value_cache, slots, layout="HND")
        assert torch.equal(got.key_cache, want.key_cache)
        assert torch.equal(got.key_cache[2, 0, 15], key[0, 0])


def test_fp8_store_on_uint8_cache(device):
    """A uint8-allocated fp8 cache is reinterpreted as e4m3; stored = fp8(x / scale)."""
    # Exactly representable values: the interpreter's fp32 -> e4m3 cast is only right for them.
    values = torch.tensor([1.0, -0.5, 448.0, 0.001953125, -3.5, 0.0, 240.0, 1.125])
    key = (values * 0.25).reshape(1, 1, 8).repeat(2, 1, 2).to(device, torch.float16)
    cache = torch.zeros(2, 16, 1, 16, dtype=torch.uint8, device=device)
    scale = torch.tensor([0.25], device=device)
    store_kv_cache(key, key, cache, cache.clone(), torch.tensor([3, 17], device=device),
                   kv_cache_dtype="fp8", k_scale=scale, v_scale=scale)
    stored = cache.view(torch.float8_e4m3fn).float()
    assert torch.equal(stored[0, 3, 0, :8].cpu(), values)
    assert torch.equal(stored[1, 1, 0, 8:].cpu(), values)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp8 rounding of the Triton store "
                    "needs CUDA: Triton 3.9's interpreter casts fp32 -> e4m3 wrongly")
def test_fp8_store_rounds_like_torch_on_cuda():
    """Rounded fp8 stores match torch's RNE cast within one code (satfinite vs NaN aside)."""
    gen = torch.Generator().manual_seed(2)
    key = (torch.randn(64, 4, 128, generator=gen) * 100).cuda()
    key_cache = torch.zeros(8, 16, 4, 128, dtype=torch.float8_e4m3fn, device="cuda")
    want = key_cache.clone()
    slots = torch.randperm(128, generator=gen)[:64].cuda()
    scale = torch.tensor([key.abs().max().item() / 64], device="cuda")
    store_kv_cache(key, key, key_cache, key_cache.clone(), slots, "fp8", scale, scale)
    store_kv_cache_ref(key, key, want, want.clone(), slots, "fp8", scale, scale)
    diff = (key_cache.view(torch.uint8).int() - want.view(torch.uint8).int()).abs()
    assert int(diff.max()) <= 1


def test_64bit_offsets(device):
    """Slots past 2**31 elements: the cache really has > 2**31 elements (uint8, mostly untouched).

    torch.empty only reserves virtual memory and the store touches two rows, so this costs
    ~2 GiB of address space, not of RAM (the interpreter works on the CPU tensor in place).
    An int32 offset computation would wrap and write (or crash) elsewhere.
    """
    block_size, num_kv_heads, head_size = 16, 8, 128
    per_block = block_size * num_kv_heads * head_size
    num_blocks = 2**31 // per_block + 2
    key_cache = torch.empty(num_blocks, block_size, num_kv_heads, head_size, dtype=torch.uint8,
                            device=device)
    value_cache = torch.empty(1, block_size, num_kv_heads, head_size, dtype=torch.uint8,
                              device=device).expand(num_blocks, -1, -1, -1)  # writes alias
    assert key_cache.numel() > 2**31
    values = torch.tensor([1.0, -2.0, 0.5, 3.0]).repeat(num_kv_heads * head_size // 4)
    key = values.reshape(1, num_kv_heads, head_size).repeat(2, 1, 1).to(device)
    last = num_blocks * block_size - 1  # element offset of its row: ~2**31 + 2 * per_block
    slots = torch.tensor([last, last - block_size - 3], device=device)
    store_kv_cache(key, key, key_cache, value_cache, slots, "fp8", 1.0, 1.0)
    for slot in slots.tolist():
        row = key_cache[slot // block_size, slot % block_size].view(torch.float8_e4m3fn)
        assert torch.equal(row.float().cpu(), key[0].cpu()), f"slot {slot} not written"


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda a: a.update(key=a["key"][0]), "key must be 3-D"),
        (lambda a: a.update(key_cache=a["key_cache"][0]), "key_cache must be 4-D"),
        (lambda a: a.update(key=a["key"][:, :1], value=a["value"][:, :1]), "KV heads"),
        (lambda a: a.update(key=a["key"][..., :32], value=a["value"][..., :32]), "head_size"),
        (lambda a: a.update(key_cache=a["key_cache"].transpose(2, 3)), "shapes differ"),
        (lambda a: a.update(key=a["key"].transpose(1, 2).contiguous().transpose(1, 2)),
         "contiguous head dimension"),
        (lambda a: a.update(slot_mapping=a["slot_mapping"].float()), "slot_mapping must be"),
        (lambda a: a.update(slot_mapping=a["slot_mapping"][None]), "slot_mapping must be 1-D"),
        (lambda a: a.update(slot_mapping=torch.arange(9)), "only 4 tokens"),
        (lambda a: a.update(kv_cache_dtype="fp8_e5m2"), "unsupported kv_cache_dtype"),
        (lambda a: a.update(kv_cache_dtype="fp8"), "float8_e4m3fn"),
        (lambda a: a.update(layout="HDN"), "layout must be"),
        (lambda a: a.update(key=a["key"].half()), "share a float32"),
    ],
)
def test_bad_inputs_raise_clear_errors(mutate, match):
    """Host validation names the problem and the fix before anything is launched."""
    args = dict(
        key=torch.randn(4, 2, 64), value=torch.randn(4, 2, 64),
        key_cache=torch.zeros(3, 16, 2, 64), value_cache=torch.zeros(3, 16, 2, 64),
        slot_mapping=torch.tensor([0, 1, -1, 5]), kv_cache_dtype="auto", layout="NHD",
    )
    mutate(args)
    layout = args.pop("layout")
    with pytest.raises(ValueError, match=match):
        store_kv_cache(*args.values(), layout=layout)
