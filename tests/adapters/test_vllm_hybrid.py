"""The vLLM adapter on KV-cache groups (``kvcheck.adapters.vllm_manager`` over
``kvcheck.adapters.vllm_kv_config``), on the real vLLM.

Runs only where vLLM is importable (an environment built by scripts/vllm-cpu-env.sh; run it
with that environment's python), and then in this process: the golden scenarios of the hybrid
spec (docs/semantics.md#kv-cache-groups-hybrid-models, ``kvcheck.conformance.hybrid_golden``) for
the installed release's profile are
replayed through the adapter and every column is compared (the call's result, every block
table, the free queue, vLLM's cache map, the KV events with their group fields, and under
vllm-0.10 the null block's ref count); the configurations the release refuses must be
declined with ``UnsupportedSpec`` naming the release and the rule.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import replace
from importlib.metadata import version as dist_version
from typing import Any

import pytest

from kvcheck.adapters.vllm_features import release_behaviour, select_profile
from kvcheck.conformance.hybrid_golden import SCENARIOS, GoldenRow, GoldenScenario
from kvcheck.conformance.protocol import (
    KVCacheGroupSpec,
    KVCacheSpec,
    RequestView,
    UnsupportedSpec,
)
from kvcheck.errors import KVCheckInputError

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (build it: scripts/vllm-cpu-env.sh)")


def _installed_profile() -> str | None:
    """The profile of the installed vLLM release, read from its dist-info (no vLLM import at
    collection; the adapter's own choice is checked against it in a test)."""
    if not HAS_VLLM:
        return None
    behaviour = release_behaviour(dist_version("vllm"))
    return None if behaviour is None else select_profile(behaviour)[0]


PROFILE = _installed_profile()
GOLDEN = [sc for sc in SCENARIOS if sc.profile == PROFILE]
FULL = KVCacheGroupSpec("full_attention")
SWA4 = KVCacheGroupSpec("sliding_window", sliding_window=4)
CHUNK4 = KVCacheGroupSpec("chunked_local_attention", attention_chunk_size=4)


@pytest.fixture(scope="module")
def adapter() -> Any:
    import kvcheck.adapters.vllm as module

    return module


def _spec(*groups: KVCacheGroupSpec, **kwargs: Any) -> KVCacheSpec:
    fields: dict[str, Any] = {"num_blocks": 16, "block_size": 2, "profile": PROFILE or ""}
    fields.update(kwargs)
    return KVCacheSpec(kv_cache_groups=groups, **fields)


# ------------------------------------------------------------------------------ observation
def _cache_map(pool: Any) -> Iterator[tuple[bytes, int, tuple[int, ...]]]:
    """vLLM's prefix-cache map as ``(block hash, group id, block ids in lookup order)``: keys
    are ``hash‖group`` (4-byte big-endian group id) in both releases; a value is one block or
    a dict of them (0.33's ``BlockHashToBlockMap._cache``, 0.10.2's plain dict)."""
    raw = pool.cached_block_hash_to_block
    table = getattr(raw, "_cache", raw)
    for key, value in table.items():
        blocks = [value] if hasattr(value, "block_id") else list(value.values())
        yield bytes(key[:-4]), int.from_bytes(key[-4:], "big"), tuple(
            b.block_id for b in blocks)


class _HashNames:
    """Hash bytes <-> the scenario's hash numbers ("Hn"), learnt from each request's own
    ``block_hashes`` and the golden ``hash_numbers``; a clash means the inferred prompts
    do not reproduce the table."""

    def __init__(self) -> None:
        self.number: dict[bytes, int] = {}
        self.digest: dict[int, bytes] = {}

    def learn(self, request_id: str, numbers: tuple[int, ...], hashes: list[bytes]) -> None:
        for n, h in zip(numbers, hashes, strict=False):
            known_n, known_h = self.number.setdefault(h, n), self.digest.setdefault(n, h)
            assert known_n == n and known_h == h, (
                f"request {request_id}: its block hash H{n} is also H{known_n} (or H{n} "
                f"was another hash): the scenario's prompts do not give the table's hashes")

    def name(self, digest: bytes) -> int:
        assert digest in self.number, f"hash {digest.hex()[:16]}... is no request's block hash"
        return self.number[digest]


class _Replay:
    """One golden scenario driven through the adapter, row by row."""

    def __init__(self, adapter: Any, sc: GoldenScenario) -> None:
        self.sc = sc
        self.manager = adapter.make_kv_cache_manager(sc.spec)
        self.names = _HashNames()
        self.hits: dict[str, tuple[list[list[int]], int]] = {}
        self.live: set[str] = set()

    def view(self, row: GoldenRow) -> RequestView:
        req = self.sc.request(row.request_id)
        return RequestView(row.request_id, req.prompt_token_ids,
                           req.output_token_ids[:row.num_output_tokens],
                           row.num_computed_tokens)

    def call(self, row: GoldenRow) -> Any:
        m, rid = self.manager, row.request_id
        if row.op == "get_computed_blocks":
            self.live.add(rid)
            self.hits[rid] = m.get_computed_blocks(self.view(row))
            return self.hits[rid]
        if row.op == "allocate_slots":
            blocks, tokens = self.hits.pop(rid) if row.with_hits else ([], 0)
            return m.allocate_slots(self.view(row), row.num_new_tokens, tokens, blocks)
        m.free(rid)
        self.live.discard(rid)
        return None

    def check(self, row: GoldenRow, result: Any) -> None:
        m, sc = self.manager, self.sc
        where = f"{sc.profile} {sc.name} row {row.index} {row.op}({row.request_id})"
        for rid in sorted(self.live):
            self.names.learn(rid, sc.request(rid).hash_numbers, m.block_hashes(rid))
        if row.op == "get_computed_blocks":
            got = ([tuple(g) for g in result[0]], result[1])
            assert got == (list(row.hit_blocks or ()), row.hit_tokens), f"{where}: result"
        elif row.op == "allocate_slots":
            want = None if row.refused else list(row.new_blocks or ())
            got_new = None if result is None else [tuple(g) for g in result]
            assert got_new == want, f"{where}: new blocks"
        for rid in sorted({r for r, _ in row.tables} | self.live):
            got_table = tuple(tuple(g) for g in m.get_block_ids(rid))
            assert got_table == row.block_ids(rid, sc.num_groups), f"{where}: table of {rid}"
        assert tuple(m.free_block_ids()) == row.free_queue, f"{where}: free queue"
        cache = sorted((self.names.name(h), g, ids) for h, g, ids in _cache_map(m.pool))
        assert cache == sorted(row.cache), f"{where}: cache map"
        self.check_events(where, row, m.take_events())
        if row.null_ref_cnt is not None:
            assert m.ref_cnt(0) == row.null_ref_cnt, f"{where}: null block ref_cnt"
        elif sc.profile == "vllm-0.33":
            assert m.ref_cnt(0) == 0, f"{where}: null block ref_cnt (0.33 keeps it at 0)"

    def check_events(self, where: str, row: GoldenRow, events: list[dict[str, Any]]) -> None:
        got = [(e["type"], e.get("group_idx"), tuple(self.names.name(h)
                                                      for h in e["block_hashes"]))
               for e in events]
        assert got == [(e.type, e.group_idx, e.hashes) for e in row.events], f"{where}: events"
        groups = self.sc.spec.groups
        for e in events:
            if self.sc.profile == "vllm-0.10":
                assert not {"group_idx", "kv_cache_spec_kind",
                            "kv_cache_spec_sliding_window"} & set(e), f"{where}: {e}"
            elif e["type"] == "BlockStored":
                group = groups[e["group_idx"]]
                window = group.sliding_window if group.kind == "sliding_window" else None
                assert (e["kv_cache_spec_kind"], e["kv_cache_spec_sliding_window"]) == (
                    group.kind, window), f"{where}: group fields of {e}"


# ------------------------------------------------------------------------------ golden
def test_installed_profile_has_golden_scenarios(adapter: Any) -> None:
    assert adapter.IMPL_INFO.profile == PROFILE
    assert {"kv_cache_groups", "sliding_window", "chunked_local_attention"} <= (
        adapter.IMPL_INFO.capabilities)
    assert len(GOLDEN) >= 7


@pytest.mark.parametrize("sc", GOLDEN, ids=[f"{sc.profile}-{sc.name}" for sc in GOLDEN])
def test_golden_scenario_on_vllm(adapter: Any, sc: GoldenScenario) -> None:
    replay = _Replay(adapter, sc)
    for row in sc.rows:
        replay.check(row, replay.call(row))


# ------------------------------------------------------------------------------ refusals
_REFUSED_010 = [
    (_spec(FULL, KVCacheGroupSpec("sliding_window", 4, sliding_window=8)),
     "one block size"),
    (_spec(FULL, SWA4, KVCacheGroupSpec("sliding_window", sliding_window=8)),
     "one full-attention spec and one other spec"),
    (_spec(FULL, FULL), "one full-attention spec and one other spec"),
    (_spec(FULL, SWA4, FULL), "interleave"),
    (_spec(CHUNK4, enable_kv_cache_events=True), "null block"),
    (_spec(FULL, KVCacheGroupSpec("sliding_window", sliding_window=2),
           enable_kv_cache_events=True), "null block"),
]
_REFUSED_033 = [
    (_spec(KVCacheGroupSpec("full_attention", 4), KVCacheGroupSpec(
        "chunked_local_attention", 2, attention_chunk_size=4)), "scheduler block size"),
]


_REFUSED = _REFUSED_010 if PROFILE == "vllm-0.10" else _REFUSED_033


@pytest.mark.parametrize(("spec", "rule"), _REFUSED, ids=[r for _, r in _REFUSED])
def test_refused_layouts_are_declined_naming_release_and_rule(adapter: Any, spec: KVCacheSpec,
                                                              rule: str) -> None:
    with pytest.raises(UnsupportedSpec) as info:
        adapter.make_kv_cache_manager(spec)
    assert f"vLLM {adapter.VERSION}" in str(info.value) and rule in str(info.value)


def test_layouts_refused_with_caching_are_taken_without(adapter: Any) -> None:
    """0.10.2 takes any groups with prefix caching off (no hits); 0.33 any layout."""
    for spec, _ in _REFUSED_010 + _REFUSED_033:
        if spec.enable_kv_cache_events:
            continue
        m = adapter.make_kv_cache_manager(replace(spec, enable_caching=False))
        view = RequestView("r", tuple(range(100, 109)))
        assert m.get_computed_blocks(view) == ([[]] * len(spec.groups), 0)
        new = m.allocate_slots(view, 9)
        assert new is not None and [len(g) for g in new] == [
            -(-9 // spec.group_block_size(i)) for i in range(len(spec.groups))]


@pytest.mark.parametrize("group", [
    KVCacheGroupSpec("mamba", mamba_cache_mode="sometimes"),
    KVCacheGroupSpec("sliding_window"),
    KVCacheGroupSpec("chunked_local_attention", attention_chunk_size=0),
    KVCacheGroupSpec("full_attention", 0),
])
def test_malformed_group_is_an_input_error(adapter: Any, group: KVCacheGroupSpec) -> None:
    with pytest.raises(KVCheckInputError):
        adapter.make_kv_cache_manager(_spec(group, enable_caching=False))


# ------------------------------------------------------------------------------ one group
def test_one_full_group_matches_the_single_group_adapter(adapter: Any) -> None:
    """``kv_cache_groups=(full,)`` is the flat spec in per-group form: same ids, same queue,
    same hashes."""
    flat = _spec(num_blocks=12, block_size=2)
    grouped = _spec(FULL, num_blocks=12, block_size=2)
    a, b = adapter.make_kv_cache_manager(flat), adapter.make_kv_cache_manager(grouped)
    prompts = {"x": tuple(range(100, 109)), "y": tuple(range(100, 105)) + (7, 8, 9)}
    for rid, prompt in prompts.items():
        view = RequestView(rid, prompt)
        (hits_a, n_a), (hits_b, n_b) = a.get_computed_blocks(view), b.get_computed_blocks(view)
        assert ([hits_a], n_a) == (hits_b, n_b)
        assert [a.allocate_slots(view, len(prompt) - n_a, n_a, hits_a)] == b.allocate_slots(
            view, len(prompt) - n_b, n_b, hits_b)
        assert [a.get_block_ids(rid)] == b.get_block_ids(rid)
        assert a.block_hashes(rid) == b.block_hashes(rid)
        assert a.free_block_ids() == b.free_block_ids()
    for rid in prompts:
        a.free(rid)
        b.free(rid)
        assert a.free_block_ids() == b.free_block_ids()


def test_a_flat_spec_is_vllms_one_full_attention_group(adapter: Any) -> None:
    """One construction: a spec without ``kv_cache_groups`` is the one-group ``KVCacheConfig``
    (``FullAttentionSpec`` at ``spec.block_size``), the same class and config as
    ``kv_cache_groups=(full,)`` and as the benchmark hook's manager."""
    from kvcheck.adapters.vllm_native import make_native_manager

    flat = adapter.make_kv_cache_manager(_spec(num_blocks=12, block_size=4))
    grouped = adapter.make_kv_cache_manager(_spec(FULL, num_blocks=12, block_size=4))
    native = make_native_manager(_spec(num_blocks=12, block_size=4))
    assert type(flat) is type(grouped)
    assert (flat.grouped, grouped.grouped, flat.num_groups) == (False, True, 1)
    (group,) = flat.manager.kv_cache_config.kv_cache_groups
    assert group.layer_names == ["layer.0"]
    assert type(group.kv_cache_spec).__name__ == "FullAttentionSpec"
    assert group.kv_cache_spec.block_size == 4
    for other in (grouped.manager, native.manager):
        assert other.kv_cache_config == flat.manager.kv_cache_config
        assert type(other.coordinator) is type(flat.manager.coordinator)
    assert (flat.scheduler_block_size, flat.hash_block_size) == (4, 4)


def test_flat_events_carry_the_reference_fields_grouped_ones_vllms(adapter: Any) -> None:
    """The single-group protocol's events have exactly the reference's fields (but
    ``lookahead_token_ids``, present only with hash lookahead); with ``kv_cache_groups`` they
    keep vLLM's group fields where the release has them."""
    from dataclasses import fields

    from kvcheck.reference_impl.events import BlockStored

    reference = {"type"} | {f.name for f in fields(BlockStored)} - {"lookahead_token_ids"}
    view = RequestView("r", tuple(range(100, 109)))
    keys = []
    for spec in (_spec(enable_kv_cache_events=True),
                 _spec(FULL, enable_kv_cache_events=True)):
        m = adapter.make_kv_cache_manager(spec)
        assert m.allocate_slots(view, 9) is not None
        (stored,) = m.take_events()
        keys.append(set(stored))
    assert keys[0] == reference
    if PROFILE == "vllm-0.33":
        assert keys[1] == reference | {"kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
    else:
        assert keys[1] == reference - {"group_idx"}


def test_hits_need_one_list_per_group(adapter: Any) -> None:
    m = adapter.make_kv_cache_manager(_spec(FULL, SWA4, enable_caching=False))
    with pytest.raises(KVCheckInputError, match="1 lists for 2 KV-cache groups"):
        m.allocate_slots(RequestView("r", tuple(range(100, 109))), 9, 2, [[1]])


def test_slot_mapping_maps_group_0_even_past_the_pool_size(adapter: Any) -> None:
    """A sliding window's table outgrows the pool (its skipped entries are nulls): group 0's
    slots are still ``table[pos // bs] * bs + pos % bs`` for the positions it holds."""
    m = adapter.make_kv_cache_manager(_spec(SWA4, num_blocks=8, enable_caching=False))
    prompt = tuple(range(100, 140))
    for start in range(0, len(prompt), 4):
        view = RequestView("r", prompt, (), start)
        assert m.allocate_slots(view, 4) is not None
    table = m.get_block_ids("r")[0]
    assert len(table) == 20 > m.spec.num_blocks
    assert m.slot_mapping("r", 36, 40) == [table[p // 2] * 2 + p % 2 for p in range(36, 40)]


@pytest.mark.skipif(PROFILE != "vllm-0.33", reason="shared_prefix_boundary is 0.33's")
def test_lookup_pins_the_shared_prefix_boundary_as_the_scheduler_does(adapter: Any) -> None:
    """docs/semantics.md#hits-per-group-and-the-common-hit-length /
    docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups with retention 0: A
    (10 tokens) leaves its SWA(w=4) blocks 2-3 cached;
    B (A + 6 tokens) hits 8 tokens while full attention alone would hit 10, so the boundary
    is 8 + 2 = 10 and B's SWA group caches blocks [3, 5) besides [5, 7) (prompt boundary 15):
    hashes 2-6, block 4 only because of the boundary."""
    m = adapter.make_kv_cache_manager(_spec(FULL, SWA4, num_blocks=32,
                                            prefix_cache_retention_interval=0))
    m.allocate_slots(RequestView("A", tuple(range(100, 110))), 10)
    m.free("A")
    view = RequestView("B", tuple(range(100, 116)))
    hits, num = m.get_computed_blocks(view)
    assert (hits, num) == ([[1, 2, 3, 4], [0, 0, 8, 9]], 8)
    assert m.allocate_slots(view, 16 - num, num, hits) is not None
    index = {h: i for i, h in enumerate(m.block_hashes("B"))}
    swa = sorted(index[h] for h, g, _ in _cache_map(m.pool) if g == 1)
    assert swa == [2, 3, 4, 5, 6]
