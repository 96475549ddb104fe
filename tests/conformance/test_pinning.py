"""Lookups with side effects (``pinning_lookup``) and the two ref-count conventions
(``ImplInfo.ref_cnt_counts_cache``), issue 24 items 5 and 6.

``pinning_kv`` (this folder) is a small independent design whose lookups pin their hits and
whose ``ref_cnt`` counts the cache's own reference; it conforms to ``generic``, and
``mut_pin_leak`` (its ``release_computed`` keeps the references) is caught with a message
naming the law and the pinned blocks. The rest checks the pieces one by one: the guard's pin
ledger, the driver's releases, the laws under both conventions, the loader's checks of the new
field and capability, traces with ``lookup`` ops, the random workloads and the benchmark loop.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Imported here so that pytester's per-test sys.modules restore keeps them (the reference's
# C extensions load once per process) across the in-process suite run.
import kvcheck.adapters.reference
import kvcheck.conformance
from kvcheck.conformance.cache_refs import allowed_ref_cnts, may_be_cached
from kvcheck.conformance.call_limit import CallLimit
from kvcheck.conformance.differential import ConformanceMismatch, Pair
from kvcheck.conformance.guard import GuardedManager, ProtocolViolation
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.loader import ImplHandle, ImplLoadError, load_impl
from kvcheck.conformance.ops import add, free, lookup, schedule
from kvcheck.conformance.pinning import PinLedger, PinningMisuse, ledger_of, pinned_ids
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.conformance.trace_check import TraceError, check_ops

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent
DOCS = HERE.parents[1] / "docs"
SUITE_DIR = Path(kvcheck.conformance.__file__).resolve().parent


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``load_impl`` for the modules of this folder (``pinning_kv``, ``mut_pin_leak``)."""
    monkeypatch.syspath_prepend(str(HERE))
    return load_impl


def _pair(impl: ImplHandle, **fields: Any) -> Pair:
    return Pair(impl, None, KVCacheSpec(profile="generic", **fields))


def _cached(pair: Pair, prompt: list[int]) -> None:
    pair.run([add("a", prompt), schedule("a"), free("a")])


# ---------------------------------------------------------------- the design and its mutant
def _run_generic(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, impl: str,
                 *args: str, subprocess: bool = False) -> pytest.RunResult:
    """The shipped suite under generic on a module of this folder: in a fresh interpreter
    (``subprocess``: the whole suite, kernels' imports included, as a user runs it), or
    in-process for a few suite files (the child pytest a partial run starts to count the
    whole suite is stubbed: only failures are read)."""
    argv = (f"--kv-impl={impl}", "--kv-profile=generic", "-p", "no:cacheprovider",
            "--kv-max-examples=10", *args)
    if subprocess:
        monkeypatch.setenv("PYTHONPATH", str(HERE))
        return pytester.runpytest_subprocess(*argv)
    pytester.syspathinsert(HERE)
    for name, module in list(sys.modules.items()):
        if name.startswith("kvcheck.plugin") and hasattr(module, "inventory_subprocess"):
            monkeypatch.setattr(module, "inventory_subprocess", lambda *a, **k: None)
    return pytester.runpytest_inprocess(*argv)


