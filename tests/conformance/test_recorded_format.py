"""The recorded corpus format (``kvcheck.conformance.recorded``): round trip of the delta
encoding, byte-for-byte determinism, the shipped corpora's budget, and a clear ``CorpusError``
for every kind of broken file (not xz, truncated, not CBOR, another format, a newer version,
a bad header, trace or step); multi-group traces (format version 2: block ids per group,
encoder tokens) likewise."""

from __future__ import annotations

import copy
import gc
import lzma
from pathlib import Path
from typing import Any

import cbor2
import pytest

from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import VLLM_PROFILES
from kvcheck.conformance.recorded import (
    FORMAT_VERSION,
    GROUPS_FORMAT_VERSION,
    CorpusError,
    corpus_path,
    decode_corpus,
    encode_corpus,
    first_difference,
    iter_steps,
    load_corpus,
    make_corpus,
)
from kvcheck.conformance.recorder import (
    DEFAULT_TRACES,
    HYBRID_START,
    default_traces,
    record_trace,
    trace_indices,
    trace_plan,
)
from kvcheck.errors import KVCheckInputError

STEPS = 60


@pytest.fixture(scope="module")
def recorded() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Three traces of the reference with full states, and their corpus."""
    impl = load_impl("reference")
    traces = [record_trace(impl, "vllm-0.33", i, 7, STEPS) for i in range(3)]
    corpus = make_corpus(copy.deepcopy(traces), profile="vllm-0.33", impl=impl, seed=7,
                         steps_per_trace=STEPS)
    return traces, corpus


def reencode(corpus: dict[str, Any]) -> bytes:
    return lzma.compress(cbor2.dumps(corpus))


def test_round_trip_rebuilds_every_full_state(recorded: tuple[list[dict[str, Any]],
                                                              dict[str, Any]]) -> None:
    """The file stores only what changed per step; reading it back gives every step's full
    state, op and answer as recorded."""
    traces, corpus = recorded
    loaded = decode_corpus(encode_corpus(corpus), "mem")
    assert loaded["header"]["steps"] == sum(len(t["steps"]) for t in traces)
    for original, trace in zip(traces, loaded["traces"], strict=True):
        steps = list(iter_steps(trace))
        assert len(steps) == len(original["steps"]) >= STEPS
        for (op, answer, state), full in zip(steps, original["steps"], strict=True):
            assert (op, answer) == (full["op"], full["answer"])
            assert state == full["state"]
    # The deltas are smaller than the full states (the point of them).
    stored = sum(len(s["state"]) for t in loaded["traces"] for s in t["steps"])
    assert stored < sum(len(s["state"]) for t in traces for s in t["steps"])


def test_recording_is_deterministic(recorded: tuple[list[dict[str, Any]],
                                                    dict[str, Any]]) -> None:
    _, corpus = recorded
    impl = load_impl("reference")
    again = make_corpus([record_trace(impl, "vllm-0.33", i, 7, STEPS) for i in range(3)],
                        profile="vllm-0.33", impl=impl, seed=7, steps_per_trace=STEPS)
    assert encode_corpus(again) == encode_corpus(corpus)
    assert first_difference(corpus, again) is None


def test_another_seed_differs(recorded: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    _, corpus = recorded
    impl = load_impl("reference")
    other = make_corpus([record_trace(impl, "vllm-0.33", i, 8, STEPS) for i in range(3)],
                        profile="vllm-0.33", impl=impl, seed=8, steps_per_trace=STEPS)
    assert first_difference(corpus, other) == "header.seed: shipped 7, re-recorded 8"


#: Multi-group traces each shipped corpus holds (vLLM 0.10.2 lacks Mamba "align", partial-block
#: keys and mixed layouts with caching on: 5 of the 12 plans).
_MULTI_GROUP = {"vllm-0.33": 12, "vllm-0.10": 7}


@pytest.mark.parametrize("profile", VLLM_PROFILES)
def test_shipped_corpus_budget(profile: str) -> None:
    """Recorded from that vLLM release: at least 50 traces and 10,000 steps, named as the
    plans name them (the single-group ones first, then the multi-group ones the release
    accepts); each file under 1 MiB, both together at most 2 MB."""
    corpus = load_corpus(corpus_path(profile))
    header = corpus["header"]
    assert header["impl"] == "vllm" and header["target"] == "vllm"
    assert header["impl_version"].startswith({"vllm-0.33": "0.33.", "vllm-0.10": "0.10."}[profile])
    assert header["profile"] == profile
    assert header["traces"] == default_traces(profile) == HYBRID_START + _MULTI_GROUP[profile]
    assert header["steps"] >= 10_000
    assert [t["name"] for t in corpus["traces"]] == [
        trace_plan(i, profile).name for i in trace_indices(profile, header["traces"])]
    grouped = [t for t in corpus["traces"] if t["spec"].get("kv_cache_groups")]
    assert len(grouped) == _MULTI_GROUP[profile]
    assert corpus["format_version"] == GROUPS_FORMAT_VERSION
    assert corpus_path(profile).stat().st_size < 1 << 20
    assert sum(corpus_path(p).stat().st_size for p in VLLM_PROFILES) <= 2_000_000


def _generation_of(obj: object) -> int | None:
    """The collector generation holding ``obj`` (None: untracked or frozen)."""
    return next((g for g in range(3) if any(o is obj for o in gc.get_objects(generation=g))),
                None)


def test_a_decoded_corpus_lands_in_the_oldest_generation() -> None:
    """Its ~330,000 lists and maps live as long as the process: no young collection walks
    them on their way up (they go straight to the oldest generation)."""
    corpus = decode_corpus(corpus_path("vllm-0.33").read_bytes(), "shipped 0.33 corpus")
    steps = corpus["traces"][0]["steps"]
    assert _generation_of(steps) == 2
    assert _generation_of(steps[-1]["op"]) in (2, None)  # a map of atoms may be untracked


def test_decoding_leaves_what_someone_froze_frozen() -> None:
    theirs: list[list[int]] = [[]]
    gc.freeze()
    try:
        assert _generation_of(theirs) is None and gc.is_tracked(theirs)  # frozen
        corpus = decode_corpus(corpus_path("vllm-0.33").read_bytes(), "shipped 0.33 corpus")
        assert _generation_of(theirs) is None  # still frozen: not given back by the move
        assert _generation_of(corpus["traces"][0]["steps"]) in (0, 1, 2)
    finally:
        gc.unfreeze()


def test_the_0_33_only_layouts_are_left_out_of_0_10_under_the_same_names() -> None:
    """A trace index is one plan and one name under every profile; vLLM 0.10.2's corpus
    leaves out the layouts its release refuses (they come last), and asking for one is an
    input error naming the profiles that accept it."""
    assert default_traces("vllm-0.33") == DEFAULT_TRACES
    only_033 = sorted(set(range(DEFAULT_TRACES))
                      - set(trace_indices("vllm-0.10", default_traces("vllm-0.10"))))
    assert [trace_plan(i, "vllm-0.33").name.split("-bs")[0] for i in only_033] == [
        "t75-mamba-align-chat", "t76-mamba-align-lookahead", "t77-partial-chat",
        "t78-fixedpoint-chunked", "t79-fine-cow"]
    for i in range(DEFAULT_TRACES):
        if i not in only_033:
            assert trace_plan(i, "vllm-0.10").name == trace_plan(i, "vllm-0.33").name
    with pytest.raises(KVCheckInputError, match=r"trace 75 \(mamba-align\): a layout only "
                                                r"\['vllm-0.33'\] accept"):
        trace_plan(75, "vllm-0.10")
    # Past the planned traces, both profiles record single-group connector traces again.
    assert trace_indices("vllm-0.10", default_traces("vllm-0.10") + 1)[-1] == DEFAULT_TRACES


def test_unknown_profile_has_no_corpus() -> None:
    with pytest.raises(CorpusError, match="no recorded corpus for profile 'generic'"):
        corpus_path("generic")


# ---------------------------------------------------------------------- broken files
def test_truncated_file(recorded: tuple[list[dict[str, Any]], dict[str, Any]],
                        tmp_path: Path) -> None:
    data = encode_corpus(recorded[1])
    path = tmp_path / "c.cbor.xz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorpusError, match=r"c\.cbor\.xz: truncated: the xz stream ends early"):
        load_corpus(path)


def test_not_xz(tmp_path: Path) -> None:
    path = tmp_path / "c.cbor.xz"
    path.write_bytes(b'{"format": "kvcheck-recorded-corpus"}')
    with pytest.raises(CorpusError, match="not an xz-compressed corpus"):
        load_corpus(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="cannot read the corpus"):
        load_corpus(tmp_path / "absent.cbor.xz")


def test_not_cbor() -> None:
    with pytest.raises(CorpusError, match="mem: not a CBOR corpus"):
        decode_corpus(lzma.compress(b"\xff\xfe\x1c"), "mem")


def test_another_format() -> None:
    with pytest.raises(CorpusError, match="not a kvcheck recorded corpus"):
        decode_corpus(reencode({"format": "something-else", "format_version": 1}), "mem")


def test_newer_format_version(recorded: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    corpus = copy.deepcopy(recorded[1])
    corpus["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(CorpusError, match=f"format_version {FORMAT_VERSION + 1} is newer than "
                                          f"this kvcheck"):
        decode_corpus(reencode(corpus), "mem")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c["header"].pop("seed"), r"header\.seed=None: expected int"),
    (lambda c: c["header"].__setitem__("traces", 4), "header counts 4 traces, the file holds 3"),
    (lambda c: c["header"].__setitem__("steps", 1), "the header counts 1 steps"),
    (lambda c: c["header"].__setitem__("profile", "generic"), "header.profile='generic'"),
    (lambda c: c["header"].__setitem__("steps_per_trace", 10**9),
     r"header\.steps_per_trace=1000000000: must be in \[1, 100000\]"),
    (lambda c: c["traces"][0].__setitem__("fields", [["free"]]), r"field 'fields'="),
    (lambda c: c["traces"][1]["steps"][4]["state"].__setitem__("tables", {"r0": ["x"]}),
     r"traces\[1\] \(t01-\S+\): steps\[4\] \(step #5\): state field 'tables' is malformed"),
    (lambda c: c["traces"][0]["steps"][2]["op"].__setitem__("op", "explode"),
     r"traces\[0\] \(t00-\S+\): ops\[2\] \(op #3\): unknown op 'explode'"),
    (lambda c: c["traces"][2]["steps"][0]["answer"].__setitem__("new", "lots"),
     r"traces\[2\] \(t02-\S+\): steps\[0\] \(step #1\): answer new='lots'"),
    (lambda c: c["traces"][0]["spec"].__setitem__("block_size", 0),
     r"traces\[0\] \(t00-\S+\): spec\.block_size=0"),
    (lambda c: c["traces"][0]["steps"][0]["state"].pop("free"),
     r"step #1\): the first step's state lacks \['free'\]"),
])
def test_malformed_content_is_named(recorded: tuple[list[dict[str, Any]], dict[str, Any]],
                                    edit: Any, message: str) -> None:
    corpus = copy.deepcopy(recorded[1])
    edit(corpus)
    with pytest.raises(CorpusError, match=message):
        decode_corpus(reencode(corpus), "mem")


def test_first_difference_names_trace_step_and_field(
        recorded: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    _, corpus = recorded
    altered = copy.deepcopy(corpus)
    step = next(s for s in altered["traces"][1]["steps"][5:] if "free" in s["state"])
    index = altered["traces"][1]["steps"].index(step)
    step["state"]["free"] += 1
    name = corpus["traces"][1]["name"]
    difference = first_difference(corpus, altered)
    assert difference is not None
    assert difference.startswith(f"trace {name}, step #{index + 1} (")
    assert "state.free differs" in difference


# ---------------------------------------------------------------------- multi-group traces
@pytest.fixture(scope="module")
def grouped() -> dict[str, Any]:
    """A corpus of three multi-group traces of the reference (sliding window, cross attention
    with encoder tokens, Mamba "align" with a speculative block)."""
    impl = load_impl("reference")
    traces = [record_trace(impl, "vllm-0.33", i, 0, STEPS) for i in (68, 74, 76)]
    return make_corpus(traces, profile="vllm-0.33", impl=impl, seed=0, steps_per_trace=STEPS)


def test_multi_group_traces_round_trip(grouped: dict[str, Any]) -> None:
    """Format version 2 (a single-group corpus stays 1, readable by older kvcheck); answers
    and tables hold one list per group; the cross-attention trace's requests carry encoder
    tokens; every full state comes back."""
    loaded = decode_corpus(encode_corpus(grouped), "mem")
    assert loaded["format_version"] == GROUPS_FORMAT_VERSION == 2
    names = [t["name"] for t in loaded["traces"]]
    assert names == ["t68-swa-chat-bs4-events", "t74-cross-pressure-bs2-nocache-events",
                     "t76-mamba-align-lookahead-bs2-events"]
    for trace in loaded["traces"]:
        groups = len(trace["spec"]["kv_cache_groups"])
        for _, answer, state in iter_steps(trace):
            for table in state["tables"].values():
                assert len(table) == groups
            if answer.get("new"):
                assert len(answer["new"]) == groups
    adds = [s["op"] for s in loaded["traces"][1]["steps"] if s["op"]["op"] == "add"]
    assert adds and all(1 <= op["encoder"] <= 12 for op in adds)
    assert not any("encoder" in s["op"] for t in (loaded["traces"][0], loaded["traces"][2])
                   for s in t["steps"])


def test_a_single_group_corpus_stays_format_version_1(
        recorded: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    assert recorded[1]["format_version"] == 1


@pytest.mark.parametrize(("edit", "message"), [
    # Block ids flat where the spec has groups, or one list short.
    (lambda c: c["traces"][0]["steps"][3]["state"].__setitem__("tables", {"r0": [1, 2]}),
     (r"traces\[0\] \(t68-\S+\): steps\[3\] \(step #4\): state field 'tables' is "
      r"malformed: \{'r0': \[1, 2\]\}: request id -> one list of block ids per group")),
    (lambda c: c["traces"][0]["steps"][1]["answer"].__setitem__("new", [[1]]),
     (r"steps\[1\] \(step #2\): answer new=\[\[1\]\]: one list of block ids per group or "
      "null")),
    (lambda c: c["traces"][2]["steps"][1]["answer"].__setitem__("hits", [[], 0]),
     (r"traces\[2\] \(t76-\S+\): steps\[1\] \(step #2\): answer hits=\[\[\], 0\]: \[block "
      r"ids \(one list of block ids per group\), num_computed_tokens\]")),
    # Encoder tokens need a cross-attention group; a multi-group trace needs version 2.
    (lambda c: c["traces"][0]["steps"][0]["op"].__setitem__("encoder", 4),
     (r"traces\[0\] \(t68-\S+\): ops\[0\] \(op #1\): encoder tokens \(4\) but "
      "spec.kv_cache_groups has no cross_attention group")),
    (lambda c: c.__setitem__("format_version", 1),
     (r"traces\[0\] \(t68-\S+\): spec.kv_cache_groups in a format_version 1 file; "
      "multi-group traces are format_version 2")),
])
def test_malformed_multi_group_content_is_named(grouped: dict[str, Any], edit: Any,
                                                message: str) -> None:
    corpus = copy.deepcopy(grouped)
    edit(corpus)
    with pytest.raises(CorpusError, match=message):
        decode_corpus(reencode(corpus), "mem")
