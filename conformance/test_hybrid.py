"""Hybrid models: several KV-cache groups (full attention, sliding window, chunked local
attention) over one block pool (docs/semantics.md#kv-cache-groups-hybrid-models). Runs on
implementations that
declare ``kv_cache_groups`` (and ``sliding_window`` / ``chunked_local_attention`` for groups
of those kinds; a scenario needing an undeclared kind is skipped naming the capability).

* the golden scenarios of docs/semantics.md#kv-cache-groups-hybrid-models for the active vLLM
profile, replayed row by row;
* the laws' group rules (``kvcheck.conformance.laws``: null block, windows, common hit
  length, one shared pool, ownership, all-or-nothing) after every op of random multi-group
  workloads, under every profile, ``generic`` included;
* the differential: the same random workloads on the implementation and on the oracle
  (``--kv-oracle``, the reference by default), every answer and observable compared after
  every op; a failure is shrunk to a short op list, written as a trace under
  ``.kvcheck/repro/`` with a runnable repro.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from kvcheck.conformance.hybrid_golden import SCENARIOS, scenario
from kvcheck.conformance.hybrid_replay import missing_capabilities, replay_golden
from kvcheck.conformance.layouts import declared_kinds
from kvcheck.conformance.protocol import VLLM_PROFILES, effective_capabilities, extra_key_kinds
from kvcheck.conformance.workload_machine import run_workload_machine

if TYPE_CHECKING:
    from hypothesis import settings as Settings

    from kvcheck.conformance.differential import Pair, PairFactory
    from kvcheck.conformance.loader import ImplHandle

pytestmark = pytest.mark.kv_capability("kv_cache_groups")

# Every scenario name of either profile, in the spec's order ("G6'" is 0.10.2's own G6).
_NAMES = list(dict.fromkeys(sc.name for sc in SCENARIOS))


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.parametrize("name", _NAMES, ids=[n.replace("'", "p") for n in _NAMES])
def test_hybrid_golden(kv_impl: ImplHandle, kv_profile: str, name: str) -> None:
    """A golden scenario of docs/semantics.md#kv-cache-groups-hybrid-models replayed row by row:
    answers, block tables, free queue,
    ref counts, events and block hashes as vLLM recorded them."""
    try:
        sc = scenario(kv_profile, name)
    except KeyError:
        pytest.skip(f"golden scenario {name} has no {kv_profile} table (it was recorded "
                    "from the other vLLM release only)")
    missing = missing_capabilities(kv_impl, sc)
    if missing:
        pytest.skip(f"{kv_impl.name} does not declare capability "
                    f"{', '.join(repr(c) for c in missing)} (IMPL_INFO.capabilities)")
    if not kv_impl.info.supports(sc.spec):  # its declared block sizes / pool sizes
        sizes = sorted({sc.spec.group_block_size(g) for g in range(len(sc.spec.groups))})
        pytest.skip(f"{kv_impl.name} does not support this scenario's pool (num_blocks="
                    f"{sc.spec.num_blocks}, group block sizes {sizes}; IMPL_INFO.block_sizes, "
                    "num_blocks_range)")
    replay_golden(kv_impl, sc)


@pytest.mark.kv_generic
def test_hybrid_laws_hold_under_random_workloads(kv_impl: ImplHandle, kv_profile: str,
                                                 kv_pair: PairFactory, kv_settings: Settings,
                                                 kv_seed: int | None) -> None:
    """The hybrid laws hold after every op of random multi-group workloads (chunked prefill,
    decode, frees, re-hits, pool pressure, caching off), with no oracle."""
    caps = effective_capabilities(kv_impl.info, kv_profile)

    def laws_only(**fields: Any) -> Pair:
        return kv_pair(with_oracle=False, **fields)

    run_workload_machine(laws_only, kv_settings, kv_seed, extras=extra_key_kinds(caps),
                         events=False, impl=kv_impl, profile=kv_profile, random_roots=True,
                         group_kinds=declared_kinds(caps))


@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_hybrid_differential(kv_impl: ImplHandle, kv_profile: str, kv_oracle: ImplHandle,
                             kv_pair: PairFactory, kv_settings: Settings,
                             kv_seed: int | None) -> None:
    """Random multi-group workloads behave exactly like the oracle: per-group answers, block
    tables, free count, and the free queue, ref counts, hashes and events where declared."""
    mine = declared_kinds(effective_capabilities(kv_impl.info, kv_profile))
    theirs = set(declared_kinds(effective_capabilities(kv_oracle.info, kv_profile)))
    kinds = [k for k in mine if k in theirs]
    if not kinds:
        pytest.skip(f"the oracle {kv_oracle.name} does not declare capability "
                    "'kv_cache_groups' (--kv-oracle)")
    run_workload_machine(kv_pair, kv_settings, kv_seed, extras=False,
                         events=kv_impl.has("events"), impl=kv_impl, profile=kv_profile,
                         group_kinds=kinds)
