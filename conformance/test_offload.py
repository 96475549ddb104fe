"""The offload tier (capability ``offload``): a second cache below the GPU pool, as vLLM 0.33's
``CPUOffloadingManager`` runs it with its LRU and ARC policies
(docs/semantics.md#the-offload-tier).

* laws after every call, whatever the policy (``offload_model``): a chunk being written is not
  readable and not evictable, a loaded chunk is pinned, ``prepare_store`` evicts exactly the
  missing room from ready unpinned chunks never of the same offer, or changes nothing; a store
  is announced at ``complete_store``, a failed one releases its keys (a ``metadata_only``
  removal that ``take_events`` drops for keys stored again since);
* eviction order per policy, as vLLM's manager decides it: LRU takes a request's tail before
  its head and re-ranks on touch; ARC keeps reused chunks (T2) over chunks seen once (T1) and
  adapts its target on a ghost hit; the admission filter (``store_threshold``);
* golden scenarios whose answers were recorded from vLLM 0.33.0's own manager
  (``offload_golden.json``, ``scripts/record_offload_golden.py``);
* random scheduler-like workloads compared with the oracle after every call
  (``test_random_offload_workloads_match_reference``; ``--kv-oracle=vllm`` checks the reference
  against vLLM's own tier);
* the two tiers together: GPU-pool evictions feed the tier, whose hits come back as a KV
  connector's external tokens (``test_gpu_evictions_come_back_as_external_tokens``).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING, Literal, TypedDict, overload

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.conformance.differential import Pair
from kvcheck.conformance.groups import one_group
from kvcheck.conformance.offload_driver import OffloadRun
from kvcheck.conformance.offload_protocol import OffloadSpec, StoreAnswer
from kvcheck.conformance.offload_workloads import ACTIONS, block_keys, run_actions
from kvcheck.conformance.ops import add, cache, free, schedule
from kvcheck.conformance.protocol import KVCacheSpec

if TYPE_CHECKING:
    from hypothesis import settings as Settings

    from kvcheck.conformance.loader import ImplHandle

pytestmark = [pytest.mark.kv_capability("offload"), pytest.mark.kv_generic,
              pytest.mark.kv_profiles("vllm-0.33", "generic")]

_POLICIES = ("lru", "arc")
#: vLLM-policy tests: a design with its own policy is checked by the laws only.
_VLLM_POLICY = pytest.mark.kv_profiles("vllm-0.33")


def _keys(document: int, num_blocks: int) -> tuple[list[bytes], dict[bytes, int]]:
    """A document's keys (one group) and their end positions."""
    blocks = block_keys(document, num_blocks, 1)
    return [key for key, _ in blocks], dict(blocks)


def _run(impl: ImplHandle, spec: OffloadSpec, oracle: ImplHandle | None = None,
         name: str | None = None) -> OffloadRun:
    """A fresh tier of ``impl`` (and of ``oracle``), law-checked call by call; a failure's repro
    is written as ``.kvcheck/repro/<name>.py``."""
    tier = impl.make_offloading_manager(spec)
    theirs = None
    if oracle is not None:
        if not oracle.has("offload"):
            pytest.skip(f"the oracle {oracle.name} does not declare capability 'offload'")
        theirs = oracle.make_offloading_manager(spec)
    run = OffloadRun(tier, theirs, spec, impl.target)
    run.trace_name = name
    return run


def _request(run: OffloadRun, req_id: str, positions: dict[bytes, int]) -> None:
    run.call("on_new_request", req_id)
    run.call("set_key_positions", req_id, positions)


def _store(run: OffloadRun, req_id: str, keys: list[bytes]) -> StoreAnswer | None:
    """Offer ``keys`` and complete whatever the tier stores; returns the offer's answer."""
    answer: StoreAnswer | None = run.call("prepare_store", keys, req_id)
    if answer is not None and answer["keys_to_store"]:
        run.call("complete_store", answer["keys_to_store"], req_id, True)
    return answer


def _short(keys: list[bytes], names: dict[bytes, str]) -> list[str]:
    return [names.get(key, key[:4].hex()) for key in keys]


