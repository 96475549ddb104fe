"""batch_metadata: the implementation's own batch builder and page-table conversions
(capability ``batch_metadata``, ``SupportsBatchMetadata``).

The per-request ``slot_mapping(request_id, start, end)`` of the ``slot_mapping`` area cannot
show the bugs of a worker's batch builder: tokens looked up in another request's row, padding
up to the CUDA-graph batch size with 0 instead of ``PAD_SLOT_ID`` (-1, which KV-store kernels
skip), decode-context-parallel (DCP) ownership and interleaving; nor those of the page-table
conversions: FlashInfer's CSR (``kv_last_page_len`` is the page size for a full last page,
never 0) and SGLang's ``req_to_token``. Each is checked twice: on worked examples whose
expected values are written out here (computed by hand and confirmed with vLLM 0.33's own
``BlockTable``), and on random batches against kvcheck's reference
(``kvcheck.reference_impl.batch_metadata`` and ``page_table``). A design that does not declare
the worked examples' block size (under ``generic``, ``kv_sizes``) gets the same examples
stated in blocks at its own size, their expected values from the formulas written here.

A call that raises ``UnsupportedSpec`` declines those arguments (a DCP interleave size the
design lacks: the example is drawn again; a conversion the implementation does not offer at
all: the test is skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import given, reject
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from kvcheck.conformance.errors import ConformanceMismatch, ProtocolViolation
from kvcheck.conformance.protocol import (
    KVCacheSpec,
    ManagerWithCapabilities,
    UnsupportedSpec,
    reserved_block_ids,
)
from kvcheck.conformance.sizes import tokens
from kvcheck.conformance.workload_machine import supported_block_sizes
from kvcheck.reference_impl import batch_metadata as ref_batch
from kvcheck.reference_impl import page_table as ref_pages

if TYPE_CHECKING:
    from hypothesis import settings as Settings

    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.sizes import DeclaredSizes

pytestmark = [pytest.mark.kv_capability("batch_metadata"), pytest.mark.kv_generic]

Rows = list[list[int]]
# Pool size of the managers the methods are called on; block ids are drawn below it.
_NUM_BLOCKS = 256


# ------------------------------------------------------------------------------ calling
class _Managers:
    """One manager per block size for a test (the methods are stateless), each call under the
    implementation's per-call limit, answers checked for their shape."""

    def __init__(self, impl: ImplHandle, profile: str) -> None:
        self.impl = impl
        self.profile = profile
        self._made: dict[int, ManagerWithCapabilities | None] = {}
        self.reserved = set(reserved_block_ids(impl.info, profile))

    def spec(self, block_size: int) -> KVCacheSpec:
        num_blocks = _NUM_BLOCKS
        if self.impl.info.num_blocks_range is not None:
            low, high = self.impl.info.num_blocks_range
            num_blocks = max(low, min(num_blocks, high))
        return KVCacheSpec(num_blocks=num_blocks, block_size=block_size, profile=self.profile)

    def get(self, block_size: int) -> ManagerWithCapabilities | None:
        """The manager for ``block_size``, or None when the implementation declines it."""
        if block_size not in self._made:
            spec = self.spec(block_size)
            manager = None
            if self.impl.info.supports(spec):
                try:
                    manager = self.impl.make_manager(spec)
                except UnsupportedSpec:
                    manager = None
            self._made[block_size] = manager
        return self._made[block_size]

    def block_sizes(self) -> list[int]:
        sizes = [b for b in supported_block_sizes(self.impl.info) if self.get(b) is not None]
        if not sizes:
            pytest.skip("the implementation declines every block size tried")
        return sizes

    def ids(self, block_size: int) -> list[int]:
        """Block ids the tests may put in a block table (in the pool, not reserved)."""
        return [b for b in range(self.spec(block_size).num_blocks) if b not in self.reserved]

    def call(self, block_size: int, method: str, *args: object) -> object:
        manager = self.get(block_size)
        assert manager is not None
        fn: Callable[..., object] = getattr(manager, method)
        return self.impl.limit.call(method, fn, *args)


def _ints(value: object, what: str, call: str) -> list[int]:
    """``value`` as a list of int (a list or tuple of exactly ``int``, as the guard wants)."""
    if isinstance(value, (list, tuple)) and all(type(x) is int for x in value):
        return list(value)
    raise ProtocolViolation(f"{call}: {what} must be a list of int, got {value!r:.300}")


