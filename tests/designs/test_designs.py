"""The generic profile on two more independent designs (``tests/designs``), each with the
design capabilities real engines have, and their mutants (one realistic bug each):

* ``radix_kv``: an SGLang-style radix tree (``dedup_on_insert``, ``pinning_lookup``,
  ``caches_running_requests``, ``ref_cnt_counts_cache=True``) at page sizes 1, 4, 16, 64;
* ``finish_kv``: an LMDeploy-style block trie caching at ``free()`` only (no
  ``caches_running_requests``) at block sizes 256 and 512 only.

Each must conform to ``--kv-profile=generic`` at its own block sizes, with every law family
tested by at least the verdict's minimum; each mutant must fail it, its failure naming the law
(or, for a block never cached, the promise) it breaks. Each run is the shipped suite in a fresh
interpreter, as a user runs it (``pytest --kv-impl=radix_kv --kv-profile=generic`` with this
folder on ``PYTHONPATH``), from an empty directory. Mutant runs stop at the first failure
(``-x``), with fewer Hypothesis examples and no shrinking (``-p nano_no_shrink``, from
``tests/nano``): only their verdict matters.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kv_helpers import assert_mutant_caught

from kvcheck.plugin.coverage import MIN_TESTS_PER_FAMILY

pytest_plugins = ["pytester"]

DESIGNS_DIR = Path(__file__).resolve().parent
NANO_DIR = DESIGNS_DIR.parent / "nano"  # nano_no_shrink.py

#: design -> (the block sizes its verdict names, the suite tests that must have PASSED:
#: those of its design capabilities, and the random-workload laws).
DESIGNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "radix_kv": ("1, 4, 16, 64", (
        "test_invariants.py::test_laws_hold_under_random_workloads",
        "test_block_ownership.py::test_block_computed_twice_may_be_rebound_once_computed",
        ("test_block_ownership.py::test_new_tokens_are_written_only_into_blocks_no_other_"
         "request_holds"),
        "test_lookup_styles.py::test_pinned_hits_are_held_until_released",
        "test_lookup_styles.py::test_refused_admission_releases_its_pins",
        "test_lookup_styles.py::test_cached_blocks_nobody_holds_are_free",
        "test_prefix_caching.py::test_decode_blocks_become_hits",
        "test_prefix_caching.py::test_hits_hold_the_requested_prefix",
    )),
    "finish_kv": ("256, 512", (
        "test_invariants.py::test_laws_hold_under_random_workloads",
        "test_block_ownership.py::test_block_computed_twice_may_be_rebound_once_computed",
        "test_prefix_caching.py::test_shared_prefix_is_shared",
        "test_prefix_caching.py::test_preempted_request_readmitted_from_cache",
        "test_prefix_caching.py::test_hit_cap_is_num_tokens_minus_one",
        "test_eviction.py::test_lazy_eviction_freed_block_still_hits",
        "test_lookup_styles.py::test_cached_blocks_nobody_holds_are_free",
    )),
}

#: mutant -> the text of the law (or promise) that must appear in its failure.
MUTANTS: dict[str, str] = {
    "mut_radix_copy_kept": "was not released: no live request holds it",
    "mut_radix_lock_leak": "pinning_lookup: a pin the design did not drop",
    "mut_radix_rebind_mismatch": "not a valid rebinding (dedup_on_insert)",
    "mut_radix_shared_write": "shared write:",
    # No law owns a block never cached (a design may evict any block): the lookups of a
    # finished request's blocks do ("Caching at finish").
    "mut_finish_drops_tail": "lazy eviction (hit correctness): b should hit a's 3 freed blocks",
    "mut_finish_unscheduled_tail": "hit correctness:",
}


def _run_generic(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, impl: str,
                 *args: str) -> pytest.RunResult:
    path = os.pathsep.join(filter(None, [str(DESIGNS_DIR), str(NANO_DIR),
                                         os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    return pytester.runpytest_subprocess(
        f"--kv-impl={impl}", "--kv-profile=generic", "-p", "no:cacheprovider", *args)


def test_every_mutant_is_listed() -> None:
    assert sorted(p.stem for p in DESIGNS_DIR.glob("mut_*.py")) == sorted(MUTANTS)


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_design_conforms_to_generic(pytester: pytest.Pytester,
                                    monkeypatch: pytest.MonkeyPatch, design: str) -> None:
    """The design passes every generic test that applies to it (default settings) at its
    own block sizes, every law family counts the verdict's minimum, and the tests of its
    design capabilities passed, not skipped."""
    sizes, must_pass = DESIGNS[design]
    result = _run_generic(pytester, monkeypatch, design, "-rA")
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, text[-4000:]
    verdict = re.search(rf"^verdict: {design} conforms to generic \(\d+ tests ran at block "
                        rf"sizes {sizes}; laws: conservation (\d+), ownership (\d+), hit "
                        r"correctness (\d+), eviction safety (\d+)\)", text, re.MULTILINE)
    assert verdict, text[-3000:]
    assert min(map(int, verdict.groups())) >= MIN_TESTS_PER_FAMILY, verdict.group(0)
    assert not result.parseoutcomes().get("failed"), result.parseoutcomes()
    for test in must_pass:
        assert re.search(rf"^PASSED {re.escape(test)}\[{design}", text, re.MULTILINE), (
            f"{test} did not pass on {design}\n" + text[-3000:])


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_generic_catches_design_mutant(pytester: pytest.Pytester,
                                       monkeypatch: pytest.MonkeyPatch, mutant: str) -> None:
    """Each mutant fails the generic suite, with its law named in the failure."""
    result = _run_generic(pytester, monkeypatch, mutant, "-x", "--kv-max-examples=10",
                          "-p", "nano_no_shrink")
    assert_mutant_caught(result, mutant, MUTANTS[mutant])


# ---------------------------------------------------------------- the design choices, in-process
@pytest.fixture
def designs(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Any]:
    """``load_impl`` for modules of this folder."""
    from kvcheck.conformance.loader import load_impl

    monkeypatch.syspath_prepend(str(DESIGNS_DIR))
    return load_impl


def _pair(load: Callable[[str], Any], target: str, **fields: Any) -> Any:
    from kvcheck.conformance.differential import Pair
    from kvcheck.conformance.protocol import KVCacheSpec

    return Pair(load(target), None, KVCacheSpec(profile="generic", **fields))


def test_radix_rebinds_pins_and_caches_running_requests(designs: Callable[[str], Any]) -> None:
    """The capabilities radix_kv declares are used, so generic judged them: a running
    request's blocks hit at once, a duplicate is rebound to the tree's block at the
    request's next call, and a lookup takes a reference on each hit until released."""
    from kvcheck.conformance.ops import add, decode, schedule
    from kvcheck.conformance.protocol import RequestView

    pair = _pair(designs, "radix_kv", num_blocks=16, block_size=4)
    prompt = list(range(1, 9))  # two full pages
    pair.run([add("a", prompt), schedule("a"), add("b", prompt)])
    [a] = pair.impl.tables()["a"]  # one KV-cache group
    got = pair.apply(schedule("b"))
    assert got["hits"] == ([a[:1]], 4), "a running request's page hits (capped at 7 tokens)"
    [[copy]] = got["new"]
    assert copy != a[1], "b recomputes its last page into a copy"
    pair.apply(decode("b"))
    [b] = pair.impl.tables()["b"]
    assert b[:2] == a[:2] and copy not in b, f"the copy is rebound to a's page: {b}"

    manager = pair.impl.manager
    view = RequestView(request_id="c", prompt_token_ids=(*prompt, 9))
    before = [manager.ref_cnt(block) for block in a]
    assert manager.get_computed_blocks(view) == (a, 8)
    assert [manager.ref_cnt(block) for block in a] == [n + 1 for n in before], "pinned"
    manager.release_computed("c")
    assert [manager.ref_cnt(block) for block in a] == before


def test_finish_caches_only_at_free_and_only_its_sizes(designs: Callable[[str], Any]) -> None:
    """finish_kv's blocks hit only once the request that wrote them is freed (the first one
    freed wins), and a block size it does not declare is declined."""
    from kvcheck.conformance.ops import add, free, schedule
    from kvcheck.conformance.protocol import KVCacheSpec, UnsupportedSpec

    pair = _pair(designs, "finish_kv", num_blocks=8, block_size=256)
    prompt = list(range(1, 2 * 256 + 2))  # two full blocks and one token
    pair.run([add("a", prompt), schedule("a"), add("b", prompt)])
    [a] = pair.impl.tables()["a"]  # one KV-cache group
    assert pair.apply(schedule("b"))["hits"] == ([[]], 0), "a running request's blocks hit"
    pair.run([free("a"), free("b"), add("c", prompt)])
    assert pair.apply(schedule("c"))["hits"] == ([a[:2]], 512)
    with pytest.raises(UnsupportedSpec, match="block sizes"):
        designs("finish_kv").module.make_kv_cache_manager(
            KVCacheSpec(profile="generic", num_blocks=8, block_size=16))
