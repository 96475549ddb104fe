"""The ``indexer`` area: a KV-aware router's prefix index, checked against what each worker's
cache really holds (``pytest --kv-indexer=MODULE``; docs/indexers.md).

Workers are reference KV-cache managers with events on (``kvcheck.conformance.indexer_cluster``);
their batches reach the index as a router receives them (``indexer_driver.plan_deliveries``),
and after every delivery every probe's answer is compared with the truth for every worker whose
stream the router can know. Random clusters come from ``indexer_workloads``; each scripted test
is one consumer bug seen in a real router, named in its docstring.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypedDict

import pytest
from hypothesis import given
from hypothesis import settings as Settings

from kvcheck.conformance.indexer_cluster import (
    LORAS,
    SALTS,
    ClusterPlan,
    Probe,
    PromptPlan,
    WorkerOp,
    run_cluster,
)
from kvcheck.conformance.indexer_driver import Deliver, IndexerRun, batch_dict, plan_deliveries
from kvcheck.conformance.indexer_protocol import HashForm, IndexerConfig, MatchContext
from kvcheck.conformance.indexer_workloads import cluster_plans, release_of
from kvcheck.events.codec import encode_batch
from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved, BlockStored

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy
    from typing_extensions import Unpack

    from kvcheck.conformance.indexer_cluster import Fault
    from kvcheck.conformance.indexer_guard import GuardedIndexer
    from kvcheck.conformance.loader import ImplHandle

pytestmark = [pytest.mark.kv_capability("indexer"), pytest.mark.kv_generic]

#: A system prompt of 2 blocks of 4 and a user turn of 1 block: 3 full blocks.
SYSTEM = (1, 2, 3, 4, 5, 6, 7, 8)
USER = (9, 10, 11, 12)
PROMPT = SYSTEM + USER


def _form(impl: ImplHandle) -> HashForm:
    """The hash form scripted tests use: vLLM's default (int) where the index reads it."""
    return "int" if "int_hashes" in impl.info.capabilities else "bytes"


def _config(impl: ImplHandle, profile: str, block_size: int = 4) -> IndexerConfig:
    algos = impl.info.hash_algos
    return IndexerConfig(block_size=block_size, release=release_of(profile),
                         hash_form=_form(impl),
                         hash_algo="sha256" if not algos or "sha256" in algos else algos[0])


def _run(impl: ImplHandle, plan: ClusterPlan, name: str, *, faults: bool = False) -> IndexerRun:
    """Play ``plan`` into a fresh index of ``impl``, checking after every delivery."""
    run = run_cluster(plan)
    checked = IndexerRun(impl.make_indexer(plan.config), plan, target=impl.target,
                         trace_name=name)
    checked.run(plan_deliveries(run, faults=faults))
    return checked


class _Faults(TypedDict, total=False):
    fault: Fault
    delay: int
    overlap: int


class _PlanOptions(TypedDict, total=False):
    sliding_window: int | None
    retention: int | None


class _Bounds(TypedDict, total=False):
    max_workers: int
    max_steps: int
    min_workers: int
    min_steps: int


def _admit(worker: int, user: tuple[int, ...] = USER, context: MatchContext | None = None,
           **fields: Unpack[_Faults]) -> WorkerOp:
    """Worker ``worker`` admits ``SYSTEM + user`` (``fields``: the op's fault fields)."""
    return WorkerOp(worker, "admit", prompt=PromptPlan(0, user, context or MatchContext()),
                    **fields)


def _plan(config: IndexerConfig, ops: list[WorkerOp], probes: list[Probe], *,
          num_blocks: tuple[int, ...] = (16, 16),
          **fields: Unpack[_PlanOptions]) -> ClusterPlan:
    return ClusterPlan(config, num_blocks, (SYSTEM,), tuple(ops), tuple(probes), **fields)


# ----------------------------------------------------------------------------- random
def _random(impl: ImplHandle, profile: str, form: HashForm,
            **bounds: Unpack[_Bounds]) -> SearchStrategy[ClusterPlan]:
    info = impl.info
    return cluster_plans(capabilities=info.capabilities, profile=profile, hash_form=form,
                         hash_algos=info.hash_algos, block_sizes=info.block_sizes, **bounds)


@pytest.mark.parametrize("form", [
    pytest.param("int", marks=pytest.mark.kv_capability("int_hashes"), id="int_hashes"),
    pytest.param("bytes", marks=pytest.mark.kv_capability("bytes_hashes"), id="bytes_hashes")])