# --------------------------------------------------------------------------- laws, scripted
@pytest.mark.parametrize("policy", _POLICIES)
def test_lookup_follows_the_chunk_state(kv_impl: ImplHandle, policy: str) -> None:
    """``MISS`` before the offer, ``HIT_PENDING`` while the store is in flight (not readable),
    ``HIT`` after ``complete_store``; a failed store leaves ``MISS`` and its slot free."""
    run = _run(kv_impl, OffloadSpec(num_chunks=3, cache_policy=policy))  # type: ignore[arg-type]
    keys, positions = _keys(0, 3)
    _request(run, "a", positions)
    run.call("lookup", keys[0], "a")
    answer = run.call("prepare_store", keys[:2], "a")
    assert answer is not None and answer["keys_to_store"] == keys[:2]
    assert run.call("lookup", keys[0], "a") == "HIT_PENDING"
    run.call("complete_store", keys[:1], "a", True)
    run.call("complete_store", keys[1:2], "a", False)
    assert [run.call("lookup", k, "a") for k in keys[:2]] == ["HIT", "MISS"]
    again = _store(run, "a", keys[1:3])  # the failed key's slot is free again
    assert again is not None and again["evicted_keys"] == [], again
    run.call("take_events")


@pytest.mark.parametrize("policy", _POLICIES)
def test_pinned_and_pending_chunks_are_never_evicted(kv_impl: ImplHandle, policy: str) -> None:
    """A full tier whose chunks are all pinned by a load or still being written refuses an
    offer (None, nothing changed); once the load completes, the same offer evicts."""
    run = _run(kv_impl, OffloadSpec(num_chunks=2, cache_policy=policy))  # type: ignore[arg-type]
    keys, positions = _keys(2, 4)
    _request(run, "a", positions)
    _store(run, "a", keys[:1])
    run.call("prepare_store", keys[1:2], "a")  # pending: its write is in flight
    run.call("prepare_load", keys[:1], "a")  # pinned
    assert run.call("prepare_store", keys[2:3], "a") is None, (
        "no chunk can be evicted: one is pinned, one is being written")
    assert [run.call("lookup", k, "a") for k in keys[:3]] == ["HIT", "HIT_PENDING", "MISS"]
    run.call("complete_load", keys[:1], "a")
    answer = run.call("prepare_store", keys[2:3], "a")
    assert answer is not None and answer["evicted_keys"] == keys[:1], answer
    run.call("take_events")


@pytest.mark.parametrize("policy", _POLICIES)
def test_offered_keys_are_never_evicted(kv_impl: ImplHandle, policy: str) -> None:
    """The tier is full of ready chunks; an offer re-listing the oldest one with a new key must
    evict another chunk, never one of its own keys (vLLM's ``protected`` set), and an offer
    whose only evictable chunks are its own keys is refused."""
    run = _run(kv_impl, OffloadSpec(num_chunks=2, cache_policy=policy))  # type: ignore[arg-type]
    keys, positions = _keys(2, 4)
    _request(run, "a", positions)
    _store(run, "a", keys[:1])
    _store(run, "a", keys[1:2])
    assert run.call("prepare_store", [keys[0], keys[1], keys[2]], "a") is None
    answer = run.call("prepare_store", [keys[0], keys[2]], "a")
    assert answer is not None and answer["evicted_keys"] == [keys[1]], answer
    run.call("take_events")


@pytest.mark.parametrize("policy", _POLICIES)
def test_events_announce_stores_at_completion(kv_impl: ImplHandle, policy: str) -> None:
    """Nothing is announced at ``prepare_store``; ``complete_store`` announces the stored keys,
    an eviction its removed keys, and a failed store a ``metadata_only`` removal that is
    dropped when the key was stored again before ``take_events``."""
    run = _run(kv_impl, OffloadSpec(num_chunks=2, cache_policy=policy))  # type: ignore[arg-type]
    keys, positions = _keys(2, 4)
    _request(run, "a", positions)
    run.call("prepare_store", keys[:2], "a")
    assert run.call("take_events") == []
    run.call("complete_store", keys[:2], "a", True)
    stored = run.call("take_events")
    assert [(e["removed"], e["keys"]) for e in stored] == [(False, keys[:2])], stored
    run.call("prepare_store", keys[2:3], "a")
    run.call("complete_store", keys[2:3], "a", False)
    _store(run, "a", keys[2:3])  # stored again before the drain
    events = run.call("take_events")
    assert all(not e["metadata_only"] for e in events), (
        f"the failed store's removal must be dropped: the key was stored again, {events}")


