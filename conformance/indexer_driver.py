"""Drive an indexer as a router receives its workers' streams, and check every answer against
the truth (``kvcheck.conformance.indexer_cluster``).

``plan_deliveries`` turns a cluster's batches into what reaches the router, in order: each
batch live as it is published, unless a fault says otherwise (with capability ``replay``):

* ``drop``: the batch is lost (past the high-water mark); the router later asks the replay
  socket, and receives, as replayed batches, everything from ``overlap`` batches before the
  first lost one up to the last lost one, once ``delay`` more live batches of the worker
  arrived (a replay racing the live stream), or before the worker restarts or is removed, or
  at the end;
* ``duplicate``: the batch arrives twice.

Never lost: a restarted engine's first batch and, when the engine restarts, its last batch
before that (with both, a router sees the sequence go back, which is how a restart is told
apart from a duplicate). A worker the router removes is given ``remove_worker``.

After every delivery, every probe is matched, and each worker's answer is compared with the
truth where the stream lets a router know it: the worker's batches delivered so far, of its
latest engine process, are exactly sequences ``0..N`` (no gap open); the truth is then the
worker's cached keys right after batch ``N``. A worker removed, or never delivered, must not
be named. A mismatch raises ``IndexerMismatch`` with the deliveries so far written as a
replayable trace and a runnable repro (``replay_indexer_trace``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from kvcheck.atomic import write_atomic
from kvcheck.conformance.errors import IndexerMismatch
from kvcheck.conformance.indexer_cluster import (
    Batch,
    ClusterPlan,
    ClusterRun,
    Probe,
    match_hashes,
    truth_hashes,
    worker_id,
)
from kvcheck.conformance.indexer_guard import GuardedIndexer
from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext, config_to_dict
from kvcheck.errors import KVCheckInputError
from kvcheck.events.codec import Release, decode_batch, encode_batch

__all__ = ["INDEXER_TRACE_VERSION", "Deliver", "IndexerMismatch", "IndexerRun", "Remove",
           "batch_dict", "plan_deliveries", "replay_indexer_trace"]

INDEXER_TRACE_VERSION: Final = 1
REPRO_DIR: Final = Path(".kvcheck") / "repro"


@dataclass(frozen=True, slots=True)
class Deliver:
    """A batch reaching the router: live, or replayed after a gap."""

    batch: Batch
    replay: bool = False


@dataclass(frozen=True, slots=True)
class Remove:
    """The router removes a worker."""

    worker: int


Action = Deliver | Remove


def plan_deliveries(run: ClusterRun, *, faults: bool) -> list[Action]:
    """What reaches the router, in order (see the module doc); ``faults``: apply the ops'
    ``drop`` / ``duplicate`` faults (the indexer declares ``replay``)."""
    history: dict[int, list[Batch]] = {}  # per worker: its latest process's batches so far
    lost: dict[int, list[Batch]] = {}
    # worker -> [its live batches still to arrive before the replay, the replay's overlap]
    due: dict[int, list[int]] = {}
    keep = _kept_before_restart(run)
    actions: list[Action] = []

    def flush(worker: int) -> None:
        missing = lost.pop(worker, [])
        if not missing:
            return
        _, overlap = due.pop(worker)
        batches = history[worker]
        start = max(0, missing[0].seq - overlap)
        actions.extend(Deliver(b, True) for b in batches[start:missing[-1].seq + 1])

    for number, (op, batch) in enumerate(run.steps):
        worker = op.worker % run.plan.workers
        if op.kind == "restart" or run.removed_at.get(worker) == number:
            flush(worker)
            if op.kind != "restart":
                actions.append(Remove(worker))
            continue
        if batch is None:
            continue
        if batch.seq == 0:
            history[worker] = []
        history[worker].append(batch)
        droppable = faults and not (batch.seq == 0 and batch.incarnation > 0) \
            and (worker, batch.incarnation, batch.seq) not in keep
        if droppable and op.fault == "drop":
            lost.setdefault(worker, []).append(batch)
            due.setdefault(worker, [max(1, op.delay), op.overlap])
            continue
        actions.append(Deliver(batch))
        if faults and op.fault == "duplicate":
            actions.append(Deliver(batch))
        if worker in due:  # the replay races this many live batches
            due[worker][0] -= 1
            if due[worker][0] <= 0:
                flush(worker)
    for worker in list(lost):
        flush(worker)
    return actions


def _kept_before_restart(run: ClusterRun) -> set[tuple[int, int, int]]:
    """``(worker, incarnation, seq)`` of each engine process's last batch before a restart."""
    last: dict[int, Batch] = {}
    keep: set[tuple[int, int, int]] = set()
    for op, batch in run.steps:
        worker = op.worker % run.plan.workers
        if batch is not None:
            last[worker] = batch
        elif op.kind == "restart" and worker in last:
            b = last[worker]
            keep.add((worker, b.incarnation, b.seq))
    return keep


