"""The random workloads (``kvcheck.conformance.workload_machine``) reach every feature they
count, stay within what an implementation declares, and catch the bug the old workloads
missed: ``allocate_slots`` caching lookahead slots during a chunked prefill.

The feature runs use the reference on both sides, derandomized; 100 examples leave a wide
margin (each feature is reached in 40), so the verdict does not hang on which examples
Hypothesis happens to draw in this process.
"""

from __future__ import annotations

import ast
import gc
import types
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from harness_fakes import FakeManager
from hypothesis import HealthCheck, Phase, settings
from kv_helpers import reference_capabilities

from kvcheck.adapters.reference import IMPL_INFO as REFERENCE_INFO
from kvcheck.adapters.reference import ReferenceManager
from kvcheck.conformance.differential import ConformanceMismatch, Pair
from kvcheck.conformance.driver import Driver
from kvcheck.conformance.groups import null_of
from kvcheck.conformance.loader import ImplHandle, load_impl
from kvcheck.conformance.ops import Op, add, decode, schedule
from kvcheck.conformance.protocol import (
    DESIGN_CAPABILITIES,
    HASH_ALGOS,
    ImplInfo,
    KVCacheGroupSpec,
    KVCacheSpec,
    RequestView,
)
from kvcheck.conformance.workload_machine import (
    FEATURES,
    answer_block_ids,
    run_workload_machine,
    workload_hash_algos,
)
from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


def _settings(max_examples: int, shrink: bool = True) -> settings:
    phases = (Phase.generate, Phase.shrink) if shrink else (Phase.generate,)
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    phases=phases, suppress_health_check=list(HealthCheck), print_blob=False)


def _run(impl: ImplHandle, oracle: ImplHandle | None, profile: str, *, examples: int,
         extras: bool = True, random_roots: bool = False, shrink: bool = True,
         group_kinds: Sequence[str] = (), specs: list[KVCacheSpec] | None = None,
         ) -> Counter[str]:
    """Run the machine on ``impl`` (against ``oracle``) under ``profile`` (multi-group
    layouts of ``group_kinds``; each engine's spec appended to ``specs``); the features."""
    stats: Counter[str] = Counter()

    def make(**fields: Any) -> Pair:
        spec = KVCacheSpec(profile=profile, **fields)
        if specs is not None:
            specs.append(spec)
        return Pair(impl, oracle, spec)

    run_workload_machine(make, _settings(examples, shrink), None, extras=extras, events=True,
                         impl=impl, profile=profile, stats=stats, random_roots=random_roots,
                         group_kinds=group_kinds)
    return stats


# ---------------------------------------------------------------------- every feature reached
@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_a_short_derandomized_run_reaches_every_feature(profile: str) -> None:
    reference = load_impl("reference")
    stats = _run(reference, reference, profile, examples=100)
    # vLLM 0.10.2 offers only the sha256 pair, and its NONE_HASH with PYTHONHASHSEED unset is
    # random per manager, so a differential run never leaves it unset there.
    absent = ({"hash_algo:xxhash", "hash_algo:xxhash_cbor", "pythonhashseed_unset"}
              if profile == "vllm-0.10" else set())
    missing = [f for f in FEATURES if f not in absent and not stats[f]]
    assert not missing, f"{profile}: features never reached: {missing}; counts {dict(stats)}"
    assert not [f for f in absent if stats[f]], f"{profile}: reached what it lacks: {stats}"


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_multi_group_layouts_reach_the_block_level_features(profile: str) -> None:
    """The same machine over multi-group layouts (every kind the reference declares), against
    the reference: every engine has ``kv_cache_groups``, several groups in most, and the
    machine's per-group reading of the answers still sees hits, blocks shared and evicted,
    a full pool, refusals, preemption and hits on evicted-and-reused blocks."""
    reference = load_impl("reference")
    specs: list[KVCacheSpec] = []
    stats = _run(reference, reference, profile, examples=40, shrink=False, specs=specs,
                 group_kinds=("full_attention", "sliding_window", "chunked_local_attention"))
    assert specs and all(s.kv_cache_groups for s in specs)
    assert sum(len(s.kv_cache_groups) > 1 for s in specs) > len(specs) // 2
    reached = ("prefix_hit", "shared_block_hit", "full_pool", "allocation_refused",
               "cached_block_evicted", "touch_free_queue_tail", "preempt_resume",
               "hit_on_evicted_and_reused_block")
    missing = [f for f in reached if not stats[f]]
    assert not missing, (missing, dict(stats))


