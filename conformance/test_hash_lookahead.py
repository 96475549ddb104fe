"""Hash lookahead (capability ``hash_lookahead``, ``KVCacheSpec.num_hash_lookahead_tokens``;
docs/semantics.md#request-block-hashes): vLLM 0.33 hashes a block only once the ``L`` tokens
after it exist, with them in its key, so it is cached and hit only then; its ``BlockStored``
lists them (``lookahead_token_ids``) and a Mamba group's prompt boundary leaves them after it.
Each golden scenario's answers, events and copies are vLLM 0.33.0's own
(``kvcheck.conformance.hash_lookahead_golden``). The random workloads of the differential and
law tests draw ``num_hash_lookahead_tokens`` too, for implementations declaring the capability
(``run_workload_machine(features={"hash_lookahead", ...})``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.golden_answers import assert_free_queue, skip_unless_declared
from kvcheck.conformance.hash_lookahead_golden import LOOKAHEAD_SCENARIOS, LookaheadScenario
from kvcheck.conformance.protocol import (
    KVCacheGroupSpec,
    KVCacheSpec,
    UnsupportedSpec,
    effective_capabilities,
)

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle

CAPABILITY = "hash_lookahead"


def _stored(events: list[dict[str, object]]) -> list[tuple[object, ...]]:
    """The ``BlockStored`` events as the scenarios record them: ``(group_idx, number of
    blocks, token_ids, lookahead_token_ids)``, sequences as tuples."""
    out: list[tuple[object, ...]] = []
    for e in events:
        if e["type"] != "BlockStored":
            continue
        lookahead = e.get("lookahead_token_ids")
        hashes = e["block_hashes"]
        tokens = e["token_ids"]
        assert isinstance(hashes, (list, tuple)) and isinstance(tokens, (list, tuple))
        out.append((e.get("group_idx", 0), len(hashes), tuple(tokens),
                    None if lookahead is None else tuple(
                        tuple(t) for t in lookahead)))  # type: ignore[attr-defined]
    return out


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability(CAPABILITY)
@pytest.mark.parametrize("sc", LOOKAHEAD_SCENARIOS, ids=lambda sc: sc.name)
def test_hash_lookahead_golden(kv_impl: ImplHandle, kv_pair: PairFactory, kv_profile: str,
                               sc: LookaheadScenario) -> None:
    """Each op's answer with ``num_hash_lookahead_tokens=L`` as vLLM 0.33.0's own
    ``KVCacheManager`` and request hasher gave it (a block hit only once its ``L`` lookahead
    tokens exist and equal; an image in the lookahead tokens in the block's key; a Mamba state
    kept ``max(1, L)`` tokens before the prompt's end, rounded to the hash block), the copies
    drained and the free queue after the last op, and, with ``events``, every ``BlockStored``
    with its ``lookahead_token_ids``."""
    caps = effective_capabilities(kv_impl.info, kv_profile)  # extra_keys: multimodal too
    skip_unless_declared(kv_impl, sc.needs, capabilities=caps)
    events = kv_impl.has("events")
    spec = KVCacheSpec(num_blocks=sc.num_blocks, block_size=4, profile=kv_profile,
                       num_hash_lookahead_tokens=sc.lookahead, kv_cache_groups=sc.groups,
                       enable_kv_cache_events=events)
    if not kv_impl.info.supports(spec):
        pytest.skip(f"{kv_impl.name} does not support this scenario's pool (IMPL_INFO."
                    "block_sizes, num_blocks_range)")
    # No oracle: the comparison with it would drain the events this test reads.
    pair = kv_pair(spec, with_oracle=False)
    stored: list[tuple[object, ...]] = []
    for i, (op, want) in enumerate(zip(sc.ops, sc.recorded.answers, strict=True)):
        got = pair.apply(op)
        assert got == want, (
            f"{sc.name} ({sc.why}), op #{i + 1} {op}: answered {got}, vLLM 0.33.0 {want} "
            "(hits and new block ids per group, 0 the null block; new None: refused)\n"
            + pair.impl.snippet())
        if events:
            stored.extend(_stored(pair.impl.manager.take_events()))
    if events:
        assert tuple(stored) == sc.recorded.stored, (
            f"{sc.name} ({sc.why}): BlockStored events (group, blocks, token_ids, "
            f"lookahead_token_ids) {stored}, vLLM 0.33.0 {list(sc.recorded.stored)}\n"
            + pair.impl.snippet())
    assert tuple(pair.impl.drained) == sc.recorded.copies, (
        f"{sc.name}: copies drained {pair.impl.drained}, vLLM {list(sc.recorded.copies)}\n"
        + pair.impl.snippet())
    assert_free_queue(pair, sc.name, sc.recorded.free_queue)


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability(CAPABILITY)
@pytest.mark.parametrize(("case", "fields", "rule"), [
    ("caching_off", {"enable_caching": False}, "enable_caching"),
    ("with_use_eagle", {"use_eagle": True}, "use_eagle"),
])
def test_hash_lookahead_combinations_vllm_never_makes_are_refused(
        kv_impl: ImplHandle, kv_profile: str, case: str, fields: dict[str, bool],
        rule: str) -> None:
    """Hash lookahead is refused where vLLM's config and scheduler never pass it: with
    caching off (``VllmConfig.num_hash_lookahead_tokens`` is 0 then) and with ``use_eagle``
    (the scheduler passes ``use_eagle=False`` whenever it hashes with lookahead): building the
    manager raises (``UnsupportedSpec`` or a misuse error) naming the field."""
    spec = KVCacheSpec(num_blocks=17, block_size=4, profile=kv_profile,
                       num_hash_lookahead_tokens=1,
                       enable_caching=fields.get("enable_caching", True),
                       use_eagle=fields.get("use_eagle", False))
    with pytest.raises(Exception) as refused:  # noqa: PT011 - the message is checked below
        kv_impl.make_manager(spec)
    text = str(refused.value)
    assert "num_hash_lookahead_tokens" in text and rule in text, (
        f"{kv_impl.name} refused hash lookahead {case} without naming it "
        f"(num_hash_lookahead_tokens and {rule}): {type(refused.value).__name__}: {text}")


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability(CAPABILITY, "sliding_window")
def test_hash_lookahead_past_one_beside_one_window_is_refused(kv_impl: ImplHandle,
                                                             kv_profile: str) -> None:
    """A layout without a full-attention group (here one sliding window) with
    ``num_hash_lookahead_tokens=2`` and caching on is declined (``UnsupportedSpec``) naming
    vLLM 0.33.0's crash: its coordinators search the first group up to ``num_tokens - 1``
    tokens, past the request's last lookahead hash, and
    ``SlidingWindowManager.find_longest_cache_hit`` indexes the missing hashes (IndexError on
    a 2-token request's first lookup; a full-attention group, searched first, stops at the
    hashes and caps the others). ``L = 1`` runs: it never searches past the hashes."""
    window = (KVCacheGroupSpec("sliding_window", 4, sliding_window=8),)
    spec = KVCacheSpec(num_blocks=17, block_size=4, profile=kv_profile, kv_cache_groups=window,
                       num_hash_lookahead_tokens=2)
    with pytest.raises(UnsupportedSpec) as refused:
        kv_impl.make_manager(spec)
    assert "IndexError" in str(refused.value), (
        f"{kv_impl.name} declined hash lookahead 2 beside one window without naming vLLM's "
        f"IndexError: {refused.value}")
    kv_impl.make_manager(KVCacheSpec(num_blocks=17, block_size=4, profile=kv_profile,
                                     kv_cache_groups=window, num_hash_lookahead_tokens=1))