def batch_dict(payload: bytes, release: Release, int_hashes: bool) -> dict[str, object]:
    """A payload decoded as ``apply_events`` receives it: ``{"ts", "events",
    "data_parallel_rank"}``, each event a dict with ``"type"`` and the release's fields."""
    decoded = decode_batch(payload, release=release, int_hashes=int_hashes)
    events = [{"type": type(e).__name__, **msgspec.structs.asdict(e)}
              for e in decoded.wire.events]
    return {"ts": decoded.ts, "events": events,
            "data_parallel_rank": decoded.data_parallel_rank}


class _Stream:
    """Where one worker's stream stands at the router: the latest engine process delivered
    and its sequence numbers delivered so far."""

    def __init__(self) -> None:
        self.incarnation = -1
        self.seqs: set[int] = set()
        self.state: dict[int, Batch] = {}

    def add(self, batch: Batch) -> None:
        if batch.incarnation > self.incarnation:
            self.incarnation, self.seqs, self.state = batch.incarnation, set(), {}
        if batch.incarnation == self.incarnation:
            self.seqs.add(batch.seq)
            self.state[batch.seq] = batch

    def known(self) -> Batch | None:
        """The batch whose state the router can know (None: a gap is open)."""
        if not self.seqs:
            return None
        top = max(self.seqs)
        return self.state[top] if len(self.seqs) == top + 1 else None


