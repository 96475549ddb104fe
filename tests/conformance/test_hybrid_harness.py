"""The multi-group harness on small fakes: the guard's per-group rules
(``GuardedManager`` for a multi-group spec), the laws' group rules (``laws``), the layouts drawn by
``layouts`` and multi-group traces (``trace_check``, ``write_trace`` /
``load_trace``).

``FakeHybrid`` is a tiny correct two-group manager (full attention + sliding window, no
caching) written from docs/semantics.md#skipped-tokens-and-null-blocks /
docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups; each subclass has one
bug, which the guard or exactly
the law meant for it must catch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvcheck.conformance.differential import load_trace, write_trace
from kvcheck.conformance.driver import Driver
from kvcheck.conformance.groups import skipped_tokens
from kvcheck.conformance.guard import GuardedManager, ProtocolViolation
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.layouts import hybrid_layouts, layout_for
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.ops import add, decode, free, schedule
from kvcheck.conformance.protocol import (
    ImplInfo,
    KVCacheGroupSpec,
    KVCacheSpec,
    RequestView,
    spec_to_dict,
)
from kvcheck.conformance.trace_check import TraceError

SPEC = KVCacheSpec(num_blocks=16, block_size=2, enable_caching=False,
                   kv_cache_groups=(KVCacheGroupSpec("full_attention", 2),
                                    KVCacheGroupSpec("sliding_window", 2, sliding_window=4)))
CAPS = frozenset({"manager", "kv_cache_groups", "sliding_window", "free_queue_order",
                  "ref_counts"})


class FakeHybrid:
    """Full attention + SWA(w) over one pool, caching off: unhashed frees go to the head."""

    def __init__(self, spec: KVCacheSpec) -> None:
        self.spec = spec
        self.queue = list(range(1, spec.num_blocks))
        self.tables: dict[str, list[list[int]]] = {}

    def skipped(self, g: int, n: int) -> int:
        return skipped_tokens(self.spec.groups[g], n) // self.spec.group_block_size(g)

    def get_computed_blocks(self, request: RequestView) -> tuple[list[list[int]], int]:
        return [[], []], 0

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0, new_computed_block_ids: Any = (),
                       num_lookahead_tokens: int = 0) -> list[list[int]] | None:
        rid = request.request_id
        tables = self.tables.get(rid, [[], []])
        n = request.num_computed_tokens + num_new_computed_tokens
        for g, table in enumerate(tables):
            freed = []
            for i in range(min(self.skipped(g, n), len(table)) - 1, -1, -1):
                if table[i] == 0:
                    break
                freed.append(table[i])
                table[i] = 0
            self.release(freed)
        total = n + num_new_tokens + num_lookahead_tokens
        need = [max(0, -(-total // 2) - len(t)) for t in tables]
        if sum(need) > len(self.queue):
            return None
        new = [self.take(k) for k in need]
        for table, part in zip(tables, new, strict=True):
            table.extend(part)
        self.tables[rid] = tables
        return new

    def take(self, k: int) -> list[int]:
        out, self.queue = self.queue[:k], self.queue[k:]
        return out

    def release(self, blocks: list[int]) -> None:
        self.queue[:0] = blocks[::-1]  # each block to the head: the first freed ends first

    def free(self, request_id: str) -> None:
        for table in self.tables.pop(request_id, []):
            self.release([b for b in reversed(table) if b])

    def get_block_ids(self, request_id: str) -> list[list[int]]:
        return [list(t) for t in self.tables.get(request_id, [[], []])]

    def num_free_blocks(self) -> int:
        return len(self.queue)

    def free_block_ids(self) -> list[int]:
        return list(self.queue)

    def ref_cnt(self, block_id: int) -> int:
        return sum(block_id in t for ts in self.tables.values() for t in ts)


class NullHandedOut(FakeHybrid):
    def take(self, k: int) -> list[int]:
        return [0] + super().take(k - 1) if k else []


class WindowTooLate(FakeHybrid):
    def skipped(self, g: int, n: int) -> int:
        return max(0, super().skipped(g, n) - 1)


class WindowTooEarly(FakeHybrid):
    def skipped(self, g: int, n: int) -> int:
        return super().skipped(g, n) + 1 if g == 1 and n > 4 else super().skipped(g, n)


class LeaksSkipped(FakeHybrid):
    def release(self, blocks: list[int]) -> None:
        pass


class NullQueued(FakeHybrid):
    def free(self, request_id: str) -> None:
        super().free(request_id)
        if 0 not in self.queue:
            self.queue.append(0)


class CrossGroup(FakeHybrid):
    """Hands group 1 a block group 0 of another request holds."""

    def allocate_slots(self, request: RequestView, *args: Any, **kwargs: Any) -> Any:
        new = super().allocate_slots(request, *args, **kwargs)
        if new and new[1] and request.request_id == "b":
            stolen = self.tables["a"][0][0]
            self.queue.append(new[1][0])
            self.tables["b"][1][self.tables["b"][1].index(new[1][0])] = stolen
            new[1][0] = stolen
        return new


def handle(cls: type[FakeHybrid], caps: frozenset[str] = CAPS) -> ImplHandle:
    module = ModuleType(f"fake_{cls.__name__}")
    info = ImplInfo(name=cls.__name__, version="0", capabilities=caps, hash_algos=())
    return ImplHandle(info.name, module.__name__, module, info, cls, None, call_timeout=None)


OPS = [add("a", range(100, 110)), schedule("a", 6), schedule("a"), decode("a", 1),
       decode("a", 1), add("b", range(200, 205)), schedule("b"), decode("b", 1),
       free("a"), decode("b", 1), free("b")]


def run(cls: type[FakeHybrid]) -> tuple[int, list[str]]:
    """The 1-based op after which a law (or the guard) first broke, and the problems."""
    driver = Driver(handle(cls), SPEC)
    for number, op in enumerate(OPS, 1):
        try:
            driver.apply(op)
            problems = check_laws(driver)
        except ProtocolViolation as exc:
            return number, [f"guard: {exc}"]
        if problems:
            return number, problems
    return 0, []


def test_correct_fake_keeps_every_hybrid_law() -> None:
    assert run(FakeHybrid) == (0, [])


@pytest.mark.parametrize(("cls", "words"), [
    (NullHandedOut, "guard: "),
    (WindowTooLate, "window: request 'a' group 1 (sliding_window) still holds live blocks"),
    (WindowTooEarly, "which its window still needs"),
    (LeaksSkipped, "conservation:"),
    # The guard stops these first (the laws repeat the rule for what the guard cannot see).
    (NullQueued, "the free queue contains reserved block id(s) [0]"),
    (CrossGroup, "handed out anew but request(s) ['a'] still hold it"),
])
def test_each_bug_breaks_its_law(cls: type[FakeHybrid], words: str) -> None:
    number, problems = run(cls)
    assert number, f"{cls.__name__}: no law broke"
    assert any(words in p for p in problems), (cls.__name__, number, problems)


def test_guard_names_the_per_group_shape() -> None:
    class Flat(FakeHybrid):
        def get_computed_blocks(self, request: RequestView) -> Any:
            return [], 0

    mgr = handle(Flat).make_manager(SPEC)
    assert isinstance(mgr, GuardedManager) and mgr.grouped
    with pytest.raises(ProtocolViolation, match=r"get_computed_blocks.*must be a list of 2 "
                                                r"lists of int \(one per KV-cache group"):
        mgr.get_computed_blocks(RequestView("a", (1, 2, 3)))


def test_guard_checks_tables_against_the_answers() -> None:
    class Rewrites(FakeHybrid):
        def get_block_ids(self, request_id: str) -> list[list[int]]:
            tables = super().get_block_ids(request_id)
            return [t[::-1] for t in tables]

    mgr = handle(Rewrites).make_manager(SPEC)
    with pytest.raises(ProtocolViolation, match="possibly replaced by the null block"):
        mgr.allocate_slots(RequestView("a", tuple(range(6))), 6, 0, [[], []])


def test_single_group_specs_keep_the_flat_guard() -> None:
    mgr = handle(FakeHybrid).make_manager(KVCacheSpec(num_blocks=8, block_size=2))
    assert isinstance(mgr, GuardedManager) and not mgr.grouped


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10", "generic"])
def test_layouts_stay_within_the_profile(profile: str) -> None:
    kinds = ("full_attention", "sliding_window", "chunked_local_attention")
    assert hybrid_layouts(profile, ("full_attention",))
    for draw in range(200):
        groups, retention = layout_for(profile, kinds, 2, draw)
        sizes = {g.block_size or 2 for g in groups}
        # Every size is a multiple of the drawn block size, so the hash block (their gcd) is
        # too; neither it nor the scheduler block (their lcm) need be a group's size (0.33:
        # full attention with windows of 2 and 3 blocks; full attention of 2 blocks beside a
        # window of 3, hashed at 1).
        lcm = math.lcm(*sizes)
        assert all(s % 2 == 0 for s in sizes), groups
        for g in groups:
            if g.kind == "sliding_window":
                assert g.sliding_window is not None and 2 <= g.sliding_window <= 32
            if g.kind == "chunked_local_attention":
                assert g.attention_chunk_size is not None and g.block_size == lcm
                assert g.attention_chunk_size % lcm == 0
        if profile == "vllm-0.10":
            assert len(sizes) == 1 and retention is None
            specs = {(g.kind, g.sliding_window, g.attention_chunk_size) for g in groups}
            full = [s for s in specs if s[0] == "full_attention"]
            assert len(specs) == 1 or (len(full) == 1 and len(specs) == 2), groups
        else:
            assert len(groups) <= 4
            # None, 0, or (with a sliding group, as vLLM requires) a multiple of the scheduler
            # block size.
            has_swa = any(g.kind == "sliding_window" for g in groups)
            assert retention in (None, 0) or (has_swa and retention > 0
                                              and retention % lcm == 0), (groups, retention)
    # Every retention kind is drawn under 0.33.
    drawn = {(r is None, r == 0) for r in
             (layout_for("vllm-0.33", kinds, 2, d)[1] for d in range(200))}
    if profile != "vllm-0.10":
        assert drawn == {(True, False), (False, True), (False, False)}


def test_multi_group_trace_round_trips(tmp_path: Path) -> None:
    spec = KVCacheSpec(num_blocks=9, block_size=2, prefix_cache_retention_interval=0,
                       kv_cache_groups=(KVCacheGroupSpec("full_attention", 2),
                                        KVCacheGroupSpec("chunked_local_attention", 2,
                                                         attention_chunk_size=4)))
    path = write_trace("t", "reference", spec, OPS, directory=tmp_path)
    assert load_trace(path)["spec"] == spec


@pytest.mark.parametrize(("groups", "retention", "words"), [
    ([{"kind": "sliding"}], None, "kind='sliding': unknown"),
    ([{"kind": "sliding_window"}], None, "needs sliding_window"),
    ([{"kind": "full_attention", "sliding_window": 4}], None, "sliding_window is set"),
    ([{"kind": "full_attention", "block_size": 0}], None, "block_size=0"),
    ([{"kind": "full_attention", "window": 4}], None, "unknown fields ['window']"),
    ("full", None, "must be a list"),
    ([], -1, "prefix_cache_retention_interval=-1"),
])
def test_trace_spec_groups_are_checked(tmp_path: Path, groups: object, retention: object,
                                       words: str) -> None:
    raw: dict[str, Any] = spec_to_dict(SPEC)
    raw["kv_cache_groups"] = groups
    raw["prefix_cache_retention_interval"] = retention
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"trace_version": 1, "impl": "x", "spec": raw, "ops": []}))
    with pytest.raises(TraceError, match=words.replace("[", r"\[").replace("(", r"\(")):
        load_trace(path)


def test_encoder_decoder_trace_round_trips(tmp_path: Path) -> None:
    spec = KVCacheSpec(num_blocks=9, block_size=2, enable_caching=False,
                       kv_cache_groups=(KVCacheGroupSpec("full_attention", 2),
                                        KVCacheGroupSpec("cross_attention", 2)))
    ops = [add("a", [1, 2, 3], encoder=6), schedule("a")]
    path = write_trace("t", "reference", spec, ops, directory=tmp_path)
    trace = load_trace(path)
    assert (trace["spec"], trace["ops"]) == (spec, ops)


@pytest.mark.parametrize(("groups", "encoder", "words"), [
    ([{"kind": "full_attention"}], 6, "no cross_attention group to hold them"),
    ([{"kind": "cross_attention"}], 0, "field 'encoder'=0"),
    ([{"kind": "cross_attention"}], "6", "field 'encoder'='6'"),
    ([{"kind": "cross_attention", "sliding_window": 4}], 6, "sliding_window is set"),
])
def test_trace_encoder_tokens_are_checked(tmp_path: Path, groups: object, encoder: object,
                                          words: str) -> None:
    raw: dict[str, Any] = spec_to_dict(SPEC)
    raw["kv_cache_groups"] = groups
    raw["enable_caching"] = False
    ops = [{"op": "add", "rid": "a", "prompt": [1, 2], "encoder": encoder}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"trace_version": 1, "impl": "x", "spec": raw, "ops": ops}))
    with pytest.raises(TraceError, match=words.replace("[", r"\[").replace("(", r"\(")):
        load_trace(path)


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_encoder_decoder_layouts_only_with_caching_off(profile: str) -> None:
    """Cross-attention layouts are drawn in half of the caching-off draws (never with caching
    on, which vLLM does not run), and caching-on draws are the table's as before."""
    kinds = ("full_attention", "sliding_window", "chunked_local_attention", "cross_attention")
    drawn_off = [layout_for(profile, kinds, 2, d, enable_caching=False)[0] for d in range(60)]
    cross = [g for g in drawn_off if any(x.kind == "cross_attention" for x in g)]
    assert len(cross) == 30
    for draw in range(60):
        on = layout_for(profile, kinds, 2, draw)[0]
        assert not any(g.kind == "cross_attention" for g in on)
        assert on == layout_for(profile, kinds[:3], 2, draw)[0]


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_a_decode_past_a_full_pool_with_cross_attention(profile: str) -> None:
    """The decode step needing a decoder block a full pool lacks: under 0.33 the
    implementation refuses it; under 0.10 the driver does not make the call (vLLM 0.10.2
    raises ValueError there, a bug not reproduced), answers it as refused and says why in the
    repro."""
    from kvcheck.conformance.loader import load_impl

    spec = KVCacheSpec(num_blocks=7, block_size=2, enable_caching=False, profile=profile,
                       kv_cache_groups=(KVCacheGroupSpec("full_attention", 2),
                                        KVCacheGroupSpec("cross_attention", 2)))
    driver = Driver(load_impl("reference"), spec)
    assert driver.apply(add("a", range(100, 105), encoder=6)) == {}
    assert driver.apply(schedule("a"))["new"] == [[1, 2, 3], [4, 5, 6]]
    assert driver.apply(decode("a"))["new"] == [[], []]
    calls = len(driver.lines)
    assert driver.apply(decode("a")) == {"new": None}
    made = [line for line in driver.lines[calls:] if line.startswith("m.allocate_slots")]
    if profile == "vllm-0.33":
        assert len(made) == 1 and made[0].endswith("# -> None")
    else:
        assert not made
        assert "not called: vLLM 0.10.2 raises ValueError" in driver.lines[-1]
    assert driver.tables() == {"a": [[1, 2, 3], [4, 5, 6]]}
    assert not check_laws(driver)