def test_random_clusters(kv_impl: ImplHandle, kv_profile: str, kv_settings: Settings,
                         request: pytest.FixtureRequest, form: HashForm) -> None:
    """Random workers, workloads, faults and probes, in each hash form the index reads:
    vLLM's default 64-bit integers, or digests (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``)."""
    @kv_settings
    @given(plan=_random(kv_impl, kv_profile, form))
    def check(plan: ClusterPlan) -> None:
        _run(kv_impl, plan, request.node.name, faults=True)

    check()


def test_eight_workers(kv_impl: ImplHandle, kv_profile: str, kv_settings: Settings,
                       request: pytest.FixtureRequest) -> None:
    """Eight workers sharing system prompts, their streams interleaved."""
    @kv_settings
    @given(plan=_random(kv_impl, kv_profile, _form(kv_impl), min_workers=8, max_workers=8,
                        min_steps=64, max_steps=160))
    def check(plan: ClusterPlan) -> None:
        _run(kv_impl, plan, request.node.name, faults=True)

    check()


# ----------------------------------------------------------------------------- scripted
def test_all_blocks_cleared_empties_only_its_worker(kv_impl: ImplHandle, kv_profile: str,
                                                    request: pytest.FixtureRequest) -> None:
    """``AllBlocksCleared`` empties the sender's index, not the others' (AIBrix #2287: it was a
    no-op, and the router kept routing to a worker whose cache was gone)."""
    config = _config(kv_impl, kv_profile)
    ops = [_admit(0), _admit(1), WorkerOp(0, "reset"), _admit(1, (20, 21, 22, 23))]
    run = _run(kv_impl, _plan(config, ops, [Probe(PROMPT)]), request.node.name)
    assert run.expected(0) == {"w0": 0, "w1": 3}  # the scenario reaches the state it is about


def test_removal_touches_only_its_sender(kv_impl: ImplHandle, kv_profile: str,
                                         request: pytest.FixtureRequest) -> None:
    """A ``BlockRemoved`` removes the hash from its sender only (AIBrix PR #2723: it evicted
    the prefix for every pod, and a counter went negative)."""
    config = _config(kv_impl, kv_profile)
    other = tuple(range(20, 32))  # 3 blocks that evict the prompt's in a pool of 4
    ops = [_admit(0), _admit(1), WorkerOp(0, "finish"),
           WorkerOp(0, "admit", prompt=PromptPlan(1, ()))]
    plan = ClusterPlan(config, (5, 16), (SYSTEM, other), tuple(ops), (Probe(PROMPT),))
    run = _run(kv_impl, plan, request.node.name)
    assert run.expected(0) == {"w0": 1, "w1": 3}  # w0 evicted its last 2


def test_removal_of_one_copy_keeps_the_other(kv_impl: ImplHandle, kv_profile: str,
                                             request: pytest.FixtureRequest) -> None:
    """A hash on two physical blocks stays cached until both copies are gone (vLLM PR #55092:
    one copy's ``BlockRemoved`` while another still serves hits; a router that drops the hash
    under-scores the worker)."""
    config = _config(kv_impl, kv_profile)
    other = tuple(range(20, 32))
    ops = [_admit(0),  # copy 1 of the prompt's 3 blocks
           WorkerOp(0, "admit", prompt=PromptPlan(0, USER, skip_read=True)),  # copy 2
           WorkerOp(0, "finish", index=1),  # copy 2 freed: the first to be evicted
           WorkerOp(0, "admit", prompt=PromptPlan(1, ()))]  # evicts 2 blocks of copy 2
    plan = ClusterPlan(config, (8,), (SYSTEM, other), tuple(ops), (Probe(PROMPT),))
    run = _run(kv_impl, plan, request.node.name)
    assert run.expected(0) == {"w0": 3}