class IndexerRun:
    """One indexer fed one cluster run's deliveries, checked after each.

    Args:
        indexer: the guarded index (``ImplHandle.make_indexer``).
        target: the ``--kv-indexer`` value (for the repro).
        trace_name: the trace's file name under ``.kvcheck/repro/`` (None: not written).
    """

    def __init__(self, indexer: GuardedIndexer, plan: ClusterPlan, *, target: str,
                 trace_name: str | None = None) -> None:
        self.indexer = indexer
        self.plan = plan
        self.target = target
        self.trace_name = trace_name
        config = plan.config
        self._release: Release = "vllm-0.10" if config.release == "vllm-0.10" else "vllm-0.33"
        self._int = config.hash_form == "int"
        hasher = truth_hashes(plan)
        self._probe_hashes = [match_hashes(hasher, config, p.tokens, p.context)
                              for p in plan.probes]
        self._payloads: dict[tuple[int, int, int], bytes] = {}
        self.done: list[dict[str, object]] = []  # the deliveries made, as the trace lists them
        self.streams: dict[int, _Stream] = {}
        self.removed: set[int] = set()

    def payload(self, batch: Batch) -> bytes:
        """The batch's bytes on the wire (encoded once)."""
        key = (batch.worker, batch.incarnation, batch.seq)
        payload = self._payloads.get(key)
        if payload is None:
            meta = batch.group_metadata if self._release == "vllm-0.33" else None
            payload = self._payloads[key] = encode_batch(
                batch.events, ts=float(batch.seq), release=self._release,
                int_hashes=self._int, group_metadata=meta)
        return payload

    def run(self, actions: Sequence[Action]) -> None:
        __tracebackhide__ = True
        for action in actions:
            self.apply(action)
            self.check()

    def apply(self, action: Action) -> None:
        __tracebackhide__ = True
        if isinstance(action, Remove):
            self.done.append({"remove": worker_id(action.worker)})
            self.removed.add(action.worker)
            self.indexer.remove_worker(worker_id(action.worker))
            return
        batch = action.batch
        payload = self.payload(batch)
        self.done.append({"deliver": worker_id(batch.worker), "seq": batch.seq,
                          "replay": action.replay, "payload": payload.hex()})
        self.streams.setdefault(batch.worker, _Stream()).add(batch)
        decoded = (batch_dict(payload, self._release, self._int) if self.indexer.decoded
                   else {})
        self.indexer.deliver(worker_id(batch.worker), batch.seq, payload, decoded,
                             action.replay)

    def expected(self, probe: int) -> dict[str, int | None]:
        """Per worker the router knows of, the truth for probe ``probe`` (None: a gap is
        open, any answer goes)."""
        hashes = self._probe_hashes[probe]
        out: dict[str, int | None] = {}
        for worker, stream in self.streams.items():
            if worker in self.removed:
                continue
            known = stream.known()
            if known is None:
                out[worker_id(worker)] = None
                continue
            count = 0
            for block_hash in hashes:
                if block_hash not in known.cached:
                    break
                count += 1
            out[worker_id(worker)] = count
        return out

    def check(self) -> None:
        """Every probe matched; every worker's answer compared with the truth."""
        __tracebackhide__ = True
        for number, probe in enumerate(self.plan.probes):
            got = self.indexer.match(probe.tokens, probe.context)
            want = self.expected(number)
            for worker, truth in want.items():
                if truth is not None and got.get(worker, 0) != truth:
                    self.fail(number, worker, truth, got)

    def fail(self, number: int, worker: str, truth: int, got: Mapping[str, int]) -> None:
        __tracebackhide__ = True
        probe = self.plan.probes[number]
        top = max(self.streams[int(worker[1:])].seqs)
        lines = [(f"after delivery #{len(self.done) - 1} ({_describe(self.done[-1])}): "
                  f"match({_probe_text(probe)}) gave worker {worker!r} {got.get(worker, 0)} "
                  f"block(s); the truth is {truth} (its stream, batches 0..{top}, says it "
                  f"holds the request's first {truth} block(s) in group "
                  f"{self.plan.config.match_group}); whole answer {dict(got)}"),
                 "last deliveries: " + "; ".join(_describe(d) for d in self.done[-6:])]
        if self.trace_name:
            try:
                path = write_indexer_trace(self.trace_name, self.target, self.plan.config,
                                           self.done, probe, {worker: truth})
                lines.append(f"trace written to {path}; repro: python -c \"from "
                             "kvcheck.conformance.indexer_driver import replay_indexer_trace; "
                             f"replay_indexer_trace('{path}')\"")
            except OSError as exc:  # an unwritable folder must not hide the failure
                lines.append(f"trace not written ({REPRO_DIR}: {exc.strerror or exc})")
        raise IndexerMismatch("\n".join(lines))


def _describe(entry: Mapping[str, object]) -> str:
    if "remove" in entry:
        return f"remove_worker({entry['remove']!r})"
    how = "replayed" if entry["replay"] else "live"
    return f"{entry['deliver']} seq {entry['seq']} {how}"


def _probe_text(probe: Probe) -> str:
    context = {k: v for k, v in asdict(probe.context).items() if v}
    return f"{len(probe.tokens)} tokens {list(probe.tokens[:12])}" + (
        "..." if len(probe.tokens) > 12 else "") + (f", {context}" if context else "")


