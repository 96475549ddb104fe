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
  ``.kvcheck/repro/`` with a runnable repro;
* the hit length iterated to a fixed point over three or more attention kinds (vLLM 0.33):
  shrunk workloads where a second (or third) round over the groups cuts the hit further
  (``hybrid_fixed_point``);
* encoder-decoder models (vLLM 0.33 and 0.10.2): a cross-attention group sized by the encoder
  tokens of the step that admits the request, decode steps leaving it alone, nothing cached,
  freed with the request (``hybrid_cross_attention``), and the layouts vLLM refuses for it
  (prefix caching on) refused by name;
* Mamba (state-space) groups (vLLM 0.33's modes "align" and "none", 0.10.2's): a state per
  request, tables not append-only (nulls returned among the new blocks, speculative blocks
  relocated), a hit refused while its block was cached in the same scheduler step
  (``new_step_starts``; ``hybrid_mamba``), and the Mamba layouts vLLM refuses refused by name;
* admission at the free-block boundary: a sliding-window group's prefix hits that sit in the
  free queue consume free blocks (docs/semantics.md#kv-cache-groups-hybrid-models), so a
  request fits a pool of exactly its count and is refused by one block fewer;
* partial-block keys (vLLM 0.33): a full-attention group larger than the hash block keys the
  block holding the prompt's last hash boundary, seen in the KV events
  (``hybrid_partial_keys``, docs/semantics.md#partial-block-keys).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from kvcheck.conformance.boundary_offloads import CAPABILITY as OFFLOADS
from kvcheck.conformance.golden_answers import (
    assert_answers,
    assert_free_queue,
    skip_unless_declared,
)
from kvcheck.conformance.groups import NULL_BLOCK
from kvcheck.conformance.hybrid_boundary_offloads import MISSING_010 as OFFLOADS_MISSING_010
from kvcheck.conformance.hybrid_boundary_offloads import OFFLOAD_SCENARIOS, OffloadScenario
from kvcheck.conformance.hybrid_cross_attention import (
    CROSS_ATTENTION_SCENARIOS,
    NO_CALL,
    CrossAttentionScenario,
)
from kvcheck.conformance.hybrid_fine_grained import (
    FINE_GRAINED_SCENARIOS,
    MISSING_010,
    FineGrainedScenario,
)
from kvcheck.conformance.hybrid_fixed_point import FIXED_POINT_SCENARIOS, FixedPointScenario
from kvcheck.conformance.hybrid_golden import SCENARIOS, scenario
from kvcheck.conformance.hybrid_knobs import (
    KNOB_REFUSALS,
    KNOB_SCENARIOS,
    KnobRefusal,
    KnobScenario,
    knob_spec,
)
from kvcheck.conformance.hybrid_mamba import MAMBA_SCENARIOS, MambaScenario
from kvcheck.conformance.hybrid_mamba_checkpoints import (
    CHECKPOINT_SCENARIOS,
    CheckpointScenario,
)
from kvcheck.conformance.hybrid_mamba_checkpoints import MISSING_010 as CHECKPOINTS_MISSING_010
from kvcheck.conformance.hybrid_partial_keys import (
    PARTIAL_KEY_SCENARIOS,
    PartialKeyScenario,
    show_events,
)
from kvcheck.conformance.hybrid_replay import needed_capabilities, replay_golden
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.layouts import declared_kinds
from kvcheck.conformance.mamba_checkpoints import CAPABILITY as CHECKPOINTS
from kvcheck.conformance.ops import add, decode, free, schedule
from kvcheck.conformance.pinning import CAPABILITY as PINNING
from kvcheck.conformance.pinning import release_after_lookup
from kvcheck.conformance.protocol import (
    KIND_CAPABILITIES,
    VLLM_PROFILES,
    KVCacheGroupSpec,
    KVCacheSpec,
    RequestView,
    UnsupportedSpec,
    effective_capabilities,
    extra_key_kinds,
)
from kvcheck.conformance.workload_machine import declared_features, run_workload_machine

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
    skip_unless_declared(kv_impl, needed_capabilities(sc),
                         capabilities=effective_capabilities(kv_impl.info, sc.profile))
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

    def laws_only(**fields: object) -> Pair:
        return kv_pair(with_oracle=False, **fields)

    run_workload_machine(laws_only, kv_settings, kv_seed, extras=extra_key_kinds(caps),
                         events=False, impl=kv_impl, profile=kv_profile, random_roots=True,
                         group_kinds=declared_kinds(caps), features=declared_features(kv_impl))


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
                         group_kinds=kinds, features=declared_features(kv_impl, kv_oracle))


# --- every layout vLLM accepts is accepted ---------------------------------------------------
@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_every_layout_vllm_accepts_is_accepted(kv_impl: ImplHandle, kv_profile: str,
                                               kv_oracle: ImplHandle) -> None:
    """Every multi-group layout the random workloads draw for the declared kinds, that the
    oracle (vLLM's rules) builds, the implementation builds too: a factory declining one
    (``UnsupportedSpec``) is skipped by the random workloads (they draw another spec), so a
    declined layout would go unchecked, and the run would still conform. At stake most: groups
    whose block sizes differ (one at twice another's), where 0.33 hashes at their gcd."""
    from kvcheck.conformance.driver import Driver
    from kvcheck.conformance.layouts import hybrid_layouts
    from kvcheck.conformance.workload_machine import spec_fields

    kinds = declared_kinds(effective_capabilities(kv_impl.info, kv_profile))
    layouts = hybrid_layouts(kv_profile, kinds)
    built, declined = [], []
    # Draws 8.. cover every layout of the table with several windows and chunk sizes.
    for draw in range(8, 8 + 3 * len(layouts)):
        fields = spec_fields(draw, 4, group_kinds=kinds, profile=kv_profile,
                             enable_kv_cache_events=kv_impl.has("events"))
        spec = KVCacheSpec(profile=kv_profile, **fields)
        if not kv_impl.info.supports(spec):
            continue  # sizes the implementation does not declare
        try:
            Driver(kv_oracle, spec)
        except UnsupportedSpec:
            continue  # vLLM refuses this layout too
        try:
            Driver(kv_impl, spec)
        except UnsupportedSpec as exc:
            declined.append(f"{[(g.kind, g.block_size) for g in spec.kv_cache_groups]}: {exc}")
        built.append(spec)
    if not built:
        pytest.skip(f"no drawn layout of {kinds} fits the sizes {kv_impl.name} declares")
    assert not declined, (
        f"{kv_impl.name} declines {len(declined)} of {len(built)} layouts that "
        f"{kv_oracle.name} builds under {kv_profile}: " + "; ".join(declined[:4]))


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("sliding_window")
def test_groups_of_one_spec_are_searched_together(kv_pair: PairFactory) -> None:
    """Two full-attention groups of one spec (and a window): vLLM looks groups of equal specs
    up together, one search giving one hit list per group, so both hold the whole hit."""
    groups = (KVCacheGroupSpec("full_attention", 4), KVCacheGroupSpec("full_attention", 4),
              KVCacheGroupSpec("sliding_window", 4, sliding_window=8))
    pair = kv_pair(num_blocks=24, block_size=4, kv_cache_groups=groups)
    prompt = list(range(1, 21))
    pair.run([add("warm", prompt[:16]), schedule("warm"), free("warm"), add("a", prompt)])
    got = pair.apply(schedule("a"))
    per_group, num_hit = got["hits"]
    assert num_hit == 16 and [len(g) for g in per_group] == [4, 4, 4], (
        f"'a' hits the 16 tokens 'warm' cached, 4 blocks in each group: {got['hits']}\n"
        + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("sliding_window")
def test_a_window_step_needing_no_block_runs_in_a_full_pool(kv_pair: PairFactory) -> None:
    """One sliding-window group, no free block left: a running request's decode that fits
    in its last block needs no block and runs (vLLM 0.33 clamps a running request's count
    at 0; 0.10.2's formula gives 0)."""
    groups = (KVCacheGroupSpec("sliding_window", 4, sliding_window=8),)
    pair = kv_pair(num_blocks=8, block_size=4, kv_cache_groups=groups)
    # 'r' holds 2 blocks, 2 slots free in the last; 'hog' takes the other 5.
    pair.run([add("r", list(range(1, 7))), schedule("r"),
              add("hog", list(range(100, 120))), schedule("hog")])
    assert pair.impl.manager.num_free_blocks() == 0
    got = pair.apply(decode("r"))
    assert got["new"] == [[]], (
        f"a decode inside the window's last block, full pool: {got['new']} (None: refused)"
        "\n" + pair.impl.snippet())


_ONE_TOKEN_WINDOW_LAYOUTS = {
    "window-alone": (KVCacheGroupSpec("sliding_window", 1, sliding_window=8),),
    "full-and-window": (KVCacheGroupSpec("full_attention", 1),
                        KVCacheGroupSpec("sliding_window", 1, sliding_window=8)),
}


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("prefix_caching", "sliding_window")
@pytest.mark.parametrize("layout", list(_ONE_TOKEN_WINDOW_LAYOUTS))
def test_sparse_retention_keeps_no_block_without_a_shared_prefix(kv_pair: PairFactory,
                                                                 layout: str) -> None:
    """0.33's ``prefix_cache_retention_interval=0`` at one-token blocks: a window of 8 keeps
    only the 7 blocks a replay of the prompt resumes from (before its last boundary). A
    request whose lookup found nothing has no shared-prefix boundary (0, not 1), so the
    window's first block is not kept: a later prompt sharing the first two tokens hits
    nothing."""
    pair = kv_pair(num_blocks=64, block_size=1,
                   kv_cache_groups=_ONE_TOKEN_WINDOW_LAYOUTS[layout],
                   prefix_cache_retention_interval=0)
    prompt = list(range(1, 20))
    pair.run([add("a", prompt), schedule("a"), free("a"),
              add("b", [*prompt[:2], 100, 101, 102, 103])])
    got = pair.apply(schedule("b"))
    assert got["hits"][1] == 0, (
        f"'b' shares 2 tokens with 'a', whose window kept only blocks 11-17: it hits "
        f"{got['hits'][1]} tokens, vLLM 0.33.0 none\n" + pair.impl.snippet())


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("prefix_caching", "sliding_window", "chunked_local_attention")
def test_without_full_attention_the_groups_are_searched_in_their_order(
        kv_pair: PairFactory) -> None:
    """A window (of 4) beside chunked local attention (chunks of 4), one-token blocks,
    ``prefix_cache_retention_interval=0``, no full-attention group: vLLM 0.33 searches the
    groups in their order, so for 'b' (which extends 'a') the window's 9-token hit comes
    first and no uncached shared prefix is seen. Searched the other way round, the chunked
    group's finished chunks (16 tokens) would make 16 a shared-prefix boundary whose tail the
    window keeps, and 'c', sharing 16 tokens with 'b', would hit all of them; in vLLM it hits
    the 9 tokens of the window's only kept tail, 'a''s."""
    groups = (KVCacheGroupSpec("sliding_window", 1, sliding_window=4),
              KVCacheGroupSpec("chunked_local_attention", 1, attention_chunk_size=4))
    pair = kv_pair(num_blocks=96, block_size=1, kv_cache_groups=groups,
                   prefix_cache_retention_interval=0)
    a = list(range(1, 11))
    b = [*a, *range(11, 21)]
    pair.run([add("a", a), schedule("a"), free("a"), add("b", b)])
    got = pair.apply(schedule("b"))
    assert got["hits"][1] == 9, f"'b' hits the window's tail of 'a' (9 tokens): {got['hits']}"
    pair.run([free("b"), add("c", [*b[:16], 900, 901])])
    got = pair.apply(schedule("c"))
    assert got["hits"][1] == 9, (
        f"'c' hits {got['hits'][1]} tokens, vLLM 0.33.0 9 (the window kept no tail at 16: "
        "'b' saw no shared prefix)\n" + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("chunked_local_attention")
def test_chunked_local_hits_inside_the_current_chunk(kv_pair: PairFactory) -> None:
    """One chunked-local group (chunks of 4 blocks of 4 tokens): a prompt within its first
    chunk hits the cached blocks of that chunk, in table order (the search walks the current
    chunk from its start and stops at the first miss)."""
    groups = (KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=16),)
    pair = kv_pair(num_blocks=12, block_size=4, kv_cache_groups=groups)
    prompt = list(range(1, 15))
    pair.run([add("warm", prompt[:12]), schedule("warm")])
    warm = pair.impl.tables()["warm"][0]
    pair.run([free("warm"), add("a", prompt)])
    got = pair.apply(schedule("a"))
    (hits,), num_hit = got["hits"]
    assert num_hit == 12 and hits == warm, (
        f"'a' hits the 3 blocks 'warm' cached, in order {warm}: {got['hits']}\n"
        + pair.impl.snippet())


# --- the hit length's fixed point (0.33) ------------------------------------------------------
@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.parametrize("sc", FIXED_POINT_SCENARIOS, ids=lambda sc: sc.name)
def test_hit_length_iterates_to_a_fixed_point(kv_impl: ImplHandle, kv_pair: PairFactory,
                                              sc: FixedPointScenario) -> None:
    """With three or more attention kinds, the first round over the groups may agree on a
    length a later group then cuts; every group is searched again at the shorter length until
    none cuts it (vLLM 0.33's ``find_longest_cache_hit``). At the last op of each scenario one
    round says ``sc.one_round`` tokens, two rounds ``sc.two_rounds``, vLLM 0.33.0
    ``sc.hit_tokens``; every op's answers and observables equal the oracle's."""
    caps = effective_capabilities(kv_impl.info, "vllm-0.33")
    skip_unless_declared(kv_impl, (KIND_CAPABILITIES[g.kind] for g in sc.groups),
                         capabilities=caps)
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, kv_cache_groups=sc.groups)
    *setup, last = sc.ops
    pair.run(setup)
    got = pair.apply(last)
    hit = got["hits"][1]
    rounds = {sc.one_round: "one round", sc.two_rounds: "two rounds"}.get(hit)
    assert hit == sc.hit_tokens, (
        f"{sc.name} ({sc.why}): the last request hits {hit} tokens, vLLM 0.33.0 "
        f"{sc.hit_tokens}" + (f" (what {rounds} over the groups give: the search must be "
                              "repeated while a group cuts the length)" if rounds else ""))


# --- encoder-decoder models: cross attention --------------------------------------------------
@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("cross_attention")
@pytest.mark.parametrize("sc", CROSS_ATTENTION_SCENARIOS, ids=lambda sc: sc.name)
def test_cross_attention_golden(kv_impl: ImplHandle, kv_pair: PairFactory, kv_profile: str,
                                sc: CrossAttentionScenario) -> None:
    """An encoder-decoder model's groups (docs/semantics.md#cross-attention-groups): each op's
    ``allocate_slots`` answer as vLLM's own ``KVCacheManager`` gave it (the cross-attention
    group sized by ``num_encoder_tokens`` at admission only), and the free queue after the
    last op; every op's answers and observables also equal the oracle's."""
    if kv_profile not in sc.answers:
        pytest.skip(f"{sc.name} has no {kv_profile} table: {sc.missing[kv_profile]}")
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=2, enable_caching=False,
                   kv_cache_groups=sc.groups)
    for i, (op, want) in enumerate(zip(sc.ops, sc.answers[kv_profile], strict=True)):
        got = pair.apply(op)
        answer = got.get("new", NO_CALL)
        assert answer == want, (
            f"{sc.name} ({sc.why}), op #{i + 1} {op}: allocate_slots answered {answer}, vLLM "
            f"{kv_profile.removeprefix('vllm-')} {want} (new block ids per group, None: "
            "refused)")
    if "free_queue_order" in pair.impl.capabilities:
        queue = tuple(pair.impl.manager.free_block_ids())
        assert queue == sc.free_queue[kv_profile], (
            f"{sc.name}: free queue after the last op {list(queue)}, vLLM "
            f"{list(sc.free_queue[kv_profile])} (each group's blocks freed in group order, its "
            "table reversed)")


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("cross_attention")
def test_cross_attention_with_prefix_caching_is_refused(kv_impl: ImplHandle,
                                                        kv_profile: str) -> None:
    """A cross-attention group with prefix caching on is a layout vLLM never runs (it turns
    caching off for encoder-decoder models, and its ``CrossAttentionManager`` raises on a
    lookup): the factory declines it (``UnsupportedSpec``) naming the rule, never models it
    silently."""
    spec = KVCacheSpec(num_blocks=9, block_size=2, enable_caching=True, profile=kv_profile,
                       kv_cache_groups=_FULL_CROSS_ATTENTION)
    with pytest.raises(UnsupportedSpec) as refused:
        kv_impl.make_manager(spec)
    assert "cach" in str(refused.value), (
        f"{kv_impl.name} declined a cross-attention layout with prefix caching on without "
        f"naming the rule (prefix caching): {refused.value}")


