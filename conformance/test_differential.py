"""Differential testing: random workloads on the implementation and on the reference, every
observable compared after every op (block tables, answers, free count, and whatever the
implementation declares: free-queue order, ref counts, hashes, events, slot mapping).

A failure prints a runnable snippet of the shrunk call sequence and writes a JSON trace under
``.kvcheck/repro/`` (``kvcheck replay TRACE --kv-impl=X`` re-runs it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.protocol import VLLM_PROFILES
from kvcheck.conformance.workload_machine import declared_features, run_workload_machine

if TYPE_CHECKING:
    from hypothesis import settings as Settings

    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle


@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_random_workloads_match_reference(kv_impl: ImplHandle, kv_profile: str,
                                          kv_oracle: ImplHandle,
                                          kv_pair: PairFactory, kv_settings: Settings,
                                          kv_seed: int | None) -> None:
    """Random scheduler workloads (no extra keys) behave exactly like the reference (with
    EAGLE's dropped hit block in some engines where both declare ``eagle``)."""
    run_workload_machine(kv_pair, kv_settings, kv_seed, extras=False,
                         events=kv_impl.has("events"), impl=kv_impl, profile=kv_profile,
                         features=declared_features(kv_impl, kv_oracle, (
                             "eagle", "prefill_lookahead", "hash_lookahead",
                             "admission_gates", "async_scheduling", "block_zeroing")))


@pytest.mark.kv_capability("extra_keys")
@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_random_workloads_with_extra_keys_match_reference(kv_impl: ImplHandle, kv_profile: str,
                                                          kv_oracle: ImplHandle,
                                                          kv_pair: PairFactory,
                                                          kv_settings: Settings,
                                                          kv_seed: int | None) -> None:
    """The same with cache salts, LoRA adapters and multimodal items mixed in (with hash
    lookahead in some engines where both declare ``hash_lookahead``: an item in a block's
    lookahead tokens is in its key)."""
    run_workload_machine(kv_pair, kv_settings, kv_seed, extras=True,
                         events=kv_impl.has("events"), impl=kv_impl, profile=kv_profile,
                         features=declared_features(kv_impl, kv_oracle,
                                                    ("hash_lookahead", "admission_gates")))
