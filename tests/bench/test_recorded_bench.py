"""A recorded corpus as a benchmark: the lean replay issues the Driver's calls (the reference
gives the recorded answers), counts by hand, skipped traces, paired rounds, bad files."""

from __future__ import annotations

import lzma
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvcheck.bench.measure.allocator import measure_rounds
from kvcheck.bench.measure.metrics import PairedRatio
from kvcheck.bench.measure.paired import PairedBench
from kvcheck.bench.replay.recorded import (
    RecordedBench,
    RecordedRun,
    decode_trace,
    load_recorded_workload,
    recorded_pair,
    replay_trace,
)
from kvcheck.conformance import ops
from kvcheck.conformance.loader import ImplHandle, load_impl
from kvcheck.conformance.protocol import KVCacheSpec, UnsupportedSpec
from kvcheck.conformance.recorded import (
    Corpus,
    CorpusError,
    corpus_path,
    iter_steps,
    needed_capabilities,
)
from kvcheck.errors import KVCheckInputError

#: Chat, lookahead, preemption, extras (LoRA / mm / salt, caching off) and resets.
_PICKED = ("t00-chat-bs4-events", "t03-lookahead-bs1-events-mml40", "t04-preempt-bs16",
           "t05-extras-bs4-nocache-events", "t06-reset-bs8-events")


@pytest.fixture(scope="module")
def reference() -> ImplHandle:
    return load_impl("reference", call_timeout=None)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_recorded_workload(corpus_path("vllm-0.33"))


def _some(corpus: Corpus, names: tuple[str, ...] = _PICKED) -> Corpus:
    """The corpus cut down to ``names`` (the bench reads the header for the record only)."""
    traces = [t for t in corpus["traces"] if t["name"] in names]
    assert [t["name"] for t in traces] == list(names), "the shipped corpus changed"
    return {**corpus, "traces": traces}


class _Recorded:
    """``replay_trace``'s ``after_op``: asserts that each op's answer, and the state after
    it (free count, block tables, block hashes), are the recorded ones."""

    def __init__(self, raw: dict[str, Any], manager: Any) -> None:
        self.trace = decode_trace(raw)
        self.states = [state for _, _, state in iter_steps(raw)]
        self.manager = manager
        self.checked = 0

    def __call__(self, i: int, answer: dict[str, Any]) -> None:
        m, state = self.manager, self.states[i]
        at = f"{self.trace.name} step #{i + 1} {self.trace.ops[i]}"
        assert answer == self.trace.answers[i], at
        assert m.num_free_blocks() == state["free"], at
        assert {rid: list(m.get_block_ids(rid)) for rid in state["tables"]} == \
            state["tables"], at
        assert {rid: [bytes(h) for h in m.block_hashes(rid)] for rid in state["hashes"]} == \
            state["hashes"], at
        self.checked += 1


def test_reference_answers_and_state_are_the_recorded_ones(reference: ImplHandle,
                                                           corpus: Corpus) -> None:
    """The reference conforms to vLLM 0.33, so when the lean replay makes the Driver's calls
    (same views, num_new, hits, lookahead, decode tokens) every answer it gets, and the state
    after every op (the hashes cover the decode tokens), is the recorded one."""
    for raw in _some(corpus)["traces"]:
        assert "hashes" in raw["fields"]
        spec = decode_trace(raw).spec
        check = _Recorded(raw, reference.make_manager(spec, guard=False))
        replay_trace(reference, check.manager, check.trace, RecordedRun(), check)
        assert check.checked == len(raw["steps"])