def test_pinning_kv_conforms_to_generic(pytester: pytest.Pytester,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinning design with the cache's reference in ref_cnt passes the whole generic
    suite, the lookup-style tests and the random laws included."""
    result = _run_generic(pytester, monkeypatch, "pinning_kv", "-rA", subprocess=True)
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, text[-4000:]
    assert "pinning_kv conforms to generic" in text, text[-2000:]
    for test in ("test_pinned_hits_are_held_until_released", "test_pinned_block_is_never_evicted",
                 "test_refused_admission_releases_its_pins",
                 "test_cached_blocks_nobody_holds_are_free", "test_ref_counts_follow_sharing",
                 "test_laws_hold_under_random_workloads"):
        assert re.search(rf"^PASSED \S+::{test}\[pinning_kv\]", text, re.MULTILINE), (
            f"{test} did not pass on pinning_kv\n" + text[-3000:])


def test_generic_catches_the_pin_leak(pytester: pytest.Pytester,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The leaky release fails the lookup-style tests, each naming conservation and the
    blocks whose pins it kept (that area only: its tests fail at once)."""
    result = _run_generic(pytester, monkeypatch, "mut_pin_leak",
                          str(SUITE_DIR / "test_lookup_styles.py"))
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, text[-3000:]
    assert "mut_pin_leak does NOT conform to generic" in text, text[-2000:]
    assert result.parseoutcomes().get("failed", 0) >= 5, text[-2000:]
    assert "conservation: " in text and "(pin ended by release_computed(" in text, text[-4000:]


def test_leaked_pin_breaks_conservation_naming_the_block(load: Any) -> None:
    """A refused admission whose pins the design keeps: the next check fails conservation,
    naming the pinned blocks and the call that should have dropped them, and ref_cnt."""
    pair = _pair(load("mut_pin_leak"), num_blocks=6, block_size=4)
    _cached(pair, list(range(9)))  # blocks 0 and 1 cached, 2 was the partial block
    pair.apply(add("big", [*range(8), *[7] * 40]))
    with pytest.raises(ConformanceMismatch) as info:
        pair.apply(schedule("big"))
    text = str(info.value)
    assert ("conservation: num_free_blocks() (4) + distinct blocks held by live requests (0) "
            "= 4 != 6") in text and "(a block was lost)" in text, text
    assert ("these once-pinned blocks are neither held by a request nor free now: block 1 "
            "(pin ended by release_computed('big')), block 0 (pin ended by "
            "release_computed('big'))") in text, text
    assert "block 0: ref_cnt 2 but 0 request(s) hold it (ref_cnt_counts_cache: 0 or 1" in text
    assert "m.release_computed('big')  # -> None" in text, "the repro shows the release"


def test_the_design_passes_the_same_scenario(load: Any) -> None:
    pair = _pair(load("pinning_kv"), num_blocks=6, block_size=4)
    _cached(pair, list(range(9)))
    pair.apply(add("big", [*range(8), *[7] * 40]))
    assert pair.apply(schedule("big")) == {"hits": ([[0, 1]], 8), "new": None}
    assert pair.impl.manager.num_free_blocks() == 6


# ---------------------------------------------------------------- the driver's releases
def test_driver_releases_refused_admissions_and_lookups(load: Any) -> None:
    pair = _pair(load("pinning_kv"), num_blocks=6, block_size=4)
    _cached(pair, list(range(9)))
    pair.run([add("big", [*range(8), *[7] * 40]), schedule("big"), add("b", list(range(9))),
              lookup("b"), schedule("b")])
    calls = [line.partition("  #")[0] for line in pair.impl.lines if line.startswith("m.")]
    assert calls[-7:] == [
        "m.get_computed_blocks(views['big'])", "m.allocate_slots(views['big'], 40, 8, [0, 1])",
        "m.release_computed('big')",  # the refused admission
        "m.get_computed_blocks(views['b'])", "m.release_computed('b')",  # the lookup op
        "m.get_computed_blocks(views['b'])", "m.allocate_slots(views['b'], 1, 8, [0, 1])",
    ], calls  # an admission that succeeds ends its lookup: no release
    ledger = ledger_of(pair.impl.manager)
    assert ledger is not None and ledger.pinned() == {}


def test_reference_lookups_stay_side_effect_free(load: Any) -> None:
    """Without pinning_lookup nothing changes: no ledger, no release_computed call (the
    reference has no such method), and a lookup op is a plain lookup."""
    pair = _pair(load("reference"), num_blocks=6, block_size=4)
    _cached(pair, list(range(9)))
    pair.run([add("b", list(range(9))), lookup("b"), add("big", [7] * 60), schedule("big")])
    assert ledger_of(pair.impl.manager) is None and not pair.impl.pinning
    assert not [line for line in pair.impl.lines if "release_computed" in line]
    assert not hasattr(pair.impl.manager._raw, "release_computed")


# ---------------------------------------------------------------- the guard's ledger
def _guarded(raw: object, spec: KVCacheSpec) -> GuardedManager:
    guard = GuardedManager(raw, impl="pinning_kv", spec=spec, reserved=(),
                           limit=CallLimit(None, "pinning_kv"))
    guard.follow_pins()
    return guard


def test_guard_refuses_a_pinned_block_handed_out(load: Any) -> None:
    """A design whose lookup does not really pin evicts a block another request's lookup
    pinned: the allocation is a protocol violation naming the block and the lookup."""
    module = load("pinning_kv").module

    class ForgetsPins(module.PinningManager):  # type: ignore[name-defined,misc]
        def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
            hits, num = super().get_computed_blocks(request)
            self.release_computed(request.request_id)  # BUG: the hits stay evictable
            self.pins[request.request_id] = []
            return hits, num

    spec = KVCacheSpec(num_blocks=4, block_size=4, profile="generic")
    mgr = _guarded(ForgetsPins(spec), spec)
    a = RequestView("a", tuple(range(9)))
    assert mgr.get_computed_blocks(a) == ([], 0)
    assert mgr.allocate_slots(a, 9) == [0, 1, 2]
    mgr.free("a")
    assert mgr.get_computed_blocks(RequestView("b", tuple(range(9)))) == ([0, 1], 8)
    c = RequestView("c", tuple(range(100, 116)))
    mgr.get_computed_blocks(c)
    with pytest.raises(ProtocolViolation, match=(
            r"pinning_kv\.allocate_slots\(.*\) returned \[3, 2, 0, 1\]: block 0 is handed out "
            r"anew but it is pinned by the lookup of request\(s\) \['b'\], not yet followed by "
            r"allocate_slots or release_computed")):
        mgr.allocate_slots(c, 16)


def test_the_suite_never_looks_up_twice_or_frees_a_pinned_request(load: Any) -> None:
    spec = KVCacheSpec(num_blocks=4, block_size=4, profile="generic")
    mgr = _guarded(load("pinning_kv").module.PinningManager(spec), spec)
    b = RequestView("b", (1, 2, 3))
    mgr.get_computed_blocks(b)
    with pytest.raises(PinningMisuse, match=r"get_computed_blocks\('b'\) called again .*\n"
                                            r"  Fix: under pinning_lookup follow every lookup"):
        mgr.get_computed_blocks(b)
    with pytest.raises(PinningMisuse, match=r"free\('b'\) called while the pins"):
        mgr.free("b")
    mgr.release_computed("b")
    mgr.free("b")  # nothing outstanding now
    mgr.get_computed_blocks(b)
    assert mgr.allocate_slots(b, 3) == [0] and not mgr.pin_ledger.pinned()


def test_ledger_counts_pins_and_remembers_how_they_ended() -> None:
    ledger = PinLedger()
    ledger.pin("b", [3, 4])
    ledger.pin("c", [3])
    assert ledger.holders() == Counter({3: 2, 4: 1}) and ledger.pinners(3) == ["b", "c"]
    assert ledger.clash("d", [5, 4]) == (
        "block 4 is handed out anew but it is pinned by the lookup of request(s) ['b'], not yet "
        "followed by allocate_slots or release_computed (pinning_lookup: a pinned block is "
        "held by the request that looked it up; it must not be evicted or handed out)")
    assert "this request's own lookup, so it is a hit" in (ledger.clash("b", [4]) or "")
    ledger.release("b")
    ledger.consume("c")
    assert ledger.ended() == {4: "release_computed('b')", 3: "allocate_slots('c')"}
    assert ledger.leak_hint({3}, free_known=True).endswith(
        "neither held by a request nor free now: block 4 (pin ended by release_computed('b'))")
    ledger.handed_out([4])
    assert ledger.leak_hint({3}, free_known=False) == "" and ledger.holders() == Counter()


def test_grouped_lookups_pin_every_real_block() -> None:
    assert pinned_ids([[3, 0, 5]], null=None) == [3, 0, 5]  # block 0 is ordinary here
    assert pinned_ids([[1, 2], [0, 0, 7]], null=0) == [1, 2, 7]  # 0: the null block


# ---------------------------------------------------------------- ref-count conventions
def test_hybrid_blocks_may_be_cached_in_any_group(load: Any) -> None:
    from kvcheck.conformance.protocol import KVCacheGroupSpec

    groups = (KVCacheGroupSpec("full_attention"), KVCacheGroupSpec("full_attention"))
    pair = Pair(load("reference"), None, KVCacheSpec(num_blocks=16, block_size=4,
                                                     kv_cache_groups=groups))
    pair.run([add("a", list(range(9))), schedule("a")])
    tables = pair.impl.tables()["a"]
    assert len(pair.impl.written) == 2
    assert may_be_cached(pair.impl) == {*tables[0][:2], *tables[1][:2]}, tables


def test_allowed_ref_cnts_by_convention(load: Any) -> None:
    counts_cache = load("pinning_kv").info
    vllm_style = dataclasses.replace(counts_cache, ref_cnt_counts_cache=False)
    assert allowed_ref_cnts(counts_cache, 2, cached=True) == {2, 3}
    assert allowed_ref_cnts(counts_cache, 2, cached=False) == {2}
    assert allowed_ref_cnts(vllm_style, 0, cached=True) == {0}


def test_cache_reference_breaks_the_vllm_convention(load: Any) -> None:
    """The same design declaring vLLM's convention fails the ref-count law on its cached
    blocks (the message has no convention note: today's wording)."""
    impl = load("pinning_kv")
    impl = dataclasses.replace(impl, info=dataclasses.replace(impl.info,
                                                              ref_cnt_counts_cache=False))
    pair = _pair(impl, num_blocks=6, block_size=4)
    pair.apply(add("a", list(range(9))))
    with pytest.raises(ConformanceMismatch, match=r"block 0: ref_cnt 2 but 1 request\(s\) hold "
                                                  r"it; block 1: ref_cnt 2 but 1 request"):
        pair.apply(schedule("a"))


def test_cache_reference_only_where_the_block_may_be_cached(load: Any) -> None:
    """With ref_cnt_counts_cache the extra reference is allowed on full computed blocks only:
    a partial block (and any block with caching off) must count its holders exactly."""
    module = load("pinning_kv").module

    class CountsOneTooMany(module.PinningManager):  # type: ignore[name-defined,misc]
        def ref_cnt(self, block_id: int) -> int:
            held = any(block_id in table for table in self.tables.values())
            return self.ref[block_id] + held  # BUG: a held block counts one reference more

    impl = dataclasses.replace(load("pinning_kv"), factory=CountsOneTooMany)
    pair = _pair(impl, num_blocks=6, block_size=4)
    pair.apply(add("a", list(range(9))))
    with pytest.raises(ConformanceMismatch) as info:
        pair.apply(schedule("a"))
    text = str(info.value)
    assert "block 0: ref_cnt 3 but 1 request(s) hold it (ref_cnt_counts_cache: 1 or 2" in text
    assert ("block 2: ref_cnt 2 but 1 request(s) hold it (ref_cnt_counts_cache: exactly 1, as "
            "it holds no full block of computed tokens, which alone the cache may keep)") in text
    off = _pair(impl, num_blocks=6, block_size=4, enable_caching=False)
    off.apply(add("a", list(range(9))))
    with pytest.raises(ConformanceMismatch, match=re.escape(
            "block 0: ref_cnt 2 but 1 request(s) hold it (ref_cnt_counts_cache: exactly 1, as "
            "caching is off (enable_caching=False))")):
        off.apply(schedule("a"))


def test_pins_count_as_references_and_held_blocks(load: Any) -> None:
    pair = _pair(load("pinning_kv"), num_blocks=6, block_size=4)
    _cached(pair, list(range(9)))
    assert may_be_cached(pair.impl) == {0, 1}
    pair.apply(add("b", list(range(9))))
    mgr = pair.impl.manager
    assert mgr.get_computed_blocks(pair.impl.views["b"]) == ([0, 1], 8)
    assert [mgr.ref_cnt(b) for b in (0, 1)] == [2, 2]  # the pin and the cache
    assert check_laws(pair.impl) == []
    assert mgr.num_free_blocks() == 4
    mgr.release_computed("b")
    assert check_laws(pair.impl) == [] and mgr.num_free_blocks() == 6


# ---------------------------------------------------------------- loader
_MODULE = """
from kvcheck.conformance.protocol import ImplInfo
from kvcheck.adapters.reference import make_kv_cache_manager, make_block_pool
IMPL_INFO = ImplInfo("{name}", "1", frozenset({caps}){extra})
"""


@pytest.mark.parametrize(("name", "caps", "extra", "message"), [
    ("pinbad_str", '{"manager", "ref_counts"}', ', ref_cnt_counts_cache="yes"',
     "IMPL_INFO.ref_cnt_counts_cache='yes' is a str, not a bool"),
    ("pinbad_int", '{"manager", "ref_counts"}', ", ref_cnt_counts_cache=1",
     "IMPL_INFO.ref_cnt_counts_cache=1 is a int, not a bool"),
    ("pinbad_alone", '{"manager"}', ", ref_cnt_counts_cache=True",
     "IMPL_INFO.ref_cnt_counts_cache=True without the 'ref_counts' capability"),
    ("pinbad_method", '{"manager", "pinning_lookup"}', "",
     ("capability 'pinning_lookup' is declared but the manager (ReferenceManager) lacks "
      "release_computed")),
    ("pinbad_pool", '{"block_pool", "pinning_lookup"}', "",
     "IMPL_INFO declares 'pinning_lookup' without 'manager'"),
])
def test_loader_checks_the_new_field_and_capability(tmp_path: Path, name: str, caps: str,
                                                    extra: str, message: str) -> None:
    (tmp_path / f"{name}.py").write_text(_MODULE.format(name=name, caps=caps, extra=extra))
    with pytest.raises(ImplLoadError) as info:
        load_impl(name, search=[tmp_path])
    text = str(info.value)
    assert text.startswith(f"kvcheck: --kv-impl={name}: ") and "\n  Fix: " in text, text
    assert message in text, text


def test_bad_ref_cnt_counts_cache_is_a_pytest_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(pinbad_cli=_MODULE.format(name="pinbad_cli", caps='{"manager"}',
                                                  extra=", ref_cnt_counts_cache=True"))
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=pinbad_cli")
    text = "\n".join(result.errlines + result.outlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "ref_cnt_counts_cache=True without the 'ref_counts' capability" in text
    assert "  Fix: declare 'ref_counts'" in text and "Traceback" not in text


# ---------------------------------------------------------------- traces, workloads, bench
def test_traces_accept_lookup_ops() -> None:
    ops = [add("a", [1, 2]), lookup("a")]
    assert check_ops(ops, "t.json") == ops
    with pytest.raises(TraceError, match=r"'lookup' op has unknown fields \['num_tokens'\]"):
        check_ops([add("a", [1]), {"op": "lookup", "rid": "a", "num_tokens": 1}], "t.json")
    with pytest.raises(TraceError, match="'lookup' names request 'b', which no earlier 'add'"):
        check_ops([lookup("b")], "t.json")


def test_random_workloads_look_up_without_scheduling_only_with_pinning(load: Any) -> None:
    from kvcheck.conformance.workload_machine import run_workload_machine

    for target, wanted in (("pinning_kv", True), ("reference", False)):
        impl, pairs, stats = load(target), [], Counter()

        def make_pair(impl: ImplHandle = impl, pairs: list[Pair] = pairs, **fields: Any) -> Pair:
            pairs.append(Pair(impl, None, KVCacheSpec(profile="generic", **fields)))
            return pairs[-1]

        run_workload_machine(make_pair, settings(max_examples=12, deadline=None,
                                                 derandomize=True, database=None,
                                                 suppress_health_check=list(HealthCheck)),
                             None, extras=False, events=False, impl=impl, profile="generic",
                             stats=stats)
        lookups = [op for p in pairs for op in p.ops if op["op"] == "lookup"]
        assert bool(lookups) == wanted, (target, len(lookups))
        assert (stats["pinned_lookup_released"] > 0) == wanted, (target, stats)


def test_bench_loop_releases_refused_lookups(load: Any) -> None:
    """The benchmark's scheduler loop releases a refused admission's pins for a design that
    declares pinning_lookup; without the release the design leaks and stalls."""
    from kvcheck.bench.measure.allocator import workload_spec
    from kvcheck.bench.replay.scheduler import run_workload
    from kvcheck.bench.workload.scenarios import make_workload
    from kvcheck.errors import KVCheckFailure

    impl = load("pinning_kv")
    workload = make_workload("eviction_pressure", scale=0.02)
    manager = impl.make_manager(workload_spec(workload), guard=False)
    run_workload(manager, workload, pinning=True)
    assert manager.num_free_blocks() == workload.num_blocks
    leaky = impl.make_manager(workload_spec(workload), guard=False)
    with pytest.raises(KVCheckFailure, match="cannot be admitted into an idle pool"):
        run_workload(leaky, workload, pinning=False)


# ---------------------------------------------------------------- scaffold and docs
def test_scaffold_writes_release_computed_under_its_capability() -> None:
    from kvcheck.plugin.scaffold import render_adapter

    text = render_adapter("myengine", "generic")
    section = text.split('# ---------------------------------------------------------'
                         '--- capability "pinning_lookup"', 1)[1]
    assert section.lstrip().startswith("def release_computed(self, request_id: str) -> None:")
    assert "ref_cnt_counts_cache=False," in text


def test_the_docs_worked_pinning_example_is_the_tested_design() -> None:
    """Every line of the pinning example in docs/writing-an-adapter.md is a line of
    pinning_kv.py, which this file runs through the suite."""
    doc = (DOCS / "writing-an-adapter.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- pinning example: tests/conformance/pinning_kv.py -->\n```python\n"
                      r"(.*?)```", doc, re.DOTALL)
    assert match, "docs/writing-an-adapter.md lost its pinning example"
    source = {line.strip() for line in (HERE / "pinning_kv.py").read_text().splitlines()}
    missing = [line for line in match.group(1).splitlines()
               if line.strip() and line.strip() != "..." and line.strip() not in source]
    assert not missing, missing
