"""The batch_metadata area has teeth: each bug of issue 15 (a token looked up in the wrong
block-table row, padding 0 instead of -1, the DCP interleave size ignored, FlashInfer's
``kv_last_page_len`` 0 for a full last page) put into the reference adapter fails exactly the
tests that own it, both the worked example and the random comparison; the reference itself
passes the area.

Each buggy implementation is a small module written into pytester's folder: the reference
adapter's manager with one method overridden. The area runs in-process
(``inner_runs.run_area``) on ``conformance/test_batch_metadata.py`` with the mutant-run
settings of ``tests/mutants/test_mutants.py`` (no shrinking: only the verdict matters).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from inner_runs import run_area

import kvcheck.conformance

AREA_FILE = Path(kvcheck.conformance.__file__).resolve().parent / "test_batch_metadata.py"

_HEADER = '''
from dataclasses import replace

import numpy as np

from kvcheck.adapters.reference import IMPL_INFO as _REFERENCE, ReferenceManager

IMPL_INFO = replace(_REFERENCE, name="{name}", capabilities=frozenset(
    {{"manager", "prefix_caching", "batch_metadata"}}))


def make_kv_cache_manager(spec):
    return Buggy(spec)

'''

#: name -> (the buggy manager class, the test functions that must fail; all others pass).
MUTANTS: dict[str, tuple[str, set[str]]] = {
    "bm_wrong_row": ('''
class Buggy(ReferenceManager):
    def build_batch(self, block_tables, num_computed_tokens, num_scheduled_tokens,
                    num_padded_tokens, dcp_world_size=1, dcp_rank=0,
                    cp_kv_cache_interleave_size=1):
        slots, positions, req_indices = super().build_batch(
            block_tables, num_computed_tokens, num_scheduled_tokens, num_padded_tokens,
            dcp_world_size, dcp_rank, cp_kv_cache_interleave_size)
        bs, w, i_size = self.spec.block_size, dcp_world_size, cp_kv_cache_interleave_size
        # BUG: side="left" gives the first token of every request but the first the row of
        # the request before it.
        rows = np.searchsorted(np.cumsum(num_scheduled_tokens), np.arange(len(positions)),
                               side="left")
        for t, pos in enumerate(positions):
            if slots[t] < 0:
                continue  # another DCP rank's token
            row = block_tables[int(rows[t])]
            vb, vo = divmod(pos, bs * w)
            block = row[vb] if vb < len(row) else 0  # a dense table is 0-padded
            slots[t] = block * bs + (vo // (w * i_size)) * i_size + vo % i_size
        return slots, positions, req_indices
''', {"test_build_batch_worked_examples", "test_build_batch_matches_reference"}),
    "bm_pad_zero": ('''
class Buggy(ReferenceManager):
    def build_batch(self, block_tables, num_computed_tokens, num_scheduled_tokens,
                    num_padded_tokens, dcp_world_size=1, dcp_rank=0,
                    cp_kv_cache_interleave_size=1):
        slots, positions, req_indices = super().build_batch(
            block_tables, num_computed_tokens, num_scheduled_tokens, num_padded_tokens,
            dcp_world_size, dcp_rank, cp_kv_cache_interleave_size)
        n = len(positions)
        # BUG: the CUDA-graph padding is a zero-filled buffer, not PAD_SLOT_ID (-1).
        return slots[:n] + [0] * (len(slots) - n), positions, req_indices
''', {"test_build_batch_worked_examples", "test_build_batch_matches_reference"}),
    "bm_dcp_interleave_ignored": ('''
class Buggy(ReferenceManager):
    def build_batch(self, block_tables, num_computed_tokens, num_scheduled_tokens,
                    num_padded_tokens, dcp_world_size=1, dcp_rank=0,
                    cp_kv_cache_interleave_size=1):
        # BUG: tokens dealt to DCP ranks one by one whatever the interleave size.
        return super().build_batch(block_tables, num_computed_tokens, num_scheduled_tokens,
                                   num_padded_tokens, dcp_world_size, dcp_rank, 1)
''', {"test_build_batch_worked_examples", "test_build_batch_matches_reference"}),
    "bm_last_page_len_zero": ('''
class Buggy(ReferenceManager):
    def flashinfer_csr(self, block_tables, seq_lens):
        indptr, indices, _ = super().flashinfer_csr(block_tables, seq_lens)
        # BUG: seq_len % page_size is 0 for a full last page (FlashInfer needs page_size).
        return indptr, indices, [n % self.spec.block_size for n in seq_lens]
''', {"test_flashinfer_csr_worked_examples", "test_flashinfer_csr_matches_reference"}),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_area_fails_each_bug(pytester: pytest.Pytester, mutant: str) -> None:
    source, must_fail = MUTANTS[mutant]
    pytester.makepyfile(**{mutant: textwrap.dedent(_HEADER.format(name=mutant)) + source})
    failed, passed, skipped = run_area(pytester, AREA_FILE, mutant)
    assert failed == must_fail, (
        f"{mutant}: failing tests {sorted(failed)}, expected exactly {sorted(must_fail)}")
    assert skipped == 0 and passed, (mutant, passed, skipped)


def test_reference_passes_area(pytester: pytest.Pytester) -> None:
    failed, passed, skipped = run_area(pytester, AREA_FILE, "reference")
    assert not failed and skipped == 0, (failed, skipped)
    assert passed == {"test_build_batch_worked_examples", "test_build_batch_matches_reference",
                      "test_flashinfer_csr_worked_examples",
                      "test_flashinfer_csr_matches_reference",
                      "test_req_to_token_worked_example",
                      "test_req_to_token_matches_reference"}, passed
