"""The offload-tier benchmark (``kvcheck.bench.offload_bench``): its stream is deterministic,
the replay's counts are the tier's own answers (recorded call by call here, not recomputed by
the benchmark's code), the tier evicts, lookups hit and keys are stored under both policies, the
reference paired with itself gives ratios of exactly 1 when both sides are timed by clocks that
count calls, and bad arguments are one line, exit 2."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from kvcheck.bench import offload_bench
from kvcheck.bench.measure.paired import PairedBench
from kvcheck.bench.offload_bench import (
    POLICIES,
    OffloadBench,
    make_offload_workload,
    replay,
)
from kvcheck.conformance.loader import load_impl

PROG = "python -m kvcheck.bench.offload_bench"


@pytest.fixture(scope="module")
def reference() -> Any:
    return load_impl("reference", call_timeout=None)


class Recorder:
    """A tier that passes every call on and records ``(method, args, answer)``."""

    def __init__(self, tier: Any) -> None:
        self._tier = tier
        self.calls: list[tuple[str, tuple[Any, ...], Any]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._tier, name)

        def call(*args: Any) -> Any:
            answer = method(*args)
            self.calls.append((name, tuple(dict(a) if isinstance(a, dict) else a
                                           for a in args), answer))
            return answer

        return call

    def answers(self, name: str) -> list[tuple[tuple[Any, ...], Any]]:
        return [(args, answer) for method, args, answer in self.calls if method == name]


def recorded(reference: Any, workload: Any) -> tuple[Recorder, Any]:
    tier = Recorder(reference.make_offloading_manager(workload.spec()).raw)
    return tier, replay(cast(Any, tier), workload)


def test_same_seed_same_calls_other_seed_other_keys(reference: Any) -> None:
    """Two streams built from one seed make the same calls with the same answers; another
    seed draws other keys."""
    first, _ = recorded(reference, make_offload_workload("lru", seed=3, scale=0.1))
    again, _ = recorded(reference, make_offload_workload("lru", seed=3, scale=0.1))
    assert first.calls and first.calls == again.calls
    other = make_offload_workload("lru", seed=4, scale=0.1)
    assert other.digest() != make_offload_workload("lru", seed=3, scale=0.1).digest()
    # Same keys for both policies (only the tier differs).
    assert (make_offload_workload("arc", seed=3, scale=0.1).digest()
            == make_offload_workload("lru", seed=3, scale=0.1).digest())


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_counts_are_the_tiers_answers(reference: Any, policy: str) -> None:
    """Every count the replay reports equals what the recorded calls show, and the stream does
    what the benchmark is for: lookups that HIT, keys stored, evictions (a tier smaller than
    the working set), announced by the tier's own events too."""
    workload = make_offload_workload(policy, seed=0, scale=0.25)
    assert workload.num_chunks < workload.working_set
    tier, result = recorded(reference, workload)
    lookups = tier.answers("lookup")
    stores = tier.answers("prepare_store")
    stored = [k for args, _ in tier.answers("complete_store") for k in args[0]]
    evicted = [k for _, answer in stores if answer is not None for k in answer["evicted_keys"]]
    events = [e for _, answer in tier.answers("take_events") for e in answer]
    hits = sum(answer == "HIT" for _, answer in lookups)
    assert result.lookups == len(lookups)
    assert result.hits == hits == sum(len(args[0]) for args, _ in tier.answers("prepare_load"))
    assert result.offers == len(stores)
    assert result.refused == sum(answer is None for _, answer in stores) == 0
    assert result.stored == len(stored)
    assert result.evicted == len(evicted)
    assert result.events == len(events)
    assert result.calls == len(tier.calls)
    assert hits > 0 and stored and evicted, result
    # The tier's events say the same: every stored key announced, every eviction too.
    assert sorted(k for e in events if not e["removed"] for k in e["keys"]) == sorted(stored)
    assert sorted(k for e in events if e["removed"] for k in e["keys"]) == sorted(evicted)
    # Each request's lookups stop at its first key that is not HIT.
    per_request: dict[str, list[str]] = {}
    for args, answer in lookups:
        per_request.setdefault(args[1], []).append(answer)
    assert len(per_request) == len(workload.requests)
    for answers in per_request.values():
        assert all(a == "HIT" for a in answers[:-1])


def test_a_tier_without_room_refuses_and_the_replay_goes_on(reference: Any) -> None:
    """A tier too small for one offer (4 chunks, offers of 16) answers None: counted as
    refused, nothing stored for it, no error."""
    workload = dataclasses.replace(make_offload_workload("lru", scale=0.05), num_chunks=4)
    tier, result = recorded(reference, workload)
    refused = sum(answer is None for _, answer in tier.answers("prepare_store"))
    assert result.refused == refused > 0
    assert result.stored == sum(len(args[0]) for args, _ in tier.answers("complete_store"))