_FULL_CROSS_ATTENTION = (KVCacheGroupSpec("full_attention", 2),
                         KVCacheGroupSpec("cross_attention", 2))


# --- Mamba groups ----------------------------------------------------------------------------
@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("mamba")
@pytest.mark.parametrize("sc", MAMBA_SCENARIOS, ids=lambda sc: sc.name)
def test_mamba_golden(kv_impl: ImplHandle, kv_pair: PairFactory, kv_profile: str,
                      sc: MambaScenario) -> None:
    """Mamba groups (docs/semantics.md#mamba-groups): each op's answer (hits and new block ids
    per group, nulls included) as vLLM's own ``KVCacheManager`` gave it, the driver marking
    the scheduler steps (``new_step_starts``), and the free queue after the last op; every
    op's answers and observables also equal the oracle's."""
    if kv_profile not in sc.answers:
        pytest.skip(f"{sc.name} has no {kv_profile} table: {sc.missing[kv_profile]}")
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, enable_caching=sc.caching,
                   kv_cache_groups=sc.groups)
    source = f"vLLM {kv_profile.removeprefix('vllm-')}"
    assert_answers(pair, f"{sc.name} ({sc.why})", sc.ops, sc.answers[kv_profile], source=source)
    assert_free_queue(pair, sc.name, sc.free_queue[kv_profile], source=source)