@pytest.mark.kv_capability("kv_cache_groups")
@pytest.mark.kv_profiles("vllm-0.33", "generic")
def test_sliding_window_group_keeps_its_own_keys(kv_impl: ImplHandle, kv_profile: str,
                                                 request: pytest.FixtureRequest) -> None:
    """A sliding-window group stores and removes the same hashes as the full-attention group
    (vLLM mixes no group into a hash); its removals and its sparse stores (tokens of null
    blocks, no hash for them) must not touch the full-attention group's keys (AMD Infera #98,
    llm-d-router PR #2363)."""
    config = _config(kv_impl, kv_profile)
    long_user = tuple(range(20, 36))
    other = tuple(range(40, 52))
    # w0: the decode step frees the window's old blocks and the pool evicts three of them:
    # BlockRemoved in group 1 of hashes group 0 still holds. w1: the request ends and a new
    # one evicts group 0's blocks first: BlockRemoved in group 0 of hashes group 1 still holds.
    ops = [_admit(0, long_user), WorkerOp(0, "decode", count=5),
           _admit(1, long_user), WorkerOp(1, "finish"),
           WorkerOp(1, "admit", prompt=PromptPlan(1, ()))]
    plan = ClusterPlan(config, (14, 14), (SYSTEM, other), tuple(ops),
                       (Probe(SYSTEM + long_user), Probe(SYSTEM)), sliding_window=4)
    run = _run(kv_impl, plan, request.node.name)
    assert run.expected(0) == {"w0": 6, "w1": 1}


#: Partial-block keys: full attention in blocks of 8 beside a window in blocks of 4 (the hash
#: block). A 14-token prompt's last hash boundary (12) is inside block 1 (tokens 8-15).
PROMPT14 = SYSTEM + (9, 10, 11, 12, 13, 14)
#: The two tokens the worker decodes with ``WorkerOp(..., "decode", count=2)``
#: (``(count * 7 + k) % 50``), which fill block 1.
DECODED2 = (14, 15)


def _partial_keys_config(impl: ImplHandle, profile: str) -> IndexerConfig:
    return dataclasses.replace(_config(impl, profile, block_size=8), hash_block_size=4)


@pytest.mark.kv_capability("kv_cache_groups")
@pytest.mark.kv_profiles("vllm-0.33", "generic")
def test_partial_block_key_is_not_a_block(kv_impl: ImplHandle, kv_profile: str,
                                          request: pytest.FixtureRequest) -> None:
    """vLLM 0.33 keys a full-attention block larger than the hash block by the hash at its
    last hash-block boundary, and the block holding a prompt's last boundary also by the hash
    at that boundary: a ``BlockStored`` of one hash whose ``block_size`` is the hash block's
    (``BlockPool.cache_partial_block``). The index must take that store (vLLM sends it
    legitimately: refusing the batch as a block-size mismatch loses the blocks stored with
    it), never count it as a block (a request cut at the boundary, or diverging after it,
    holds no more blocks), and drop only that key on its ``BlockRemoved``."""
    config = _partial_keys_config(kv_impl, kv_profile)
    other = tuple(range(40, 56))
    ops = [WorkerOp(0, "admit", prompt=PromptPlan(0, PROMPT14[8:])),  # block 0 keyed
           WorkerOp(0, "decode", count=2),  # block 1 full: its key, then the partial key
           WorkerOp(0, "finish"),
           WorkerOp(0, "admit", prompt=PromptPlan(1, ()))]  # evicts block 1: both keys go
    probes = [Probe(PROMPT14 + DECODED2), Probe(PROMPT14[:12] + (60, 61, 62, 63)),
              Probe(PROMPT14), Probe(PROMPT14[:12])]
    for steps, want in ((2, {"w0": 2}), (4, {"w0": 1})):
        plan = ClusterPlan(config, (9,), (SYSTEM, other), tuple(ops[:steps]), tuple(probes),
                           sliding_window=4)
        stored = [e for _, b in run_cluster(plan).steps if b is not None for e in b.events
                  if isinstance(e, BlockStored) and e.group_idx == 0]
        # The scenario has its partial key (vLLM 0.33.0's own manager publishes the same
        # events for these ops, replayed through kvcheck's vLLM adapter).
        assert [e.block_size for e in stored][:3] == [8, 8, 4]
        run = _run(kv_impl, plan, request.node.name)
        assert [run.expected(i) for i in range(4)] == [want, {"w0": 1}, {"w0": 1}, {"w0": 1}]