# ------------------------------------------------------------------- vLLM's eviction order
@_VLLM_POLICY
def test_lru_evicts_a_requests_tail_before_its_head(kv_impl: ImplHandle) -> None:
    """LRU ranks a request's keys by position: a new offer evicts a's tail blocks (k3, k2)
    first; once b touches k0 and k1 they are newer than b's own blocks, and the next eviction
    takes b's tail (b1), not k1."""
    run = _run(kv_impl, OffloadSpec(num_chunks=4))
    keys, positions = _keys(2, 4)
    other, other_positions = _keys(0, 3)
    names = {k: f"k{i}" for i, k in enumerate(keys)} | {k: f"b{i}" for i, k in enumerate(other)}
    _request(run, "a", positions)
    _store(run, "a", keys)
    run.call("on_request_finished", "a")
    _request(run, "b", other_positions)
    answer = _store(run, "b", other[:2])
    assert answer is not None and _short(answer["evicted_keys"], names) == ["k3", "k2"], answer
    run.call("touch", [keys[0], keys[1]], "b")
    answer = _store(run, "b", other[2:3])
    assert answer is not None and _short(answer["evicted_keys"], names) == ["b1"], (
        f"after touch([k0, k1]) b's tail b1 is the oldest, got "
        f"{_short(answer['evicted_keys'] if answer else [], names)}")
    run.call("take_events")


@_VLLM_POLICY
def test_arc_keeps_reused_chunks_over_chunks_seen_once(kv_impl: ImplHandle) -> None:
    """ARC: k0, reused by a second request, moves to T2; a later offer evicts from T1 (k1, then
    the newer request's tail) although k0 is older, where LRU evicts k0 second."""
    expected = {"arc": ["k1", "y1"], "lru": ["k1", "k0"]}
    for policy, evicted in expected.items():
        run = _run(kv_impl, OffloadSpec(num_chunks=4, cache_policy=policy))  # type: ignore[arg-type]
        keys, positions = _keys(2, 2)
        ys, y_positions = _keys(1, 6)
        ys, y_positions = ys[4:], {k: y_positions[k] for k in ys[4:]}
        zs, z_positions = _keys(0, 6)
        zs = zs[4:]
        names = {keys[0]: "k0", keys[1]: "k1", ys[0]: "y0", ys[1]: "y1"}
        _request(run, "r0", positions)
        _store(run, "r0", keys)
        run.call("on_request_finished", "r0")
        _request(run, "r1", positions)
        run.call("prepare_load", keys[:1], "r1")
        run.call("complete_load", keys[:1], "r1")
        run.call("on_request_finished", "r1")
        _request(run, "r2", y_positions)
        _store(run, "r2", ys)
        run.call("on_request_finished", "r2")
        _request(run, "r3", {k: z_positions[k] for k in zs})
        answer = _store(run, "r3", zs)
        assert answer is not None and _short(answer["evicted_keys"], names) == evicted, (
            f"{policy}: evicted {_short(answer['evicted_keys'] if answer else [], names)}, "
            f"expected {evicted}")


@_VLLM_POLICY
def test_store_threshold_admits_on_the_nth_offer(kv_impl: ImplHandle) -> None:
    """``store_threshold=2``: a key is stored the second time it is offered, not the first."""
    run = _run(kv_impl, OffloadSpec(num_chunks=4, store_threshold=2))
    keys, positions = _keys(2, 2)
    _request(run, "a", positions)
    first = run.call("prepare_store", keys, "a")
    assert first is not None and first["keys_to_store"] == [], first
    second = run.call("prepare_store", keys[1:], "a")
    assert second is not None and second["keys_to_store"] == keys[1:], second
    run.call("take_events")


# --------------------------------------------------------------------------- golden scenarios
class _GoldenSpec(TypedDict, total=False):
    num_chunks: int
    cache_policy: Literal["lru", "arc"]
    enable_events: bool
    store_threshold: int
    max_tracker_size: int
    key_width: int


class _GoldenCall(TypedDict):
    call: str
    args: list[object]
    answer: object