def _replay_033_answers(pair: Pair,
                        sc: FineGrainedScenario | CheckpointScenario | OffloadScenario) -> None:
    """Apply a vLLM 0.33 golden scenario's ops; each answer must be the one vLLM gave."""
    assert_answers(pair, f"{sc.name} ({sc.why})", sc.ops, sc.answers, source="vLLM 0.33")


def _assert_033_copies_and_queue(pair: Pair,
                                 sc: FineGrainedScenario | CheckpointScenario) -> None:
    """The copies drained and (``free_queue_order``) the free queue after the last op are
    the scenario's, as vLLM 0.33 gave them."""
    assert tuple(pair.impl.drained) == sc.copies, (
        f"{sc.name} ({sc.why}): copies drained {pair.impl.drained}, vLLM 0.33 "
        f"{list(sc.copies)} ((src, dst) pairs of take_kv_cache_block_copies, in order)\n"
        + pair.impl.snippet())
    assert_free_queue(pair, sc.name, sc.free_queue, source="vLLM 0.33")


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("fine_grained_hits")
@pytest.mark.parametrize("sc", FINE_GRAINED_SCENARIOS, ids=lambda sc: sc.name)
def test_fine_grained_golden(kv_impl: ImplHandle, kv_pair: PairFactory, kv_oracle: ImplHandle,
                             kv_profile: str, sc: FineGrainedScenario) -> None:
    """Fine-grained partial hits (docs/semantics.md#fine-grained-partial-hits): each op's
    answer as vLLM 0.33's own ``KVCacheManager`` gave it (a hit ending inside a block, its
    copy-on-write block first among the new ids, the +1 reservation refusing), every copy the
    driver drained (``take_kv_cache_block_copies``) and the free queue after the last op (the
    retained blocks' release order); every op's answers and observables also equal the
    oracle's when it declares the capability."""
    if kv_profile == "vllm-0.10":
        pytest.skip(f"{sc.name}: {MISSING_010}")
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, kv_cache_groups=sc.groups,
                   with_oracle=kv_oracle.has("fine_grained_hits"))
    _replay_033_answers(pair, sc)
    _assert_033_copies_and_queue(pair, sc)


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("mamba_checkpoints")
@pytest.mark.parametrize("sc", CHECKPOINT_SCENARIOS, ids=lambda sc: sc.name)
def test_mamba_checkpoints_golden(kv_impl: ImplHandle, kv_pair: PairFactory,
                                  kv_oracle: ImplHandle, kv_profile: str,
                                  sc: CheckpointScenario) -> None:
    """Mamba prefill checkpoint blocks and sparse Mamba retention
    (docs/semantics.md#mamba-prefill-checkpoints): each op's answer (the checkpoint block in
    the new ids, hits on it, at its position, retention's misses), every copy drained and the
    free queue after the last op, as vLLM 0.33's own ``KVCacheManager`` gave them; the laws
    hold (the checkpoint block holds the state at its position, ``kvcheck.conformance.
    mamba_checkpoints``) and every op's answers and observables equal the oracle's when it
    declares the capability."""
    if kv_profile == "vllm-0.10":
        pytest.skip(f"{sc.name}: {CHECKPOINTS_MISSING_010}")
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, kv_cache_groups=sc.groups,
                   prefix_cache_retention_interval=sc.retention,
                   with_oracle=kv_oracle.has(CHECKPOINTS))
    _replay_033_answers(pair, sc)
    pair.impl.new_step()
    problems = check_laws(pair.impl)
    assert not problems, f"{sc.name}: " + "; ".join(problems) + "\n" + pair.impl.snippet()
    _assert_033_copies_and_queue(pair, sc)


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("boundary_state_offloads")
@pytest.mark.parametrize("sc", OFFLOAD_SCENARIOS, ids=lambda sc: sc.name)
def test_boundary_state_offloads_golden(kv_impl: ImplHandle, kv_pair: PairFactory,
                                        kv_oracle: ImplHandle, kv_profile: str,
                                        sc: OffloadScenario) -> None:
    """Boundary-state hand-offs (docs/semantics.md#boundary-state-hand-offs): each op's answer,
    every drain of ``take_boundary_state_offloads`` (which block, at which boundary, in which
    order), every partial tail ``finalize_partial_tail_offloads`` handed off before a
    ``free`` and every copy drained, as vLLM 0.33's own ``KVCacheManager`` gave them; the
    hand-off laws hold (``kvcheck.conformance.boundary_offloads``) and, when the oracle
    declares the capability, every op's answers and observables equal its."""
    if kv_profile == "vllm-0.10":
        pytest.skip(f"{sc.name}: {OFFLOADS_MISSING_010}")
    pair = kv_pair(num_blocks=sc.num_blocks, block_size=4, kv_cache_groups=sc.groups,
                   with_oracle=kv_oracle.has(OFFLOADS))
    _replay_033_answers(pair, sc)
    pair.impl.new_step()  # the last step's schedule() ends: its hand-offs are drained
    problems = check_laws(pair.impl)
    assert not problems, f"{sc.name}: " + "; ".join(problems) + "\n" + pair.impl.snippet()
    drains: tuple[tuple[str, tuple[object, ...], tuple[object, ...]], ...] = (
        ("hand-offs drained (take_boundary_state_offloads, non-empty drains in order)",
         tuple(pair.impl.drained_offloads), sc.offloads),
        ("partial tails (finalize_partial_tail_offloads before free, non-empty answers)",
         tuple(pair.impl.finalized_tails), sc.tails),
        ("copies drained (take_kv_cache_block_copies)", tuple(pair.impl.drained), sc.copies))
    for what, seen, recorded in drains:
        assert seen == recorded, (f"{sc.name} ({sc.why}): {what} {list(seen)}, vLLM 0.33 "
                                  f"{list(recorded)}\n" + pair.impl.snippet())


