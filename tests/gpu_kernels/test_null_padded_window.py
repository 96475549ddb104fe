"""Sliding-window groups' null-padded block tables: kernels, references and the store never touch
the null block (docs/semantics.md#skipped-tokens-and-null-blocks null padding,
docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups per-group tables over
one pool).

"Never read" is proven by poison: block 0, every block the window dropped and (for kvcheck's own
kernels, which mask per position) every slot before the window hold NaN or +-inf, and outputs
must be finite and equal to ``attention_ref`` on the clean, contiguous K/V. Shapes stay tiny: on
CPU the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvcheck.errors import KVCheckInputError  # noqa: E402
from kvcheck.gpu_kernels import (  # noqa: E402
    NULL_BLOCK_ID,
    PAD_SLOT_ID,
    attention_ref,
    null_pad_block_table,
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_attention_varlen,
    paged_attention_varlen_ref,
    slot_mapping_from_block_table,
    store_kv_cache,
)
from kvcheck.gpu_kernels import conformance as kc  # noqa: E402
from kvcheck.gpu_kernels.null_blocks import num_skipped_tokens  # noqa: E402
from kvcheck.gpu_kernels.reference import first_key_position  # noqa: E402

POISONS = {"nan": (float("nan"), float("nan")), "inf": (float("inf"), float("-inf"))}


# ------------------------------------------------------------------------------ table helpers
def test_null_padding_follows_the_spec_worked_examples():
    """docs/semantics.md#skipped-tokens-and-null-blocks worked example (w 4, bs 2): n=10
    nulls indices 0-2; n=11 also index 3."""
    assert num_skipped_tokens(10, 4) == 7 and num_skipped_tokens(3, 4) == 0
    table = torch.arange(1, 7, dtype=torch.int32).repeat(2, 1)  # two rows [1..6]
    # Decode steps: seq_len = n + 1 (the new token), n computed tokens.
    padded = null_pad_block_table(table, [11, 12], None, 2, 4)
    assert padded.tolist() == [[0, 0, 0, 4, 5, 6], [0, 0, 0, 0, 5, 6]]
    assert table.tolist()[0] == [1, 2, 3, 4, 5, 6]  # a copy: the input is unchanged
    # G6 (0.33): a 10-token hit in an SWA w4 group is [0, 0, 0, x, y].
    assert null_pad_block_table(table[:1, :5], [12], [2], 2, 4).tolist() == [[0, 0, 0, 4, 5]]
    with pytest.raises(KVCheckInputError, match="query_len"):
        null_pad_block_table(table, [3, 3], [4, 1], 2, 4)
    with pytest.raises(KVCheckInputError, match="sliding_window"):
        null_pad_block_table(table, [3, 3], None, 2, 0)


def test_slot_mapping_skips_null_entries():
    """Positions whose table entry is the null block get PAD_SLOT_ID, others block*bs+off."""
    # bs 2, row [0, 0, 7, 3]: a 5-token chunk at positions 3..7 (seq_len 8).
    table = torch.tensor([[0, 0, 7, 3]], dtype=torch.int32)
    slots = slot_mapping_from_block_table(table, [0, 5], [8], 2, num_slots=7)
    assert slots.dtype == torch.int64
    assert slots.tolist() == [PAD_SLOT_ID, 14, 15, 6, 7, PAD_SLOT_ID, PAD_SLOT_ID]
    with pytest.raises(KVCheckInputError, match="column"):
        slot_mapping_from_block_table(table, [0, 2], [10], 2)
    with pytest.raises(KVCheckInputError, match="num_slots"):
        slot_mapping_from_block_table(table, [0, 5], [8], 2, num_slots=4)


# ------------------------------------------------------------------------ poisoned attention
def _poisoned_layout(device, seq_lens, query_lens, bs, window, poison, nh_kv=2, qpk=4, d=64,
                     dtype=torch.float16, seed=0, null_pad=True):
    """Random contiguous K/V per sequence scattered into a paged pool (permuted ids, block 0
    unused), plus a query. Block 0, the blocks before each window and the slots before each
    sequence's first key (``first_key_position``) hold ``poison``. Returns the clean K/V too."""
    gen = torch.Generator().manual_seed(seed)
    need = [math.ceil(n / bs) for n in seq_lens]
    num_blocks = 1 + sum(need) + 2
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    key = torch.full((num_blocks, bs, nh_kv, d), poison[0])
    value = torch.full((num_blocks, bs, nh_kv, d), poison[1])
    table = torch.zeros((len(seq_lens), max(need) + 1), dtype=torch.int32)
    clean = []
    for s, (n, q) in enumerate(zip(seq_lens, query_lens, strict=True)):
        k = torch.randn((n, nh_kv, d), generator=gen)
        v = torch.randn((n, nh_kv, d), generator=gen)
        clean.append((k.to(dtype), v.to(dtype)))
        row = [ids.pop() for _ in range(need[s])]
        table[s, : need[s]] = torch.tensor(row, dtype=torch.int32)
        for pos in range(first_key_position(n, q, window), n):
            key[row[pos // bs], pos % bs] = k[pos]
            value[row[pos // bs], pos % bs] = v[pos]
    if null_pad:
        table = null_pad_block_table(table, seq_lens, query_lens, bs, window)
    query = torch.randn((sum(query_lens), nh_kv * qpk, d), generator=gen).to(dtype)
    return (query.to(device), key.to(dtype).to(device), value.to(dtype).to(device),
            table.to(device), clean)


def _truth(query, clean, query_lens, window):
    """attention_ref over the clean contiguous K/V, per sequence, concatenated."""
    outs, start = [], 0
    for (k, v), q in zip(clean, query_lens, strict=True):
        outs.append(attention_ref(query[start : start + q].cpu(), k, v, query.shape[-1] ** -0.5,
                                  sliding_window=window))
        start += q
    return torch.cat(outs)


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("null_pad", [True, False], ids=["null-padded", "poisoned-real-ids"])
@pytest.mark.parametrize(("bs", "window", "num_splits", "block_n"), [
    (4, 7, 1, 32),  # a 32-key tile spans 8 blocks: null ones and live ones
    (4, 5, 3, 16),  # split-KV over the window's tiles
    (16, 20, 2, 16),
    (1, 3, 1, 16),
])
def test_decode_never_reads_before_the_window(device, poison, null_pad, bs, window, num_splits,
                                              block_n):
    """Decode through a null-padded table (or real ids whose blocks hold poison): finite and
    equal to attention on the clean K/V; the reference too."""
    seq_lens = (1, window - 1, window, window + 1, 37, 70)
    query_lens = (1,) * len(seq_lens)
    query, key, value, table, clean = _poisoned_layout(
        device, seq_lens, query_lens, bs, window, POISONS[poison], null_pad=null_pad, seed=bs)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    if null_pad:
        assert bool((table == NULL_BLOCK_ID).any())
    scale = query.shape[-1] ** -0.5
    out = paged_attention_decode(query, key, value, table, seq_lens_t, scale,
                                 sliding_window=window, num_splits=num_splits, block_n=block_n)
    ref = paged_attention_decode_ref(query, key, value, table, seq_lens_t, scale,
                                     sliding_window=window)
    truth = _truth(query, clean, query_lens, window)
    assert bool(torch.isfinite(ref).all())
    torch.testing.assert_close(ref.cpu(), truth, atol=1e-5, rtol=1e-5)
    kc.assert_attention_close("paged_attention_decode", "null-padded", out.cpu(), truth,
                              "float16", ("seq", "head", "dim"), null_padded=True)


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("null_pad", [True, False], ids=["null-padded", "poisoned-real-ids"])
@pytest.mark.parametrize(("bs", "window", "qpk"), [(4, 6, 4), (16, 20, 1), (2, 3, 8)])
def test_varlen_never_reads_before_the_window(device, poison, null_pad, bs, window, qpk):
    """Prefill, decode and extends (longer than the window, several query tiles) through
    null-padded tables; each query tile starts reading at its own first row's window."""
    seq_lens = (30, 67, 9, 45, 13, 24)
    query_lens = (3, 1, 9, 20, 0, 24)  # contexts 27, 66, 0, 25, 13, 0
    query, key, value, table, clean = _poisoned_layout(
        device, seq_lens, query_lens, bs, window, POISONS[poison], qpk=qpk, null_pad=null_pad,
        seed=10 + bs)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32,
                       device=device)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    scale = query.shape[-1] ** -0.5
    out = paged_attention_varlen(query, key, value, table, qsl, seq_lens_t, scale,
                                 sliding_window=window, block_n=16)
    ref = paged_attention_varlen_ref(query, key, value, table, qsl, seq_lens_t, scale,
                                     sliding_window=window)
    truth = _truth(query, clean, query_lens, window)
    torch.testing.assert_close(ref.cpu(), truth, atol=1e-5, rtol=1e-5)
    kc.assert_attention_close("paged_attention_varlen", "null-padded", out.cpu(), truth,
                              "float16", ("token", "head", "dim"), null_padded=True)


def test_references_never_look_up_skipped_entries(device):
    """The references do not even index the table entries before the window: entries there
    holding an id far past the pool (an IndexError if gathered) change nothing."""
    seq_lens, query_lens, bs, window = (23, 40, 6), (1, 5, 6), 4, 5
    query, key, value, table, clean = _poisoned_layout(
        device, seq_lens, query_lens, bs, window, POISONS["nan"], dtype=torch.float32, seed=5)
    table = torch.where(table == NULL_BLOCK_ID, torch.full_like(table, 10**6), table)
    for seq, n in enumerate(seq_lens):
        table[seq, math.ceil(n / bs):] = NULL_BLOCK_ID  # unused tail entries stay 0
    qsl = torch.tensor([0, 1, 6, 12], dtype=torch.int32, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    scale = query.shape[-1] ** -0.5
    out = paged_attention_varlen_ref(query, key, value, table, qsl, lens, scale,
                                     sliding_window=window)
    torch.testing.assert_close(out.cpu(), _truth(query, clean, query_lens, window))
    decode_q = query[qsl[1:].long() - 1]  # each sequence's last token
    out = paged_attention_decode_ref(decode_q, key, value, table, lens, scale,
                                     sliding_window=window)
    for seq, n in enumerate(seq_lens):
        k, v = clean[seq]
        want = attention_ref(decode_q[seq : seq + 1].cpu(), k[:n], v[:n], scale,
                             sliding_window=window)
        torch.testing.assert_close(out[seq : seq + 1].cpu(), want)


# --------------------------------------------------------- two groups over one shared pool
class _Pool:
    """A toy shared block pool: block 0 is null, frees go back to the end of the free list."""

    def __init__(self, num_blocks: int, gen: torch.Generator) -> None:
        self.free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()

    def get(self, n: int) -> list[int]:
        taken, self.free = self.free[:n], self.free[n:]
        return taken


def test_full_and_sliding_groups_share_one_pool(device):
    """Hybrid model: a full-attention layer reads its group's full table, a sliding-window layer
    its group's null-padded table, both layers in ONE cache tensor (vLLM shares a KV tensor
    between one layer of each group) over one pool. Chunked prefill 13 + 7 tokens, then two
    decodes; before each step the sliding group drops its skipped blocks
    (docs/semantics.md#skipped-tokens-and-null-blocks), which are
    poisoned as if reused. Stores go through slot mappings of each table; block 0 is never
    written; both layers equal attention on their own clean K/V."""
    bs, window, nh_kv, qpk, d = 4, 6, 2, 2, 64
    gen = torch.Generator().manual_seed(7)
    num_blocks = 24
    key_cache = torch.full((num_blocks, bs, nh_kv, d), float("nan"), dtype=torch.float32)
    value_cache = torch.full_like(key_cache, float("nan"))
    key_cache, value_cache = key_cache.to(device), value_cache.to(device)
    pool = _Pool(num_blocks, gen)
    total = 22
    # Per layer (0: full attention, 1: sliding window): the request's K/V and queries.
    kv = [(torch.randn((total, nh_kv, d), generator=gen), torch.randn((total, nh_kv, d),
                                                                       generator=gen))
          for _ in range(2)]
    queries = [torch.randn((total, nh_kv * qpk, d), generator=gen) for _ in range(2)]
    tables: list[list[int]] = [[], []]
    width = math.ceil(total / bs)
    num_computed = 0
    for chunk in (13, 7, 1, 1):
        seq_len = num_computed + chunk
        # remove_skipped_blocks(num_computed) in the sliding group; its blocks return to the pool
        # and are poisoned (another request may overwrite them).
        skipped = num_skipped_tokens(num_computed, window) // bs
        dropped = [b for b in tables[1][:skipped] if b != NULL_BLOCK_ID]
        tables[1][:skipped] = [NULL_BLOCK_ID] * skipped
        for b in dropped:
            key_cache[b] = float("nan")
            value_cache[b] = float("inf")
        pool.free += dropped
        for g in (0, 1):  # allocate_new_blocks in group order
            tables[g] += pool.get(math.ceil(seq_len / bs) - len(tables[g]))
        assert not set(tables[0]) & ({*tables[1]} - {NULL_BLOCK_ID})  # one pool, disjoint ids
        qsl = torch.tensor([0, chunk], dtype=torch.int32, device=device)
        seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=device)
        for g, window_g in ((0, None), (1, window)):
            table = torch.zeros((1, width), dtype=torch.int32)
            table[0, : len(tables[g])] = torch.tensor(tables[g], dtype=torch.int32)
            table = table.to(device)
            slots = slot_mapping_from_block_table(table, qsl.cpu(), seq_lens.cpu(), bs)
            assert PAD_SLOT_ID not in slots.tolist()  # new tokens always have real blocks
            k_new, v_new = (t[num_computed:seq_len].to(device) for t in kv[g])
            store_kv_cache(k_new, v_new, key_cache, value_cache, slots)
            q = queries[g][num_computed:seq_len].to(device)
            out = paged_attention_varlen(q, key_cache, value_cache, table, qsl, seq_lens,
                                         d**-0.5, sliding_window=window_g)
            truth = attention_ref(q.cpu(), kv[g][0][:seq_len], kv[g][1][:seq_len], d**-0.5,
                                  sliding_window=window_g)
            kc.assert_attention_close("paged_attention_varlen", f"group{g}-len{seq_len}",
                                      out.cpu(), truth, "float32", ("token", "head", "dim"),
                                      null_padded=True)
            if chunk == 1:  # decode steps: the decode kernel on the same tables
                out = paged_attention_decode(q, key_cache, value_cache, table, seq_lens,
                                             d**-0.5, sliding_window=window_g, num_splits=2)
                kc.assert_attention_close("paged_attention_decode", f"group{g}-len{seq_len}",
                                          out.cpu(), truth, "float32", ("seq", "head", "dim"),
                                          null_padded=True)
        num_computed = seq_len
    assert tables[1][: num_skipped_tokens(total - 1, window) // bs] == [0] * 4
    assert bool(torch.isnan(key_cache[NULL_BLOCK_ID]).all())
    assert bool(torch.isnan(value_cache[NULL_BLOCK_ID]).all())


# ------------------------------------------------------------------------------- the store
def test_store_through_null_padded_table_leaves_block_0_untouched(device):
    """Tokens whose block is null (the table was padded past them) get PAD_SLOT_ID and are not
    written; every other token lands in its slot; block 0 keeps its bits."""
    bs, window, nh_kv, d = 4, 5, 2, 64
    gen = torch.Generator().manual_seed(3)
    seq_lens, query_lens = [18, 9, 30], [10, 9, 1]
    num_blocks = 1 + sum(math.ceil(n / bs) for n in seq_lens)
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros((3, 8), dtype=torch.int32)
    for s, n in enumerate(seq_lens):
        row = [ids.pop() for _ in range(math.ceil(n / bs))]
        table[s, : len(row)] = torch.tensor(row, dtype=torch.int32)
    # Padded as of the END of the step (n = seq_len): new tokens of the first sequence fall in
    # null blocks (positions 8..13 of 18 with w 5: skipped(18) = 14 -> blocks 0..2 null).
    table = null_pad_block_table(table, seq_lens, [0, 0, 0], bs, window).to(device)
    qsl = [0, 10, 19, 20]
    slots = slot_mapping_from_block_table(table, qsl, seq_lens, bs, num_slots=23)
    # skipped(18) = 14 -> blocks 0-2 null: tokens 0-3 (positions 8-11) padded; skipped(9) = 5
    # -> block 0 null: tokens 10-13 (positions 0-3); skipped(30) = 26 -> position 29 is live.
    # Tokens 20-22: CUDA-graph padding.
    pads = [t for t, slot in enumerate(slots.tolist()) if slot == PAD_SLOT_ID]
    assert pads == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22]
    token_seq = [s for s, q in enumerate(query_lens) for _ in range(q)]
    positions = [n - q + i for n, q in zip(seq_lens, query_lens, strict=True) for i in range(q)]
    for tok, (seq, pos) in enumerate(zip(token_seq, positions, strict=True)):
        if tok not in pads:
            assert int(slots[tok]) == int(table[seq, pos // bs]) * bs + pos % bs
    key = torch.randn((23, nh_kv, d), generator=gen).half().to(device)
    value = torch.randn((23, nh_kv, d), generator=gen).half().to(device)
    key_cache = torch.randn((num_blocks, bs, nh_kv, d), generator=gen).half().to(device)
    key_cache[NULL_BLOCK_ID] = float("nan")
    value_cache = key_cache.clone()
    before_k, before_v = key_cache.clone(), value_cache.clone()
    store_kv_cache(key, value, key_cache, value_cache, slots)
    for cache, before, src in ((key_cache, before_k, key), (value_cache, before_v, value)):
        assert torch.equal(cache[NULL_BLOCK_ID].view(torch.int16),
                           before[NULL_BLOCK_ID].view(torch.int16))
        written = torch.zeros((num_blocks, bs), dtype=torch.bool)
        for tok, slot in enumerate(slots.tolist()):
            if slot >= 0:
                written[slot // bs, slot % bs] = True
                assert torch.equal(cache[slot // bs, slot % bs], src[tok])
        assert torch.equal(cache[~written.to(device)].view(torch.int16),
                           before[~written.to(device)].view(torch.int16))


# -------------------------------------------------------------------------- conformance case
def _null_padded(cases):
    return [c for c in cases if c.null_padded_window]


def test_conformance_sweeps_have_null_padded_cases():
    """Decode and varlen sweeps carry null-padded cases whose tables really hold null entries
    in front of live ones and whose block 0 is poisoned; they need a sliding window."""
    from kvcheck.gpu_kernels.cases import AttentionCase, build_attention_inputs

    for cases in (kc.decode_cases("cpu"), kc.varlen_cases("cpu")):
        found = _null_padded(cases)
        assert len(found) >= 2
        for case in found:
            inputs = build_attention_inputs(case)
            table = inputs["block_table"]
            nulls = 0
            for seq, (n, row) in enumerate(zip(case.seq_lens, table.tolist(), strict=True)):
                q = 1 if case.query_lens is None else case.query_lens[seq]
                first = first_key_position(n, q, case.sliding_window) // case.block_size
                assert row[:first] == [0] * first
                assert 0 not in row[first : math.ceil(n / case.block_size)]
                nulls += first
            assert nulls >= 3
            k = inputs["cache"].key_cache
            block0 = k[0] if inputs["cache"].layout == "NHD" else k[0].transpose(0, 1)
            assert bool(torch.isnan(block0.float()).all())
    bad = AttentionCase("no-window", "cpu", 4, 1, 1, 64, (9,), null_padded_window=True)
    with pytest.raises(KVCheckInputError, match="needs a sliding_window"):
        build_attention_inputs(bad)


def test_null_padded_cases_need_the_declared_feature():
    """A set that does not declare 'null_padded_window' skips those cases with a reason; the
    default KernelSet does not declare it; kvcheck's own set does."""
    case = _null_padded(kc.decode_cases("cpu"))[0]
    ks = kc.KernelSet(name="plain", paged_attention_decode=paged_attention_decode)
    assert "null_padded_window" in ks.skip_reason("paged_attention_decode", case)
    assert "null_padded_window" in kc.kvcheck_kernel_set().features
    ids = [tid for tid, _, _ in kc.kernel_checks(kc.KernelSet(), "cpu")]
    assert "paged_attention_varlen[varlen-nullpad-window6-f16-gqa4-bs4]" in ids


def test_kernel_reading_the_null_block_is_caught():
    """A varlen implementation that gathers the whole table (null entries included) and masks
    afterwards fails the null-padded case with NaN, and the message names the null block."""

    def gathers_everything(query, key_cache, value_cache, block_table, query_start_loc,
                           seq_lens, scale, *, sliding_window=None, **kw):
        full_table_read = paged_attention_varlen_ref(
            query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale,
            sliding_window=None, **kw)  # any read of block 0 poisons the output
        windowed = paged_attention_varlen_ref(
            query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale,
            sliding_window=sliding_window, **kw)
        return windowed + 0.0 * full_table_read

    case = _null_padded(kc.varlen_cases("cpu"))[0]
    with pytest.raises(AssertionError, match="null-padded") as info:
        kc.check_paged_attention_varlen(gathers_everything, case)
    assert "got nan" in str(info.value)