# --- Mamba groups ------------------------------------------------------------------------------
_KINDS_M = ("full_attention", "sliding_window", "chunked_local_attention", "cross_attention",
            "mamba")


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10", "generic"])
def test_mamba_layouts_where_vllm_runs_them(profile: str) -> None:
    """Mamba layouts: a quarter of the draws (caching on: vLLM 0.33's mode "align", the Mamba
    block the smallest of the layout; caching off: mode "none", both releases), no retention
    interval, 0 or 1 speculative blocks (with caching off a Mamba block may be the larger);
    every other draw is the one drawn without the
    ``mamba`` kind (the tables were appended to)."""
    for caching in (True, False):
        mamba = 0
        for draw in range(80):
            groups, retention = layout_for(profile, _KINDS_M, 2, draw, enable_caching=caching)
            kinds = [g.kind for g in groups]
            if "mamba" not in kinds:
                assert (groups, retention) == layout_for(profile, _KINDS_M[:4], 2, draw,
                                                         enable_caching=caching)
                continue
            mamba += 1
            assert draw % 4 == (3 if caching else 2) and retention is None
            assert "cross_attention" not in kinds
            for g in groups:
                if g.kind == "mamba":
                    assert g.mamba_cache_mode == ("align" if caching else "none")
                    assert g.num_speculative_blocks in (0, 1)
                    if caching:  # the hash block: 0.33's fine-grained hits stay off
                        assert g.block_size == min(x.block_size or 2 for x in groups)
        assert mamba == (0 if caching and profile == "vllm-0.10" else 20), (profile, caching)