#: profile -> the Mamba layouts its vLLM refuses: (mode, caching, the words the refusal names).
_MAMBA_REFUSED: dict[str, tuple[tuple[str, bool, str], ...]] = {
    "vllm-0.33": (("none", True, "align"),),
    "vllm-0.10": (("align", False, "mamba_cache_mode"), ("none", True, "cach")),
}


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("mamba")
def test_mamba_layouts_vllm_refuses_are_refused(kv_impl: ImplHandle, kv_profile: str) -> None:
    """The Mamba layouts vLLM never runs are declined (``UnsupportedSpec``) naming the rule,
    never modelled silently: 0.33 asserts mode "align" with prefix caching on; 0.10.2's
    ``MambaSpec`` has no mode, and it runs Mamba models with prefix caching off."""
    for mode, caching, words in _MAMBA_REFUSED[kv_profile]:
        spec = KVCacheSpec(num_blocks=9, block_size=4, enable_caching=caching,
                           profile=kv_profile,
                           kv_cache_groups=(KVCacheGroupSpec("full_attention", 4),
                                            KVCacheGroupSpec("mamba", 4, mamba_cache_mode=mode)))
        with pytest.raises(UnsupportedSpec) as refused:
            kv_impl.make_manager(spec)
        assert words in str(refused.value), (
            f"{kv_impl.name} declined a Mamba layout (mode {mode!r}, caching {caching}) "
            f"without naming the rule ({words!r}): {refused.value}")