@pytest.mark.kv_capability("kv_cache_groups")
@pytest.mark.kv_profiles("vllm-0.33", "generic")
def test_partial_block_key_left_alone_is_not_a_block(
        kv_impl: ImplHandle, kv_profile: str, request: pytest.FixtureRequest) -> None:
    """A block whose keys were dropped while its request runs (``evict_blocks``: its KV
    connector load failed) is keyed again by the next step at the prompt's last boundary
    only, its full key not restored (vLLM 0.33: the block counts as cached): the partial key
    is then the block's only key, and the worker holds the block's prefix up to that
    boundary, not the block."""
    config = _partial_keys_config(kv_impl, kv_profile)
    ops = [WorkerOp(0, "admit", prompt=PromptPlan(0, PROMPT14[8:])),
           WorkerOp(0, "decode", count=2),        # block 1: full key and partial key
           WorkerOp(0, "evict", count=2),         # both dropped
           WorkerOp(0, "decode", count=1)]        # the partial key again, alone
    plan = ClusterPlan(config, (9,), (SYSTEM,), tuple(ops),
                       (Probe(PROMPT14 + DECODED2), Probe(PROMPT14[:12])), sliding_window=4)
    last = [b for _, b in run_cluster(plan).steps if b is not None][-1]
    assert [(type(e).__name__, e.group_idx, getattr(e, "block_size", None))
            for e in last.events if not isinstance(e, AllBlocksCleared)] == [
        ("BlockStored", 0, 4)], last.events  # as vLLM 0.33.0 publishes it (see above)
    run = _run(kv_impl, plan, request.node.name)
    assert [run.expected(0), run.expected(1)] == [{"w0": 1}, {"w0": 1}]


@pytest.mark.kv_capability("kv_cache_groups")
@pytest.mark.kv_profiles("vllm-0.33", "generic")
def test_mamba_hashes_are_not_attention_hits(kv_impl: ImplHandle, kv_profile: str,
                                             request: pytest.FixtureRequest) -> None:
    """A Mamba group in "align" mode stores the very hashes of the full-attention group (vLLM
    mixes no group into a hash) for the blocks whose state it keeps, and a ``BlockStored``
    with no hash at all for a range of nulls; a Mamba key says a state is cached, not the
    prefix's attention KV. When the attention copy of a block is evicted and the Mamba one
    is not, the block is no attention hit (AMD Infera #98: Mamba hashes collided with
    attention hashes in the router's map, and every request went to one worker)."""
    config = _config(kv_impl, kv_profile)
    long_user = tuple(range(20, 28))
    other = tuple(range(40, 48))
    # w0: the request ends; its attention blocks are freed before its Mamba block (group
    # order), so the next prompt evicts attention's last block while Mamba's copy of that
    # hash stays cached. w1: a prompt one token past a block boundary keeps its state in no
    # cached block: a Mamba store of no hash.
    ops = [_admit(0, long_user), WorkerOp(0, "finish"),
           WorkerOp(0, "admit", prompt=PromptPlan(1, ())), _admit(1, long_user + (50,))]
    plan = ClusterPlan(config, (8, 16), (SYSTEM, other), tuple(ops),
                       (Probe(SYSTEM + long_user), Probe(SYSTEM)), mamba=True)
    steps = [b for _, b in run_cluster(plan).steps if b is not None]
    mamba = [e for b in steps for e in b.events if isinstance(e, BlockStored)
             and e.group_idx == 1]
    # The scenario has its stores, and w0 its eviction, as vLLM 0.33.0 publishes them (the
    # ops replayed through kvcheck's vLLM adapter).
    assert [len(e.block_hashes) for e in mamba] == [1, 1, 0]
    run = _run(kv_impl, plan, request.node.name)
    assert [run.expected(0), run.expected(1)] == [{"w0": 3, "w1": 4}, {"w0": 2, "w1": 2}]


def test_sequence_reset_clears_the_worker(kv_impl: ImplHandle, kv_profile: str,
                                          request: pytest.FixtureRequest) -> None:
    """A restarted engine publishes from sequence 0 again with an empty cache: the router
    must clear that worker (llm-d-router #1737, llm-d-kv-cache PR #691)."""
    config = _config(kv_impl, kv_profile)
    ops = [_admit(0), _admit(0, (30, 31, 32, 33)), WorkerOp(0, "restart"),
           _admit(0, (40, 41, 42, 43))]
    plan = _plan(config, ops, [Probe(PROMPT), Probe(SYSTEM + (40, 41, 42, 43))],
                 num_blocks=(16,))
    run = _run(kv_impl, plan, request.node.name)
    assert (run.expected(0), run.expected(1)) == ({"w0": 2}, {"w0": 3})


