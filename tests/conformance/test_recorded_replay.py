"""The ``recorded`` area: the shipped corpora of real vLLM replay identically on the reference
under both profiles; a mutant fails with the trace, the step and the field named (and a trace
for ``kvcheck replay``); only the state an implementation declares is compared; the area is
skipped under ``generic``."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from kv_helpers import reference_capabilities_source, reference_without_kernels

from kvcheck.conformance.differential import ConformanceMismatch, load_trace
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import VLLM_PROFILES, effective_capabilities
from kvcheck.conformance.recorded import needed_capabilities, replay_recorded, shipped_corpus
from kvcheck.conformance.recorder import DEFAULT_TRACES
from kvcheck.plugin.cli import main

TESTS = Path(__file__).resolve().parents[1]
MUTANTS = TESTS / "mutants"
SUITE_FILE = TESTS.parent / "conformance" / "test_recorded.py"

_CAPS = reference_capabilities_source("_R.capabilities", drop={"block_pool"})
# The reference, but its free queue is shown tail first: wrong wherever the queue is compared.
QUEUE_REVERSED = f"""
from kvcheck.adapters.reference import IMPL_INFO as _R, ReferenceManager
from kvcheck.conformance.protocol import ImplInfo
CAPS = {_CAPS}
IMPL_INFO = ImplInfo("queue_reversed", "0", CAPS if DECLARE else CAPS - {{"free_queue_order"}})
class M(ReferenceManager):
    def free_block_ids(self):
        return list(reversed(super().free_block_ids()))
def make_kv_cache_manager(spec):
    return M(spec)
