"""Bad input on the surfaces added since the last bad-input review (issue 23, item 7): hybrid
specs, sizing answers, batch metadata answers, recorded corpora (the shipped ones and
``kvcheck record --check``) and ``kvcheck record``'s numbers. Each case is a row of
docs/bad-input.md, section "Hybrid specs, sizing, batch metadata, corpora and the benchmark
commands" (the benchmark commands' cases: tests/bench/test_cli_bounds.py)."""

from __future__ import annotations

import json
import lzma
import math
import random
import textwrap
from pathlib import Path
from typing import Any

import cbor2
import numpy as np
import pytest

import kvcheck.conformance
from kvcheck.conformance import recorded
from kvcheck.conformance.call_limit import CallLimit
from kvcheck.conformance.guard import GuardedManager, ProtocolViolation
from kvcheck.conformance.loader import ImplLoadError, load_impl
from kvcheck.conformance.protocol import ImplInfo, KVCacheGroupSpec, KVCacheSpec
from kvcheck.conformance.recorder import DEFAULT_TRACES
from kvcheck.conformance.sizing_answers import SizingAnswerError, check_sizing_answer, plan_int
from kvcheck.conformance.workload_machine import run_workload_machine, spec_fields
from kvcheck.plugin.cli import main

SUITE = Path(kvcheck.conformance.__file__).resolve().parent
NO_HYBRID = ('{"kv_cache_groups", "sliding_window", "chunked_local_attention", '
             '"cross_attention", "mamba", "fine_grained_hits", "boundary_state_offloads", '
             '"mamba_checkpoints", "dcp", "prefix_match_unit", "mamba_dcp", '
             '"mamba_shared_prefix_checkpoint"}')
MODULE_LEVEL = '{"block_pool", "kernels", "sizing", "offload"}'


@pytest.fixture
def no_inventory_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner runs of one suite file: no child pytest counting the whole suite (seconds each;
    only the completeness of the inner run needs it, and it is not what these tests check)."""
    monkeypatch.setattr("kvcheck.plugin.state.inventory_subprocess", lambda *a, **k: None)


def _write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                  source: str) -> str:
    """``name``.py in ``tmp_path``, importable (unique names: ``sys.modules`` caches)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _never_load(*args: object, **kwargs: object) -> None:
    raise AssertionError("an implementation was loaded before the arguments were checked")