def test_answers_are_read_per_group() -> None:
    """``answer_block_ids``: the groups' lists joined in group order; the null block (0) left
    out on a multi-group spec only (a single-group spec's block 0 may be real, under
    ``generic``): its one list is the answer as it is."""
    grouped = KVCacheSpec(16, 4, kv_cache_groups=(
        KVCacheGroupSpec(), KVCacheGroupSpec("sliding_window", sliding_window=4)))
    single = KVCacheSpec(16, 4, profile="generic")
    assert answer_block_ids([[3, 0, 5], [0, 0], [7]], null_of(grouped)) == [3, 5, 7]
    assert answer_block_ids([[0, 1, 2]], null_of(single)) == [0, 1, 2]
    assert answer_block_ids([[]], null_of(single)) == answer_block_ids([], None) == []


def test_laws_only_runs_leave_the_hash_seed_unset_where_the_root_is_random() -> None:
    """Without an oracle nothing compares hashes across managers: vllm-0.10's random
    NONE_HASH (PYTHONHASHSEED unset) is exercised too."""
    stats = _run(load_impl("reference"), None, "vllm-0.10", examples=40, random_roots=True)
    assert stats["pythonhashseed_unset"] > 0, dict(stats)


@pytest.mark.parametrize(("declared", "profile", "expected"), [
    (tuple(HASH_ALGOS), "vllm-0.33", HASH_ALGOS),  # sha256 first: what shrinking favours
    (tuple(HASH_ALGOS), "vllm-0.10", ("sha256", "sha256_cbor")),  # all 0.10.2 offers
    ((), "vllm-0.33", ("sha256",)),  # its own hashing: the field is ignored
    (("xxhash", "sha256_cbor"), "vllm-0.33", ("sha256_cbor", "xxhash")),
    (("xxhash",), "generic", ("xxhash",)),
])
def test_hash_algorithms_drawn(declared: tuple[str, ...], profile: str,
                               expected: Sequence[str]) -> None:
    info = ImplInfo(name="x", version="0", capabilities=frozenset({"manager"}),
                    profile="vllm-0.33", hash_algos=declared)
    assert workload_hash_algos(info, profile) == tuple(expected)


# ---------------------------------------------------------------------- nothing kept after a run
def _machine_classes_alive() -> list[type]:
    gc.collect()
    # type(o), not isinstance: that reads o.__class__, which some modules' objects (Torch's
    # deprecated aliases) answer with a warning.
    return [o for o in gc.get_objects() if issubclass(type(o), type)
            and o.__qualname__ == "run_workload_machine.<locals>.KVWorkload"]


def test_a_run_leaves_its_machine_class_to_the_collector() -> None:
    # Each run makes a machine class whose rules close over its pairs and settings; Hypothesis
    # caches per class (its rules, its sorted rule strategy). Kept, a conformance run would
    # keep every workload test's class, implementation and, in pytest, session alive.
    # Compared by identity, not counted: an LRU cache kept full by earlier runs would evict
    # one class for the new one and keep the count. Holding the earlier ones here keeps their
    # addresses from being reused.
    reference = load_impl("reference")
    before = _machine_classes_alive()
    _run(reference, reference, "vllm-0.33", examples=3)
    new = [c for c in _machine_classes_alive() if not any(c is b for b in before)]
    assert not new, "the run's machine class is still alive"


# ---------------------------------------------------------------------- undeclared: never used
class _Recorder(FakeManager):
    """A correct fake that records what the workloads asked of it."""

    seen: ClassVar[Counter[str]] = Counter()  # reset by each test

    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        self.seen[f"hash_algo:{spec.hash_algo}"] += 1
        self.seen["caching_off" if not spec.enable_caching else "caching_on"] += 1

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        if num_lookahead_tokens:
            self.seen["lookahead"] += 1
        if request.skip_reading_prefix_cache:
            self.seen["skip_read"] += 1
        return super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                      new_computed_block_ids, num_lookahead_tokens)

    def reset_prefix_cache(self) -> bool:
        self.seen["reset"] += 1
        return super().reset_prefix_cache()


def _recorder(caps: frozenset[str]) -> ImplHandle:
    info = ImplInfo(name="recorder", version="0", capabilities=caps, profile="generic",
                    hash_algos=())
    return ImplHandle(name="recorder", target="harness_fakes", module=types.ModuleType("r"),
                      info=info, factory=_Recorder, pool_factory=None, call_timeout=None)


def _decode_sizes(ops: Sequence[Op]) -> set[int]:
    return {op["num_tokens"] for op in ops if op["op"] == "decode"}