# --- partial-block keys (0.33) ----------------------------------------------------------------
@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("events", "sliding_window")
@pytest.mark.parametrize("sc", PARTIAL_KEY_SCENARIOS, ids=lambda sc: sc.name)
def test_partial_block_keys(kv_impl: ImplHandle, kv_profile: str, kv_pair: PairFactory,
                            sc: PartialKeyScenario) -> None:
    """A full-attention group whose block is larger than the hash block keys the block holding
    the prompt's last hash boundary by the hash there too, once the block is full, and loses
    every key of a block at once (docs/semantics.md#partial-block-keys): each op's answer and
    KV events as vLLM 0.33.0 gave them (``hybrid_partial_keys``)."""
    from kvcheck.conformance.differential import normalize_events

    if kv_profile != "vllm-0.33":
        pytest.skip("partial-block keys are vLLM 0.33's: 0.10.2 supports one block size with "
                    "prefix caching (kv_cache_manager.py:106-109), so no full-attention group "
                    "is larger than the hash block")
    skip_unless_declared(kv_impl, sc.needs)
    spec = KVCacheSpec(num_blocks=sc.num_blocks, block_size=2, profile=kv_profile,
                       kv_cache_groups=sc.groups, enable_kv_cache_events=True)
    if not kv_impl.info.supports(spec):
        pytest.skip(f"{kv_impl.name} does not support this scenario's pool (IMPL_INFO."
                    "block_sizes, num_blocks_range)")
    # No oracle: the comparison with it would drain the events this test reads.
    pair = kv_pair(spec, with_oracle=False)
    names: dict[object, str] = {}
    for i, step in enumerate(sc.steps):
        got = pair.apply(step.op)
        events = tuple(show_events(normalize_events(pair.impl.manager.take_events()), names))
        assert (got, events) == (step.answer, step.events), (
            f"{sc.name} ({sc.why}), op #{i + 1} {step.op}: answer {got}, events "
            f"{list(events)}; vLLM 0.33.0 answered {step.answer} with events "
            f"{list(step.events)}\n" + pair.impl.snippet())