@pytest.mark.kv_capability("replay")
def test_replayed_store_never_lands_after_a_later_removal(
        kv_impl: ImplHandle, kv_profile: str, request: pytest.FixtureRequest) -> None:
    """A lost ``BlockStored`` replayed after the live ``BlockRemoved`` of the same block must
    not resurrect it: batches apply in sequence order (Mooncake PR #4159)."""
    config = _config(kv_impl, kv_profile)
    other = tuple(range(20, 32))
    ops = [WorkerOp(0, "admit", prompt=PromptPlan(1, ())),             # seq 0
           WorkerOp(0, "finish"),
           _admit(0, fault="drop", delay=3),                            # seq 1: lost
           WorkerOp(0, "finish"),
           WorkerOp(0, "admit", prompt=PromptPlan(1, (50, 51, 52, 53)))]  # seq 2: evicts it
    plan = ClusterPlan(config, (5,), (SYSTEM, other), tuple(ops), (Probe(PROMPT),))
    run = _run(kv_impl, plan, request.node.name, faults=True)
    assert run.expected(0) == {"w0": 0}


@pytest.mark.kv_capability("replay")
def test_replay_overlapping_the_live_stream_is_applied_once(
        kv_impl: ImplHandle, kv_profile: str, request: pytest.FixtureRequest) -> None:
    """A replay that starts before the gap re-sends batches the router already applied; each
    applies once (llm-d-kv-cache #691: double counting after a replay), so a block stored
    once and removed once is gone."""
    config = _config(kv_impl, kv_profile)
    other = tuple(range(20, 32))
    ops = [_admit(0), WorkerOp(0, "finish"),                                 # seq 0
           WorkerOp(0, "admit", prompt=PromptPlan(1, ()), fault="drop", overlap=1),  # seq 1
           WorkerOp(0, "finish"),
           _admit(0, (70, 71, 72, 73))]  # seq 2, live before the replay of seqs 0-1
    plan = ClusterPlan(config, (5,), (SYSTEM, other), tuple(ops), (Probe(PROMPT),))
    run = _run(kv_impl, plan, request.node.name, faults=True)
    assert run.expected(0) == {"w0": 2}  # 2 blocks lost in seq 1, 1 stored again in seq 2


@pytest.mark.kv_capability("replay")
def test_duplicated_delivery_is_applied_once(kv_impl: ImplHandle, kv_profile: str,
                                             request: pytest.FixtureRequest) -> None:
    """A batch delivered twice counts once: its blocks go when their one copy is evicted."""
    config = _config(kv_impl, kv_profile)
    other = tuple(range(20, 32))
    ops = [_admit(0, fault="duplicate"), WorkerOp(0, "finish"),
           WorkerOp(0, "admit", prompt=PromptPlan(1, ()))]
    plan = ClusterPlan(config, (5,), (SYSTEM, other), tuple(ops), (Probe(PROMPT),))
    run = _run(kv_impl, plan, request.node.name, faults=True)
    assert run.expected(0) == {"w0": 1}  # its last 2 blocks evicted


@pytest.mark.kv_capability("lora")
def test_lora_and_base_model_do_not_share_blocks(kv_impl: ImplHandle, kv_profile: str,
                                                 request: pytest.FixtureRequest) -> None:
    """The same tokens under a LoRA adapter are other blocks (dynamo PR #6517: LoRA and base
    model produced the same sequence hash)."""
    config = _config(kv_impl, kv_profile)
    lora = MatchContext(lora=LORAS[0])
    ops = [_admit(0, context=lora), _admit(1)]
    probes = [Probe(PROMPT), Probe(PROMPT, lora), Probe(PROMPT, MatchContext(lora=LORAS[1]))]
    run = _run(kv_impl, _plan(config, ops, probes), request.node.name)
    assert [run.expected(i) for i in range(3)] == [{"w0": 0, "w1": 3}, {"w0": 3, "w1": 0},
                                                   {"w0": 0, "w1": 0}]