def test_a_round_counts_every_call_of_every_trace(reference: ImplHandle,
                                                  corpus: Corpus) -> None:
    """Calls per kind match the recorded answers (a lookup per ``hits``, an allocate_slots
    per ``new``), hit tokens are the recorded hits of successful admissions, and the round's
    throughput is the tokens over the on-CPU time inside the calls."""
    small = _some(corpus)
    bench = RecordedBench(reference, small, "some/dir/vllm-0.33.cbor.xz")
    metrics = {m.name: m for m in measure_rounds(bench, rounds=2, warmup=1)}
    run: RecordedRun = bench.results[-1]
    answers = [a for t in bench.traces for a in t.answers]
    all_ops = [op for t in bench.traces for op in t.ops]
    assert run.traces == len(_PICKED) and run.steps == len(all_ops) == bench.num_steps
    assert len(run.lookup_ns) == sum("hits" in a for a in answers)
    assert len(run.allocate_ns) == sum("new" in a for a in answers)
    assert len(run.free_ns) == sum(op.kind == "free" for op in all_ops)
    assert len(run.reset_ns) == sum(op.kind == "reset" for op in all_ops)
    assert run.hit_tokens == sum(a["hits"][1] for a in answers
                                 if "hits" in a and a["new"] is not None)
    assert run.scheduled_tokens > 0 and 0 < run.prefix_hit_rate < 1
    assert run.impl_ns == (sum(run.allocate_ns) + sum(run.lookup_ns) + sum(run.free_ns)
                           + sum(run.reset_ns))
    assert 0 < run.peak_usage <= 1
    assert len(metrics["scheduled_tokens_per_s"].samples) == 2
    assert metrics["scheduled_tokens_per_s"].samples[-1] == pytest.approx(
        run.scheduled_tokens / (run.on_cpu_ns / 1e9))
    # Replays are deterministic: every round counts the same.
    assert bench.results[0].scheduled_tokens == run.scheduled_tokens
    info = bench.info()
    assert info["corpus_file"] == "vllm-0.33.cbor.xz"  # the name, never a path
    assert (info["profile"], info["recorded_impl"], info["recorded_impl_version"]) == (
        "vllm-0.33", "vllm", "0.33.0")
    assert (info["traces_run"], info["traces_skipped"], info["steps_skipped"]) == (5, 0, 0)
    assert info["steps_run"] == run.steps
    produced = info["produced"]
    assert produced["prefix_hit_rate"] == run.prefix_hit_rate
    assert produced["steps"] == run.steps
    assert 1 <= produced["prompt_tokens_p10"] <= produced["prompt_tokens_p50"] \
        <= produced["prompt_tokens_p90"] <= produced["prompt_tokens_max"]


def test_counts_by_hand(reference: ImplHandle) -> None:
    """Block size 4. r0 (9 tokens) prefills 9, decodes 2, is freed and scheduled again: a
    preemption, re-admitted with its 2 full cached blocks hit (8 tokens), 3 to compute. r1
    (5 tokens) prefills 2 then 3 and is freed for good. Scheduled 9 + 2 + 3 + 2 + 3 = 19,
    hits 8, admitted tokens 9 + 11 + 5 = 25."""
    steps = [ops.add("r0", range(1, 10)), ops.schedule("r0"), ops.decode("r0", 2),
             ops.free("r0"), ops.schedule("r0"), ops.free("r0"),
             ops.add("r1", range(100, 105)), ops.schedule("r1", 2), ops.schedule("r1"),
             ops.free("r1"), ops.reset()]
    trace = {"name": "hand", "spec": {"num_blocks": 16, "block_size": 4}, "fields": [],
             "steps": [{"op": op, "answer": {}, "state": {}} for op in steps]}
    corpus = {"header": {"profile": "vllm-0.33", "impl": "hand", "impl_version": "0",
                         "kvcheck_version": "0", "seed": 0}, "traces": [trace]}
    bench = RecordedBench(reference, corpus, "hand.cbor.xz")
    measure_rounds(bench, rounds=1, warmup=0)
    run: RecordedRun = bench.results[0]
    assert (run.scheduled_tokens, run.hit_tokens, run.queried_tokens) == (19, 8, 25)
    assert run.preemptions == 1 and run.steps == 11 and run.finished == 0
    assert (len(run.lookup_ns), len(run.allocate_ns), len(run.free_ns),
            len(run.reset_ns)) == (3, 5, 3, 1)
    assert (run.peak_used_blocks, run.usable_blocks) == (3, 15)  # r0: 11 tokens, 3 blocks


class _Declining:
    """The reference without ``extra_keys``, declining pools of 16-token blocks."""

    def __init__(self, ref: ImplHandle) -> None:
        self.ref = ref
        self.name = "declining"
        self.info = replace(ref.info, name="declining",
                            capabilities=ref.info.capabilities - {"extra_keys"})

    def has(self, capability: str) -> bool:
        return capability in self.info.capabilities

    def make_manager(self, spec: KVCacheSpec, *, guard: bool = True) -> Any:
        if spec.block_size == 16:
            raise UnsupportedSpec("no 16-token blocks")
        return self.ref.make_manager(spec, guard=guard)


def test_traces_the_implementation_cannot_run_are_skipped_and_counted(
        reference: ImplHandle, corpus: Corpus) -> None:
    small = _some(corpus)
    bench = RecordedBench(_Declining(reference), small, "vllm-0.33.cbor.xz")
    assert needed_capabilities(small["traces"][3]) == {"extra_keys"}
    assert [t.name for t in bench.traces] == [_PICKED[0], _PICKED[1], _PICKED[4]]
    assert "extra_keys" in bench.skipped["t05-extras-bs4-nocache-events"]
    assert "declines" in bench.skipped["t04-preempt-bs16"]
    info = bench.info()
    assert (info["traces_run"], info["traces_skipped"]) == (3, 2)
    assert info["steps_skipped"] == sum(len(t["steps"]) for t in small["traces"][3:4]) + \
        len(small["traces"][2]["steps"])
    measure_rounds(bench, rounds=1, warmup=0)
    assert bench.results[0].traces == 3