# --- admission at the free-block boundary ----------------------------------------------------
# Full attention + a 4-token sliding window at block size 2 (the golden scenarios' layout). A
# 4-token prompt fills 2 blocks per group, and the window needs cdiv(4 - 1, 2) = 2 blocks, so
# a later request hits both blocks of both groups and its window skips nothing.
_FULL_SWA = (KVCacheGroupSpec("full_attention", 2),
             KVCacheGroupSpec("sliding_window", 2, sliding_window=4))
_PREFIX = (100, 101, 102, 103)
#: What B (the prefix + 1 token, hitting the 4 cached prefix tokens) consumes per group, by
#: docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups under both
#: rule sets: T = cdiv(5, 2) = 3 slots' blocks, 2 hits, 0 held, 2 hits in the free queue
#: (0.10.2: 3 - 2 - 0 + 2; 0.33: skip = max(0, 4 - 4 + 1) // 2 = 0, max(3 - max(0, 2 + 0), 0)
#: + the 2 free hits after the first max(0, 0 - 0)): 3 in each group.
_NEED = 6


def _admit_after_freed_prefix(kv_impl: ImplHandle, kv_profile: str,
                              num_free: int) -> tuple[list[list[int]] | None, int, list[str]]:
    """Prefill A (``_PREFIX``) and free it (its 2 blocks per group stay cached in the free
    queue), then look B (``_PREFIX`` + 1 token) up and allocate its 1 new token, in a pool of
    ``num_free`` free blocks (``num_free + 1`` blocks with the null block). Returns B's
    ``allocate_slots`` answer, the free count after it, and the calls made (for messages)."""
    spec = KVCacheSpec(num_blocks=num_free + 1, block_size=2, profile=kv_profile,
                       kv_cache_groups=_FULL_SWA)
    if not kv_impl.info.supports(spec):
        pytest.skip(f"{kv_impl.name} does not support a {spec.num_blocks}-block pool of "
                    "2-token blocks (IMPL_INFO.block_sizes, num_blocks_range)")
    # Any: the manager speaks the per-group protocol (SupportsKVCacheGroups) for this grouped
    # spec, which ManagerWithCapabilities (the flat form) does not type.
    mgr: Any = kv_impl.make_manager(spec)
    a = RequestView("a", _PREFIX)
    assert mgr.allocate_slots(a, len(_PREFIX), 0, [[], []]) is not None, (
        f"A's 4-token prefill (4 blocks) must fit a pool of {num_free} free blocks")
    mgr.free("a")
    b = RequestView("b", (*_PREFIX, 200))
    hits, num_hit = mgr.get_computed_blocks(b)
    calls = ["allocate_slots(a, 4)", "free(a)",
             f"get_computed_blocks(b) -> {[list(g) for g in hits]}, {num_hit}"]
    assert num_hit == len(_PREFIX) and all(len(g) == 2 and NULL_BLOCK not in g for g in hits), (
        "B should hit A's 2 cached blocks in both groups (the window of 4 tokens needs 2 "
        f"blocks, so nothing is skipped): got {[list(g) for g in hits]}, {num_hit}")
    new = mgr.allocate_slots(b, 1, num_hit, hits)
    calls.append(f"allocate_slots(b, 1, {num_hit}, hits) -> {new}")
    if new is None:  # a refusal ends the lookup; a pinning design releases its pins here
        release_after_lookup(mgr, "b", pinning=PINNING in kv_impl.info.capabilities)
    answer = None if new is None else [list(g) for g in new]
    return answer, mgr.num_free_blocks(), calls