def test_mamba_trace_round_trips(tmp_path: Path) -> None:
    spec = KVCacheSpec(num_blocks=9, block_size=2,
                       kv_cache_groups=(KVCacheGroupSpec("full_attention", 2),
                                        KVCacheGroupSpec("mamba", 2, mamba_cache_mode="align",
                                                         num_speculative_blocks=1)))
    path = write_trace("t", "reference", spec, OPS, directory=tmp_path)
    assert load_trace(path)["spec"] == spec
    # A group's Mamba fields are written only when set (other traces read as before).
    assert spec_to_dict(SPEC)["kv_cache_groups"] == [
        {"kind": "full_attention", "block_size": 2, "sliding_window": None,
         "attention_chunk_size": None},
        {"kind": "sliding_window", "block_size": 2, "sliding_window": 4,
         "attention_chunk_size": None}]


@pytest.mark.parametrize(("group", "words"), [
    ({"kind": "mamba", "mamba_cache_mode": "all"}, "mamba_cache_mode='all'"),
    ({"kind": "mamba", "num_speculative_blocks": -1}, "num_speculative_blocks=-1"),
    ({"kind": "mamba", "num_speculative_blocks": "1"}, "num_speculative_blocks='1'"),
    ({"kind": "full_attention", "mamba_cache_mode": "none"}, "mamba groups only"),
    ({"kind": "sliding_window", "sliding_window": 4, "num_speculative_blocks": 1},
     "mamba groups only"),
])
def test_trace_mamba_fields_are_checked(tmp_path: Path, group: dict[str, object],
                                        words: str) -> None:
    raw: dict[str, Any] = spec_to_dict(SPEC)
    raw["kv_cache_groups"] = [group]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"trace_version": 1, "impl": "x", "spec": raw, "ops": []}))
    with pytest.raises(TraceError, match=words.replace("[", r"\[").replace("(", r"\(")):
        load_trace(path)


