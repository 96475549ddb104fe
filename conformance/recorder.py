"""Recording real behaviour: seeded scheduler-like workloads driven through any loaded
implementation, with its answer and observable state after every step.

``record_corpus(impl, profile, traces=N, seed=S)`` runs ``N`` traces. Trace ``i`` is planned
from its index alone (``trace_plan``: block size, pool size, hash algorithm, caching, KV
events, a model-length cap, and a flavour that weights the scheduler's moves), so its name is
the same under every profile; its moves come from ``random.Random`` seeded with ``(S, i)``.
A move may depend on the implementation's answers (a refused allocation preempts the request
admitted last, as vLLM's scheduler does), but the ops actually applied are recorded, so a
replay only re-applies them.

The moves (``kvcheck.conformance.ops``, run by ``kvcheck.conformance.driver.Driver``):
requests with shared system prompts and chat-style resubmissions (prefix hits, also on
evicted and reused blocks), chunked prefill, decode of one or several tokens, speculative
lookahead slots, scheduler steps over every running request, finishing, preempt-and-resume,
pool pressure (a long request that takes the pool), prefix-cache resets (refused while
requests hold blocks), and LoRA / cache-salt / multimodal requests (``extras`` traces, of the
extra-key kinds the implementation declares, ``extra_keys`` for all three; LoRA only without
KV events: vLLM 0.10.2 crashes on that pair, see ``adapters/vllm-0.10.2.xfails``).

Multi-group traces (``HYBRID_PLANS``, after the single-group ones): the same moves on layouts
of several KV-cache groups, each a layout its vLLM release accepts: full attention beside
sliding-window or chunked-local groups, Mamba groups (mode "none" with prefix caching off, and
under vLLM 0.33 mode "align" at the hash block, some with a speculative block),
cross attention (prefix caching off; every request carries encoder tokens, ``add(...,
encoder=E)``), and under 0.33 partial-block keys (a full-attention group larger than the hash
block). Pool pressure takes the free blocks' worth of tokens over the groups that hold tokens,
and in a Mamba layout the driver marks the scheduler steps (``new_step_starts``). The plans
vLLM 0.10.2 refuses (Mamba "align", mixed block sizes or more than one non-full spec with
caching on) come last and are left out of that profile's corpora (``runs_under``,
``trace_indices``): a trace index is one plan, and one name, under every profile. Recording
them needs ``kv_cache_groups`` and their kinds: ``record_corpus`` refuses an implementation
without them before recording anything, naming the ``--traces`` it can record.

Observed after every step (``observe_state``): ``num_free_blocks()``, the block tables of the
requests holding blocks, and what the implementation declares: the free queue
(``free_queue_order``), the non-zero ref counts (``ref_counts``), each live request's block
hashes (``block_hashes``, for the hash algorithms it reproduces) and the KV events of the step
(``events``). Deterministic: the same implementation version and seed give the same corpus,
byte for byte (``kvcheck.conformance.recorded.encode_corpus``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from kvcheck.conformance.differential import normalize_events
from kvcheck.conformance.driver import Driver, StepResult
from kvcheck.conformance.groups import AdapterBlockIds, adapter_form, shown_tables
from kvcheck.conformance.guard import read_block_hashes, read_ref_cnts
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.ops import (
    Op,
    RequestExtras,
    add,
    cache,
    decode,
    evict,
    free,
    reset,
    schedule,
)
from kvcheck.conformance.protocol import (
    VLLM_PROFILES,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVEvent,
    effective_capabilities,
    extra_key_kinds,
    group_capabilities,
    spec_to_dict,
)
from kvcheck.conformance.workload_machine import OFFERED_HASH_ALGOS, same_extras
from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "BLOCK_SIZES",
    "DEFAULT_SEED",
    "DEFAULT_TRACES",
    "FLAVOURS",
    "HYBRID_PLANS",
    "HYBRID_START",
    "STEPS_PER_TRACE",
    "HybridPlan",
    "RecordedAnswer",
    "RecordedState",
    "RecordedStep",
    "RecordedTrace",
    "TracePlan",
    "default_traces",
    "normalize_answer",
    "observe_state",
    "plan_spec",
    "record_corpus",
    "record_trace",
    "recordable_fields",
    "runs_under",
    "trace_indices",
    "trace_plan",
]

#: Traces of the eight original flavours, then the KV-connector traces after them, then the
#: multi-group traces (each kind appended, so the earlier traces keep the plans they were
#: recorded with).
PLAIN_TRACES = 60
CONNECTOR_TRACES = 8
HYBRID_START = PLAIN_TRACES + CONNECTOR_TRACES
#: The seed of the shipped corpora (``kvcheck record``'s default).
DEFAULT_SEED = 0
#: Ops per trace (a trace ends at the first move that reaches it).
STEPS_PER_TRACE = 180
#: Block sizes the plans cycle through.
BLOCK_SIZES = (4, 2, 8, 1, 16, 4, 8, 2)
#: Trace flavours, cycled by index: each weights the moves differently.
FLAVOURS = ("chat", "pressure", "chunked", "lookahead", "preempt", "extras", "reset",
            "mixed")
#: The flavour of the traces after ``PLAIN_TRACES``: a KV connector's tokens (asynchronous and
#: synchronous loads, loads that fail, ``evict_blocks``), where the implementation declares
#: ``external_kv`` (plain moves otherwise).
#: Move -> weight per flavour (moves without a weight get 1).
_WEIGHTS: dict[str, dict[str, int]] = {
    "chat": {"add": 3, "resubmit": 5, "step": 6, "finish": 3},
    "pressure": {"add": 3, "pressure": 3, "step": 6, "step_all": 3},
    "chunked": {"long_prefill": 4, "step": 6, "step_all": 3, "duplicate": 3},
    "lookahead": {"long_prefill": 3, "step": 6, "step_all": 3},
    "preempt": {"preempt": 4, "step": 6, "finish": 2},
    "extras": {"add": 5, "resubmit": 3, "duplicate": 3, "step": 6},
    "reset": {"reset": 3, "add": 3, "resubmit": 3, "step": 5},
    "mixed": {},
    "connector": {"add": 2, "resubmit": 2, "step": 5, "finish": 2, "external": 6,
                  "load_ends": 4, "evict": 1},
    "cow": {"add": 2, "resubmit": 2, "step": 4, "finish": 3, "fine_share": 6},
}
#: The moves of ``connector`` traces only (other flavours draw from ``_MOVES`` alone, so their
#: traces stay as they were recorded).
_CONNECTOR_MOVES = ("external", "load_ends", "evict")
_MOVES = ("add", "resubmit", "long_prefill", "duplicate", "admit", "step", "step_all",
          "finish", "preempt", "pressure", "reset")
# System prompts shared by requests (the longer ones extend the shorter ones).
_PREFIXES = [list(range(1, 17)), list(range(1, 20)), list(range(1, 9)), list(range(1, 33)),
             list(range(1, 5)), [], [7] * 6]
# Token ids of every pickle / CBOR integer width.
_TOKENS = (0, 1, 2, 3, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 151643)


@dataclass(frozen=True)
class HybridPlan:
    """A multi-group trace's layout and moves. ``label`` names the layout in the trace's name;
    ``block_size`` is the hash block (the smallest group's); ``profiles``: the vLLM profiles
    whose release accepts the layout (the others leave the trace out)."""

    label: str
    flavour: str
    block_size: int
    pool_tokens: int
    enable_caching: bool
    enable_kv_cache_events: bool
    groups: tuple[KVCacheGroupSpec, ...]
    profiles: tuple[str, ...] = ("vllm-0.33", "vllm-0.10")


_F, _S, _C = "full_attention", "sliding_window", "chunked_local_attention"
_033 = ("vllm-0.33",)


def _g(kind: str, size: int, *, sliding_window: int | None = None,
       attention_chunk_size: int | None = None, mamba_cache_mode: str | None = None,
       num_speculative_blocks: int = 0) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(kind, size, sliding_window, attention_chunk_size, mamba_cache_mode,
                            num_speculative_blocks)


#: The multi-group traces, trace ``HYBRID_START + i`` being plan ``i``. Both releases first;
#: the layouts only vLLM 0.33 accepts last, so that vLLM 0.10.2's corpus holds a prefix of
#: the plans. Events are off where 0.10.2 crashes on them (a chunked-local group, a window
#: ``w - 1 < block_size``) under both profiles, so names stay those of the plans; caching is
#: off for cross attention (vLLM runs encoder-decoder models so) and Mamba mode "none".
HYBRID_PLANS: tuple[HybridPlan, ...] = (
    HybridPlan("swa", "chat", 4, 48, True, True, (_g(_F, 4), _g(_S, 4, sliding_window=8))),
    HybridPlan("swa", "pressure", 2, 32, True, True,
               (_g(_S, 2, sliding_window=5), _g(_F, 2))),
    HybridPlan("chunked", "chunked", 4, 48, True, False,
               (_g(_F, 4), _g(_C, 4, attention_chunk_size=8))),
    HybridPlan("swa4", "lookahead", 2, 32, True, True,
               (_g(_F, 2), _g(_F, 2), _g(_S, 2, sliding_window=4),
                _g(_S, 2, sliding_window=4))),
    HybridPlan("mamba", "lookahead", 4, 48, False, True,
               (_g(_F, 4), _g("mamba", 4, mamba_cache_mode="none", num_speculative_blocks=1))),
    HybridPlan("mamba", "preempt", 2, 32, False, True,
               (_g(_F, 2), _g(_S, 2, sliding_window=4), _g("mamba", 2, mamba_cache_mode="none"))),
    HybridPlan("cross", "pressure", 2, 32, False, True,
               (_g(_F, 2), _g("cross_attention", 2))),
    # vLLM 0.33 only: Mamba "align" (at the hash block: a larger one turns on 0.33's
    # fine-grained partial hits), partial-block keys, three kinds for the hit fixed point.
    HybridPlan("mamba-align", "chat", 4, 48, True, True,
               (_g(_F, 4), _g("mamba", 4, mamba_cache_mode="align")), _033),
    HybridPlan("mamba-align", "lookahead", 2, 32, True, True,
               (_g(_F, 2), _g(_S, 2, sliding_window=5),
                _g("mamba", 2, mamba_cache_mode="align", num_speculative_blocks=1)), _033),
    HybridPlan("partial", "chat", 2, 48, True, True,
               (_g(_F, 8), _g(_S, 2, sliding_window=4)), _033),
    HybridPlan("fixedpoint", "chunked", 2, 32, True, True,
               (_g(_F, 2), _g(_C, 2, attention_chunk_size=4), _g(_S, 2, sliding_window=3)),
               _033),
    # vLLM 0.33's fine-grained partial hits: a Mamba "align" block larger than the hash block
    # (hits inside blocks, copied on write; the driver drains the copies).
    HybridPlan("fine", "cow", 4, 96, True, True,
               (_g(_F, 4), _g("mamba", 8, mamba_cache_mode="align")), _033),
)
#: Trace indices planned (``kvcheck record``'s default under vLLM 0.33: every plan; under
#: 0.10 the plans its release runs, ``default_traces``).
DEFAULT_TRACES = HYBRID_START + len(HYBRID_PLANS)


@dataclass(frozen=True)
class TracePlan:
    """What trace ``index`` is, from its index alone. ``name`` is its test id (the same under
    every profile: the hash algorithm, which depends on what the profile offers, is not in
    it). ``groups``: the KV-cache groups of a multi-group trace (``HYBRID_PLANS``; ``()``:
    one group, the single-group protocol)."""

    index: int
    name: str
    flavour: str
    block_size: int
    pool_tokens: int
    hash_algo: str
    enable_caching: bool
    enable_kv_cache_events: bool
    max_model_len: int | None
    groups: tuple[KVCacheGroupSpec, ...] = ()


def _hybrid(index: int) -> HybridPlan | None:
    """The multi-group plan of trace ``index`` (None: a single-group trace)."""
    if HYBRID_START <= index < DEFAULT_TRACES:
        return HYBRID_PLANS[index - HYBRID_START]
    return None


def runs_under(index: int, profile: str) -> bool:
    """Whether ``profile``'s vLLM release runs trace ``index``'s layout (every single-group
    trace; a multi-group one when its plan lists the profile). Under another profile
    (``generic``) every trace runs."""
    hybrid = _hybrid(index)
    return hybrid is None or profile not in VLLM_PROFILES or profile in hybrid.profiles


def trace_indices(profile: str, traces: int) -> list[int]:
    """The indices of a corpus of ``traces`` traces under ``profile``: the first ``traces``
    trace indices it runs (``runs_under``); a corpus of vLLM 0.10.2 leaves the 0.33-only
    layouts out."""
    out: list[int] = []
    index = 0
    while len(out) < traces:
        if runs_under(index, profile):
            out.append(index)
        index += 1
    return out


def default_traces(profile: str) -> int:
    """``kvcheck record``'s default trace count under ``profile``: every planned trace its
    release runs (``DEFAULT_TRACES`` under vLLM 0.33)."""
    return sum(runs_under(i, profile) for i in range(DEFAULT_TRACES))


def trace_plan(index: int, profile: str) -> TracePlan:
    """The plan of trace ``index`` under ``profile`` (hash algorithms: those the profile's
    vLLM offers, cycled). Indices past the multi-group traces are single-group connector
    traces again.

    Raises:
        KVCheckInputError: a negative index, or a multi-group layout ``profile``'s vLLM
            release does not accept (``runs_under``).
    """
    if index < 0:
        raise KVCheckInputError(f"trace index {index}: must be >= 0")
    algos = OFFERED_HASH_ALGOS.get(profile, OFFERED_HASH_ALGOS["vllm-0.33"])
    hybrid = _hybrid(index)
    if hybrid is not None:
        if not runs_under(index, profile):
            raise KVCheckInputError(
                f"trace {index} ({hybrid.label}): a layout only {list(hybrid.profiles)} "
                f"accept; a {profile} corpus leaves it out (trace_indices)")
        name = (f"t{index:02d}-{hybrid.label}-{hybrid.flavour}-bs{hybrid.block_size}"
                + ("" if hybrid.enable_caching else "-nocache")
                + ("-events" if hybrid.enable_kv_cache_events else ""))
        return TracePlan(index, name, hybrid.flavour, hybrid.block_size, hybrid.pool_tokens,
                         algos[index % len(algos)], hybrid.enable_caching,
                         hybrid.enable_kv_cache_events, None, hybrid.groups)
    flavour = FLAVOURS[index % len(FLAVOURS)] if index < PLAIN_TRACES else "connector"
    block_size = BLOCK_SIZES[(index // len(FLAVOURS) + index) % len(BLOCK_SIZES)]
    caching = index % 7 != 5
    events = index % 5 != 4
    max_model_len = 40 if index % 6 == 3 else None
    pool_tokens = (32, 48, 64, 96, 128)[index % 5]
    name = (f"t{index:02d}-{flavour}-bs{block_size}"
            + ("" if caching else "-nocache") + ("-events" if events else "")
            + ("" if max_model_len is None else f"-mml{max_model_len}"))
    return TracePlan(index, name, flavour, block_size, pool_tokens, algos[index % len(algos)],
                     caching, events, max_model_len)


def plan_spec(plan: TracePlan, profile: str) -> KVCacheSpec:
    """The spec trace ``plan`` runs on: ``pool_tokens`` worth of blocks (at least 3) plus
    vLLM's null block; with several groups, that per group (each token needs a slot in every
    group), no retention interval."""
    sizes = [g.block_size or plan.block_size for g in plan.groups] or [plan.block_size]
    return KVCacheSpec(
        num_blocks=1 + sum(max(3, plan.pool_tokens // size) for size in sizes),
        block_size=plan.block_size, enable_caching=plan.enable_caching,
        hash_algo=plan.hash_algo, enable_kv_cache_events=plan.enable_kv_cache_events,
        max_model_len=plan.max_model_len, profile=profile, kv_cache_groups=plan.groups)


class RecordedAnswer(TypedDict, total=False):
    """An op's answer as a corpus stores it (``normalize_answer``): ``hits`` is
    ``[block ids, num_computed_tokens]``, block ids in the adapter's form."""

    hits: list[AdapterBlockIds | int]
    new: AdapterBlockIds | None
    reset: bool