def _check_boundary(kv_impl: ImplHandle, kv_profile: str, rule: str) -> None:
    """B fits a pool of exactly ``_NEED`` free blocks (one new block per group, nothing left
    free) and is refused, with nothing taken, by a pool of one block fewer."""
    __tracebackhide__ = True
    fit, left, calls = _admit_after_freed_prefix(kv_impl, kv_profile, _NEED)
    assert fit is not None and [len(g) for g in fit] == [1, 1] and left == 0, (
        f"{rule}: B needs exactly {_NEED} free blocks and the pool has {_NEED}, so it fits "
        f"with one new block per group and no free block left; got {fit}, {left} free\n  "
        + "\n  ".join(calls))
    short, left, calls = _admit_after_freed_prefix(kv_impl, kv_profile, _NEED - 1)
    assert short is None and left == _NEED - 1, (
        f"{rule}: B needs {_NEED} free blocks and the pool has {_NEED - 1}, so allocate_slots "
        f"must return None and take nothing; got {short}, {left} free\n  "
        + "\n  ".join(calls))


@pytest.mark.kv_profiles("vllm-0.10")
@pytest.mark.kv_capability("prefix_caching", "sliding_window")
def test_v010_window_hits_in_the_free_queue_consume_free_blocks(kv_impl: ImplHandle,
                                                                 kv_profile: str) -> None:
    """vLLM 0.10.2 counts per group ``T - hits - held + free hits``: a sliding-window hit
    that sits in the free queue leaves it when adopted, so it consumes a free block like a new
    block does (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups)."""
    _check_boundary(kv_impl, kv_profile, "0.10.2's per-group count T - hits - held + free hits")


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("prefix_caching", "sliding_window")
def test_v033_window_hits_inside_the_window_consume_free_blocks(kv_impl: ImplHandle,
                                                                 kv_profile: str) -> None:
    """vLLM 0.33 counts only the hits after the first ``max(0, skip - held)`` (those before are
    dropped, not adopted): when the window skips nothing, every free-queue hit, the first
    included, consumes a free block
    (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups)."""
    _check_boundary(kv_impl, kv_profile, "0.33's skip-aware count (skip 0: every free hit)")