def test_driver_marks_steps_for_mamba_layouts_only() -> None:
    """In a layout with a Mamba group the driver calls ``new_step_starts()`` at each step's
    start (the first schedule op, and an op of a request already scheduled in the step), and
    the repro shows the calls; elsewhere it calls nothing."""
    from kvcheck.conformance.loader import load_impl

    impl = load_impl("reference")
    spec = KVCacheSpec(num_blocks=12, block_size=4,
                       kv_cache_groups=(KVCacheGroupSpec("mamba", 4, mamba_cache_mode="align"),))
    driver = Driver(impl, spec)
    ops = [add("a", range(100, 112)), schedule("a", 8), add("b", range(100, 112)),
           schedule("b"), schedule("b"), schedule("a")]
    got = [driver.apply(op) for op in ops]
    # b's hit on a's state cached in this step is refused; its retry is the next step.
    assert got[3] == {"hits": ([[0, 1]], 8), "new": None}
    assert got[4]["new"] == [[2]]
    calls = [line for line in driver.lines if line.startswith(("m.new_step_starts",
                                                               "m.allocate_slots"))]
    assert [c.partition("(")[0] for c in calls] == [
        "m.new_step_starts", "m.allocate_slots", "m.allocate_slots", "m.new_step_starts",
        "m.allocate_slots", "m.allocate_slots"]
    assert driver.steps == 2 and not check_laws(driver)
    assert "m.new_step_starts()" in driver.snippet()
    other = Driver(impl, replace_groups(spec, (KVCacheGroupSpec("full_attention", 4),)))
    for op in ops:
        other.apply(op)
    assert "new_step_starts" not in other.snippet() and other.steps == 0