@pytest.mark.kv_capability("lookahead_hashes")
@pytest.mark.kv_profiles("vllm-0.33", "generic")
def test_lookahead_keys_cover_the_tokens_after_the_block(kv_impl: ImplHandle, kv_profile: str,
                                                        request: pytest.FixtureRequest) -> None:
    """Workers hashing with vLLM 0.33's hash lookahead (``L = 1``: an EAGLE drafter with
    prefix caching) key a block with the token after it: a block whose next token is not
    there yet is not cached and has no key, and two requests whose tokens differ only in the
    token after a block share no key for that block. An index hashing requests without the
    lookahead matches nothing at all; one that keys blocks by their own tokens alone matches
    a block the worker never cached."""
    config = dataclasses.replace(_config(kv_impl, kv_profile), num_hash_lookahead_tokens=1)
    other = (99, 10, 11, 12)  # PROMPT with the token after block 1 changed
    ops = [_admit(0), _admit(1, other)]
    probes = [Probe(PROMPT), Probe(PROMPT + (13,)), Probe(SYSTEM + other)]
    run = _run(kv_impl, _plan(config, ops, probes), request.node.name)
    # PROMPT's third block has no token after it: cached by neither worker, and no key.
    assert [run.expected(i) for i in range(3)] == [{"w0": 2, "w1": 1}, {"w0": 2, "w1": 1},
                                                   {"w0": 1, "w1": 2}]


@pytest.mark.kv_capability("cache_salt")
def test_salted_requests_match_only_their_salt(kv_impl: ImplHandle, kv_profile: str,
                                               request: pytest.FixtureRequest) -> None:
    """A salt changes every block's key (vLLM's ``cache_salt`` enters the first block, and the
    chain carries it on)."""
    config = _config(kv_impl, kv_profile)
    salted = MatchContext(cache_salt=SALTS[0])
    ops = [_admit(0, context=salted), _admit(1)]
    probes = [Probe(PROMPT), Probe(PROMPT, salted),
              Probe(PROMPT, MatchContext(cache_salt=SALTS[1]))]
    run = _run(kv_impl, _plan(config, ops, probes), request.node.name)
    assert [run.expected(i) for i in range(3)] == [{"w0": 0, "w1": 3}, {"w0": 3, "w1": 0},
                                                   {"w0": 0, "w1": 0}]


@pytest.mark.kv_capability("multimodal")
def test_an_image_changes_the_blocks_it_overlaps(kv_impl: ImplHandle, kv_profile: str,
                                                 request: pytest.FixtureRequest) -> None:
    """Blocks overlapping a multimodal item are keyed by it: another image, other blocks."""
    config = _config(kv_impl, kv_profile)
    image = MatchContext(mm_features=(("img-0", 0, 2),))
    ops = [_admit(0, context=image)]
    probes = [Probe(PROMPT, image), Probe(PROMPT, MatchContext(mm_features=(("img-1", 0, 2),))),
              Probe(PROMPT)]
    run = _run(kv_impl, _plan(config, ops, probes, num_blocks=(16,)), request.node.name)
    assert [run.expected(i) for i in range(3)] == [{"w0": 3}, {"w0": 0}, {"w0": 0}]


def test_removed_worker_is_never_named(kv_impl: ImplHandle, kv_profile: str,
                                       request: pytest.FixtureRequest) -> None:
    """A worker the router removed is gone from every answer (the guard refuses an answer
    naming it)."""
    config = _config(kv_impl, kv_profile)
    ops = [_admit(0), _admit(1), WorkerOp(0, "remove")]
    run = _run(kv_impl, _plan(config, ops, [Probe(PROMPT)]), request.node.name)
    assert run.expected(0) == {"w1": 3}


def test_block_size_mismatch_is_refused(kv_impl: ImplHandle, kv_profile: str) -> None:
    """Stores of blocks of 8 tokens fed to an index configured for 4 are refused, and the
    index is left as it was: their hashes are of other blocks, and matching them anyway
    fails silently (dynamo PR #1233: "routing will fail silently")."""
    config = _config(kv_impl, kv_profile)
    wide = dataclasses.replace(config, block_size=8)
    plan = _plan(wide, [_admit(0, USER + (13, 14, 15, 16))], [Probe(PROMPT)], num_blocks=(8,))
    (_, batch), = run_cluster(plan).steps
    assert batch is not None
    payload = encode_batch(batch.events, ts=0.0, release=release_of(kv_profile),  # type: ignore[arg-type]
                           int_hashes=config.hash_form == "int",
                           group_metadata=None if kv_profile == "vllm-0.10"
                           else batch.group_metadata)
    indexer = kv_impl.make_indexer(config)
    decoded = _decoded(indexer, payload, kv_profile, config)
    with pytest.raises(Exception) as refused:  # noqa: PT011 - any exception is a refusal
        indexer.deliver("w0", 0, payload, decoded, False)
    assert not isinstance(refused.value, AssertionError), (
        f"the refusal must be the index's own error, not a failed check: {refused.value}")
    indexer.known.discard("w0")  # refused: the worker is not known to the router
    assert indexer.match(PROMPT, MatchContext()) in ({}, {"w0": 0})


