"""A recorded corpus as a benchmark: every op of every trace replayed on fresh managers, timed.

A corpus (``kvcheck record`` output, ``.cbor.xz``: ``kvcheck.conformance.recorded``) holds what
a real engine did, op by op. ``RecordedBench`` replays those ops on an implementation
(``replay_trace``) with the ``Driver``'s calls and arguments: ``add`` builds the
``RequestView`` with the Driver's ``view_from_add``; ``schedule`` / ``decode`` plan
``num_new`` and the sampled tokens with the Driver's own ``plan_schedule``
(``kvcheck.conformance.schedule_step``), the hits and the lookahead passed as the Driver
passes them; ``free``; ``reset`` -> ``reset_prefix_cache``. What it leaves out is what makes
the ``Driver`` far too slow to time: the repro lines, the law checks and the state
observation. The implementation's own answers are passed on (its hits go into its
``allocate_slots``), never the recorded ones, so a divergent implementation replays its own
run of the trace.

Timing follows ``kvcheck.bench.replay.scheduler``: ``perf_counter_ns`` around each call into the
implementation only, the sum scaled by the whole replay's on-CPU fraction (``thread_time_ns``
over wall time). A round replays the whole corpus (the runnable traces, each on a fresh
manager built untimed by ``setup``) and yields one ``RecordedRun``, a ``SchedulerRun`` whose
counters mean:

* ``scheduled_tokens``: ``num_new`` of every successful ``allocate_slots``;
* ``hit_tokens`` / ``queried_tokens``: at admissions (an ``allocate_slots`` after
  ``get_computed_blocks`` that succeeds), the hit and the request's token count;
* ``preemptions``: a trace does not say why a request was freed, so a free counts as a
  preemption when the request held blocks and the trace schedules it again later (the
  count is made when it is re-admitted);
* ``steps``: ops replayed; ``finished`` is not counted (0);
* ``peak_used_blocks`` / ``usable_blocks``: those of the trace whose pool was fullest
  (``num_free_blocks`` read untimed after each successful ``allocate_slots``);
* ``reset_ns``: ``reset_prefix_cache`` calls, included in ``impl_ns``.

Ops are decoded from the corpus once, when the bench is built (``decode_trace``; the recorded
states are not rebuilt). ``load_recorded_workload`` bounds a corpus as a benchmark (steps in
all, decode work) on top of ``load_corpus``'s checks. Traces the
implementation cannot run (a capability their requests need, a pool its factory declines) are
skipped and counted, and so are those the lean replay does not model
(``lean_replay_problem``: KV-connector traces, cross-attention and Mamba layouts; the other
multi-group traces replay, one list of block ids per group as the adapter answers);
``recorded_pair`` builds an implementation bench and a reference bench over the traces both
can run, for ``kvcheck.bench.measure.paired.PairedBench``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from kvcheck.bench.measure.allocator import scheduler_metrics
from kvcheck.bench.measure.metrics import Metric, percentile
from kvcheck.bench.measure.rounds import RoundBench, SetupArgs
from kvcheck.bench.measure.timing import timed_call
from kvcheck.bench.replay.scheduler import SchedulerRun
from kvcheck.bench.workload.scenarios import shared_prefix_blocks
from kvcheck.conformance.bounds import MAX_DECODE_TOKEN_STEPS, MAX_OPS, power_of_two
from kvcheck.conformance.driver import view_from_add
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.pinning import declares_pinning
from kvcheck.conformance.protocol import (
    KIND_CAPABILITIES,
    KVCacheSpec,
    ManagerWithCapabilities,
    RequestView,
    UnsupportedSpec,
    effective_capabilities,
    reserved_block_ids,
)
from kvcheck.conformance.recorded import Corpus, CorpusError, load_corpus, needed_capabilities
from kvcheck.conformance.schedule_step import plan_schedule
from kvcheck.conformance.trace_check import check_spec

# Any: one trace of a loaded corpus, decoded CBOR as conformance.recorded types it (Corpus)
Trace = dict[str, Any]
#: A replayed op's answer in the corpus's form (see ``iter_ops``).
Answer = dict[str, object]

__all__ = [
    "RecordedBench",
    "RecordedOp",
    "RecordedRun",
    "RecordedTrace",
    "decode_trace",
    "iter_ops",
    "lean_replay_problem",
    "load_recorded_workload",
    "missing_capabilities",
    "recorded_pair",
    "replay_trace",
]


def load_recorded_workload(path: str | Path) -> Corpus:
    """A recorded corpus file, fully validated (``kvcheck.conformance.recorded.load_corpus``:
    the bounds of ``kvcheck replay`` on every trace's spec and ops), and bounded as a
    benchmark: every round replays all its ops, so the corpus holds at most ``MAX_OPS``
    (10**6) steps in all (the shipped ones: 1.1 * 10**4), and its decode work (for each
    ``schedule`` / ``decode`` op, the tokens of its request so far: what the replay copies
    into request views) is at most ``MAX_DECODE_TOKEN_STEPS`` (2**32), as for a request
    trace.

    Raises:
        CorpusError: the file cannot be used (an input error naming the file, the trace and
            the step), or it is past a benchmark bound (naming the trace that crosses it).
    """
    corpus = load_corpus(path)
    steps = work = 0
    for index, trace in enumerate(corpus["traces"]):
        at = f"{path}: traces[{index}] ({trace['name']})"
        steps += len(trace["steps"])
        if steps > MAX_OPS:
            raise CorpusError(f"{at}: the traces up to this one hold {steps} steps; a corpus "
                              f"replayed as a benchmark holds at most {MAX_OPS} (as a kvcheck "
                              "replay trace); record fewer traces (kvcheck record --traces)")
        work += _decode_work(trace)
        if work > MAX_DECODE_TOKEN_STEPS:
            raise CorpusError(
                f"{at}: replaying the traces up to this one hands out {work} request tokens "
                "(for each schedule or decode op, the tokens of its request so far); at most "
                f"{power_of_two(MAX_DECODE_TOKEN_STEPS)} a round, as for a request trace; "
                "record fewer or shorter traces")
    return corpus


def _decode_work(trace: Trace) -> int:
    """An upper bound of the request tokens the replay of ``trace`` puts into views at its
    ``schedule`` / ``decode`` ops (each may append to an immutable ``RequestView``)."""
    prompt: dict[str, int] = {}
    asked: dict[str, int] = {}
    work = 0
    for step in trace["steps"]:
        op = step["op"]
        kind, rid = op["op"], op.get("rid", "")
        if kind == "add":
            prompt[rid], asked[rid] = len(op["prompt"]), 0
        elif kind in ("schedule", "decode"):
            n = op.get("num_tokens")
            asked[rid] += 1 if n is None else n
            work += prompt[rid] + asked[rid]
    return work


class RecordedOp(NamedTuple):
    """One corpus op, decoded: ``kind`` is the op's name; ``view`` the new request of an
    ``add``; ``num_tokens`` / ``lookahead`` those of a ``schedule`` or ``decode``."""

    kind: str
    rid: str = ""
    view: RequestView | None = None
    num_tokens: int | None = None
    lookahead: int = 0


@dataclass(frozen=True)
class RecordedTrace:
    """A trace ready to replay: its pool, its decoded ops and the recorded answers (in
    ``normalize_answer`` form, for checks; the replay never reads them)."""

    name: str
    spec: KVCacheSpec
    ops: tuple[RecordedOp, ...]
    answers: tuple[Answer, ...]

    @property
    def prompt_lengths(self) -> list[int]:
        """Prompt length of every ``add``."""
        return [len(op.view.prompt_token_ids) for op in self.ops if op.view is not None]


def _decode_op(op: Any) -> RecordedOp:  # Any: an op of a Trace
    """A corpus op (checked by ``load_corpus``) as a ``RecordedOp``; an ``add``'s view is
    built as ``Driver._add`` builds it."""
    kind = op["op"]
    if kind == "add":
        view = view_from_add(op)
        return RecordedOp(kind, op["rid"], view)
    if kind in ("schedule", "decode"):
        n = op.get("num_tokens")
        return RecordedOp(kind, op["rid"], None, None if n is None else int(n),
                          int(op.get("lookahead", 0)))
    return RecordedOp(kind, op.get("rid", ""))


def decode_trace(trace: Trace) -> RecordedTrace:
    """A loaded corpus trace as a ``RecordedTrace``: its ops and answers (the recorded states
    are not rebuilt: the replay never reads them)."""
    steps = trace["steps"]
    return RecordedTrace(trace["name"], check_spec(trace["spec"], trace["name"]),
                         tuple(_decode_op(step["op"]) for step in steps),
                         tuple(step["answer"] for step in steps))


@dataclass
class RecordedRun(SchedulerRun):
    """One round over a corpus (see the module docstring for what each counter means)."""

    reset_ns: list[int] = field(default_factory=list)  # reset_prefix_cache
    traces: int = 0

    @property
    def impl_ns(self) -> int:
        """Total wall time inside the implementation's calls, resets included."""
        return super().impl_ns + sum(self.reset_ns)


class _Replay:
    """One trace on one manager: the views, which requests hold blocks, and the counters.

    The methods mirror ``Driver.apply``; every call into the manager is timed into ``run``.
    """

    def __init__(self, manager: ManagerWithCapabilities, run: RecordedRun, usable_blocks: int,
                 *, pinning: bool = False) -> None:
        self.manager = manager
        self.pinning = pinning  # pinning_lookup: a lookup no allocation follows is released
        self.run = run
        self.usable_blocks = usable_blocks
        self.peak_used = 0
        self.views: dict[str, RequestView] = {}
        self.running: set[str] = set()
        self.preempted: set[str] = set()  # freed while holding blocks, not yet re-admitted

    def apply(self, op: RecordedOp) -> Answer:
        """Run one op; returns the implementation's answer in the corpus's form."""
        kind = op.kind
        answer: Answer = {}
        if kind == "add":
            assert op.view is not None
            self.views[op.rid] = op.view
            self.preempted.discard(op.rid)
        elif kind == "schedule" or kind == "decode":
            answer = self.schedule(op)
        elif kind == "free":
            self.free(op.rid)
        elif kind == "reset":
            answer["reset"] = bool(timed_call(self.run.reset_ns,
                                              self.manager.reset_prefix_cache))
        elif kind == "lookup" and op.rid not in self.running:
            found, num_hit = timed_call(self.run.lookup_ns, self.manager.get_computed_blocks,
                                        self.views[op.rid])
            answer["hits"] = [list(found), int(num_hit)]
            self._release(op.rid)
        return answer

    def _release(self, rid: str) -> None:
        """The end of a lookup no allocation followed (``pinning_lookup`` only; untimed)."""
        if self.pinning:
            self.manager.release_computed(rid)

    def schedule(self, op: RecordedOp) -> Answer:
        """``Driver._schedule``: a lookup when the request holds no blocks, decode tokens
        appended when it is running and decoding (or done with its prompt), then
        ``allocate_slots``."""
        rid, num_tokens, run = op.rid, op.num_tokens, self.run
        view = self.views[rid]
        answer: Answer = {}
        hits: list[int] = []
        num_hit = 0
        admitting = rid not in self.running
        if admitting:
            found, num_hit = timed_call(run.lookup_ns, self.manager.get_computed_blocks, view)
            hits = list(found)
            answer["hits"] = [hits, int(num_hit)]
        plan = plan_schedule(rid, view, num_tokens, num_hit, running=not admitting,
                             decode=op.kind == "decode")
        view, num_new = plan.view, plan.num_new
        if plan.decoded:
            self.views[rid] = view
        if op.lookahead:  # passed only when asked for, as the Driver does
            new = timed_call(run.allocate_ns, self.manager.allocate_slots, view, num_new,
                             num_hit, hits, op.lookahead)
        else:
            new = timed_call(run.allocate_ns, self.manager.allocate_slots, view, num_new,
                             num_hit, hits)
        answer["new"] = None if new is None else list(new)
        if new is None and admitting:
            self._release(rid)
        if new is not None:
            self.running.add(rid)
            self.views[rid] = replace(view, num_computed_tokens=view.num_computed_tokens
                                      + num_hit + num_new)
            run.scheduled_tokens += num_new
            if admitting:
                run.hit_tokens += num_hit
                run.queried_tokens += view.num_tokens
                if rid in self.preempted:
                    self.preempted.discard(rid)
                    run.preemptions += 1
            used = self.usable_blocks - self.manager.num_free_blocks()
            self.peak_used = max(self.peak_used, used)
        return answer

    def free(self, rid: str) -> None:
        timed_call(self.run.free_ns, self.manager.free, rid)
        if rid in self.running:
            self.running.discard(rid)
            self.preempted.add(rid)
        view = self.views.get(rid)
        if view is not None:  # a freed request may be re-admitted from token 0
            self.views[rid] = replace(view, num_computed_tokens=0)


def _usable_blocks(impl: ImplHandle, spec: KVCacheSpec) -> int:
    return max(1, spec.num_blocks - len(reserved_block_ids(impl.info, spec.profile)))


def iter_ops(impl: ImplHandle, manager: ManagerWithCapabilities, trace: RecordedTrace,
             run: RecordedRun) -> Iterator[tuple[int, Answer]]:
    """Replay every op of ``trace`` on ``manager`` (fresh, built by ``impl`` for
    ``trace.spec``), timing its calls and counting into ``run``; yields ``(index, answer)``
    after each op, the answer in the corpus's form (``{"hits": [ids, n], "new": ids |
    None}``, ``{"reset": bool}`` or ``{}``). Drains no KV events (``kvcheck events serve``
    takes them per op); ``run``'s trace counters are filled once the last op has run."""
    replay = _Replay(manager, run, _usable_blocks(impl, trace.spec),
                     pinning=declares_pinning(impl))
    for index, op in enumerate(trace.ops):
        yield index, replay.apply(op)
    run.steps += len(trace.ops)
    run.traces += 1
    if replay.peak_used * run.usable_blocks >= run.peak_used_blocks * replay.usable_blocks:
        run.peak_used_blocks, run.usable_blocks = replay.peak_used, replay.usable_blocks


def replay_trace(impl: ImplHandle, manager: ManagerWithCapabilities, trace: RecordedTrace,
                 run: RecordedRun, after_op: Callable[[int, Answer], None] | None = None
                 ) -> None:
    """``iter_ops`` to the end.

    ``after_op(index, answer)``, when given, is called (untimed) after each op, to compare
    with ``trace.answers`` and the recorded state. Untimed too: after each op, the KV events
    of a trace that enables them are drained (``take_events``, as the recorder did), so an
    implementation's buffer does not grow over the trace.
    """
    drain = (trace.spec.enable_kv_cache_events and impl.has("events")
             and hasattr(manager, "take_events"))
    for index, answer in iter_ops(impl, manager, trace, run):
        if drain:
            manager.take_events()
        if after_op is not None:
            after_op(index, answer)


def missing_capabilities(impl: ImplHandle, trace: Trace,
                         spec: KVCacheSpec) -> frozenset[str]:
    """Capabilities the trace needs that ``impl`` lacks under the trace's profile."""
    needed = set(needed_capabilities(trace))
    if spec.kv_cache_groups:
        needed |= {"kv_cache_groups", *(KIND_CAPABILITIES[g.kind] for g in spec.kv_cache_groups)}
    return frozenset(needed) - effective_capabilities(impl.info, spec.profile)


#: Capabilities of the KV-connector traces, which the benchmark does not replay.
_CONNECTOR_CAPABILITIES = frozenset({"external_kv", "evict_blocks"})


def lean_replay_problem(trace: Trace, spec: KVCacheSpec) -> str:
    """Why the lean replay (``iter_ops``) cannot replay ``trace`` as recorded ('' when it
    can): it has no external-KV step (KV-connector traces), passes no encoder tokens
    (``cross_attention`` layouts) and marks no scheduler steps (``new_step_starts``, which a
    ``mamba`` layout's answers depend on). The ``recorded`` area checks those traces."""
    if needed_capabilities(trace) & _CONNECTOR_CAPABILITIES:
        return "a KV-connector trace (external tokens, load endings)"
    kinds = {g.kind for g in spec.kv_cache_groups}
    if "cross_attention" in kinds:
        return "a cross_attention layout (the benchmark's replay passes no encoder tokens)"
    if "mamba" in kinds:
        return ("a mamba layout (the benchmark's replay marks no scheduler steps, "
                "new_step_starts)")
    return ""


class RecordedBench(RoundBench[RecordedRun]):
    """Each round replays every runnable trace of ``corpus`` on its own fresh manager.

    ``name`` is the corpus file's name (only the last path component is kept: results never
    carry a path). ``only``: replay just these trace names (the others count as skipped);
    ``recorded_pair`` uses it so both sides of a pair run the same traces.
    """

    def __init__(self, impl: ImplHandle, corpus: Corpus, name: str, *,
                 only: Collection[str] | None = None) -> None:
        super().__init__()
        self.impl = impl
        self.header: dict[str, object] = dict(corpus["header"])
        self.name = Path(name).name
        self.traces: list[RecordedTrace] = []
        self.skipped: dict[str, str] = {}  # trace name -> why
        self.skipped_steps = 0
        for raw in corpus["traces"]:
            spec = check_spec(raw["spec"], raw["name"])
            why = self._why_not(raw, spec, only)
            if why:
                self.skipped[raw["name"]] = why
                self.skipped_steps += len(raw["steps"])
            else:
                self.traces.append(decode_trace(raw))

    def _why_not(self, raw: Trace, spec: KVCacheSpec,
                 only: Collection[str] | None) -> str:
        """Why the trace is not replayed here ('' when it is); builds one manager to ask."""
        missing = missing_capabilities(self.impl, raw, spec)
        if missing:
            return f"{self.impl.name} does not declare {sorted(missing)}"
        lean = lean_replay_problem(raw, spec)
        if lean:  # checked by the recorded area, not timed here
            return f"{lean}: not timed"
        if not self.impl.info.supports(spec):
            return (f"{self.impl.name} does not support the pool (num_blocks="
                    f"{spec.num_blocks}, block_size={spec.block_size})")
        try:
            self.impl.make_manager(spec, guard=False)
        except UnsupportedSpec as exc:
            return f"{self.impl.name} declines the spec ({exc})"
        if only is not None and raw["name"] not in only:
            return "the other side of the pair cannot run it"
        return ""

    @property
    def num_steps(self) -> int:
        """Ops replayed per round."""
        return sum(len(t.ops) for t in self.traces)

    def setup(self) -> SetupArgs:
        managers = [self.impl.make_manager(t.spec, guard=False) for t in self.traces]
        gc.collect()
        return (managers,), {}

    def run(self, managers: list[ManagerWithCapabilities]) -> None:
        result = RecordedRun()
        wall0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
        for trace, manager in zip(self.traces, managers, strict=True):
            replay_trace(self.impl, manager, trace, result)
        result.cpu_ns = time.thread_time_ns() - cpu0
        result.wall_ns = time.perf_counter_ns() - wall0
        self.results.append(result)
        self.advance(result.on_cpu_ns / 1e9)

    def metrics(self, results: list[RecordedRun]) -> list[Metric]:
        return scheduler_metrics(results)

    def info(self) -> dict[str, object]:
        h = self.header
        return {
            "workload": "recorded", "corpus_file": self.name, "profile": h["profile"],
            "recorded_impl": h["impl"], "recorded_impl_version": h["impl_version"],
            "recorded_kvcheck_version": h["kvcheck_version"], "corpus_seed": h["seed"],
            "impl": self.impl.name, "traces_run": len(self.traces), "steps_run": self.num_steps,
            "traces_skipped": len(self.skipped), "steps_skipped": self.skipped_steps,
            "skipped": dict(self.skipped), "produced": self.produced(),
        }

    def produced(self) -> dict[str, float]:
        """Prompt lengths of the replayed ``add`` ops (percentiles, linear interpolation),
        and what the first measured round achieved (replays are deterministic): prefix hit
        rate, preemptions, peak usage, steps."""
        lengths = [n for t in self.traces for n in t.prompt_lengths]
        out = {f"prompt_tokens_p{q}": percentile(lengths, q) for q in (10, 50, 90)
               } if lengths else {}
        if lengths:
            out["prompt_tokens_max"] = float(max(lengths))
            # Each trace has its own pool: prefixes are shared within a trace only.
            counts = [shared_prefix_blocks([op.view.prompt_token_ids for op in t.ops
                                            if op.view is not None], t.spec.block_size)
                      for t in self.traces]
            total = sum(c[0] for c in counts)
            out["shared_prefix_fraction"] = sum(c[1] for c in counts) / total if total else 0.0
        if self.results:
            run: RecordedRun = self.results[0]
            out.update({"prefix_hit_rate": run.prefix_hit_rate,
                        "preemptions": float(run.preemptions), "peak_usage": run.peak_usage,
                        "steps": float(run.steps)})
        return out


def recorded_pair(impl: ImplHandle, reference: ImplHandle, corpus: Corpus, name: str
                  ) -> tuple[RecordedBench, RecordedBench]:
    """``(implementation bench, reference bench)`` over the traces both can run (a trace one
    side skips is skipped by both, so their rounds replay the same ops)."""
    first = RecordedBench(impl, corpus, name)
    second = RecordedBench(reference, corpus, name)
    both = {t.name for t in first.traces} & {t.name for t in second.traces}
    if len(both) < len(first.traces):
        first = RecordedBench(impl, corpus, name, only=both)
    if len(both) < len(second.traces):
        second = RecordedBench(reference, corpus, name, only=both)
    return first, second