"""


@pytest.mark.parametrize("profile", VLLM_PROFILES)
def test_every_shipped_trace_replays_on_the_reference(profile: str) -> None:
    corpus = shipped_corpus(profile)
    impl = load_impl("reference")
    steps = sum(replay_recorded(impl, trace, corpus["header"]) for trace in corpus["traces"])
    assert steps == corpus["header"]["steps"]


def test_a_mutant_fails_naming_trace_step_and_field(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """mut_all_to_tail appends every freed block to the tail (0.10's order) under 0.33."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(MUTANTS))
    mutant = load_impl("mut_all_to_tail", search=[MUTANTS])
    corpus = shipped_corpus("vllm-0.33")
    failures = []
    caps = effective_capabilities(mutant.info, "vllm-0.33")
    # The traces the area runs on it: not the multi-group ones (the mutant is single-group).
    runnable = [t for t in corpus["traces"] if needed_capabilities(t) <= caps]
    assert len(runnable) == len(corpus["traces"]) - 12
    for trace in runnable:
        try:
            replay_recorded(mutant, trace, corpus["header"])
        except ConformanceMismatch as exc:
            failures.append((trace["name"], str(exc)))
    assert len(failures) >= len(runnable) // 2, [name for name, _ in failures]
    name, message = failures[0]
    first = message.splitlines()[0]
    assert first.startswith(f"recorded trace {name} (vllm-0.33, vllm 0.33.0), step #"), first
    assert "state field 'queue' differs: recorded [" in first, first
    # The steps so far, as a trace `kvcheck replay` re-runs against the reference.
    trace_file = tmp_path / ".kvcheck" / "repro" / f"recorded-vllm-0.33-{name}.json"
    assert f"written to {trace_file.relative_to(tmp_path)}" in message
    assert load_trace(trace_file)["impl"] == "mut_all_to_tail"
    assert main(["replay", str(trace_file)]) == 1
    # ... and a runnable repro that ends by comparing the queue with vLLM's.
    assert "what = 'queue after step #" in message
    assert "got = list(m.free_block_ids())" in message


@pytest.fixture
def queue_reversed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("queue_declared", "queue_undeclared"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("declare", [True, False])
def test_only_declared_state_is_compared(queue_reversed: Path, declare: bool) -> None:
    name = "queue_declared" if declare else "queue_undeclared"
    (queue_reversed / f"{name}.py").write_text(
        f"DECLARE = {declare}\n" + textwrap.dedent(QUEUE_REVERSED))
    impl = load_impl(name, search=[queue_reversed])
    corpus = shipped_corpus("vllm-0.33")
    trace = corpus["traces"][0]
    if declare:
        with pytest.raises(ConformanceMismatch, match=r"step #1 .*state field 'queue' differs"):
            replay_recorded(impl, trace, corpus["header"])
    else:
        assert replay_recorded(impl, trace, corpus["header"]) == len(trace["steps"])


@pytest.mark.parametrize("profile", VLLM_PROFILES)
def test_extras_traces_need_extra_keys(profile: str) -> None:
    """LoRA, salt and multimodal requests appear in the extras and mixed traces only; those
    are skipped for an implementation without extra_keys."""
    needing = {t["name"].split("-")[1] for t in shipped_corpus(profile)["traces"]
               if needed_capabilities(t) == {"extra_keys"}}
    assert needing == {"extras", "mixed"}


def test_area_is_skipped_under_generic(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-q", "-rs", "--kv-impl=reference", "--kv-profile=generic",
        str(SUITE_FILE))
    result.assert_outcomes(skipped=DEFAULT_TRACES)
    result.stdout.fnmatch_lines(["*checks exact vLLM behaviour; not run under --kv-profile*"])


def test_multi_group_traces_are_skipped_where_the_layout_is_missing(
        pytester: pytest.Pytester) -> None:
    """Under vllm-0.10 the layouts only vLLM 0.33 accepts (Mamba "align", partial-block keys)
    have no trace: skipped, naming the layout; an implementation that does not declare
    ``mamba`` skips the Mamba traces its release has, naming the capability; the other
    multi-group traces replay."""
    pytester.makepyfile(nossm=reference_without_kernels(name="nossm").replace(
        '- {"kernels"}',
        '- {"kernels", "mamba", "fine_grained_hits", "boundary_state_offloads", '
        '"mamba_checkpoints", "mamba_dcp", "mamba_shared_prefix_checkpoint"}'))
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "-q", "-rs", "--kv-impl=nossm",
                                "--kv-profile=vllm-0.10", str(SUITE_FILE), "-k",
                                "mamba or partial or swa-chat")
    result.assert_outcomes(passed=1, skipped=5)
    skips = [line.split(": ", 1)[1] for line in result.stdout.lines
             if line.startswith("SKIPPED [")]
    refused = ("vllm-0.10's vLLM release does not accept this trace's layout ({}), so its "
               "corpus has no such trace; the layout is recorded under ['vllm-0.33']")
    assert sorted(skips) == sorted([
        "nossm does not declare ['mamba'], which this trace's layout needs",  # t72 and t73
        refused.format("mamba-align: full_attention, mamba"),
        refused.format("mamba-align: full_attention, sliding_window, mamba"),
        refused.format("partial: full_attention, sliding_window")])
    assert "SKIPPED [2] " in result.stdout.str()


@pytest.mark.parametrize("profile", VLLM_PROFILES)
def test_multi_group_traces_need_their_kinds(profile: str) -> None:
    """A multi-group trace needs ``kv_cache_groups`` and each of its groups' kinds (and
    nothing of the requests' extras); a single-group one none of them."""
    needs = {t["name"]: needed_capabilities(t) for t in shipped_corpus(profile)["traces"]}
    assert needs["t68-swa-chat-bs4-events"] == {"kv_cache_groups", "sliding_window"}
    assert needs["t70-chunked-chunked-bs4"] == {"kv_cache_groups", "chunked_local_attention"}
    assert needs["t73-mamba-preempt-bs2-nocache-events"] == {
        "kv_cache_groups", "sliding_window", "mamba"}
    assert needs["t74-cross-pressure-bs2-nocache-events"] == {"kv_cache_groups",
                                                              "cross_attention"}
    assert needs["t00-chat-bs4-events"] == frozenset()