def _rows_of_ints(value: object, call: str) -> list[list[int]]:
    if not isinstance(value, (list, tuple)):
        raise ProtocolViolation(f"{call} must return a list of rows, got {value!r:.300}")
    return [_ints(row, f"row {b}", call) for b, row in enumerate(value)]


def _triple(value: object, names: tuple[str, str, str],
            call: str) -> tuple[list[int], list[int], list[int]]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ProtocolViolation(f"{call} must return a triple {names}, got {value!r:.300}")
    return (_ints(value[0], names[0], call), _ints(value[1], names[1], call),
            _ints(value[2], names[2], call))


def _build_call(rows: Rows, computed: Sequence[int], scheduled: Sequence[int], padded: int,
                world: int, rank: int, interleave: int) -> str:
    return (f"build_batch({rows}, {list(computed)}, {list(scheduled)}, {padded}, "
            f"dcp_world_size={world}, dcp_rank={rank}, cp_kv_cache_interleave_size="
            f"{interleave})")


def _build(managers: _Managers, block_size: int, rows: Rows, computed: Sequence[int],
           scheduled: Sequence[int], padded: int, world: int = 1, rank: int = 0,
           interleave: int = 1) -> tuple[list[int], list[int], list[int]]:
    call = _build_call(rows, computed, scheduled, padded, world, rank, interleave)
    value = managers.call(block_size, "build_batch", [list(r) for r in rows], list(computed),
                          list(scheduled), padded, world, rank, interleave)
    return _triple(value, ("slot_mapping", "positions", "req_indices"),
                   f"block_size {block_size}: {call}")


def _first_difference(got: list[int], want: list[int]) -> str:
    if len(got) != len(want):
        return f"{len(got)} entries, expected {len(want)}"
    i = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
    return f"entry {i} is {got[i]}, expected {want[i]}"


def _check_batch(got: tuple[list[int], list[int], list[int]],
                 want: tuple[list[int], list[int], list[int]], call: str,
                 positions: Sequence[int], req_indices: Sequence[int]) -> None:
    """Compare ``build_batch`` answers; the message names the first wrong token."""
    for name, g, w in zip(("positions", "req_indices"), got[1:], want[1:], strict=True):
        assert g == w, f"{call}: {name} {g}, expected {w} ({_first_difference(g, w)})"
    slots, expected = got[0], want[0]
    if slots != expected:
        detail = _first_difference(slots, expected)
        i = next((i for i, (g, w) in enumerate(zip(slots, expected, strict=False)) if g != w),
                 None)
        if i is not None and i < len(positions):
            detail += f" (token {i}: request {req_indices[i]}, position {positions[i]})"
        elif i is not None:
            detail += f" (padding entry {i}: padding is PAD_SLOT_ID = -1)"
        raise ConformanceMismatch(f"{call}: slot_mapping {slots}, expected {expected}: {detail}")


# ------------------------------------------------------------------------------ worked examples
# Rows [7, 3, 9] and [5, 2], block_size 4; request 0: 0 computed + 5 scheduled, request 1:
# 4 computed + 3 scheduled; padded to 10 tokens. Positions [0..4 | 4, 5, 6].
_ROWS = [[7, 3, 9], [5, 2]]
_POSITIONS = [0, 1, 2, 3, 4, 4, 5, 6]
_REQ_INDICES = [0, 0, 0, 0, 0, 1, 1, 1]
#: (dcp_world_size, dcp_rank, interleave) -> slot_mapping. With W ranks and interleave I,
#: position p lives on rank (p // I) % W; a virtual block of 4 * W positions per row entry.
_WORKED: dict[tuple[int, int, int], list[int]] = {
    # 7*4 + 0..3, then position 4 in block 3; request 1 positions 4-6 in block 2 (2*4 + 0..2).
    (1, 0, 1): [28, 29, 30, 31, 12, 8, 9, 10, -1, -1],
    # Odd positions on rank 1, local offset vo // 2: 28, 29 (req 0), 5*4 + 2 = 22 (req 1).
    (2, 1, 1): [-1, 28, -1, 29, -1, -1, 22, -1, -1, -1],
    (2, 0, 1): [28, -1, 29, -1, 30, 22, -1, 23, -1, -1],
    # Chunks of 2: positions 0-1 and 4-5 on rank 0 (offsets 0, 1, 2, 3), 2-3 and 6 on rank 1.
    (2, 0, 2): [28, 29, -1, -1, 30, 22, 23, -1, -1, -1],
    (2, 1, 2): [-1, -1, 28, 29, -1, -1, -1, 22, -1, -1],
}