def replace_groups(spec: KVCacheSpec, groups: tuple[KVCacheGroupSpec, ...]) -> KVCacheSpec:
    from dataclasses import replace

    return replace(spec, kv_cache_groups=groups)


def test_a_mamba_adapter_without_new_step_starts_is_refused_under_033(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Declaring ``mamba`` under vllm-0.33 needs ``new_step_starts`` (vLLM 0.33's same-step
    refusal lifts there): the loader names the missing method and the fix."""
    from kvcheck.conformance.loader import ImplLoadError, load_impl

    (tmp_path / "nostep_adapter.py").write_text(
        "from kvcheck.adapters.reference import IMPL_INFO as _REF\n"
        "from kvcheck.adapters.reference import make_kv_cache_manager as _make\n"
        "from dataclasses import replace\n"
        "IMPL_INFO = replace(_REF, name='nostep', capabilities=_REF.capabilities\n"
        "                    - {'block_pool', 'kernels', 'sizing'})\n"
        "class Manager:\n"
        "    def __init__(self, inner):\n"
        "        self._inner = inner\n"
        "    def __getattr__(self, name):\n"
        "        if name == 'new_step_starts':\n"
        "            raise AttributeError(name)\n"
        "        return getattr(self._inner, name)\n"
        "def make_kv_cache_manager(spec):\n"
        "    return Manager(_make(spec))\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplLoadError) as info:
        load_impl("nostep_adapter")
    text = str(info.value)
    assert "capability 'mamba'" in text and "new_step_starts" in text, text
    assert "Fix: implement new_step_starts(self) -> None" in text, text


def test_mamba_groups_meet_dcp_only_where_mamba_dcp_is_declared() -> None:
    """``layouts.knobs_for``: a DCP draw holds a Mamba group with caching on (0.33) or under
    0.10.2 only when both sides declare ``mamba_dcp`` (with caching on ``fine_grained_hits``
    too); then in a good share of the DCP draws, with caching on only beside full attention
    (vLLM 0.33's HybridKVCacheCoordinator asserts it) in mode "align"; and an implementation
    declaring it keeps every non-DCP draw."""
    from kvcheck.conformance.layouts import knobs_for

    kinds = ("full_attention", "sliding_window", "chunked_local_attention", "mamba")
    old = ("dcp", "prefix_match_unit", "fine_grained_hits")
    for profile in ("vllm-0.33", "vllm-0.10"):
        for caching in (True, False):
            with_mamba = 0
            for draw in range(120):
                groups, _ = layout_for(profile, kinds, 4, draw, enable_caching=caching,
                                       fine_grained=True)
                before = knobs_for(profile, groups, 4, draw, enable_caching=caching,
                                   knobs=old)
                after = knobs_for(profile, groups, 4, draw, enable_caching=caching,
                                  knobs=(*old, "mamba_dcp"))
                if after is None or after[1] == 1:
                    assert after == before, (profile, caching, draw)  # non-DCP draws kept
                    continue
                mamba = [g for g in after[0] if g.kind == "mamba"]
                if before is not None and ((caching and profile == "vllm-0.33")
                                           or profile == "vllm-0.10"):
                    assert not any(g.kind == "mamba" for g in before[0]), (profile, draw)
                if mamba:
                    with_mamba += 1
                    if caching:
                        assert profile == "vllm-0.33"
                        assert {g.kind for g in after[0]} <= {"full_attention", "mamba"}
                        assert all(g.mamba_cache_mode == "align" for g in mamba)
            # 0.10.2 has no Mamba prefix caching: never with caching on there.
            if profile == "vllm-0.10" and caching:
                assert with_mamba == 0
            else:
                assert with_mamba >= 10, (profile, caching, with_mamba)


def test_dcp_draws_keep_mamba_out_where_the_run_kinds_do() -> None:
    """``layouts.knobs_for(group_kinds=...)``: a run whose kinds leave ``mamba`` out never
    gets a Mamba layout of DCP's own (it did: H1's DCP Mamba layouts ignored the kinds), and
    a run drawing Mamba keeps every draw it had without the argument."""
    from kvcheck.conformance.layouts import knobs_for

    knobs = ("dcp", "prefix_match_unit", "fine_grained_hits", "mamba_dcp")
    no_mamba = ("full_attention", "sliding_window", "chunked_local_attention")
    every = (*no_mamba, "mamba")
    dcp_draws = 0
    for profile in ("vllm-0.33", "vllm-0.10"):
        for caching in (True, False):
            for draw in range(120):
                groups, _ = layout_for(profile, no_mamba, 4, draw, enable_caching=caching,
                                       fine_grained=True)
                got = knobs_for(profile, groups, 4, draw, enable_caching=caching,
                                knobs=knobs, group_kinds=no_mamba)
                if got is not None and got[1] > 1:
                    dcp_draws += 1
                    assert all(g.kind != "mamba" for g in got[0]), (profile, caching, draw)
                groups, _ = layout_for(profile, every, 4, draw, enable_caching=caching,
                                       fine_grained=True)
                assert knobs_for(profile, groups, 4, draw, enable_caching=caching,
                                 knobs=knobs, group_kinds=every) == knobs_for(
                    profile, groups, 4, draw, enable_caching=caching, knobs=knobs)
    assert dcp_draws >= 40, dcp_draws