def _call_counter(step_ns: int = 1_000) -> Callable[[], int]:
    """A clock that moves ``step_ns`` per reading: a replay's times count its calls, so the
    same work measures the same on any machine at any load."""
    return itertools.count(0, step_ns).__next__


def test_reference_paired_with_itself_is_one(reference: Any) -> None:
    """A/A through ``PairedBench``, each side timed by a clock that counts its calls: the
    same work on both sides, so every figure's paired ratio is exactly 1 (interval [1, 1]),
    and the figures the module doc names. (With the wall clock the ratio is only near 1, and
    on a loaded machine not even that: it is the benchmark's to print, not a test's to
    assert.)"""
    workload = make_offload_workload("arc", scale=0.25)
    mine, theirs = (OffloadBench(reference, workload, clock=_call_counter(),
                                 cpu_clock=lambda: 0) for _ in range(2))
    pair = PairedBench(mine, theirs)
    pair.measure(5, 1)
    metrics, _ = pair.metrics(1)
    assert [m.name for m in metrics] == ["lookups_per_s", "stores_per_s", "evictions_per_s",
                                         "calls_per_s"]
    assert mine.results[0].work() == theirs.results[-1].work()
    for metric in metrics:
        assert metric.value > 0 and len(metric.samples) == 5
        assert metric.paired is not None and metric.paired.pairs == 5
        assert metric.paired.ci_low == metric.paired.ratio == metric.paired.ci_high == 1.0, (
            metric.name, metric.paired)
    info = mine.info()
    assert info["produced"]["evicted"] > 0 and info["num_chunks"] < info["working_set"]


def test_command_line_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert offload_bench.main(["--policy", "lru", "--rounds", "1", "--warmup", "0",
                               "--scale", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "offload tier, policy lru" in out and "policy arc" not in out
    for name in ("lookups_per_s", "stores_per_s", "evictions_per_s", "calls_per_s"):
        assert name in out
    assert "reference A / reference B" in out


BAD = [
    (["--rounds", "0"], ["--rounds", "[1, 10000]", "Fix"]),
    (["--warmup", "-1"], ["--warmup", "[0, 1000]"]),
    (["--policy", "mru"], ["--policy", "['mru']", "lru, arc"]),
    (["--policy", "lru,lru"], ["--policy", "named twice"]),
    (["--scale", "nan"], ["--scale", "(0, 64]"]),
    (["--seed", "-1"], ["--seed", "[0, 2^63-1]"]),
    (["--tier-fraction", "0"], ["--tier-fraction", "(0, 1]"]),
    (["--tier-fraction", "1.5"], ["--tier-fraction", "(0, 1]"]),
]


@pytest.mark.parametrize(("argv", "words"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_argument_is_one_line_and_exit_2(argv: list[str], words: list[str],
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("an implementation was loaded before the arguments were checked")

    monkeypatch.setattr("kvcheck.conformance.loader.load_impl", no_load)
    with pytest.raises(SystemExit) as exit_info:
        offload_bench.main(argv)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"{PROG}: error: argument "), err
    for word in words:
        assert word in lines[0], (word, err)


@pytest.mark.parametrize(("impl", "words"), [
    ("no_such_module_xyz", ["--impl no_such_module_xyz: cannot import", "Fix"]),
    ("kvcheck.adapters.reference_indexer", ["does not declare capability 'offload'", "Fix"]),
])
def test_an_implementation_without_a_tier_is_one_line(
        impl: str, words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert offload_bench.main(["--impl", impl, "--scale", "0.05"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{PROG}: error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


def test_a_declined_policy_is_named_and_skipped(
        impl_module: Callable[[str, str], str], capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    name = impl_module("offload_bench_lru_only", """
        from kvcheck.adapters.reference import make_offloading_manager as _make
        from kvcheck.conformance.protocol import ImplInfo, UnsupportedSpec

        IMPL_INFO = ImplInfo(name="lru-only", version="0", capabilities=frozenset({"offload"}),
                             hash_algos=())

        def make_offloading_manager(spec):
            if spec.cache_policy != "lru":
                raise UnsupportedSpec("only LRU here")
            return _make(spec)
        """)
    argv = ["--impl", name, "--rounds", "1", "--warmup", "0", "--scale", "0.05"]
    assert offload_bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "offload tier, policy lru" in out
    assert "policy arc: not measured: lru-only declines it (only LRU here)" in out
    assert offload_bench.main([*argv, "--policy", "arc"]) == 2  # nothing measured
