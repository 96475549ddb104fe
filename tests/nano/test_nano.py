"""The generic profile on an independent design: ``nano_kv`` (a nano-vllm-style block manager,
see its docstring) must conform to ``--kv-profile=generic``, and each of its mutants (one
realistic bug each) must fail it, caught by the law that owns the bug.

Each run is the shipped suite in a fresh interpreter, as a user runs it
(``pytest --kv-impl=nano_kv --kv-profile=generic`` with this folder on ``PYTHONPATH``), from
an empty directory. Mutant runs use fewer Hypothesis examples and no shrinking (``-p
nano_no_shrink``): only their verdict matters.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from kv_helpers import assert_mutant_caught

pytest_plugins = ["pytester"]

NANO_DIR = Path(__file__).resolve().parent

#: mutant -> the law whose message must appear among the failures.
MUTANTS: dict[str, str] = {
    "mut_content_hash": "hit correctness:",
    "mut_stale_hit": "hit correctness:",
    "mut_leak_on_free": "conservation:",
    "mut_double_hand_out": "conservation:",
    "mut_shared_write": "shared write:",
}


def _run_generic(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, impl: str,
                 *args: str) -> pytest.RunResult:
    path = os.pathsep.join(filter(None, [str(NANO_DIR), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    return pytester.runpytest_subprocess(
        f"--kv-impl={impl}", "--kv-profile=generic", "-p", "no:cacheprovider", *args)


def test_every_mutant_is_listed() -> None:
    assert sorted(p.stem for p in NANO_DIR.glob("mut_*.py")) == sorted(MUTANTS)


def test_nano_conforms_to_generic(pytester: pytest.Pytester,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The independent design passes every generic test that applies to it (default
    settings), and the laws ran: the random-workload law tests passed, not skipped."""
    result = _run_generic(pytester, monkeypatch, "nano_kv", "-rA")
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, text[-4000:]
    assert "nano_kv conforms to generic" in text, text[-2000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 20 and not outcomes.get("failed"), outcomes
    for test in ("test_laws_hold_under_random_workloads", "test_hits_hold_the_requested_prefix",
                 "test_capacity_exact_fit_then_none", "test_all_or_nothing"):
        assert re.search(rf"^PASSED \S+::{test}\[nano_kv\]", text, re.MULTILINE), (
            f"{test} did not pass on nano_kv\n" + text[-3000:])


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_generic_catches_nano_mutant(pytester: pytest.Pytester,
                                     monkeypatch: pytest.MonkeyPatch, mutant: str) -> None:
    """Each mutant fails the generic suite, with its law named in the failure."""
    result = _run_generic(pytester, monkeypatch, mutant, "--kv-max-examples=10",
                          "-p", "nano_no_shrink")
    assert_mutant_caught(result, mutant, MUTANTS[mutant])


# ---------------------------------------------------------------- the design choices, in-process
@pytest.fixture
def nano(monkeypatch: pytest.MonkeyPatch):
    """``load_impl`` for modules of this folder."""
    from kvcheck.conformance.loader import load_impl

    monkeypatch.syspath_prepend(str(NANO_DIR))
    return load_impl


def _pair(load, target: str, **fields: Any):
    from kvcheck.conformance.differential import Pair
    from kvcheck.conformance.protocol import KVCacheSpec

    return Pair(load(target), None, KVCacheSpec(profile="generic", **fields))


def test_nano_differs_from_vllm_where_generic_allows(nano) -> None:
    """The choices generic must accept are real: block 0 is handed out, a chunk's first
    allocation takes blocks for the whole prompt, and the last writer of a key wins."""
    from kvcheck.conformance.ops import add, schedule

    pair = _pair(nano, "nano_kv", num_blocks=8, block_size=4)
    pair.apply(add("a", range(8)))
    got = pair.apply(schedule("a", 3))
    assert got["new"] == [[0, 1]], got  # 8 tokens -> 2 blocks at admission, from block 0
    pair.run([schedule("a"), add("b", range(8)), schedule("b")])  # b recomputes block 1
    [b] = pair.impl.tables()["b"]  # one KV-cache group
    pair.apply(add("c", range(9)))
    assert pair.apply(schedule("c"))["hits"] == ([[0, b[1]]], 8), "last writer wins"


def test_hit_law_names_block_position_holder_and_need(nano) -> None:
    """A stale hit fails with the block, its index and positions, what it holds (and who
    wrote it) and what the request needed."""
    from kvcheck.conformance.differential import ConformanceMismatch
    from kvcheck.conformance.ops import add, free, schedule

    pair = _pair(nano, "mut_stale_hit", num_blocks=4, block_size=4)
    pair.run([add("old", range(1, 9)), schedule("old"), free("old"),
              add("fill", range(100, 116)), schedule("fill"), add("new", range(1, 10))])
    with pytest.raises(ConformanceMismatch) as info:
        pair.apply(schedule("new"))
    text = str(info.value)
    assert "hit correctness: get_computed_blocks('new') returned block" in text, text
    assert "at index 0 (positions 0..3)" in text and "written by request 'fill'" in text, text
    assert "request 'new' needs tokens [1, 2, 3, 4]" in text, text


def test_shared_write_law_names_block_requests_and_positions(nano) -> None:
    """A block-aligned prompt equal to a live request's keeps that request's last block as a
    hit and recomputes its last token into it: the shared-write law names the block, both
    requests, where each holds it and the position written."""
    from kvcheck.conformance.differential import ConformanceMismatch
    from kvcheck.conformance.ops import add, schedule

    pair = _pair(nano, "mut_shared_write", num_blocks=8, block_size=4)
    pair.run([add("a", range(8)), schedule("a"), add("b", range(8))])
    with pytest.raises(ConformanceMismatch) as info:
        pair.apply(schedule("b"))
    text = str(info.value)
    assert ("shared write: the forward pass of allocate_slots('b') writes its position 7 into "
            "block 1 (its block 1), but request 'a' also holds it (its block 1)") in text, text


def test_one_token_decodes_splits_only_without_the_capability() -> None:
    from kvcheck.conformance.ops import add, decode, one_token_decodes, schedule

    ops = [add("r", [1, 2]), schedule("r"), decode("r", 3), decode("r")]
    assert one_token_decodes(ops, True) == ops
    assert one_token_decodes(ops, False) == ops[:2] + [decode("r", 1)] * 4


def test_random_workloads_draw_only_declared_block_sizes(nano) -> None:
    from kvcheck.conformance.workload_machine import supported_block_sizes

    assert supported_block_sizes(nano("nano_kv").info) == [4, 2, 8]
    assert supported_block_sizes(nano("reference").info) == [4, 2, 8, 1]


def test_random_workloads_stay_within_the_declared_design(nano, monkeypatch) -> None:
    """For nano_kv (no reset_prefix_cache, caching_off, skip_reading_prefix_cache or
    multi_token_decode; block sizes 2..32) the random workload machine never resets, never
    turns caching off, sends no prompt-logprobs request, decodes one token per step and draws
    only declared block sizes."""
    from hypothesis import HealthCheck, settings

    from kvcheck.conformance.differential import Pair
    from kvcheck.conformance.protocol import KVCacheSpec
    from kvcheck.conformance.workload_machine import run_workload_machine

    impl = nano("nano_kv")
    pairs: list[Pair] = []
    decode_steps: list[int] = []  # num_new_tokens of every allocation after the prompt
    allocate = impl.module.NanoManager.allocate_slots

    def recording(self: Any, request: Any, num_new_tokens: int, *args: Any) -> Any:
        if request.num_computed_tokens >= len(request.prompt_token_ids):
            decode_steps.append(num_new_tokens)
        return allocate(self, request, num_new_tokens, *args)

    monkeypatch.setattr(impl.module.NanoManager, "allocate_slots", recording)

    def make_pair(**fields: Any) -> Pair:
        pairs.append(Pair(impl, None, KVCacheSpec(profile="generic", **fields)))
        return pairs[-1]

    run_workload_machine(make_pair, settings(max_examples=25, deadline=None, derandomize=True,
                                             database=None,
                                             suppress_health_check=list(HealthCheck)),
                         None, extras=False, events=False, impl=impl, profile="generic")
    ops = [op for pair in pairs for op in pair.ops]
    assert {p.spec.block_size for p in pairs} == {2, 4, 8}
    assert all(p.spec.enable_caching for p in pairs)
    assert not [op for op in ops if op["op"] == "reset" or op.get("skip_read")]
    assert decode_steps and set(decode_steps) == {1}, sorted(set(decode_steps))