@pytest.mark.parametrize("declared", [False, True], ids=["undeclared", "declared"])
def test_design_features_follow_the_declared_capabilities(declared: bool) -> None:
    """Under ``generic`` a design feature is exercised only when declared: lookahead slots,
    resets, caching off, prompt-logprobs requests and multi-token decode steps. Declared, each
    is exercised (so the undeclared verdict is not vacuous)."""
    base = frozenset({"manager", "prefix_caching", "free_queue_order", "ref_counts"})
    impl = _recorder(base | DESIGN_CAPABILITIES if declared else base)
    _Recorder.seen = Counter()
    pairs: list[Pair] = []

    def make(**fields: Any) -> Pair:
        pairs.append(Pair(impl, None, KVCacheSpec(profile="generic", **fields)))
        return pairs[-1]

    run_workload_machine(make, _settings(40), None, extras=False, events=False, impl=impl,
                         profile="generic")
    seen = _Recorder.seen
    decode_sizes: set[int] = set().union(*(_decode_sizes(p.ops) for p in pairs))
    lookahead_ops = sum(1 for p in pairs for op in p.ops
                        if op["op"] in ("schedule", "decode") and op.get("lookahead"))
    # No hash_algos declared (its own hashing): the field stays at sha256.
    assert [k for k in seen if k.startswith("hash_algo:")] == ["hash_algo:sha256"], dict(seen)
    if declared:
        assert seen["lookahead"] and lookahead_ops and seen["reset"] and seen["caching_off"]
        assert seen["skip_read"] and max(decode_sizes) > 1, (dict(seen), decode_sizes)
    else:
        assert not (seen["lookahead"] or lookahead_ops or seen["reset"] or seen["caching_off"]
                    or seen["skip_read"]), dict(seen)
        assert decode_sizes <= {1}, decode_sizes


# ---------------------------------------------------------------------- the lookahead op
def test_lookahead_reaches_allocate_slots_and_the_repro() -> None:
    impl = _recorder(frozenset({"manager", "prefix_caching"}))
    _Recorder.seen = Counter()
    driver = Driver(impl, KVCacheSpec(num_blocks=8, block_size=4, profile="generic"))
    ops: list[Op] = [add("a", range(10)), schedule("a", 4), schedule("a", 4, lookahead=3),
                     schedule("a", 2), decode("a", 1, lookahead=2)]
    driver.run(ops)
    assert _Recorder.seen["lookahead"] == 2
    calls = [line for line in driver.lines if line.startswith("m.allocate_slots")]
    assert [c.split("  #")[0] for c in calls] == [
        "m.allocate_slots(views['a'], 4, 0, [])",
        "m.allocate_slots(views['a'], 4, 0, [], 3)",
        "m.allocate_slots(views['a'], 2, 0, [])",
        "m.allocate_slots(views['a'], 1, 0, [], 2)",
    ]
    # 4 + 4 computed and 3 slots ahead: 11 slots, three blocks; the decode's 2 slots reach
    # position 12, a fourth block.
    assert [len(ast.literal_eval(c.split("# -> ")[1])) for c in calls] == [1, 2, 0, 1]
    assert schedule("a", 4) == {"op": "schedule", "rid": "a", "num_tokens": 4}  # no field


# ---------------------------------------------------------------------- the bug they now catch
class _LookaheadCachingManager(KVCacheManager):
    """The bug: the lookahead (speculative) slots count as computed tokens to cache, so during
    a chunked prefill a block is cached before its prompt tokens are computed."""

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None = None,
                       num_lookahead_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       ) -> tuple[list[KVCacheBlock], ...] | None:
        new = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                     new_computed_blocks, num_lookahead_tokens,
                                     delay_cache_blocks)
        if new is not None and self.enable_caching:
            computed = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
            self.coordinator.cache_blocks(
                request, min(computed + num_lookahead_tokens, request.num_tokens))
        return new


class _LookaheadCachingAdapter(ReferenceManager):
    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        self.manager.__class__ = _LookaheadCachingManager  # one method differs, no state


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_random_workloads_catch_lookahead_cached_during_chunked_prefill(profile: str) -> None:
    """The suite's differential run (40 derandomized examples) fails this bug on its own;
    the old workloads, with no lookahead op, passed it."""
    info = ImplInfo(name="lookahead-cached", version="0",
                    capabilities=reference_capabilities(),
                    profile=profile, hash_algos=REFERENCE_INFO.hash_algos,
                    reserved_block_ids=REFERENCE_INFO.reserved_block_ids)
    buggy = ImplHandle(name="lookahead-cached", target="reference",
                       module=types.ModuleType("lookahead_cached"), info=info,
                       factory=_LookaheadCachingAdapter, pool_factory=None, call_timeout=None)
    with pytest.raises(ConformanceMismatch):
        _run(buggy, load_impl("reference"), profile, examples=40, extras=False, shrink=False)