# --- decode context parallelism and prefix_match_unit -----------------------------------------
def _knob_needs(sc: KnobScenario | KnobRefusal) -> list[str]:
    """The capabilities a knob scenario needs: its groups' kinds and its knobs."""
    needs = [KIND_CAPABILITIES[g.kind] for g in sc.groups if g.kind in KIND_CAPABILITIES]
    if sc.dcp_world_size != 1:
        needs.append("dcp")
    if sc.prefix_match_unit is not None:
        needs.append("prefix_match_unit")
    return needs


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("events")
@pytest.mark.parametrize("sc", KNOB_SCENARIOS, ids=lambda sc: sc.name)
def test_dcp_and_prefix_match_unit_golden(kv_impl: ImplHandle, kv_profile: str,
                                          kv_pair: PairFactory, sc: KnobScenario) -> None:
    """DCP scales a sharded group's block (``block_size * dcp_world_size`` tokens for
    allocation, hashing and hits) and vLLM 0.33's ``prefix_match_unit`` sets the hash block of
    several groups: each op's answer and KV events as vLLM 0.33.0 / 0.10.2 gave them
    (``hybrid_knobs``; docs/semantics.md#decode-context-parallelism-and-prefix_match_unit)."""
    from kvcheck.conformance.differential import normalize_events

    steps = sc.steps if kv_profile == "vllm-0.33" else sc.steps_010
    if steps is None:
        pytest.skip(f"{sc.name}: vLLM 0.10.2 refuses this layout or lacks the knob "
                    "(KNOB_REFUSALS)")
    skip_unless_declared(kv_impl, (*_knob_needs(sc), *sc.needs))
    spec = knob_spec(sc, kv_profile)
    if not kv_impl.info.supports(spec):
        pytest.skip(f"{kv_impl.name} does not support this scenario's pool (IMPL_INFO."
                    "block_sizes, num_blocks_range)")
    pair = kv_pair(spec, with_oracle=False)  # no oracle: it would drain the events read here
    names: dict[object, str] = {}
    for i, step in enumerate(steps):
        got = pair.apply(step.op)
        events = (tuple(show_events(normalize_events(pair.impl.manager.take_events()), names))
                  if spec.enable_kv_cache_events else ())
        assert (got, events) == (step.answer, step.events), (
            f"{sc.name} ({sc.why}), op #{i + 1} {step.op}: answer {got}, events "
            f"{list(events)}; vLLM answered {step.answer} with events {list(step.events)}\n"
            + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.parametrize("rf", KNOB_REFUSALS, ids=lambda rf: rf.name)
def test_dcp_and_prefix_match_unit_layouts_vllm_refuses_are_refused(
        kv_impl: ImplHandle, kv_profile: str, rf: KnobRefusal) -> None:
    """The DCP and ``prefix_match_unit`` layouts vLLM refuses (an assertion, a ValueError, a
    knob the release lacks) are declined (``UnsupportedSpec``) naming the rule, never modelled
    silently (``hybrid_knobs.KNOB_REFUSALS``)."""
    if kv_profile not in rf.profiles:
        pytest.skip(f"{rf.name}: a rule of {', '.join(rf.profiles)}, not {kv_profile}")
    skip_unless_declared(kv_impl, _knob_needs(rf))
    with pytest.raises(UnsupportedSpec) as refused:
        kv_impl.make_manager(knob_spec(rf, kv_profile))
    assert rf.words in str(refused.value), (
        f"{kv_impl.name} declined {rf.name} ({rf.rule}) without naming the rule "
        f"({rf.words!r}): {refused.value}")
