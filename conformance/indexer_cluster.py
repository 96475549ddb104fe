"""Simulated workers for the ``indexer`` area: each a reference KV-cache manager with events on,
run by a tiny scheduler, whose batches a router receives, and the truth an index must answer.

A ``ClusterPlan`` is data (what Hypothesis draws and shrinks): the workers' configuration, a
list of ``WorkerOp`` (admit a prompt, a chat turn, decode, finish, reset the prefix cache,
restart the engine, remove the worker from the router) and a list of ``Probe`` (the prompts
the router is asked about). ``run_cluster`` plays the ops and returns every worker's batches,
each with its sequence number (per publisher process: 0 again after a restart) and the
worker's cached keys after it.

**The truth** (docs/indexers.md, "The truth"): after the batches of a worker's stream up to
sequence ``N`` are applied, a match for that worker is the number of leading hashes of the
request (hashed as the worker hashes it: block size, algorithm, NONE_HASH, LoRA, salt and
multimodal inputs) that the worker's prefix cache held in the match group right after it
published batch ``N``. ``IndexerRun.expected`` computes it from the recorded keys and
``match_hashes``: with a hash block smaller than the match group's block (vLLM 0.33 hybrid
layouts), the group keys each block by the hash at its last hash-block boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from kvcheck.conformance.indexer_protocol import HashForm, IndexerConfig, MatchContext
from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.block import get_block_hash, get_group_id
from kvcheck.reference_impl.events import KVCacheEvent
from kvcheck.reference_impl.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import LoRARequest, MultiModalFeature, Request

__all__ = ["LORAS", "SALTS", "Batch", "ClusterPlan", "ClusterRun", "Probe", "PromptPlan",
           "WorkerOp", "hashes_of", "match_hashes", "run_cluster", "truth_hashes",
           "worker_id"]

#: The LoRA adapters and salts workloads and probes draw from.
LORAS: Final = (("adapter-a", 1, "/loras/a"), ("adapter-b", 2, "/loras/b"))
SALTS: Final = ("salt-1", "salt-2")
#: Bytes of vLLM's default integer event hash (the digest's last 8).
_INT_HASH_BYTES: Final = 8

OpKind = Literal["admit", "turn", "decode", "finish", "reset", "restart", "remove", "evict"]
Fault = Literal["none", "drop", "duplicate"]


@dataclass(frozen=True, slots=True)
class PromptPlan:
    """A prompt: shared system prompt ``system`` (an index into ``ClusterPlan.systems``) then
    ``user`` tokens, with its context. ``skip_read``: the request does not read the prefix
    cache (vLLM's ``skip_reading_prefix_cache``), so its full blocks are cached again: a
    second physical copy of each hash, stored and later removed on its own."""

    system: int
    user: tuple[int, ...]
    context: MatchContext = field(default_factory=MatchContext)
    skip_read: bool = False


@dataclass(frozen=True, slots=True)
class WorkerOp:
    """One scheduler step of worker ``worker``.

    * ``admit``: a new request of ``prompt``, prefilled at once (or refused and dropped);
    * ``turn``: the next turn of running request ``index`` (mod the running count): a new
      request whose prompt is that request's tokens then ``prompt.user``; the old one ends;
    * ``decode``: running request ``index`` gains ``count`` tokens (preempted if the pool is
      full); ``finish``: it ends;
    * ``reset``: every request ends, then ``reset_prefix_cache`` (``AllBlocksCleared``);
    * ``restart``: the engine process restarts (an empty cache, a new publisher: sequence 0);
    * ``remove``: the router removes the worker (no batch of it follows);
    * ``evict`` (0.33; scripted tests only, the random plans never draw it): the KV
      connector's load into running request ``index``'s match-group block ``count - 1``
      failed, and the scheduler drops every key of that block (``evict_blocks``; the block
      stays in the request, its tokens counted as computed).

    ``fault`` is what happens to the batch the step publishes on its way to the router
    (``kvcheck.conformance.indexer_driver.plan_deliveries``): ``drop`` (replayed after
    ``delay`` more live batches of the worker, from ``overlap`` batches before) or
    ``duplicate``.
    """

    worker: int
    kind: OpKind
    index: int = 0
    count: int = 1
    prompt: PromptPlan | None = None
    fault: Fault = "none"
    delay: int = 1
    overlap: int = 0


@dataclass(frozen=True, slots=True)
class Probe:
    """A request the router is asked about: ``tokens`` with ``context``."""

    tokens: tuple[int, ...]
    context: MatchContext = field(default_factory=MatchContext)


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    """Everything a run depends on.

    Attributes:
        config: what the index is told (block size, release, hash form and algorithm...).
        num_blocks: per worker, the pool size (null block included): small pools evict.
        sliding_window: None: one full-attention group; else a second group, a sliding window
            of that many tokens (``kv_cache_groups``; 0.33 only), in blocks of
            ``config.hash_block_size`` (None: ``config.block_size``). A smaller block than the
            full-attention group's makes that group publish partial-block keys.
        mamba: a second group of Mamba layers in "align" mode (0.33's Mamba prefix caching)
            in blocks of ``config.hash_block_size`` (None: ``config.block_size``), instead of
            a sliding window: its stores name only the blocks it keeps, and their hashes are
            the full-attention group's (``kv_cache_groups``; 0.33 only).
        retention: 0.33's ``prefix_cache_retention_interval`` for the sliding-window group
            (None: every block cached; 0 or a multiple of the block size: blocks masked out
            of the cache, so its stores are sparse: ``token_ids`` span blocks
            ``block_hashes`` skips).
        systems: the shared system prompts (token tuples).
        ops: the steps, in the order they happen across workers.
        probes: what the router is asked after every delivery.
    """

    config: IndexerConfig
    num_blocks: tuple[int, ...]
    systems: tuple[tuple[int, ...], ...]
    ops: tuple[WorkerOp, ...]
    probes: tuple[Probe, ...]
    sliding_window: int | None = None
    retention: int | None = None
    mamba: bool = False

    def __post_init__(self) -> None:
        if self.mamba and (self.sliding_window is not None or self.retention is not None):
            raise KVCheckInputError("ClusterPlan: a Mamba group replaces the sliding-window "
                                    "group (and its retention); set mamba=False or "
                                    "sliding_window=None and retention=None")
        if self.config.hash_block_size not in (None, self.config.block_size) and not (
                self.mamba or self.sliding_window is not None):
            raise KVCheckInputError("ClusterPlan: a hash block smaller than the block needs a "
                                    "second group in blocks of it (sliding_window or mamba)")

    @property
    def workers(self) -> int:
        return len(self.num_blocks)

    @property
    def specs(self) -> tuple[KVCacheSpec, ...]:
        """The workers' KV-cache groups: full attention (the match group, 0), then the
        sliding window or Mamba group, if any, in blocks of the hash block."""
        config = self.config
        small = config.hash_block_size or config.block_size
        specs: tuple[KVCacheSpec, ...] = (FullAttentionSpec(config.block_size),)
        if self.sliding_window is not None:
            specs += (SlidingWindowSpec(small, sliding_window=self.sliding_window),)
        elif self.mamba:
            specs += (MambaSpec(small, mamba_cache_mode="align"),)
        return specs


@dataclass(frozen=True, slots=True)
class Batch:
    """One published batch: ``worker`` (its id: ``worker_id(i)``), ``incarnation`` (its engine
    process, 0 until the first restart), ``seq``, the events, and the worker's cached keys of
    the match group right after it (hashes in the stream's form)."""

    worker: int
    incarnation: int
    seq: int
    events: tuple[KVCacheEvent, ...]
    cached: frozenset[bytes]
    group_metadata: tuple[tuple[str, int | None], ...]


@dataclass
class ClusterRun:
    """What ``run_cluster`` produced: ``steps`` in op order, each the op and the batch it
    published (None: it published nothing, or the op was skipped), and the workers removed
    by the router, by op index."""

    plan: ClusterPlan
    steps: list[tuple[WorkerOp, Batch | None]] = field(default_factory=list)
    removed_at: dict[int, int] = field(default_factory=dict)


def worker_id(index: int) -> str:
    """The id a worker is known to the router by."""
    return f"w{index}"


def _options(context: MatchContext) -> dict[str, object]:
    options: dict[str, object] = {}
    if context.lora is not None:
        options["lora_request"] = LoRARequest(*context.lora)
    if context.cache_salt is not None:
        options["cache_salt"] = context.cache_salt
    if context.mm_features:
        options["mm_features"] = [MultiModalFeature(*item) for item in context.mm_features]
    return options


def hashes_of(manager: KVCacheManager, tokens: Sequence[int], context: MatchContext,
              hash_form: HashForm) -> list[bytes]:
    """The block hashes of a request as ``manager`` hashes it (in blocks of its hash block),
    in the stream's form."""
    request = manager.make_request("probe", list(tokens), **_options(context))  # type: ignore[arg-type]
    hashes = [bytes(h) for h in request.block_hashes]
    return [h[-_INT_HASH_BYTES:] for h in hashes] if hash_form == "int" else hashes


def match_hashes(manager: KVCacheManager, config: IndexerConfig, tokens: Sequence[int],
                 context: MatchContext) -> list[bytes]:
    """The keys of a request's full blocks in the match group, in the stream's form: its
    hashes at the hash block (``truth_hashes``), every ``block_size // hash_block_size``-th,
    as vLLM 0.33 keys a group of larger blocks (``BlockHashListWithBlockSize``: the hash at
    a block's last hash-block boundary chains over its whole prefix)."""
    hashes = hashes_of(manager, tokens, context, config.hash_form)
    scale = config.block_size // (config.hash_block_size or config.block_size)
    return hashes[scale - 1::scale]


class _Worker:
    """One simulated engine: a reference manager with events on and its running requests."""

    def __init__(self, plan: ClusterPlan, index: int) -> None:
        self.plan = plan
        self.index = index
        self.incarnation = -1
        self.removed = False
        self.restart()

    def restart(self) -> None:
        config, plan = self.plan.config, self.plan
        self.manager = KVCacheManager(
            plan.num_blocks[self.index], kv_cache_specs=plan.specs, profile=config.release,
            enable_kv_cache_events=True, hash_algo=config.hash_algo,
            pythonhashseed=config.pythonhashseed,
            num_hash_lookahead_tokens=config.num_hash_lookahead_tokens,
            prefix_cache_retention_interval=(plan.retention if plan.sliding_window is not None
                                             else None))
        self.running: list[Request] = []
        self.incarnation += 1
        self.seq = 0
        self.number = 0

    def _new(self, tokens: Sequence[int], context: MatchContext, skip_read: bool = False) -> None:
        self.number += 1
        request = self.manager.make_request(f"r{self.number}", list(tokens),
                                            skip_reading_prefix_cache=skip_read,
                                            **_options(context))  # type: ignore[arg-type]
        hits, num_hit = self.manager.get_computed_blocks(request)
        num_new = request.num_tokens - num_hit
        if self.manager.allocate_slots(request, num_new, num_hit, hits) is None:
            return  # refused: the pool is full of running requests
        request.num_computed_tokens = request.num_tokens
        self.running.append(request)

    def step(self, op: WorkerOp) -> None:
        mgr = self.manager
        mgr.new_step_starts()  # as vLLM's scheduler does (Mamba's hits of the last step)
        if op.kind == "admit" and op.prompt is not None:
            prompt = op.prompt
            self._new(self.plan.systems[prompt.system] + prompt.user, prompt.context,
                      prompt.skip_read)
        elif op.kind == "turn" and op.prompt is not None and self.running:
            old = self.running.pop(op.index % len(self.running))
            mgr.free(old)
            self._new(tuple(old.all_token_ids) + op.prompt.user, _context_of(old))
        elif op.kind in ("decode", "finish") and self.running:
            request = self.running[op.index % len(self.running)]
            if op.kind == "finish":
                self.running.remove(request)
                mgr.free(request)
                return
            request.append_output_token_ids([(op.count * 7 + k) % 50 for k in range(op.count)])
            num_new = request.num_tokens - request.num_computed_tokens
            if mgr.allocate_slots(request, num_new) is None:
                self.running.remove(request)  # preempted
                mgr.free(request)
            else:
                request.num_computed_tokens = request.num_tokens
        elif op.kind == "evict" and self.running:
            request = self.running[op.index % len(self.running)]
            table = mgr.get_block_ids(request.request_id)[self.plan.config.match_group]
            if 0 < op.count <= len(table):
                mgr.evict_blocks([table[op.count - 1]])
        elif op.kind == "reset":
            for request in self.running:
                mgr.free(request)
            self.running.clear()
            mgr.reset_prefix_cache()

    def cached(self) -> frozenset[bytes]:
        """The match group's cached hashes now, in the stream's form (partial-block keys
        included: they are keys of the group, and never a block's key, ``match_hashes``)."""
        group = self.plan.config.match_group
        cut = _INT_HASH_BYTES if self.plan.config.hash_form == "int" else None
        keys = self.manager.block_pool.cached_block_hash_to_block
        return frozenset(bytes(get_block_hash(key))[-cut:] if cut else
                         bytes(get_block_hash(key)) for key in keys
                         if get_group_id(key) == group)


def _context_of(request: Request) -> MatchContext:
    lora = request.lora_request
    return MatchContext(
        lora=None if lora is None else (lora.lora_name, lora.lora_int_id, lora.lora_path),
        cache_salt=request.cache_salt,
        mm_features=tuple((f.identifier, f.offset, f.length) for f in request.mm_features))


def run_cluster(plan: ClusterPlan) -> ClusterRun:
    """Play ``plan.ops``; every op that emits events publishes one batch (as vLLM's scheduler
    publishes one per step). Ops of a removed worker are skipped."""
    workers = [_Worker(plan, i) for i in range(plan.workers)]
    run = ClusterRun(plan)
    for number, op in enumerate(plan.ops):
        worker = workers[op.worker % plan.workers]
        if worker.removed:
            run.steps.append((op, None))
            continue
        if op.kind == "remove":
            worker.removed = True
            run.removed_at[worker.index] = number
            run.steps.append((op, None))
            continue
        if op.kind == "restart":
            # Only after two batches: a router tells a restart (the sequence goes back) from
            # a duplicate delivery only when the old process's last sequence was above 0.
            if worker.seq >= 2:
                worker.restart()
            run.steps.append((op, None))
            continue
        worker.step(op)
        events = tuple(worker.manager.take_events())
        if not events:
            run.steps.append((op, None))
            continue
        batch = Batch(worker.index, worker.incarnation, worker.seq, events, worker.cached(),
                      worker.manager.kv_cache_event_metadata)
        worker.seq += 1
        run.steps.append((op, batch))
    return run


def truth_hashes(plan: ClusterPlan) -> KVCacheManager:
    """A manager hashing requests as every worker of ``plan`` does, in blocks of the hash
    block (for ``hashes_of`` and ``match_hashes``)."""
    config = plan.config
    return KVCacheManager(2, config.hash_block_size or config.block_size,
                          profile=config.release,
                          hash_algo=config.hash_algo, pythonhashseed=config.pythonhashseed,
                          num_hash_lookahead_tokens=config.num_hash_lookahead_tokens)
