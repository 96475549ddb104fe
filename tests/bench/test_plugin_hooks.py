"""The benchmark plugin takes what it needs from the conformance plugin through
kvcheck.plugin.hooks: the profile its records name follows --kv-profile."""

from __future__ import annotations

import pytest

from kvcheck.results.schema import load_records


def test_records_name_the_active_profile(pytester: pytest.Pytester) -> None:
    """vllm-0.10, not the implementation's own claim (vllm-0.33, also the fallback when the
    hook has no answer). Under generic the benchmarks are gated off like the exact tests."""
    profile = "vllm-0.10"
    # A subprocess: the benchmarks import numpy (and torch where installed), which an
    # in-process pytester run would drop from sys.modules when it ends.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kv-impl=reference", f"--kv-profile={profile}",
        "--kv-bench", "--kv-bench-scale=0.03", "--kv-bench-rounds=1", "--kv-bench-warmup=0",
        "-k", "scheduler and burst_short", "--kv-bench-report=r.jsonl")
    result.assert_outcomes(passed=1)
    assert "verdict:" not in result.stdout.str()
    (record,) = load_records(pytester.path / "r.jsonl")
    assert record["profile"] == profile