def dcp_slot(row: Sequence[int], pos: int, bs: int, world: int, rank: int,
             interleave: int) -> int:
    """The slot of position ``pos`` of a request with block table ``row`` on DCP rank
    ``rank`` of ``world`` (-1: another rank's): positions go to ranks in chunks of
    ``interleave``, a row entry covers ``bs * world`` positions, ``bs`` of them on each rank."""
    if (pos // interleave) % world != rank:
        return -1
    offset = pos % (bs * world)
    local = (offset // (interleave * world)) * interleave + offset % interleave
    return row[pos // (bs * world)] * bs + local


@pytest.mark.parametrize(("world", "rank", "interleave"), list(_WORKED),
                         ids=[f"dcp{w}-rank{r}-interleave{i}" for w, r, i in _WORKED])
def test_build_batch_worked_examples(kv_impl: ImplHandle, kv_profile: str,
                                     kv_sizes: DeclaredSizes, world: int, rank: int,
                                     interleave: int) -> None:
    """Slots, positions and request indices of a two-request step, padded with -1, on one
    rank and on each of two DCP ranks (interleave 1 and 2); at a declared block size other
    than 4, the same step in blocks (request 0: a block and a token scheduled; request 1: a
    block computed, 3 tokens scheduled; 2 padding entries)."""
    managers = _Managers(kv_impl, kv_profile)
    bs = kv_sizes.block_size(4)
    if managers.get(bs) is None:
        pytest.skip(f"the implementation declines block_size {bs}")
    computed, scheduled = [0, tokens(1, bs)], [tokens(1, bs, 1), 3]
    positions = [*range(scheduled[0]), *range(computed[1], computed[1] + 3)]
    req_indices = [0] * scheduled[0] + [1] * 3
    padded = len(positions) + 2
    want = _WORKED[world, rank, interleave] if bs == 4 else [
        *(dcp_slot(_ROWS[r], p, bs, world, rank, interleave)
          for r, p in zip(req_indices, positions, strict=True)), -1, -1]
    call = _build_call(_ROWS, computed, scheduled, padded, world, rank, interleave)
    got = _build(managers, bs, _ROWS, computed, scheduled, padded, world, rank, interleave)
    _check_batch(got, (want, positions, req_indices), f"block_size {bs}: {call}", positions,
                 req_indices)


def _offered(managers: _Managers, block_size: int, method: str, *args: object) -> object:
    """``method(*args)``, or a skip when the implementation declines the conversion."""
    try:
        return managers.call(block_size, method, *args)
    except UnsupportedSpec as exc:
        pytest.skip(f"the implementation does not offer {method}: {exc}")


@pytest.mark.parametrize(("block_size", "rows", "seq_lens", "want"), [
    # FlashInfer's own smoke test (tests/attention/test_page.py): 45 = (3 - 1) * 16 + 13.
    (16, [[4, 9, 1], [7], [2, 5], [8, 3]], [45, 8, 25, 22],
     ([0, 3, 4, 6, 8], [4, 9, 1, 7, 2, 5, 8, 3], [13, 8, 9, 6])),
    # Full last pages: last_page_len is the page size, never 0; spare blocks are not listed.
    (4, [[7, 3], [5, 2, 9]], [8, 4], ([0, 2, 3], [7, 3, 5], [4, 4])),
], ids=["flashinfer-smoke", "full-last-page"])
def test_flashinfer_csr_worked_examples(kv_impl: ImplHandle, kv_profile: str,
                                        kv_sizes: DeclaredSizes, block_size: int,
                                        rows: Rows, seq_lens: list[int],
                                        want: tuple[list[int], list[int], list[int]]) -> None:
    """kv_indptr, kv_indices and kv_last_page_len of FlashInfer's CSR page table; at a
    declared block size other than the example's, the same pages (each last page as full as
    in the example, or full)."""
    managers = _Managers(kv_impl, kv_profile)
    if kv_sizes.block_size(block_size) != block_size:
        block_size = kv_sizes.block_size(block_size)
        indptr, indices, last = want
        last = [min(n, block_size) for n in last]
        seq_lens = [tokens(indptr[b + 1] - indptr[b] - 1, block_size, last[b])
                    for b in range(len(seq_lens))]
        want = (indptr, indices, last)
    if managers.get(block_size) is None:
        pytest.skip(f"the implementation declines block_size {block_size}")
    call = f"block_size {block_size}: flashinfer_csr({rows}, {seq_lens})"
    got = _triple(_offered(managers, block_size, "flashinfer_csr", rows, seq_lens),
                  ("kv_indptr", "kv_indices", "kv_last_page_len"), call)
    assert got == want, f"{call} = {got}, expected {want}"


def test_req_to_token_worked_example(kv_impl: ImplHandle, kv_profile: str,
                                     kv_sizes: DeclaredSizes) -> None:
    """SGLang's req_to_token: the flat slot of every position, row by row (at a declared
    block size other than 4: a block and 2 tokens, and 3 tokens)."""
    managers = _Managers(kv_impl, kv_profile)
    bs = kv_sizes.block_size(4)
    if managers.get(bs) is None:
        pytest.skip(f"the implementation declines block_size {bs}")
    rows, seq_lens = [[7, 3], [5, 2]], [tokens(1, bs, 2), 3]
    call = f"block_size {bs}: req_to_token({rows}, {seq_lens})"
    got = _rows_of_ints(_offered(managers, bs, "req_to_token", rows, seq_lens), call)
    want = ([[28, 29, 30, 31, 12, 13], [20, 21, 22]] if bs == 4 else
            [[row[p // bs] * bs + p % bs for p in range(n)]
             for row, n in zip(rows, seq_lens, strict=True)])
    assert got == want, f"{call} = {got}, expected {want}"


# ------------------------------------------------------------------------------ random batches
def _rows(data: st.DataObject, ids: list[int], needed: list[int]) -> Rows:
    """One row per request with ``needed[r]`` blocks plus up to two spare ones (a request may
    hold blocks past its tokens: lookahead, preallocation); ids distinct within a row."""
    rows = []
    for r, n in enumerate(needed):
        spare = data.draw(st.integers(0, 2), label=f"spare blocks {r}")
        rows.append(data.draw(st.lists(st.sampled_from(ids), min_size=n + spare,
                                       max_size=n + spare, unique=True), label=f"row {r}"))
    return rows


def _run(test: Callable[[], None], kv_seed: int | None) -> None:
    (hypothesis_seed(kv_seed)(test) if kv_seed is not None else test)()


def test_build_batch_matches_reference(kv_impl: ImplHandle, kv_profile: str,
                                       kv_settings: Settings, kv_seed: int | None) -> None:
    """Random steps (1-4 requests, chunked prefills and decodes, spare blocks, padding, DCP
    world sizes 1-4 with every interleave size that divides the block size): slot_mapping,
    positions and request indices equal the reference's."""
    managers = _Managers(kv_impl, kv_profile)
    block_sizes = managers.block_sizes()

    @kv_settings
    @given(data=st.data(), block_size=st.sampled_from(block_sizes),
           world=st.sampled_from([1, 1, 2, 3, 4]))
    def run(data: st.DataObject, block_size: int, world: int) -> None:
        rank = data.draw(st.integers(0, world - 1), label="dcp_rank")
        interleave = data.draw(st.sampled_from(
            [i for i in range(1, block_size + 1) if block_size % i == 0]), label="interleave")
        num_reqs = data.draw(st.integers(1, 4), label="num_reqs")
        computed = data.draw(st.lists(st.integers(0, 40), min_size=num_reqs,
                                      max_size=num_reqs), label="num_computed_tokens")
        scheduled = data.draw(st.lists(st.integers(1, 12), min_size=num_reqs,
                                       max_size=num_reqs), label="num_scheduled_tokens")
        virtual = block_size * world
        needed = [-(-(c + s) // virtual) for c, s in zip(computed, scheduled, strict=True)]
        rows = _rows(data, managers.ids(block_size), needed)
        padded = sum(scheduled) + data.draw(st.integers(0, 8), label="padding")
        call = f"block_size {block_size}: " + _build_call(
            rows, computed, scheduled, padded, world, rank, interleave)
        try:
            got = _build(managers, block_size, rows, computed, scheduled, padded, world,
                         rank, interleave)
        except UnsupportedSpec:
            reject()  # e.g. an interleave size the design does not have: draw another step
        want = ref_batch.build_batch(rows, computed, scheduled, block_size, padded,
                                     dcp_world_size=world, dcp_rank=rank,
                                     cp_kv_cache_interleave_size=interleave)
        _check_batch(got, (want.slot_mapping.tolist(), want.positions.tolist(),
                           want.req_indices.tolist()), call,
                     want.positions.tolist(), want.req_indices.tolist())

    _run(run, kv_seed)


def test_flashinfer_csr_matches_reference(kv_impl: ImplHandle, kv_profile: str,
                                          kv_settings: Settings, kv_seed: int | None) -> None:
    """Random block tables and sequence lengths (full and partial last pages, spare blocks):
    the CSR equals the reference's, and it addresses every position at
    row[pos // P] * P + pos % P."""
    managers = _Managers(kv_impl, kv_profile)
    block_sizes = managers.block_sizes()
    _offered(managers, block_sizes[0], "flashinfer_csr", [managers.ids(block_sizes[0])[:1]],
             [1])

    @kv_settings
    @given(data=st.data(), block_size=st.sampled_from(block_sizes))
    def run(data: st.DataObject, block_size: int) -> None:
        num_reqs = data.draw(st.integers(1, 5), label="num_reqs")
        seq_lens = data.draw(st.lists(st.integers(1, 5 * block_size), min_size=num_reqs,
                                      max_size=num_reqs), label="seq_lens")
        rows = _rows(data, managers.ids(block_size), [-(-n // block_size) for n in seq_lens])
        call = f"block_size {block_size}: flashinfer_csr({rows}, {seq_lens})"
        got = _triple(managers.call(block_size, "flashinfer_csr", rows, seq_lens),
                      ("kv_indptr", "kv_indices", "kv_last_page_len"), call)
        want = tuple(a.tolist() for a in ref_pages.to_flashinfer_csr(rows, seq_lens,
                                                                     block_size))
        for name, g, w in zip(("kv_indptr", "kv_indices", "kv_last_page_len"), got, want,
                              strict=True):
            assert g == w, f"{call}: {name} {g}, expected {w} ({_first_difference(g, w)})"
        # The same table read back the way FlashInfer's append kernel addresses tokens.
        batch = [b for b, n in enumerate(seq_lens) for _ in range(n)]
        positions = [p for n in seq_lens for p in range(n)]
        slots = ref_pages.slot_from_csr(got[0], got[1], block_size, batch, positions).tolist()
        assert slots == [rows[b][p // block_size] * block_size + p % block_size
                         for b, p in zip(batch, positions, strict=True)], call

    _run(run, kv_seed)


def test_req_to_token_matches_reference(kv_impl: ImplHandle, kv_profile: str,
                                        kv_settings: Settings, kv_seed: int | None) -> None:
    """Random block tables and sequence lengths: req_to_token equals the reference's, and its
    pages are contiguous and give back the block table (SGLang's page-contiguity law)."""
    managers = _Managers(kv_impl, kv_profile)
    block_sizes = managers.block_sizes()
    _offered(managers, block_sizes[0], "req_to_token", [managers.ids(block_sizes[0])[:1]], [1])

    @kv_settings
    @given(data=st.data(), block_size=st.sampled_from(block_sizes))
    def run(data: st.DataObject, block_size: int) -> None:
        num_reqs = data.draw(st.integers(1, 5), label="num_reqs")
        seq_lens = data.draw(st.lists(st.integers(1, 5 * block_size), min_size=num_reqs,
                                      max_size=num_reqs), label="seq_lens")
        needed = [-(-n // block_size) for n in seq_lens]
        rows = _rows(data, managers.ids(block_size), needed)
        call = f"block_size {block_size}: req_to_token({rows}, {seq_lens})"
        got = _rows_of_ints(managers.call(block_size, "req_to_token", rows, seq_lens), call)
        table = ref_batch.req_to_token(rows, seq_lens, block_size)
        want = [table[b, :n].tolist() for b, n in enumerate(seq_lens)]
        assert len(got) == len(want), f"{call}: {len(got)} rows, expected {len(want)}"
        for b, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g == w, f"{call}: row {b} {g}, expected {w} ({_first_difference(g, w)})"
        padded = np.zeros((num_reqs, max(seq_lens)), dtype=np.int64)
        for b, row in enumerate(got):
            padded[b, : len(row)] = row
        back, lens = ref_pages.block_table_from_sglang_req_to_token(
            padded, list(range(num_reqs)), seq_lens, block_size)
        assert [back[b, :n].tolist() for b, n in enumerate(needed)] == [
            r[:n] for r, n in zip(rows, needed, strict=True)], call
        assert lens.tolist() == seq_lens, call

    _run(run, kv_seed)