def test_a_paired_run_gives_paired_ratios_over_the_same_traces(reference: ImplHandle,
                                                               corpus: Corpus) -> None:
    """The pair replays only the traces both sides run; each headline figure gets the
    median of the per-round ratios."""
    small = _some(corpus, _PICKED[:4])
    mine, ref = recorded_pair(_Declining(reference), reference, small, "vllm-0.33.cbor.xz")
    assert [t.name for t in mine.traces] == [t.name for t in ref.traces] == list(_PICKED[:2])
    assert ref.skipped[_PICKED[2]].startswith("the other side")
    pair = PairedBench(mine, ref)
    pair.measure(rounds=3, warmup=0)
    impl_metrics, ref_metrics = pair.metrics(warmup=0)
    headline = {m.name: m for m in impl_metrics}["scheduled_tokens_per_s"]
    assert isinstance(headline.paired, PairedRatio) and headline.paired.pairs == 3
    assert headline.paired.ratio > 0
    # Same ops on both sides: the same counts.
    assert mine.results[0].scheduled_tokens == ref.results[0].scheduled_tokens > 0
    assert len(ref_metrics) == len(impl_metrics)


def test_a_malformed_file_is_the_corpus_input_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.cbor.xz"
    garbage.write_bytes(b"not a corpus")
    with pytest.raises(CorpusError, match="not an xz-compressed corpus"):
        load_recorded_workload(garbage)
    truncated = tmp_path / "truncated.cbor.xz"
    truncated.write_bytes(corpus_path("vllm-0.33").read_bytes()[:1000])
    with pytest.raises(KVCheckInputError, match="truncated"):
        load_recorded_workload(truncated)
    other = tmp_path / "other.cbor.xz"
    other.write_bytes(lzma.compress(b"\xa1\x61a\x01", format=lzma.FORMAT_XZ))  # CBOR {"a": 1}
    with pytest.raises(CorpusError, match="not a kvcheck recorded corpus"):
        load_recorded_workload(other)
    with pytest.raises(CorpusError, match="cannot read"):
        load_recorded_workload(tmp_path / "missing.cbor.xz")


def test_kv_connector_traces_are_not_timed(reference: ImplHandle, corpus: Corpus) -> None:
    """The lean replay has no external-KV step, passes no encoder tokens and marks no
    scheduler steps: the shipped corpus's KV-connector, cross-attention and Mamba traces are
    skipped, saying why (the recorded area checks them), and every other trace runs, the
    other multi-group ones included."""
    bench = RecordedBench(reference, corpus, "vllm-0.33.cbor.xz")
    names = [t["name"] for t in corpus["traces"]]
    connector = {n for n in names if "-connector-" in n}
    lean = {n for n in names if "-mamba-" in n or "-cross-" in n or "-fine-" in n}
    assert len(connector) == 8 and len(lean) == 6
    assert set(bench.skipped) == connector | lean
    assert all("KV-connector trace" in bench.skipped[n] for n in connector)
    assert bench.skipped["t74-cross-pressure-bs2-nocache-events"] == (
        "a cross_attention layout (the benchmark's replay passes no encoder tokens): not timed")
    assert bench.skipped["t76-mamba-align-lookahead-bs2-events"] == (
        "a mamba layout (the benchmark's replay marks no scheduler steps, new_step_starts): "
        "not timed")
    assert len(bench.traces) == len(corpus["traces"]) - len(connector) - len(lean)
    grouped = [t.name for t in bench.traces if t.spec.kv_cache_groups]
    assert grouped == ["t68-swa-chat-bs4-events", "t69-swa-pressure-bs2-events",
                       "t70-chunked-chunked-bs4", "t71-swa4-lookahead-bs2-events",
                       "t77-partial-chat-bs2-events", "t78-fixedpoint-chunked-bs2-events"]


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_multi_group_traces_replay_as_recorded(reference: ImplHandle, profile: str) -> None:
    """The multi-group traces the benchmark times (windows, chunks, partial-block keys) give
    vLLM's recorded answers, tables (one list per group) and hashes on the reference through
    the lean replay: it issues the Driver's calls for several groups too."""
    corpus = load_recorded_workload(corpus_path(profile))
    bench = RecordedBench(reference, corpus, f"{profile}.cbor.xz")
    timed = {t.name for t in bench.traces}
    picked = [raw for raw in corpus["traces"]
              if raw["spec"].get("kv_cache_groups") and raw["name"] in timed]
    assert len(picked) == {"vllm-0.33": 6, "vllm-0.10": 4}[profile]
    for raw in picked:
        check = _Recorded(raw, reference.make_manager(decode_trace(raw).spec, guard=False))
        replay_trace(reference, check.manager, check.trace, RecordedRun(), check)
        assert check.checked == len(raw["steps"])
