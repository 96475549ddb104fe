"""Recorded: real vLLM behaviour, replayed. The wheel ships a corpus per vLLM profile
(``conformance/corpus/<profile>.cbor.xz``, recorded from that vLLM release with ``kvcheck
record``): seeded scheduler-like traces with vLLM's answer and observable state after every
step (``kvcheck.conformance.recorder``). Each test replays one trace on the implementation and
compares its answers, and the state fields it declares (free count and block tables always;
free queue, ref counts, block hashes, KV events by capability), step by step. The
multi-group traces (``tNN-swa-...``, ``-mamba-``, ``-cross-``...) need ``kv_cache_groups`` and
their groups' kinds; vLLM 0.10.2's corpus has no trace of the layouts only 0.33 accepts
(Mamba "align", partial-block keys), so under that profile those tests are skipped, saying so.

Only under the vLLM profiles: the corpus is one release's exact behaviour, so under
``--kv-profile=generic`` the area is skipped (the profile-independent laws are the
``invariants`` area's). A failure names the trace, the step and the differing field, and
writes a trace that ``kvcheck replay`` re-runs against the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.protocol import KIND_CAPABILITIES, VLLM_PROFILES, effective_capabilities
from kvcheck.conformance.recorded import (
    CorpusError,
    corpus_path,
    needed_capabilities,
    replay_recorded,
    shipped_corpus,
)
from kvcheck.conformance.recorder import (
    DEFAULT_TRACES,
    HYBRID_PLANS,
    HYBRID_START,
    runs_under,
    trace_indices,
    trace_plan,
)
from kvcheck.conformance.trace_check import check_spec

if TYPE_CHECKING:
    from kvcheck.conformance.loader import ImplHandle

# Trace names do not depend on the profile (trace_plan), so both corpora share these ids; the
# first profile (vLLM 0.33) runs every trace (runs_under), the other a subset.
_NAMES = [trace_plan(i, VLLM_PROFILES[0]).name for i in range(DEFAULT_TRACES)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Load the shipped corpus of every active vLLM profile at collection. A damaged or
    missing one (package data cut short, a bad install) is kvcheck's fault, not the
    implementation's: it fails this module's collection, so the run is incomplete ("collection
    errors in test_recorded.py") instead of 60 failures reading "does NOT conform". The load is
    cached: the tests reuse it. Not in the inventory child of a partial run (``--kv-inventory``,
    ``kvcheck.plugin.completeness``): it only lists the tests that should have run, which the
    corpus does not change (their ids come from ``trace_plan``), and the load and the
    collections walking the corpus at its exit were 1.0 of its 1.9 CPU-seconds."""
    if metafunc.config.getoption("kv_inventory", None):
        return
    profiles = metafunc.config.hook.pytest_kvcheck_profiles(config=metafunc.config) or {}
    for profile in sorted(set(profiles.values()) & set(VLLM_PROFILES)):
        try:
            shipped_corpus(profile)
            continue
        except CorpusError as exc:
            problem = str(exc)
        pytest.fail(f"kvcheck's shipped {profile} corpus ({corpus_path(profile)}) is unusable, "
                    f"so the recorded area cannot run: {problem}\n  Fix: reinstall kvcheck "
                    "(pip install --force-reinstall kvcheck); this says nothing about the "
                    "implementation", pytrace=False)


@pytest.mark.kv_capability("manager")
@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.parametrize("index", range(DEFAULT_TRACES), ids=_NAMES)
def test_recorded_trace_replays(kv_impl: ImplHandle, kv_profile: str, index: int) -> None:
    """The implementation answers, and shows the state, that vLLM did on this trace."""
    if not runs_under(index, kv_profile):
        plan = HYBRID_PLANS[index - HYBRID_START]
        pytest.skip(f"{kv_profile}'s vLLM release does not accept this trace's layout "
                    f"({plan.label}: {', '.join(g.kind for g in plan.groups)}), so its corpus "
                    f"has no such trace; the layout is recorded under {list(plan.profiles)}")
    corpus = shipped_corpus(kv_profile)
    traces = corpus["traces"]
    indices = trace_indices(kv_profile, len(traces))
    assert index in indices, (
        f"the shipped {kv_profile} corpus holds {len(traces)} traces, not "
        f"{len(trace_indices(kv_profile, index + 1))} or more: record it again (kvcheck "
        "record, see docs/recorded.md)")
    trace = traces[indices.index(index)]
    assert trace["name"] == _NAMES[index], (
        f"trace {index} of the shipped {kv_profile} corpus is {trace['name']!r}, expected "
        f"{_NAMES[index]!r}: record the corpus again (docs/recorded.md)")
    missing = needed_capabilities(trace) - effective_capabilities(kv_impl.info, kv_profile)
    if missing:
        what = ("layout needs" if missing & {"kv_cache_groups", *KIND_CAPABILITIES.values()}
                else "requests need")
        pytest.skip(f"{kv_impl.name} does not declare {sorted(missing)}, which this trace's "
                    f"{what}")
    spec = check_spec(trace["spec"], trace["name"])
    if not kv_impl.info.supports(spec):
        pytest.skip(f"{kv_impl.name} does not support this trace's pool (num_blocks="
                    f"{spec.num_blocks}, block_size={spec.block_size})")
    replay_recorded(kv_impl, trace, corpus["header"])