# ------------------------------------------------------------------ kvcheck record's numbers
@pytest.mark.parametrize(("argv", "words"), [
    (["--traces", "1000000000"], ["--traces 1000000000", "record 1 to 10000 traces",
                                  "refuses to load more", f"e.g. --traces {DEFAULT_TRACES}"]),
    (["--traces", "-1"], ["--traces -1", "record 1 to 10000 traces"]),
    (["--seed", "-1"], ["--seed -1", "[0, 2^63-1]", "random.Random uses the absolute value",
                        "e.g. --seed 0"]),
    (["--seed", str(2**64)], ["--seed a 65-bit number", "signed 64-bit integer"]),
], ids=["traces-1e9", "traces-negative", "seed-negative", "seed-2^64"])
def test_record_numbers_are_bounded_before_anything_runs(
        argv: list[str], words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Was: 10^9 traces recorded for hours (then refused by every reader); a negative seed
    recorded trace 0 of the positive one; a seed past 2^63 wrote a corpus readers refuse."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("kvcheck.conformance.loader.load_impl", _never_load)
    assert main(["record", "--kv-impl=reference", *argv, "-o", "c.cbor.xz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcheck record: "), err
    for word in words:
        assert word in err, (word, err)
    assert list(tmp_path.iterdir()) == []  # no corpus, no lock file


def test_negative_seed_really_repeats_the_positive_one() -> None:
    """Why negative seeds are refused: the recorder seeds ``random.Random(seed * 1000003 +
    index)`` and ``random`` uses the absolute value, so trace 0 of -1 is trace 0 of 1."""
    assert random.Random(-1 * 1_000_003 + 0).random() == random.Random(1 * 1_000_003).random()


@pytest.mark.parametrize("argv", [["--traces", "5"], ["--seed", "3"]], ids=["traces", "seed"])
def test_record_check_refuses_numbers_it_would_ignore(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--check`` records again with the corpus header's traces and seed: a ``--traces`` or
    ``--seed`` beside it was silently ignored."""
    monkeypatch.setattr("kvcheck.conformance.loader.load_impl", _never_load)
    assert main(["record", "--check", str(tmp_path / "c.cbor.xz"), *argv]) == 2
    err = capsys.readouterr().err
    assert f"{' '.join(argv)} with --check" in err and "would be ignored" in err, err


def test_record_check_of_another_profiles_corpus_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--kv-profile=vllm-0.10 --check vllm-0.33.cbor.xz`` silently checked under 0.33."""
    monkeypatch.setattr("kvcheck.conformance.loader.load_impl", _never_load)
    path = recorded.corpus_path("vllm-0.33")
    before = path.read_bytes()
    assert main(["record", "--check", str(path), "--kv-profile=vllm-0.10"]) == 2
    err = capsys.readouterr().err
    assert "--kv-profile=vllm-0.10 with --check" in err and "that corpus records vllm-0.33" in err
    assert path.read_bytes() == before


def _damaged_corpora(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    shipped = recorded.corpus_path("vllm-0.33").read_bytes()
    files = {
        "truncated": (shipped[:1000], "truncated: the xz stream ends early"),
        "garbage-cbor": (lzma.compress(b"\xff\x1c\x00", format=lzma.FORMAT_XZ),
                         "not a CBOR corpus"),
        "json-record": (json.dumps({"kind": "conformance"}).encode(),
                        "not an xz-compressed corpus"),
        "another-format": (lzma.compress(cbor2.dumps({"format": "x"}), format=lzma.FORMAT_XZ),
                           "not a kvcheck recorded corpus"),
    }
    out = {}
    for name, (data, words) in files.items():
        path = tmp_path / f"{name}.cbor.xz"
        path.write_bytes(data)
        out[name] = (path, words)
    out["directory"] = (tmp_path, "a directory")
    return out


@pytest.mark.parametrize("kind", ["truncated", "garbage-cbor", "json-record", "another-format",
                                  "directory"])
def test_record_check_of_a_file_that_is_no_corpus(kind: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Confirmed handled, now pinned at the command: exit 2 naming the file and why, before
    any implementation is loaded; the file is left as it was."""
    monkeypatch.setattr("kvcheck.conformance.loader.load_impl", _never_load)
    path, words = _damaged_corpora(tmp_path)[kind]
    before = None if path.is_dir() else path.read_bytes()
    assert main(["record", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvcheck record: {path}: "), err
    assert words in err and "Traceback" not in err, err
    assert before is None or path.read_bytes() == before


# ------------------------------------------------------------------ the shipped corpora, damaged
@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_shipped_corpus_is_no_verdict_on_the_implementation(
        damage: str, pytester: pytest.Pytester, no_inventory_child: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: every recorded test failed with CorpusError and the verdict read "reference does
    NOT conform". Now the recorded area fails to collect, naming the file and the fix
    (reinstall kvcheck), and the run is incomplete."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    if damage == "truncated":
        data = recorded.corpus_path("vllm-0.33").read_bytes()[:1000]
        (folder / "vllm-0.33.cbor.xz").write_bytes(data)
    monkeypatch.setattr(recorded, "CORPUS_DIR", folder)
    recorded.shipped_corpus.cache_clear()
    report = tmp_path / "r.jsonl"
    try:
        rec = pytester.inline_run("--kv-impl=reference", "--kv-profile=vllm-0.33",
                                  f"--kv-report={report}", "-p", "no:cacheprovider",
                                  str(SUITE / "test_recorded.py"))
    finally:
        recorded.shipped_corpus.cache_clear()  # the real corpus for whoever runs next
    failed = [r for r in rec.getreports("pytest_collectreport") if r.failed]
    assert len(failed) == 1, failed
    text = failed[0].longreprtext
    assert "kvcheck's shipped vllm-0.33 corpus" in text and "reinstall kvcheck" in text, text
    assert "says nothing about the implementation" in text
    assert rec.getreports("pytest_runtest_logreport") == []  # no test ran, so none failed
    record = json.loads(report.read_text().splitlines()[0])
    assert record["conforms"] is False and record["complete"] is False
    assert "collection errors in test_recorded.py" in record["completeness"]["reasons"]


def test_the_inventory_child_of_a_partial_run_does_not_load_the_corpus(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child that lists what a partial run should have run (``--collect-only
    --kv-inventory=FILE``) lists the recorded tests without loading the corpus (1.0 of its
    1.9 CPU-seconds): here the corpus is missing, and the child neither fails nor loads it."""
    monkeypatch.setattr(recorded, "CORPUS_DIR", tmp_path / "no-corpus-here")
    # Not cleared (this worker's later runs reuse the cached corpus): any call, a cache hit
    # included, moves the counts.
    before = recorded.shipped_corpus.cache_info()
    inventory = tmp_path / "inventory.json"
    rec = pytester.inline_run("--collect-only", "-q", "--kv-impl=reference",
                              "--kv-profile=vllm-0.33", f"--kv-inventory={inventory}",
                              "-p", "no:cacheprovider", str(SUITE / "test_recorded.py"))
    after = recorded.shipped_corpus.cache_info()
    assert (after.hits, after.misses) == (before.hits, before.misses)
    assert [r for r in rec.getreports("pytest_collectreport") if r.failed] == []
    listed = json.loads(inventory.read_text())
    assert listed["collect_errors"] == []
    assert sum("test_recorded_trace_replays[" in t
               for t in listed["applicable"]["reference"]) == DEFAULT_TRACES


# ------------------------------------------------------------------ hybrid specs
def _trace(path: Path, groups: list[dict[str, Any]]) -> Path:
    spec = {"num_blocks": 32, "block_size": 4, "kv_cache_groups": groups}
    ops = [{"op": "add", "rid": "a", "prompt": list(range(20))}, {"op": "schedule", "rid": "a"}]
    path.write_text(json.dumps({"trace_version": 1, "spec": spec, "ops": ops}))
    return path


_WRAPPED = """
import dataclasses
from kvcheck.adapters import reference as _ref
IMPL_INFO = dataclasses.replace(
    _ref.IMPL_INFO, name={name!r}, block_sizes={sizes!r},
    capabilities=_ref.IMPL_INFO.capabilities - {drop})
def make_kv_cache_manager(spec):
    {body}
"""


def test_replay_of_a_multi_group_trace_on_a_single_group_design(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Was exit 1, "protocol violation: flat.get_computed_blocks(...) returned []: must be a
    list of 2 lists", blaming a design for a spec it never claimed. Now exit 2 naming the
    capabilities the trace needs."""
    module = _write_module(tmp_path, monkeypatch, "hostile_flat", _WRAPPED.format(
        name="flat", sizes=None, drop=f"({NO_HYBRID} | {MODULE_LEVEL})",
        body="return _ref.make_kv_cache_manager(dataclasses.replace(spec, kv_cache_groups=()))"))
    trace = _trace(tmp_path / "t.json", [{"kind": "full_attention"},
                                         {"kind": "sliding_window", "sliding_window": 8}])
    assert main(["replay", str(trace), f"--kv-impl={module}"]) == 2
    out, err = capsys.readouterr()
    assert "diverges" not in out and "protocol violation" not in out + err
    assert ("the trace's spec has 2 KV-cache group(s) (full_attention, sliding_window), which "
            "need capability 'kv_cache_groups', 'sliding_window'; flat does not declare it") in err
    assert "--kv-impl=reference" in err


def test_replay_of_group_block_sizes_outside_the_declared_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Was: ``ImplInfo.supports`` read only ``spec.block_size``, so groups of block size 8
    reached a design declaring ``block_sizes=(4,)``. Now exit 2 before the factory runs."""
    module = _write_module(tmp_path, monkeypatch, "hostile_decl4", _WRAPPED.format(
        name="decl4", sizes=(4,), drop=MODULE_LEVEL,
        body="assert all(spec.group_block_size(g) == 4 for g in range(len(spec.groups))), "
             "spec\n    return _ref.make_kv_cache_manager(spec)"))
    trace = _trace(tmp_path / "t.json", [{"kind": "full_attention", "block_size": 8},
                                         {"kind": "full_attention", "block_size": 8}])
    assert main(["replay", str(trace), f"--kv-impl={module}"]) == 2
    err = capsys.readouterr().err
    assert ("the trace's pool (num_blocks=32, group block sizes [8]) is outside what decl4 "
            "declares (block_sizes=(4,)") in err, err


def test_supports_reads_every_groups_block_size() -> None:
    info = ImplInfo("x", "1", block_sizes=(4,))
    spec = KVCacheSpec(32, 4)
    assert info.supports(spec)
    assert info.supports(KVCacheSpec(32, 4, kv_cache_groups=(KVCacheGroupSpec(),)))
    assert not info.supports(KVCacheSpec(32, 4, kv_cache_groups=(
        KVCacheGroupSpec(), KVCacheGroupSpec("sliding_window", 8, sliding_window=8))))
    assert not info.supports(KVCacheSpec(32, 8))


def test_random_hybrid_layouts_stay_within_the_declared_block_sizes() -> None:
    """The hybrid workload machine grew group block sizes (x2, x4) past ``block_sizes``; such
    a layout is now rejected (Hypothesis draws another): the machine builds only layouts of
    declared sizes, while the draws it rejects include layouts of larger ones."""
    from dataclasses import replace

    from hypothesis import HealthCheck, Phase, settings

    from kvcheck.conformance.differential import Pair

    kinds = ("full_attention", "sliding_window")
    drawn = [KVCacheSpec(**spec_fields(n, 4, group_kinds=kinds, profile="vllm-0.33"))
             for n in range(4, 40)]
    info = ImplInfo("x", "1", capabilities=frozenset({"manager", "kv_cache_groups",
                                                      "sliding_window"}), block_sizes=(4,))
    assert any(not info.supports(s) for s in drawn) and any(info.supports(s) for s in drawn)
    ref = load_impl("reference")
    impl = replace(ref, info=replace(ref.info, block_sizes=(4,)))
    made: list[KVCacheSpec] = []

    def make(**fields: Any) -> Pair:
        made.append(KVCacheSpec(**fields))
        return Pair(impl, None, made[-1])

    run_workload_machine(make, settings(max_examples=15, deadline=None, derandomize=True,
                                        database=None, phases=[Phase.generate],
                                        suppress_health_check=list(HealthCheck)),
                         None, extras=False, events=False, impl=impl, profile="vllm-0.33",
                         step_count=5, group_kinds=kinds)
    assert any(len(s.kv_cache_groups) > 1 for s in made)
    assert all(g.block_size == 4 for s in made for g in s.kv_cache_groups)


def test_golden_scenarios_outside_the_declared_block_sizes_are_skipped(
        pytester: pytest.Pytester, no_inventory_child: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: the golden scenarios (block sizes 2 and 4) reached a factory declaring
    ``block_sizes=(16,)``, whose failures read as non-conformance. Now skipped, by reason."""
    module = _write_module(tmp_path, monkeypatch, "hostile_decl16", _WRAPPED.format(
        name="decl16", sizes=(16,), drop=MODULE_LEVEL,
        body="assert all(spec.group_block_size(g) == 16 for g in range(len(spec.groups))), "
             "spec\n    return _ref.make_kv_cache_manager(spec)"))
    rec = pytester.inline_run(f"--kv-impl={module}", "-p", "no:cacheprovider", "-p",
                              "no:terminal", "-k", "test_hybrid_golden",
                              str(SUITE / "test_hybrid.py"))
    _, skipped, failed = rec.listoutcomes()
    assert not failed and skipped, failed
    reasons = {str(r.longrepr[2]) for r in skipped if isinstance(r.longrepr, tuple)}
    assert any("decl16 does not support this scenario's pool" in r for r in reasons), reasons


@pytest.mark.parametrize(("caps", "words"), [
    ('{"manager", "sliding_window"}', "declares 'sliding_window' without 'kv_cache_groups'"),
    ('{"manager", "chunked_local_attention"}',
     "declares 'chunked_local_attention' without 'kv_cache_groups'"),
    ('{"manager", "cross_attention"}', "declares 'cross_attention' without 'kv_cache_groups'"),
    ('{"manager", "mamba"}', "declares 'mamba' without 'kv_cache_groups'"),
    ('{"block_pool", "kv_cache_groups"}', "declares 'kv_cache_groups' without 'manager'"),
], ids=["sliding_window-alone", "chunked_local_attention-alone", "cross_attention-alone",
        "mamba-alone", "kv_cache_groups-no-manager"])
def test_capabilities_that_could_never_be_tested(caps: str, words: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: accepted, and every test of the capability skipped for lacking the other one (a
    claimed capability that was never checked). Now a usage error naming both."""
    name = f"hostile_caps_{abs(hash(caps))}"
    _write_module(tmp_path, monkeypatch, name, f"""
        IMPL_INFO = {{"name": "c", "version": "1", "capabilities": frozenset({caps})}}
        """)
    with pytest.raises(ImplLoadError) as info:
        load_impl(name, search=[tmp_path])
    assert words in str(info.value) and "Fix: declare" in str(info.value), info.value


# ------------------------------------------------------------------ sizing answers
@pytest.mark.parametrize(("name", "answer", "words"), [
    ("kv_page_size_bytes", 65536.0, "a page size is an int of bytes >= 0, not a float"),
    ("kv_page_size_bytes", "65536", "not a str"),
    ("kv_page_size_bytes", True, "not a bool"),
    ("kv_page_size_bytes", math.nan, "not a float"),
    ("kv_page_size_bytes", -1, "below 0"),
    ("kv_cache_view_shape", (2, 16.0, 8), "16.0 is a float"),
    ("kv_cache_view_shape", "2x16", "must be a tuple of ints, not a str"),
    ("kv_block_sizes", (16,), "must be a tuple of 2 ints, not a tuple of 1"),
    ("kv_block_sizes", (16, 0), "ints >= 1; 0 is a int below 1"),
], ids=["page-float", "page-str", "page-bool", "page-nan", "page-negative", "shape-float-dim",
        "shape-str", "block-sizes-one", "block-sizes-zero"])
def test_sizing_answers_of_the_wrong_type(name: str, answer: object, words: str) -> None:
    """Was: 65536.0 == 65536 and int("65536") passed; int(nan) was a raw ValueError."""
    with pytest.raises(SizingAnswerError) as info:
        check_sizing_answer("impl", name, ("spec", "vllm-0.33"), answer)
    assert f"protocol violation: impl.{name}('spec', 'vllm-0.33') returned" in str(info.value)
    assert words in str(info.value), info.value


def test_sizing_integer_types_are_accepted_as_ints() -> None:
    assert check_sizing_answer("i", "kv_page_size_bytes", (), np.int64(80)) == 80
    assert check_sizing_answer("i", "kv_cache_view_shape", (), [2, np.int32(4)]) == (2, 4)
    assert plan_int("i", "num_blocks", np.int64(5)) == 5
    with pytest.raises(SizingAnswerError, match="whose page_size is '65536' \\(str\\)"):
        plan_int("i", "page_size", "65536")


_SIZING = """
import dataclasses
from kvcheck.adapters import reference as _ref
IMPL_INFO = dataclasses.replace(_ref.IMPL_INFO, name="sz",
                                capabilities=_ref.IMPL_INFO.capabilities - {{"block_pool",
                                                                            "kernels",
                                                                            "offload"}})
make_kv_cache_manager = _ref.make_kv_cache_manager
kv_cache_view_shape = _ref.kv_cache_view_shape
kv_block_sizes = _ref.kv_block_sizes
def kv_page_size_bytes(spec, profile):
    return {page}
def kv_sizing_plan(layers, memory, profile, override):
    plan = _ref.kv_sizing_plan(layers, memory, profile, override)
    return {plan}
"""


@pytest.mark.parametrize(("page", "plan", "test", "words"), [
    ("float(_ref.kv_page_size_bytes(spec, profile))", "plan", "test_page_size_golden",
     "kv_page_size_bytes(LayerKVSpec("),
    ("_ref.kv_page_size_bytes(spec, profile)",
     "dataclasses.replace(plan, page_size=str(plan.page_size))",
     "test_worked_example_full_swa_2_to_4", "whose page_size is '65536' (str)"),
], ids=["float-page-size", "str-page-size-in-plan"])
def test_sizing_area_fails_a_wrong_typed_answer(page: str, plan: str, test: str, words: str,
                                                pytester: pytest.Pytester,
                                                no_inventory_child: None, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's sizing tests, before: a float page size and a str page size in the plan
    passed. Now each fails as a protocol violation naming the answer."""
    module = _write_module(tmp_path, monkeypatch, f"hostile_sizing_{test[-8:]}",
                           _SIZING.format(page=page, plan=plan))
    rec = pytester.inline_run(f"--kv-impl={module}", "-p", "no:cacheprovider", "-p",
                              "no:terminal", "-k", test, str(SUITE / "test_sizing.py"))
    passed, _, failed = rec.listoutcomes()
    assert failed and not passed, (passed, failed)
    text = failed[0].longreprtext
    assert "protocol violation: sz." in text and words in text, text


# ------------------------------------------------------------------ batch metadata answers
class _Batch:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def build_batch(self, *args: object) -> object:
        return self.answer

    flashinfer_csr = req_to_token = build_batch


def _guard(answer: object) -> Any:
    return GuardedManager(_Batch(answer), impl="bm", spec=KVCacheSpec(16, 4), reserved=(0,),
                          limit=CallLimit(None, "bm"))


@pytest.mark.parametrize(("method", "answer", "words"), [
    ("build_batch", ([math.nan] * 4, [0, 1, 2, 3], [0] * 4),
     "slot_mapping must be a list of int; element nan is a float"),
    ("build_batch", ([True] * 4, [0, 1, 2, 3], [0] * 4), "element True is a bool"),
    ("build_batch", (np.arange(4), [0, 1, 2, 3], [0] * 4), "not a numpy.ndarray"),
    ("build_batch", ([4, 5, 6, 7], [0, 1, 2, 3]), "must be a tuple of 3 lists of int"),
    ("flashinfer_csr", {"kv_indptr": [0, 1]}, "must be a tuple of 3 lists of int"),
    ("req_to_token", [[4, 5.5]], "row 0 must be a list of int; element 5.5 is a float"),
    ("req_to_token", "4,5", "must be a list of rows (lists of int), not a str"),
], ids=["build_batch-nan", "build_batch-bool", "build_batch-ndarray", "build_batch-two-parts",
        "flashinfer_csr-dict", "req_to_token-float", "req_to_token-str"])
def test_batch_metadata_answers_of_the_wrong_type(method: str, answer: object,
                                                  words: str) -> None:
    """Confirmed handled by the guard, now pinned: NaN, bool, numpy slots and wrong shapes
    are protocol violations naming the method and the element."""
    guard = _guard(answer)
    args = {"build_batch": ([[1]], [0], [4], 4), "flashinfer_csr": ([[1]], [4]),
            "req_to_token": ([[1]], [4])}[method]
    with pytest.raises(ProtocolViolation) as info:
        getattr(guard, method)(*args)
    assert f"bm.{method}(" in str(info.value) and words in str(info.value), info.value