class _GoldenScenario(TypedDict):
    """A scenario of ``offload_golden.json`` (package data kvcheck ships)."""

    name: str
    spec: _GoldenSpec
    keys: list[str]
    calls: list[_GoldenCall]
    vllm: str


def _golden() -> list[_GoldenScenario]:
    text = resources.files("kvcheck.conformance").joinpath("offload_golden.json").read_text()
    scenarios: list[_GoldenScenario] = json.loads(text)["scenarios"]
    return scenarios


@overload
def _decode(value: list[object], keys: list[bytes]) -> list[object]: ...
@overload
def _decode(value: object, keys: list[bytes]) -> object: ...
def _decode(value: object, keys: list[bytes]) -> object:
    """Keys are stored as ``{"k": i}`` (``keys[i]``), positions as ``{"positions": [[i,
    end_token], ...]}``."""
    if isinstance(value, dict) and set(value) == {"k"}:
        return keys[value["k"]]
    if isinstance(value, list):
        return [_decode(v, keys) for v in value]
    if isinstance(value, dict):
        if set(value) == {"positions"}:
            return {keys[i]: end for i, end in value["positions"]}
        return {k: _decode(v, keys) for k, v in value.items()}
    return value


@_VLLM_POLICY
@pytest.mark.parametrize("scenario", [s["name"] for s in _golden()])
def test_golden_offload_scenario(kv_impl: ImplHandle, scenario: str) -> None:
    """A scenario replayed call by call; every answer must equal the one vLLM 0.33.0's own
    ``CPUOffloadingManager`` gave (recorded by ``scripts/record_offload_golden.py``; slots
    left out)."""
    recorded = next(s for s in _golden() if s["name"] == scenario)
    spec = OffloadSpec(**recorded["spec"])
    run = _run(kv_impl, spec)
    keys = [bytes.fromhex(k) for k in recorded["keys"]]
    for i, step in enumerate(recorded["calls"]):
        got = run.call(step["call"], *_decode(step["args"], keys))
        if step["call"] == "prepare_store" and got is not None:
            got = {k: got[k] for k in ("keys_to_store", "evicted_keys")}
        if step["call"] == "prepare_load":
            got = None
        want = _decode(step["answer"], keys)
        assert got == want, (
            f"{recorded['name']}: call #{i} {step['call']} answered {got!r}; vLLM "
            f"{recorded['vllm']} answered {want!r}\n{run.repro()}")


# --------------------------------------------------------------------------- random workloads
@pytest.mark.parametrize("policy", _POLICIES)
def test_random_offload_workloads_match_reference(kv_impl: ImplHandle, kv_oracle: ImplHandle,
                                                  kv_profile: str, kv_settings: Settings,
                                                  policy: str,
                                                  request: pytest.FixtureRequest) -> None:
    """Random scheduler-like workloads (shared prefixes, loads left in flight, failed stores,
    touches, finished requests, resets, the admission filter, one or two KV-cache groups): the
    laws after every call, and every answer equal to the oracle's (laws only, and no admission
    filter, which is vLLM's, under ``generic``)."""
    generic = kv_profile == "generic"
    oracle = None if generic else kv_oracle

    @kv_settings
    @given(actions=ACTIONS, num_chunks=st.integers(1, 12),
           threshold=st.sampled_from([1] if generic else [1, 1, 2]),
           tracker=st.sampled_from([64_000, 3]), groups=st.integers(1, 2))
    def check(actions: list[tuple[int, int, int]], num_chunks: int, threshold: int,
              tracker: int, groups: int) -> None:
        spec = OffloadSpec(num_chunks=num_chunks, cache_policy=policy,  # type: ignore[arg-type]
                           store_threshold=threshold, max_tracker_size=tracker)
        run_actions(_run(kv_impl, spec, oracle, request.node.name), actions, groups)

    check()