class RecordedState(TypedDict, total=False):
    """The observable state after an op (``observe_state``; in a corpus, only what changed)."""

    free: int
    tables: dict[str, AdapterBlockIds]
    queue: list[int]
    refs: list[list[int]]
    hashes: dict[str, list[bytes]]
    events: list[KVEvent]


class RecordedStep(TypedDict):
    """One step of a trace: the op, its answer and the state after it."""

    op: Op
    answer: RecordedAnswer
    state: RecordedState


class RecordedTrace(TypedDict):
    """One recorded trace (``record_trace``)."""

    name: str
    spec: dict[str, object]
    fields: list[str]
    steps: list[RecordedStep]


def normalize_answer(spec: KVCacheSpec, answer: StepResult) -> RecordedAnswer:
    """An op's answer as plain lists in the adapter's form (``adapter_form``: one list for a
    single-group spec), what the corpus stores and replays compare."""
    out: RecordedAnswer = {}
    if "hits" in answer:
        ids, num = answer["hits"]
        out["hits"] = [adapter_form(spec, [list(g) for g in ids]), int(num)]
    if "new" in answer:
        new = answer["new"]
        out["new"] = None if new is None else adapter_form(spec, [list(g) for g in new])
    if "reset" in answer:
        out["reset"] = bool(answer["reset"])
    return out


