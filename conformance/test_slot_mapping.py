"""slot_mapping: every computed token's flat KV slot, checked against the implementation's own
block table, through FlashInfer's CSR page table, and for uniqueness across live requests.

The expected slot of position ``pos`` of a request whose block table is ``block_ids`` is
``block_ids[pos // block_size] * block_size + pos % block_size`` (W = 1); the tests
write that formula themselves instead of calling kvcheck's reference.

Not covered here: ``PAD_SLOT_ID`` (-1) tail padding up to the padded batch size, DCP
(decode context parallel) slot ownership and the batch-level layout belong to the worker's
batch builder, checked by the ``batch_metadata`` capability (conformance/test_batch_metadata.py).
The worked examples of docs/semantics.md#slot-mapping check kvcheck's own slot mapping in
``tests/reference_impl/test_block_table.py``; an implementation's kernels are checked by the
``kernels`` capability. ``slot_mapping`` is never asked about positions a request has not
computed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.errors import ConformanceMismatch
from kvcheck.conformance.groups import one_group_tables
from kvcheck.conformance.ops import Op, add, decode, free, one_token_decodes, schedule
from kvcheck.conformance.protocol import KVCacheSpec, UnsupportedSpec
from kvcheck.conformance.scaled_workloads import ScaledDriver
from kvcheck.conformance.sizes import tokens
from kvcheck.conformance.workload_machine import supported_block_sizes
from kvcheck.reference_impl.page_table import to_flashinfer_csr

if TYPE_CHECKING:
    from hypothesis import settings as Settings

    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.sizes import DeclaredSizes

pytestmark = pytest.mark.kv_capability("manager")


def expected_slots(block_ids: list[int], block_size: int, start: int, end: int) -> list[int]:
    """The slot of each position in ``[start, end)`` read off the block table."""
    return [block_ids[pos // block_size] * block_size + pos % block_size
            for pos in range(start, end)]


def _ranges(start_of_step: int, end: int) -> list[tuple[int, int]]:
    """The ranges asked of slot_mapping: everything, the last step's tokens, one token."""
    out = [(0, end), (start_of_step, end)]
    if end > 0:
        out.append((end // 2, end // 2 + 1))
    return out


def _workload(driver: Driver, ops: list[Op],
              check: Callable[[Driver, dict[str, int]], None]) -> None:
    """Run ``ops`` (decodes one token at a time without ``multi_token_decode``), calling
    ``check(driver, computed_before)`` after each."""
    for op in one_token_decodes(ops, "multi_token_decode" in driver.capabilities):
        before = {rid: driver.views[rid].num_computed_tokens for rid in driver.running}
        driver.apply(op)
        check(driver, before)


def _script(bs: int) -> list[Op]:
    """Chunked prefills ending inside blocks, decode, shared prefixes and a free, stated in
    blocks of ``bs`` tokens (the script of 14-, 11-, 17- and 13-token prompts at 4)."""
    return [
        add("a", range(1, 1 + tokens(3, bs, 2))), schedule("a", bs - 1), schedule("a", bs + 2),
        schedule("a"), decode("a"), decode("a", 3),
        # b shares a's 2 full blocks.
        add("b", list(range(1, 1 + tokens(2, bs))) + [70, 71, 72]), schedule("b"),
        add("c", range(300, 300 + tokens(4, bs, 1))), schedule("c", bs + 1), schedule("c", bs),
        free("a"), decode("b", 2), schedule("c"),
        # d hits b's prefix blocks (and a's third, cached when a finished).
        add("d", list(range(1, 1 + tokens(3, bs))) + [80]), schedule("d", 1),
        decode("c", 4), schedule("d"),
    ]


@pytest.mark.kv_generic
@pytest.mark.kv_capability("slot_mapping")
def test_slot_mapping_matches_block_table(kv_impl: ImplHandle, kv_profile: str,
                                          kv_sizes: DeclaredSizes) -> None:
    """slot_mapping(rid, start, end) equals block_ids[pos // bs] * bs + pos % bs for every
    computed position, through chunked prefill, decode and shared prefixes (at the declared
    block size and a larger one)."""

    def check(driver: Driver, before: dict[str, int]) -> None:
        bs = driver.spec.block_size
        for rid in sorted(driver.running):
            ids = list(driver.manager.get_block_ids(rid))
            n = driver.views[rid].num_computed_tokens
            for start, end in _ranges(before.get(rid, 0), n):
                got = list(driver.manager.slot_mapping(rid, start, end))
                want = expected_slots(ids, bs, start, end)
                assert got == want, (
                    f"slot_mapping({rid!r}, {start}, {end}) = {got}, block table {ids} gives "
                    f"{want}\n" + driver.snippet())

    for bs in kv_sizes.block_sizes_for(4):
        spec = kv_sizes.spec(num_blocks=24, block_size=bs, profile=kv_profile)
        _workload(Driver(kv_impl, spec), _script(bs), check)


@pytest.mark.kv_generic
def test_flashinfer_csr_cross_check(kv_impl: ImplHandle, kv_profile: str,
                                    kv_sizes: DeclaredSizes) -> None:
    """FlashInfer's CSR page table built from the implementation's block tables addresses every
    token at its slot: kv_indices[kv_indptr[b] + pos // bs] * bs + pos % bs, with
    seq_len = bs * (npages - 1) + last_page_len and 0 < last_page_len <= bs (at the declared
    block size and a larger one)."""
    has_slots = kv_impl.has("slot_mapping")

    def check(driver: Driver, before: dict[str, int]) -> None:
        bs = driver.spec.block_size
        rids = [r for r in sorted(driver.running) if driver.views[r].num_computed_tokens > 0]
        if not rids:
            return
        seq_lens = [driver.views[r].num_computed_tokens for r in rids]
        # The pages attention reads: a design may hold blocks past the computed tokens
        # (lookahead, or the whole sequence reserved at admission).
        rows = [list(driver.manager.get_block_ids(r))[:-(-n // bs)]
                for r, n in zip(rids, seq_lens, strict=True)]
        try:
            indptr, indices, last = to_flashinfer_csr(rows, seq_lens, bs)
        except ValueError as exc:
            raise ConformanceMismatch(
                f"block tables {dict(zip(rids, rows, strict=True))} with seq_lens {seq_lens} "
                f"are not a valid page table: {exc}\n" + driver.snippet()) from None
        assert indptr.dtype.name == indices.dtype.name == last.dtype.name == "int32"
        for b, (rid, ids, n) in enumerate(zip(rids, rows, seq_lens, strict=True)):
            npages = int(indptr[b + 1] - indptr[b])
            assert n == bs * (npages - 1) + int(last[b]) and 0 < int(last[b]) <= bs, (
                f"{rid!r}: seq_len {n}, {npages} pages, last_page_len {int(last[b])}")
            want = (list(driver.manager.slot_mapping(rid, 0, n)) if has_slots
                    else expected_slots(ids, bs, 0, n))
            csr = [int(indices[int(indptr[b]) + pos // bs]) * bs + pos % bs for pos in range(n)]
            assert csr == want, (
                f"{rid!r}: CSR slots {csr}, "
                f"{'slot_mapping' if has_slots else 'block table'} slots {want}\n"
                + driver.snippet())

    for bs in kv_sizes.block_sizes_for(4):
        spec = kv_sizes.spec(num_blocks=24, block_size=bs, profile=kv_profile)
        _workload(Driver(kv_impl, spec), _script(bs), check)


@pytest.mark.kv_generic
def test_slots_unique_except_shared_prefix_blocks(kv_impl: ImplHandle, kv_profile: str,
                                                  kv_settings: Settings,
                                                  kv_seed: int | None) -> None:
    """Random prompts sharing prefixes, random chunks, decode and frees: every computed token's
    slot lies in the pool (never in the null block 0) and belongs to one live request, except
    tokens of a shared full prefix block at the same position. The lengths drawn are for
    4-token blocks: at a larger declared size the driver scales them (``ScaledDriver``), so
    prompts still span and share several blocks."""
    from hypothesis import assume, given
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    has_slots = kv_impl.has("slot_mapping")
    stems = [[], [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23, 24],
             [9] * 12]
    block_sizes = sorted(supported_block_sizes(kv_impl.info))
    # Hypothesis derives the derandomized examples from run's source, decorators included, so
    # run stays as written and the name it builds its driver with is the scaling one here: the
    # same examples wherever the scale is 1 (the vLLM profiles, no declared sizes).
    Driver = ScaledDriver

    @kv_settings
    @given(data=st.data(), block_size=st.sampled_from(block_sizes),
           num_blocks=st.integers(4, 40))
    def run(data: st.DataObject, block_size: int, num_blocks: int) -> None:
        spec = KVCacheSpec(num_blocks=num_blocks, block_size=block_size, profile=kv_profile)
        assume(kv_impl.info.supports(spec))
        try:
            driver = Driver(kv_impl, spec)
        except UnsupportedSpec:
            assume(False)  # declined by the factory: another spec
        multi_token = "multi_token_decode" in driver.capabilities
        for step in range(data.draw(st.integers(1, 14), label="steps")):
            kind = data.draw(st.sampled_from(["add", "add", "step", "decode", "free"]),
                             label="op")
            if kind == "add":
                prompt = data.draw(st.sampled_from(stems), label="stem") + data.draw(
                    st.lists(st.integers(0, 30), max_size=9), label="tail")
                if not prompt:
                    continue
                rid = f"r{step}"
                driver.run([add(rid, prompt), schedule(rid, data.draw(
                    st.one_of(st.none(), st.integers(1, 10)), label="chunk"))])
            elif driver.running:
                rid = data.draw(st.sampled_from(sorted(driver.running)), label="request")
                n = data.draw(st.integers(1, 6), label="tokens")
                view = driver.views[rid]
                if not multi_token and (kind == "decode"
                                        or view.num_computed_tokens >= view.num_tokens):
                    n = 1  # one token per decode step: all the design promises
                by_kind: dict[str, Op] = {"step": schedule(rid, n), "decode": decode(rid, n),
                                          "free": free(rid)}
                driver.apply(by_kind[kind])
            _check_slots(driver, has_slots)

    if kv_seed is not None:
        run = hypothesis_seed(kv_seed)(run)
    run()


def _check_slots(driver: Driver, has_slots: bool) -> None:
    spec = driver.spec
    bs = spec.block_size
    owners: dict[int, list[tuple[str, int]]] = {}
    for rid in sorted(driver.running):
        view = driver.views[rid]
        ids = list(driver.manager.get_block_ids(rid))
        n = view.num_computed_tokens
        assert len(ids) * bs >= n, (
            f"{rid!r}: {n} computed tokens but {len(ids)} blocks\n" + driver.snippet())
        slots = expected_slots(ids, bs, 0, n)
        if has_slots:
            got = list(driver.manager.slot_mapping(rid, 0, n))
            assert got == slots, (f"slot_mapping({rid!r}, 0, {n}) = {got}, block table "
                                  f"{ids} gives {slots}\n" + driver.snippet())
        for pos, slot in enumerate(slots):
            assert 0 <= slot < spec.num_blocks * bs and slot // bs not in driver.reserved, (
                f"{rid!r} position {pos}: slot {slot} outside [0, {spec.num_blocks * bs}) or "
                f"in a reserved block {sorted(driver.reserved)}\n" + driver.snippet())
            owners.setdefault(slot, []).append((rid, pos))
    for slot, users in owners.items():
        if len(users) < 2:
            continue
        (rid0, pos0), rest = users[0], users[1:]
        end = (pos0 // bs + 1) * bs  # the shared block must be full, and the same prefix
        for rid, pos in rest:
            shared_ok = (
                pos == pos0
                and driver.views[rid0].num_computed_tokens >= end
                and driver.views[rid].num_computed_tokens >= end
                and driver.views[rid0].token_ids[:end] == driver.views[rid].token_ids[:end]
            )
            assert shared_ok, (
                f"slot {slot} is written by {rid0!r} position {pos0} and {rid!r} position {pos}"
                f": only a shared full prefix block at the same position may share slots; "
                f"tables {one_group_tables(driver.tables())}\n" + driver.snippet())