def test_partial_block_is_never_a_prefix_block(kv_impl: ImplHandle, kv_profile: str,
                                               request: pytest.FixtureRequest) -> None:
    """A store whose last block is partial (fewer tokens than a block) names a hash for it;
    that block is never matched, and its removal is harmless (dynamo PR #866: TRT-LLM sent
    partial blocks, and the indexer failed to find them to remove)."""
    config = _config(kv_impl, kv_profile)
    plan = _plan(config, [_admit(0)], [Probe(PROMPT)], num_blocks=(16,))
    (_, batch), = run_cluster(plan).steps
    assert batch is not None
    stored = next(e for e in batch.events if isinstance(e, BlockStored))
    trimmed = dataclasses.replace(stored, token_ids=stored.token_ids[:-2])  # the 3rd: partial
    cached = frozenset(h for h in batch.cached if h not in _stream_form(
        stored.block_hashes[-1:], config))
    partial = dataclasses.replace(batch, events=(trimmed,), cached=cached)
    removal = dataclasses.replace(partial, seq=1,
                                  events=(BlockRemoved(stored.block_hashes[-1:]),))
    run = IndexerRun(kv_impl.make_indexer(config), plan, target=kv_impl.target,
                     trace_name=request.node.name)
    run.run([Deliver(partial), Deliver(removal)])
    assert run.expected(0) == {"w0": 2}


def test_removal_of_an_unknown_hash_is_ignored(kv_impl: ImplHandle, kv_profile: str,
                                               request: pytest.FixtureRequest) -> None:
    """A ``BlockRemoved`` of a hash the index never stored (a batch before the router
    subscribed, a partial block it skipped) changes nothing: no error, no negative count that
    would hide the hash when it is stored later (AIBrix PR #2723)."""
    config = _config(kv_impl, kv_profile)
    plan = _plan(config, [_admit(0)], [Probe(PROMPT)], num_blocks=(16,))
    (_, batch), = run_cluster(plan).steps
    assert batch is not None
    stored = next(e for e in batch.events if isinstance(e, BlockStored))
    early = dataclasses.replace(batch, events=(BlockRemoved(stored.block_hashes),),
                                cached=frozenset())
    later = dataclasses.replace(batch, seq=1)
    run = IndexerRun(kv_impl.make_indexer(config), plan, target=kv_impl.target,
                     trace_name=request.node.name)
    run.run([Deliver(early), Deliver(later)])
    assert run.expected(0) == {"w0": 3}


def test_other_media_are_not_the_gpu_cache(kv_impl: ImplHandle, kv_profile: str,
                                           request: pytest.FixtureRequest) -> None:
    """Stores of another medium (a CPU offload tier's, which vLLM's offloading connectors
    publish beside the GPU's) are not GPU blocks: a router that counts them sends requests to
    a worker whose GPU does not hold the prefix (dynamo PR #10368 maps the media)."""
    config = _config(kv_impl, kv_profile)
    plan = _plan(config, [_admit(0), _admit(0, (20, 21, 22, 23))], [Probe(PROMPT)],
                 num_blocks=(16,))
    first, second = (b for _, b in run_cluster(plan).steps if b is not None)
    stores = [e for e in first.events if isinstance(e, BlockStored)]
    offloaded = dataclasses.replace(first, cached=frozenset(), events=tuple(
        dataclasses.replace(e, medium="CPU") for e in stores))
    run = IndexerRun(kv_impl.make_indexer(config), plan, target=kv_impl.target,
                     trace_name=request.node.name)
    run.run([Deliver(offloaded)])
    assert run.expected(0) == {"w0": 0}
    run.run([Deliver(dataclasses.replace(second, cached=second.cached - first.cached))])
    assert run.expected(0) == {"w0": 0}


def _stream_form(hashes: tuple[bytes, ...], config: IndexerConfig) -> set[bytes]:
    return {h[-8:] if config.hash_form == "int" else h for h in hashes}


def _decoded(indexer: GuardedIndexer, payload: bytes, profile: str,
             config: IndexerConfig) -> dict[str, object]:
    return (batch_dict(payload, release_of(profile), config.hash_form == "int")  # type: ignore[arg-type]
            if indexer.decoded else {})