def observe_state(driver: Driver, fields: frozenset[str]) -> RecordedState:
    """The observable state named by ``fields`` (``STATE_FIELDS`` of
    ``kvcheck.conformance.recorded``): ``free`` (num_free_blocks), ``tables`` (block tables of
    the requests holding blocks), ``queue`` (the free queue, head first), ``refs`` ([block,
    ref_cnt] of every block with a non-zero count, reserved ones left out), ``hashes`` (block
    hashes of each request holding blocks) and ``events`` (the KV events of the step, drained)."""
    mgr = driver.manager
    state: RecordedState = {"free": mgr.num_free_blocks(),
                             "tables": shown_tables(driver.spec, driver.tables())}
    if "queue" in fields:
        state["queue"] = list(mgr.free_block_ids())
    if "refs" in fields:
        # Blocks in the free queue are unreferenced (a law the invariants area checks): only
        # the others are asked, which halves the cost of a replay.
        queued = set(state.get("queue", ()))
        ids = [b for b in driver.ordinary_block_ids if b not in queued]
        state["refs"] = [[b, n] for b, n in zip(ids, read_ref_cnts(mgr, ids), strict=True)
                         if n]
    if "hashes" in fields:
        rids = sorted(driver.running)
        state["hashes"] = {rid: [bytes(h) for h in hashes]
                           for rid, hashes in zip(rids, read_block_hashes(mgr, rids),
                                                  strict=True)}
    if "events" in fields:
        state["events"] = (normalize_events(mgr.take_events())
                           if driver.spec.enable_kv_cache_events else [])
    return state