# ------------------------------------------------------------------------ the two tiers together
def _two_tiers(impl: ImplHandle, profile: str) -> list[object]:
    """A GPU pool of 12 blocks and a tier of 8 chunks: a prompt's cached blocks are evicted from
    the pool by a long request, stored in the tier as their ``BlockRemoved`` events arrive, and
    come back to a request with the same prompt as external tokens (an asynchronous load, then
    ``cache_blocks``). Returns every observation, to compare with the oracle's."""
    spec = KVCacheSpec(num_blocks=12, block_size=4, enable_kv_cache_events=True, profile=profile)
    pair = Pair(impl, None, spec)
    manager = pair.impl.manager
    tier_spec = OffloadSpec(num_chunks=8)
    run = OffloadRun(impl.make_offloading_manager(tier_spec), None, tier_spec, impl.target)
    seen: list[object] = []
    bs = spec.block_size
    prompt = list(range(1, 6 * bs + 2))
    pair.run([add("a", prompt), schedule("a"), free("a")])
    chain = [e["block_hashes"] for e in manager.take_events() if e["type"] == "BlockStored"]
    chain_hashes = [bytes(h) for hashes in chain for h in hashes]
    seen.append(len(chain_hashes))
    run.call("on_new_request", "a")
    run.call("set_key_positions", "a", {h + bytes(4): (i + 1) * bs
                                        for i, h in enumerate(chain_hashes)})
    # A long request takes the pool: the prompt's cached blocks are evicted, and offloaded.
    pair.run([add("b", list(range(1000, 1000 + 10 * bs))), schedule("b")])
    removed = [bytes(h) for e in manager.take_events() if e["type"] == "BlockRemoved"
               for h in e["block_hashes"]]
    seen.append([chain_hashes.index(h) if h in chain_hashes else -1 for h in removed])
    offloaded = [h + bytes(4) for h in removed if h in chain_hashes]
    seen.append(_store(run, "a", offloaded))
    pair.run([free("b")])
    manager.take_events()
    # The same prompt again: the local hit, then the tier's hits as external tokens.
    pair.apply(add("a2", prompt))
    local = manager.get_computed_blocks_per_group(pair.impl.views["a2"])[1]
    run.call("on_new_request", "a2")
    keys = [h + bytes(4) for h in chain_hashes]
    run.call("set_key_positions", "a2", {k: (i + 1) * bs for i, k in enumerate(keys)})
    hits = []
    for key in keys[local // bs:]:
        if run.call("lookup", key, "a2") != "HIT":
            break
        hits.append(key)
    seen.append((local, len(hits)))
    got = one_group(pair.apply(schedule("a2", external=len(hits) * bs, delay=True)))
    seen.append(got)
    run.call("prepare_load", hits, "a2")
    run.call("complete_load", hits, "a2")
    pair.apply(cache("a2", local + len(hits) * bs))
    run.call("on_request_finished", "a2")
    seen.append(run.call("take_events"))
    pair.apply(add("probe", prompt))
    seen.append(manager.get_computed_blocks_per_group(pair.impl.views["probe"])[1])
    return seen


@pytest.mark.kv_capability("manager", "events", "external_kv", "offload")
@_VLLM_POLICY
def test_gpu_evictions_come_back_as_external_tokens(kv_impl: ImplHandle, kv_oracle: ImplHandle,
                                                   kv_profile: str) -> None:
    """The two tiers together: what the GPU pool evicts is offloaded, and a request with the
    same prompt gets it back through ``num_external_computed_tokens`` (loaded asynchronously,
    then cached): afterwards the whole prompt hits in the pool. Every observation (pool events,
    the tier's answers and events, the allocation) equals the oracle's, on the oracle's own
    manager and tier (``--kv-oracle=vllm``: vLLM's)."""
    if not kv_oracle.has("offload") or not kv_oracle.has("external_kv"):
        pytest.skip(f"the oracle {kv_oracle.name} lacks 'offload' or 'external_kv'")
    mine = _two_tiers(kv_impl, kv_profile)
    hits = mine[3]
    assert isinstance(hits, tuple)  # _two_tiers' 4th observation: (local hit, tier hits)
    local, loaded = hits
    assert loaded > 0, f"the tier must hold evicted blocks of the prompt: {mine}"
    assert mine[-1] == local + loaded * 4 == 24, (
        f"after the load and cache_blocks the whole prompt (6 blocks) hits: {mine}")
    theirs = _two_tiers(kv_oracle, kv_profile)
    assert mine == theirs, f"implementation {mine!r}\n{kv_oracle.name} {theirs!r}"
