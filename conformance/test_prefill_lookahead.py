"""vLLM 0.33's multi-module MTP (capability ``prefill_lookahead``,
``KVCacheSpec.num_prefill_lookahead``; docs/semantics.md#multi-module-mtp): the last ``K - 1``
computed tokens are cached only once more tokens are computed (one group; several: in EAGLE's
groups), every sliding window frees its blocks ``K - 1`` tokens later, and ``K`` above the
scheduler block size with EAGLE and caching on is refused, as vLLM 0.33.0's own
``KVCacheManager`` does (``kvcheck.conformance.mtp_golden``). The random workloads of the
differential and law tests draw ``num_prefill_lookahead`` too, for implementations declaring
the capability (``run_workload_machine(features={"prefill_lookahead", ...})``); the window
law allows the retained blocks (``kvcheck.conformance.groups.null_floor``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.golden_answers import (
    assert_answers,
    assert_free_queue,
    skip_unless_declared,
)
from kvcheck.conformance.mtp_golden import (
    MTP_REFUSALS,
    MTP_SCENARIOS,
    MTPRefusal,
    MTPScenario,
)
from kvcheck.conformance.protocol import KIND_CAPABILITIES, KVCacheSpec, UnsupportedSpec

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle

CAPABILITY = "prefill_lookahead"


def _needs(sc: MTPScenario | MTPRefusal, eagle: bool) -> set[str]:
    """The capabilities the layout needs (besides ``prefill_lookahead``)."""
    needs = {"eagle"} if eagle else set()
    if sc.groups:
        needs |= {"kv_cache_groups", *(KIND_CAPABILITIES[g.kind] for g in sc.groups)}
    return needs


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability(CAPABILITY)
@pytest.mark.parametrize("sc", MTP_SCENARIOS, ids=lambda sc: sc.name)
def test_prefill_lookahead_golden(kv_impl: ImplHandle, kv_pair: PairFactory,
                                  kv_oracle: ImplHandle, sc: MTPScenario) -> None:
    """Each op's answer with ``num_prefill_lookahead`` as vLLM 0.33.0's own ``KVCacheManager``
    gave it (the re-prefillable tail cached later; a window's blocks freed later, its hits
    unchanged; several groups without EAGLE caching to the aligned boundary), the free count
    after each op and the free queue after the last; every op's answers and observables
    also equal the oracle's when it declares ``prefill_lookahead``."""
    skip_unless_declared(kv_impl, _needs(sc, sc.use_eagle))
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, use_eagle=sc.use_eagle,
                   num_prefill_lookahead=sc.lookahead, kv_cache_groups=sc.groups,
                   with_oracle=kv_oracle.has(CAPABILITY))
    where = f"{sc.name} ({sc.why})"
    assert_answers(pair, where, sc.ops, sc.recorded.answers, sc.recorded.num_free)
    assert_free_queue(pair, where, sc.recorded.free_queue)


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability(CAPABILITY, "eagle")
@pytest.mark.parametrize("refusal", MTP_REFUSALS,
                         ids=lambda r: f"{len(r.groups) or 1}_groups_k{r.lookahead}")
def test_prefill_lookahead_past_scheduler_block_is_refused(kv_impl: ImplHandle,
                                                           kv_profile: str,
                                                           refusal: MTPRefusal) -> None:
    """With EAGLE and caching on, ``num_prefill_lookahead`` above the scheduler block size is
    declined (``UnsupportedSpec``) with vLLM 0.33.0's rule in the message (its
    ``KVCacheManager`` raises ValueError: a hit's dropped tail could not hold the lookahead);
    at the scheduler block size, or with caching off, the spec is served."""
    skip_unless_declared(kv_impl, _needs(refusal, True))
    spec = KVCacheSpec(num_blocks=32, block_size=4, profile=kv_profile, use_eagle=True,
                       kv_cache_groups=refusal.groups,
                       num_prefill_lookahead=refusal.lookahead)
    with pytest.raises(UnsupportedSpec) as refused:
        kv_impl.make_manager(spec)
    rule = refusal.message.split(" (=")[0]  # "... requires scheduler_block_size"
    assert rule in str(refused.value) and "num_speculative_tokens" in str(refused.value), (
        f"{kv_impl.name} declined num_prefill_lookahead={refusal.lookahead} without naming "
        f"vLLM's rule ({refusal.message!r}): {refused.value}")
    kv_impl.make_manager(KVCacheSpec(num_blocks=32, block_size=4, profile=kv_profile,
                                     use_eagle=True, kv_cache_groups=refusal.groups,
                                     num_prefill_lookahead=refusal.lookahead - 1))
    if kv_impl.has("caching_off"):
        kv_impl.make_manager(KVCacheSpec(num_blocks=32, block_size=4, profile=kv_profile,
                                         use_eagle=True, enable_caching=False,
                                         kv_cache_groups=refusal.groups,
                                         num_prefill_lookahead=refusal.lookahead))