# ------------------------------------------------------------------------------- traces
def write_indexer_trace(name: str, target: str, config: IndexerConfig,
                        done: Sequence[Mapping[str, object]], probe: Probe,
                        expected: Mapping[str, int], directory: Path | None = None) -> Path:
    """The deliveries, then the probe and the workers' truth, as JSON (atomically)."""
    from kvcheck.conformance.differential import safe_name  # one file-naming rule

    trace = {"indexer_trace_version": INDEXER_TRACE_VERSION, "impl": target,
             "config": config_to_dict(config), "actions": list(done),
             "probe": {"tokens": list(probe.tokens), "context": asdict(probe.context)},
             "expected": dict(expected)}
    path = (directory or REPRO_DIR) / f"{safe_name(name)}.indexer.json"
    return write_atomic(path, json.dumps(trace, indent=1) + "\n")


# Any: one JSON entry, read duck-typed: a malformed one raises KeyError / TypeError, which
# replay_indexer_trace reports.
def _trace_action(action: Any) -> tuple[str, int, bytes | None, bool]:
    """One entry of a trace's ``actions``: ``(worker, seq, payload, replay)``, the payload
    None for a ``remove_worker`` (raises KVCheckInputError, KeyError or TypeError when
    malformed)."""
    if "remove" in action:
        return str(action["remove"]), 0, None, False
    seq, replay = action["seq"], action["replay"]
    if type(seq) is not int or seq < 0 or type(replay) is not bool:
        raise KVCheckInputError(
            f"a delivery needs an int seq >= 0 and a bool replay: {action!r:.80}")
    return str(action["deliver"]), seq, bytes.fromhex(action["payload"]), replay


def replay_indexer_trace(path: str | Path, target: str | None = None) -> dict[str, int]:
    """Replay a trace ``IndexerRun`` wrote on the indexer it names (or ``target``) and
    compare its last answer with the truth recorded there. Returns the answer.

    Raises:
        IndexerMismatch: the answer still differs.
        KVCheckInputError: the file is not such a trace.
    """
    from kvcheck.conformance.loader import load_impl

    try:
        trace = json.loads(Path(path).read_text(encoding="utf-8"))
        version = trace["indexer_trace_version"]
        config = IndexerConfig(**trace["config"])
        actions = trace["actions"]
        context = trace["probe"]["context"]
        probe = MatchContext(
            lora=None if context["lora"] is None else tuple(context["lora"]),
            cache_salt=context["cache_salt"],
            mm_features=tuple(tuple(item) for item in context["mm_features"]))
        tokens = [int(t) for t in trace["probe"]["tokens"]]
        expected = {str(k): int(v) for k, v in trace["expected"].items()}
        steps = [_trace_action(action) for action in actions]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KVCheckInputError(f"{path}: not an indexer trace ({type(exc).__name__}: {exc})\n"
                                "  Fix: pass a .indexer.json file the indexer area wrote"
                                ) from None
    if version != INDEXER_TRACE_VERSION:
        raise KVCheckInputError(f"{path}: indexer_trace_version {version!r}; this kvcheck "
                                f"reads version {INDEXER_TRACE_VERSION}")
    handle = load_impl(target or trace["impl"])
    indexer = handle.make_indexer(config)
    release: Release = "vllm-0.10" if config.release == "vllm-0.10" else "vllm-0.33"
    for worker, seq, payload, replay in steps:
        if payload is None:
            indexer.remove_worker(worker)
            continue
        decoded = (batch_dict(payload, release, config.hash_form == "int")
                   if indexer.decoded else {})
        indexer.deliver(worker, seq, payload, decoded, replay)
    got = indexer.match(tokens, probe)
    for worker, truth in expected.items():
        if got.get(worker, 0) != truth:
            raise IndexerMismatch(f"{path}: worker {worker!r}: {got.get(worker, 0)} block(s), "
                                  f"the truth is {truth}")
    return got
