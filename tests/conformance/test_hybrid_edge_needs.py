"""The hybrid edge goldens (``conformance/hybrid_edge_golden.py``, suite test
``test_edge_cases.py::test_hybrid_edge_golden``) ask for what each scenario uses: an
implementation that does not declare it skips that scenario, naming the capability, and runs
the others. Checked here for three of those needs: tokens in flight (``async_scheduling``,
not ``admission_gates``, when the gates carry only ``num_in_flight_tokens``), an
encoder-decoder layout with caching off (``caching_off``) and evictions (``evict_blocks``);
and a scenario recorded from another vLLM release is not applicable under this one."""

from __future__ import annotations

import pytest
from inner_runs import SUITE

from kvcheck.conformance.hybrid_edge_golden import HYBRID_EDGE_SCENARIOS

LACKING = ("async_scheduling", "caching_off", "evict_blocks")

#: The reference, under another name, without its kernels and without ``LACKING``.
SOURCE = (
    "from dataclasses import replace\n\n"
    "from kvcheck.adapters.reference import *  # noqa: F403\n"
    "from kvcheck.adapters.reference import IMPL_INFO as _REFERENCE\n\n"
    "IMPL_INFO = replace(_REFERENCE, name='lacking', capabilities=_REFERENCE.capabilities\n"
    f"                    - {{'kernels', *{LACKING!r}}})\n")

#: scenario -> the lacking capability it must skip for.
SKIPPED = {
    "in_flight_tokens_hold_a_window_of_one": "async_scheduling",
    "in_flight_tokens_hold_a_window_through_the_gates": "async_scheduling",
    "cross_attention_reserved_blocks": "caching_off",
    "cross_attention_window_external_tokens": "caching_off",
    "eagle_drops_again_after_another_group_cuts_the_hit": "evict_blocks",
    "eagle_drops_once_per_candidate": "evict_blocks",
    "full_scan_stops_at_an_evicted_block": "evict_blocks",
    "partial_probe_stays_inside_the_missed_block": "evict_blocks",
}
#: scenario -> the profile it was recorded under, when not the run's (not applicable here).
OTHER_PROFILE = {sc.name: sc.profile for sc in HYBRID_EDGE_SCENARIOS
                 if sc.profile != "vllm-0.33"}


def test_each_scenario_skips_naming_what_it_needs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(lacking_impl=SOURCE)
    pytester.syspathinsert()
    ini = pytester.makeini("[pytest]\n")
    rec = pytester.inline_run("--kv-impl=lacking_impl", "--kv-profile=vllm-0.33",
                              "-k", "hybrid_edge_golden", "-p", "no:cacheprovider",
                              "-p", "no:terminal", "-c", str(ini),
                              str(SUITE / "test_edge_cases.py"))
    passed, skipped, failed = rec.listoutcomes()
    assert not failed, [r.nodeid for r in failed]

    def scenario(report: pytest.TestReport) -> str:
        return report.nodeid.rsplit("-", 1)[-1].rstrip("]")

    reasons = {scenario(r): str(r.longrepr) for r in skipped}
    assert set(reasons) == set(SKIPPED) | set(OTHER_PROFILE), sorted(reasons)
    for name, capability in SKIPPED.items():
        assert capability in reasons[name], (name, reasons[name])
    for name, profile in OTHER_PROFILE.items():
        assert profile in reasons[name], (name, reasons[name])
    # Everything else ran: the gates without tokens in flight need no async_scheduling.
    assert {scenario(r) for r in passed} == (
        {sc.name for sc in HYBRID_EDGE_SCENARIOS} - set(SKIPPED) - set(OTHER_PROFILE))