def recordable_fields(impl: ImplHandle, spec: KVCacheSpec) -> frozenset[str]:
    """The state fields ``impl`` shows for ``spec`` (by its declared capabilities)."""
    caps = impl.info.capabilities
    fields = {"free", "tables"}
    if "free_queue_order" in caps:
        fields.add("queue")
    if "ref_counts" in caps:
        fields.add("refs")
    if "block_hashes" in caps and spec.hash_algo in impl.info.hash_algos:
        fields.add("hashes")
    if "events" in caps and spec.enable_kv_cache_events:
        fields.add("events")
    return frozenset(fields)


class _Workload:
    """A scheduler over one ``Driver``: the moves of the module docstring, each a few ops;
    every op's answer and state are appended to ``steps``."""

    def __init__(self, driver: Driver, plan: TracePlan, rng: random.Random,
                 extras: frozenset[str], fields: frozenset[str]) -> None:
        self.d = driver
        self.plan = plan
        self.rng = rng
        self.extras = extras  # the extra-key kinds requests may carry (EXTRA_KEY_KINDS)
        self.fields = fields
        self.pending: list[str] = []
        self.running: list[str] = []
        self.prompts: list[list[int]] = []
        self.next_id = 0
        self.steps: list[RecordedStep] = []
        weights = _WEIGHTS[plan.flavour]
        self.moves = list(_MOVES)
        caps = driver.capabilities
        if plan.flavour == "connector" and "external_kv" in caps:
            # vLLM 0.10.2's KVCacheManager has no evict_blocks: not drawn under its profile,
            # whatever the implementation declares (the reference refuses the call there).
            evicts = "evict_blocks" in caps and driver.spec.profile != "vllm-0.10"
            self.moves += [m for m in _CONNECTOR_MOVES if m != "evict" or evicts]
        if plan.flavour == "cow":  # fine-grained partial hits: a move of these traces only
            self.moves.append("fine_share")
        self.weights = [weights.get(m, 1) for m in self.moves]
        self.loading: list[str] = []  # admitted with an asynchronous load not yet ended
        self.multi = "multi_token_decode" in driver.capabilities
        # Groups that hold the request's tokens (all but cross attention's encoder blocks):
        # pool pressure spreads the free blocks over them. 0: a single-group trace.
        self.token_groups = sum(g.kind != "cross_attention" for g in plan.groups)
        self.encoder = any(g.kind == "cross_attention" for g in plan.groups)
        self.lookahead = "lookahead" in driver.capabilities and plan.flavour in (
            "lookahead", "mixed", "chunked")

    # ------------------------------------------------------------ recording
    def apply(self, op: Op) -> StepResult:
        answer = self.d.apply(op)
        self.steps.append({"op": op.copy(), "answer": normalize_answer(self.d.spec, answer),
                           "state": observe_state(self.d, self.fields)})
        return answer

    def run(self, max_steps: int) -> None:
        while len(self.steps) < max_steps:
            move = self.rng.choices(self.moves, self.weights)[0]
            # `_add` and `_admit` are helpers; those moves are `_add_` and `_admit_`.
            getattr(self, f"_{move}_" if move in ("add", "admit") else f"_{move}")()

    # ------------------------------------------------------------ helpers
    def _la(self) -> int:
        return self.rng.choice((0, 0, 1, 2, 4)) if self.lookahead else 0

    def _chunk(self) -> int | None:
        return self.rng.choice((None, None, 1, 2, 3, 5, 8))

    def _tail(self, low: int, high: int) -> list[int]:
        return [self.rng.choice(_TOKENS) for _ in range(self.rng.randint(low, high))]

    def _add(self, prompt: list[int], remember: bool = True,
             **kwargs: Unpack[RequestExtras]) -> str | None:
        mml = self.plan.max_model_len
        if not prompt or (mml is not None and len(prompt) >= mml):
            return None
        if remember:
            self.prompts.append(prompt)
        rid = f"r{self.next_id}"
        self.next_id += 1
        if self.encoder:  # an encoder-decoder request: its encoder tokens (audio frames)
            kwargs["encoder"] = self.rng.randint(1, 12)
        self.apply(add(rid, prompt, **kwargs))
        self.pending.append(rid)
        return rid

    def _extra(self, prompt: list[int]) -> RequestExtras:
        if not self.extras:
            return {}
        kinds = ["", *(op for cap, op in (("cache_salt", "salt"), ("multimodal", "mm"))
                       if cap in self.extras)]
        if "lora" in self.extras and not self.plan.enable_kv_cache_events:
            kinds.append("lora")
        kind = self.rng.choice(kinds)
        if kind == "salt":
            return {"salt": self.rng.choice(("tenant-a", "tenant-b"))}
        if kind == "lora":
            return {"lora": ("adapter", 1, "/lora/adapter")}
        if kind == "mm" and len(prompt) >= 3:
            return {"mm": [("img0", 1, min(4, len(prompt) - 1))]}
        return {}

    def _admit(self, rid: str, chunk: int | None) -> None:
        got = self.apply(schedule(rid, chunk))
        if got.get("new") is not None:
            self.pending.remove(rid)
            self.running.append(rid)

    def _in_prefill(self, rid: str) -> bool:
        view = self.d.views[rid]
        return view.num_computed_tokens < view.num_tokens

    def _step_one(self, rid: str, num_tokens: int, lookahead: int) -> None:
        prefill = self._in_prefill(rid)
        if not self.multi and not prefill:
            num_tokens = 1
        mml = self.plan.max_model_len
        if not prefill and mml is not None:
            room = mml - self.d.views[rid].num_tokens
            if room <= 0:
                self._free(rid)
                return
            num_tokens = min(num_tokens, room)
        op: Op = (schedule(rid, num_tokens, lookahead) if prefill
                  else decode(rid, num_tokens, lookahead))
        while self.apply(op).get("new") is None:
            victim = self.running[-1]
            self._free(victim)
            if victim == rid:
                return
            op = schedule(rid, num_tokens, lookahead)

    def _free(self, rid: str) -> None:
        view = self.d.views[rid]
        self.apply(free(rid))
        if rid in self.running:
            self.running.remove(rid)
            self.pending.append(rid)
            if view.output_token_ids:
                self.prompts.append(list(view.token_ids))
        elif rid in self.pending:
            self.pending.remove(rid)

    # ------------------------------------------------------------ moves
    def _add_move(self, prompt: list[int]) -> None:
        rid = self._add(prompt, **self._extra(prompt))
        if rid is not None and self.rng.random() < 0.7:
            self._admit(rid, self._chunk())

    def _add_(self) -> None:
        self._add_move(self.rng.choice(_PREFIXES) + self._tail(0, 10))

    def _resubmit(self) -> None:
        if not self.prompts:
            return self._add_()
        self._add_move(self.rng.choice(self.prompts) + self._tail(0, 6))
        return None

    def _long_prefill(self) -> None:
        rid = self._add(self.rng.choice(_PREFIXES) + self._tail(8, 24))
        if rid is None:
            return
        chunk = self.rng.randint(1, 8)
        lookahead = self._la()
        self._admit(rid, chunk)
        while rid in self.running and self._in_prefill(rid):  # each step advances or frees
            self._step_one(rid, chunk, lookahead)

    def _duplicate(self) -> None:
        if not self.running:
            return self._add_()
        rids = [r for r in self.running if self._in_prefill(r)] or self.running
        view = self.d.views[self.rng.choice(rids)]
        rid = self._add(list(view.prompt_token_ids), remember=False, **same_extras(view))
        if rid is not None:
            self._admit(rid, self._chunk())
        return None

    def _fine_share(self) -> None:
        """vLLM 0.33's fine-grained partial hits (``kvcheck.conformance.fine_grained``): a
        prompt prefilled to its last hash boundary (the state there is cached, inside a Mamba
        block), then to its end and two decode steps, then a request sharing the prompt up to
        that boundary or a few tokens past it: its hit ends inside a block, copied on write."""
        hashed = self.plan.block_size  # a multi-group plan's block_size is the hash block
        prompt = self.rng.choice(_PREFIXES) + self._tail(1, 10)
        boundary = (len(prompt) - 1) // hashed * hashed
        rid = self._add(prompt) if boundary else None
        if rid is None:
            return
        self._admit(rid, boundary)
        for num_tokens in (len(prompt) - boundary, 1, 1):
            if rid not in self.running:
                return
            self._step_one(rid, num_tokens, 0)
        other = self._add(prompt[:boundary + self.rng.randrange(hashed)] + self._tail(1, 6))
        if other is not None:
            self._admit(other, None)

    def _admit_(self) -> None:
        if self.pending:
            self._admit(self.rng.choice(self.pending), self._chunk())

    def _step(self) -> None:
        if self.running:
            self._step_one(self.rng.choice(self.running), self.rng.randint(1, 6), self._la())
        else:
            self._admit_()

    def _step_all(self) -> None:
        lookahead = self._la()
        for rid in list(self.running):
            if rid in self.running:
                self._step_one(rid, self.rng.randint(1, 6), lookahead)

    def _finish(self) -> None:
        live = self.running + self.pending
        if live:
            self._free(self.rng.choice(live))

    def _preempt(self) -> None:
        with_output = [r for r in self.running if self.d.views[r].output_token_ids]
        if not with_output:
            return self._step()
        rid = self.rng.choice(with_output)
        self._free(rid)
        self._admit(rid, self._chunk())
        return None

    def _pressure(self) -> None:
        size = self.d.manager.num_free_blocks() - self.rng.randint(0, 2)
        if size <= 0:
            return self._finish()
        base = 100_000 + 1_000 * self.next_id
        tokens = size * self.plan.block_size
        if self.token_groups:  # every group holding tokens takes its share of the pool
            tokens //= self.token_groups
        if self.plan.max_model_len is not None:
            tokens = min(tokens, self.plan.max_model_len - 1)
        rid = self._add([base + i for i in range(tokens)], remember=False)
        if rid is None:
            return None
        self._admit(rid, None)
        if rid in self.running:
            self._free(rid)
        return None

    def _external(self) -> None:
        """A request whose prefix a KV connector holds after the local hit: the external
        tokens loaded synchronously, or asynchronously (then the request waits for
        ``_load_ends``)."""
        base = self.rng.choice(self.prompts) if self.prompts and self.rng.random() < 0.5 \
            else self.rng.choice(_PREFIXES)
        rid = self._add(base + self._tail(1, 12))
        if rid is None:
            return
        external = self.rng.randint(1, len(self.d.views[rid].prompt_token_ids))
        delay = self.rng.random() < 0.5
        got = self.apply(schedule(rid, self._chunk(), external=external, delay=delay))
        if got.get("new") is not None:
            self.pending.remove(rid)
            (self.loading if rid in self.d.loading else self.running).append(rid)

    def _load_ends(self) -> None:
        """A pending asynchronous load arrives (all of it), or fails after a whole number of
        blocks (none valid: vLLM's scheduler frees the request)."""
        if not self.loading:
            return self._external()
        rid = self.rng.choice(self.loading)
        self.loading.remove(rid)
        computed = self.d.views[rid].num_computed_tokens
        valid = computed if self.rng.random() < 0.6 else (
            self.rng.randint(0, computed // self.plan.block_size) * self.plan.block_size)
        self.apply(cache(rid, valid))
        if rid in self.d.running:
            self.running.append(rid)
        else:
            self.pending.append(rid)
        return None

    def _evict(self) -> None:
        """``evict_blocks`` of a few block ids, as the scheduler does for failed loads."""
        ids = self.d.ordinary_block_ids
        self.apply(evict(sorted(set(self.rng.sample(ids, min(len(ids),
                                                               self.rng.randint(1, 3)))))))

    def _reset(self) -> None:
        if self.rng.random() < 0.5:
            for rid in list(self.running):
                self._free(rid)
        self.apply(reset())



def record_trace(impl: ImplHandle, profile: str, index: int, seed: int,
                 steps: int = STEPS_PER_TRACE) -> RecordedTrace:
    """Run trace ``index`` on ``impl`` under ``profile``: ``{"name", "spec" (spec_to_dict),
    "fields" (the state fields recorded), "steps": [{"op", "answer", "state"}, ...]}``."""
    plan = trace_plan(index, profile)
    spec = plan_spec(plan, profile)
    driver = Driver(impl, spec)
    fields = recordable_fields(impl, spec)
    extras = (extra_key_kinds(effective_capabilities(impl.info, profile))
              if plan.flavour in ("extras", "mixed") and not plan.groups else frozenset())
    workload = _Workload(driver, plan, random.Random(seed * 1_000_003 + index), extras, fields)
    workload.run(steps)
    return {"name": plan.name, "spec": spec_to_dict(spec), "fields": sorted(fields),
            "steps": workload.steps}


def record_corpus(impl: ImplHandle, profile: str, traces: int | None = None,
                  seed: int = DEFAULT_SEED, steps: int = STEPS_PER_TRACE
                  ) -> list[RecordedTrace]:
    """``traces`` traces of ``impl`` under ``profile`` (None: ``default_traces(profile)``),
    those of ``trace_indices`` (see ``record_trace``)."""
    if traces is None:
        traces = default_traces(profile)
    if traces < 1:
        raise KVCheckInputError(f"--traces {traces}: record at least one trace")
    indices = trace_indices(profile, traces)
    caps = effective_capabilities(impl.info, profile)
    for n, index in enumerate(indices):  # before anything is recorded
        plan = trace_plan(index, profile)
        missing = group_capabilities(plan_spec(plan, profile)) - caps
        if missing:
            raise KVCheckInputError(
                f"trace {index} ({plan.name}) has several KV-cache groups and needs "
                f"{sorted(missing)}, which {impl.name} does not declare; record the traces "
                f"before it with --traces {n}")
    return [record_trace(impl, profile, i, seed, steps) for i in indices]
