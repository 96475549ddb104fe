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
from kv_helpers import reference_capabilities_source

from kvcheck.conformance.differential import ConformanceMismatch, load_trace
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import VLLM_PROFILES
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
    for trace in corpus["traces"]:
        try:
            replay_recorded(mutant, trace, corpus["header"])
        except ConformanceMismatch as exc:
            failures.append((trace["name"], str(exc)))
    assert len(failures) >= len(corpus["traces"]) // 2, [name for name, _ in failures]
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
