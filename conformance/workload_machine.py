"""The random-workload state machine shared by the differential and invariant tests.

Hypothesis generates scheduler-like workloads (requests with shared prefixes, chunked prefill,
decode, frees, resets, pool pressure) as ``kvcheck.conformance.ops`` dicts and feeds them to a
``Pair``; every op is checked there (laws, and the oracle when there is one). Hypothesis
shrinks a failure to a short op list, whose trace the ``Pair`` writes for ``kvcheck replay``.

The machine counts the workload features it reaches (``FEATURES``: lookahead during chunked
prefill and decode, successful and refused resets, each hash algorithm, caching off, prompt
logprobs, extra keys, preempt-and-resume, hits on evicted-and-reused blocks, touches at both
ends of the free queue, a full pool); ``scripts/coverage_report.py`` prints them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from hypothesis import assume
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvcheck.conformance.ops import RequestExtras, add, decode, free, reset, schedule
from kvcheck.conformance.protocol import (
    DESIGN_CAPABILITIES,
    HASH_ALGOS,
    ImplInfo,
    KVCacheSpec,
    UnsupportedSpec,
    effective_capabilities,
    reserved_block_ids,
)

if TYPE_CHECKING:
    from kvcheck.conformance.differential import Pair
    from kvcheck.conformance.driver import Driver, StepResult
    from kvcheck.conformance.loader import ImplHandle

__all__ = ["FEATURES", "OFFERED_HASH_ALGOS", "REACHED", "run_workload_machine",
           "supported_block_sizes", "workload_hash_algos"]

# Block sizes random workloads draw from (the first is what Hypothesis shrinks towards).
_BLOCK_SIZES = (4, 2, 8, 1)

# System prompts of different lengths so random requests share (and partially share) prefixes;
# the longer ones are extensions of the shorter ones, as in multi-turn chat. Hypothesis favours
# the first entry of sampled_from, so the most reusable prompt comes first.
# 16 tokens first: block-aligned for every block size drawn, which exercises the hit cap.
_PREFIXES = [list(range(1, 17)), list(range(1, 20)), list(range(1, 9)), list(range(1, 33)),
             list(range(1, 5)), [], [7] * 6]
# Token ids of every pickle/CBOR integer width (docs/semantics.md#serialization-bytes).
_TOKENS = st.sampled_from([0, 1, 2, 3, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 151643])
# A prefill chunk: the rest of the prompt (None) or up to n tokens (chunked prefill).
_CHUNKS = st.one_of(st.none(), st.integers(1, 12))

#: Hash algorithms each profile's vLLM offers (docs/semantics.md#hash-algorithms: 0.10.2 has
#: only the sha256 pair); random workloads never ask an oracle for one its vLLM lacks.
OFFERED_HASH_ALGOS: dict[str, tuple[str, ...]] = {
    "vllm-0.33": HASH_ALGOS,
    "vllm-0.10": ("sha256", "sha256_cbor"),
}

#: The workload features the machine counts, each reached by the suite's derandomized runs
#: (``tests/conformance/test_workload_coverage.py``; a hash algorithm only where the profile
#: offers it and the implementation declares it).
FEATURES: tuple[str, ...] = (
    "lookahead_chunked_prefill",  # speculative slots past a prompt not yet computed
    "lookahead_decode",
    "reset_succeeded",
    "reset_refused",  # reset_prefix_cache while requests hold blocks
    *(f"hash_algo:{algo}" for algo in HASH_ALGOS),
    "caching_off",
    "skip_read",  # a prompt-logprobs request (skip_reading_prefix_cache) admitted
    "extra_keys:salt",
    "extra_keys:lora",
    "extra_keys:mm",
    "preempt_resume",  # a freed request re-admitted with its prompt plus generated tokens
    "hit_on_evicted_and_reused_block",  # a hit on a block handed out as new twice or more
    "touch_free_queue_head",  # a hit taken from the head of the free queue
    "touch_free_queue_tail",
    "full_pool",  # num_free_blocks() == 0 after an allocation
    "allocation_refused",  # allocate_slots returned None
)

#: Features reached by every run in this process (``run_workload_machine`` adds to it).
REACHED: Counter[str] = Counter()


def supported_block_sizes(info: ImplInfo) -> list[int]:
    """The block sizes random workloads use for ``info``: the usual small ones it supports,
    else its smallest declared ones (workload prompts are tens of tokens). Every size is
    drawn about equally often."""
    if info.block_sizes is None:
        return list(_BLOCK_SIZES)
    usual = [b for b in _BLOCK_SIZES if b in info.block_sizes]
    return usual or sorted(b for b in set(info.block_sizes) if b >= 1)[:3]


def workload_hash_algos(info: ImplInfo | None, profile: str | None) -> tuple[str, ...]:
    """The hash algorithms random workloads draw for ``info`` under ``profile``: those it
    reproduces (``ImplInfo.hash_algos``) that the profile's vLLM offers, sha256 first (what
    Hypothesis shrinks towards). An implementation with its own scheme (``hash_algos == ()``)
    ignores the field: sha256 only. Without ``info``: every algorithm the profile offers."""
    offered = OFFERED_HASH_ALGOS.get(profile or "", HASH_ALGOS)
    if info is None:
        return offered
    if not info.hash_algos:
        return ("sha256",)
    own = tuple(a for a in offered if a in info.hash_algos)
    return own or (info.hash_algos[0],)


def run_workload_machine(make_pair: Callable[..., Pair], settings: Settings, seed: int | None,
                         *, extras: bool, events: bool, step_count: int = 30,
                         impl: ImplHandle | None = None, profile: str | None = None,
                         stats: Counter[str] | None = None) -> None:
    """Run the machine under ``settings``; ``make_pair(**spec_fields)`` builds each example's
    ``Pair``. ``extras`` adds salts / LoRA / multimodal items; ``events`` may enable KV events.

    With ``impl`` (and the active ``profile``) the workloads stay within what the design
    declares: block and pool sizes ``ImplInfo.supports`` (a spec the factory still declines
    with ``UnsupportedSpec`` is rejected and another drawn), the hash algorithms of
    ``workload_hash_algos``, and only the design features of ``effective_capabilities``:
    resets (``reset_prefix_cache``), caching off (``caching_off``), prompt-logprobs requests
    (``skip_reading_prefix_cache``), speculative slots (``lookahead``) and decode steps of
    several tokens (``multi_token_decode``). Without ``impl``: everything.

    The workload features reached (``FEATURES``) are counted into ``stats`` when given, and
    into the process-wide ``REACHED`` in any case, also when the run fails.
    """
    if impl is None:
        caps: frozenset[str] = DESIGN_CAPABILITIES
        block_sizes = list(_BLOCK_SIZES)
        num_reserved = 1
    else:
        active = profile or impl.info.profile
        caps = effective_capabilities(impl.info, active)
        block_sizes = supported_block_sizes(impl.info)
        num_reserved = len(reserved_block_ids(impl.info, active))
    info = None if impl is None else impl.info
    hash_algos = workload_hash_algos(info, profile or (None if info is None else info.profile))
    multi_token = "multi_token_decode" in caps
    caching_draw = (st.sampled_from([True, True, True, False]) if "caching_off" in caps
                    else st.just(True))
    skip_read_draw = st.booleans() if "skip_reading_prefix_cache" in caps else st.just(False)
    # Speculative slots as an EAGLE/MTP scheduler reserves them (0 first: Hypothesis shrinks
    # towards it); 4 can span a whole block of the sizes drawn.
    lookahead_draw = (st.sampled_from([0, 1, 2, 4]) if "lookahead" in caps else st.just(0))
    reached: Counter[str] = Counter()

    class KVWorkload(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pair: Pair  # set by setup (the @initialize rule), which runs before any other
            self.pending: list[str] = []   # added, not holding blocks
            self.running: list[str] = []   # holding blocks
            self.prompts: list[list[int]] = []  # every prompt seen, for resubmission
            self.next_id = 0
            self.last_freed: list[int] | None = None  # tokens of the request freed last
            # block id -> how often allocate_slots handed it out as new (2+: it left the free
            # queue, was evicted and reused)
            self.handed_out: Counter[int] = Counter()

        # Pools sized to the workload (a few requests fit, pressure still happens) and caching
        # mostly on: otherwise most allocations fail and prefix hits never occur.
        @initialize(block_size=st.sampled_from(block_sizes), pool_tokens=st.integers(24, 96),
                    caching=caching_draw, with_events=st.booleans(),
                    hash_algo=st.sampled_from(hash_algos))
        def setup(self, block_size: int, pool_tokens: int, caching: bool,
                  with_events: bool, hash_algo: str) -> None:
            num_blocks = num_reserved + max(2, pool_tokens // block_size)
            if info is not None and info.num_blocks_range is not None:
                low, high = info.num_blocks_range
                num_blocks = min(max(num_blocks, low), high)
            spec = KVCacheSpec(num_blocks=num_blocks, block_size=block_size, hash_algo=hash_algo)
            assume(info is None or info.supports(spec))
            try:
                self.pair = make_pair(num_blocks=num_blocks, block_size=block_size,
                                      hash_algo=hash_algo, enable_caching=caching,
                                      enable_kv_cache_events=events and with_events)
            except UnsupportedSpec:
                assume(False)  # the factory declined it: draw another spec
            reached[f"hash_algo:{hash_algo}"] += 1
            reached["caching_off" if not caching else "caching_on"] += 1

        @rule(prefix=st.sampled_from(_PREFIXES), tail=st.lists(_TOKENS, max_size=10),
              skip_read=skip_read_draw, extra=st.sampled_from(["", "salt", "lora", "mm"]),
              admit_now=st.booleans(), chunk=_CHUNKS)
        def add_request(self, prefix: list[int], tail: list[int], skip_read: bool,
                        extra: str, admit_now: bool, chunk: int | None) -> None:
            """A new request; with ``admit_now`` the scheduler admits it in the same step, as
            vLLM does whenever the pool has room (free-queue order is observed right away)."""
            rid = self._add(prefix + tail, skip_read, extra)
            if rid is not None and admit_now:
                self._admit(rid, chunk)

        @precondition(lambda self: bool(self.prompts))
        @rule(data=st.data(), tail=st.lists(_TOKENS, max_size=6), admit_now=st.booleans())
        def resubmit(self, data: st.DataObject, tail: list[int], admit_now: bool) -> None:
            """A new request repeating an earlier prompt (plus a new tail), or an earlier
            request's prompt and output (the next turn of a chat): the prefix-hit path, often
            on blocks that were freed and sit in the free queue, or were evicted and reused."""
            prompt = data.draw(st.sampled_from(self.prompts), label="earlier prompt")
            rid = self._add(prompt + tail, False, "")
            if rid is not None and admit_now:
                self._admit(rid, None)

        @precondition(lambda self: self.last_freed is not None)
        @rule(keep=st.sampled_from([1, 2, 3, 0]))
        def fill_pool(self, keep: int) -> None:
            """A long request of tokens nobody shares takes all free blocks but ``keep`` (0: a
            full pool), evicting the oldest free blocks; the request freed last comes back.
            Its cached blocks were freed to the tail, so the ones left sit at the head of the
            free queue too, and its hits touch the head and the tail of the queue."""
            free_blocks = self._observer().manager.num_free_blocks()
            size = (free_blocks - keep) * self.pair.spec.block_size
            if size > 0:
                rid = self._add([100_000 + self.next_id] * size, False, "", remember=False)
                if rid is not None:
                    self._admit(rid, None)
            rid = self._add(list(self.last_freed or ()), False, "")
            if rid is not None:
                self._admit(rid, None)

        def _add(self, prompt: list[int], skip_read: bool, extra: str,
                 remember: bool = True) -> str | None:
            if not prompt:
                return None
            if remember:
                self.prompts.append(prompt)
            rid = f"r{self.next_id}"
            self.next_id += 1
            kwargs: RequestExtras = {"skip_read": skip_read} if skip_read else {}
            if extras and extra == "salt":
                kwargs["salt"] = "tenant-a"
            elif extras and extra == "lora":
                kwargs["lora"] = ("adapter", 1, "/lora/adapter")
            elif extras and extra == "mm" and len(prompt) >= 3:
                kwargs["mm"] = [("img0", 1, min(4, len(prompt) - 1))]
            self.pair.apply(add(rid, prompt, **kwargs))
            self.pending.append(rid)
            return rid

        @precondition(lambda self: bool(self.pending))
        @rule(data=st.data(), chunk=_CHUNKS)
        def admit(self, data: st.DataObject, chunk: int | None) -> None:
            rid = data.draw(st.sampled_from(self.pending), label="pending request")
            self._admit(rid, chunk)

        def _admit(self, rid: str, chunk: int | None) -> None:
            """Schedule a pending request: prefix lookup, then its first chunk (or all)."""
            view = self.pair.impl.views[rid]
            queue = self._free_queue()
            got = self.pair.apply(schedule(rid, chunk))
            if not self._allocated(got):
                return
            self.pending.remove(rid)
            self.running.append(rid)
            hits = got["hits"][0] if "hits" in got else []
            reached["preempt_resume" if view.output_token_ids else "admitted"] += 1
            if view.skip_reading_prefix_cache:
                reached["skip_read"] += 1
            for key, value in (("salt", view.cache_salt), ("lora", view.lora),
                               ("mm", view.mm_features)):
                if value:
                    reached[f"extra_keys:{key}"] += 1
            if hits:
                reached["prefix_hit"] += 1
            if any(self.handed_out[b] >= 2 for b in hits):
                reached["hit_on_evicted_and_reused_block"] += 1
            if queue:
                touched = [queue.index(b) for b in hits if b in queue]
                if 0 in touched:
                    reached["touch_free_queue_head"] += 1
                if len(queue) - 1 in touched:
                    reached["touch_free_queue_tail"] += 1
                if any(0 < i < len(queue) - 1 for i in touched):
                    reached["touch_free_queue_middle"] += 1

        def _allocated(self, got: StepResult) -> bool:
            """Count what an allocate_slots answer shows; whether it allocated."""
            new = got.get("new")
            if new is None:
                reached["allocation_refused"] += 1
                return False
            self.handed_out.update(new)
            if self._observer().manager.num_free_blocks() == 0:
                reached["full_pool"] += 1
            return True

        def _observer(self) -> Driver:
            """The side whose state feature counts are read from: the oracle (the reference)
            when there is one, else the implementation (whose laws read the same methods)."""
            return self.pair.oracle or self.pair.impl

        def _free_queue(self) -> list[int]:
            """The free queue, head first ([] when the observed side does not show it)."""
            side = self._observer()
            if "free_queue_order" not in side.capabilities:
                return []
            return list(side.manager.free_block_ids())

        @precondition(lambda self: bool(self.running))
        @rule(data=st.data(), num_tokens=st.integers(1, 6), lookahead=lookahead_draw)
        def step(self, data: st.DataObject, num_tokens: int, lookahead: int) -> None:
            """One scheduler step of any running request: the next chunk of its prefill, else
            a decode step (one token, or several with multi_token_decode), with ``lookahead``
            speculative slots."""
            rid = data.draw(st.sampled_from(self.running), label="running request")
            view = self.pair.impl.views[rid]
            prefill = view.num_computed_tokens < view.num_tokens
            if not multi_token and not prefill:
                num_tokens = 1  # a decode step of one token: all the design promises
            op = (schedule(rid, num_tokens, lookahead) if prefill
                  else decode(rid, num_tokens, lookahead))
            if not self._allocated(self.pair.apply(op)) or not lookahead:
                return
            after = self.pair.impl.views[rid]
            if not prefill:
                reached["lookahead_decode"] += 1
            elif after.num_computed_tokens < after.num_tokens:
                reached["lookahead_chunked_prefill"] += 1  # slots past uncomputed prompt

        @precondition(lambda self: bool(self.running or self.pending))
        @rule(data=st.data())
        def finish(self, data: st.DataObject) -> None:
            """Free a request; it may come back later (preemption) with its output."""
            rid = data.draw(st.sampled_from(self.running + self.pending), label="request")
            self._free(rid)

        @precondition(lambda self: any(self.pair.impl.views[r].output_token_ids
                                       for r in self.running))
        @rule(data=st.data(), chunk=_CHUNKS)
        def preempt(self, data: st.DataObject, chunk: int | None) -> None:
            """Preempt a request that has generated tokens and resume it at once: freed, then
            scheduled again from scratch with its prompt plus output (its own blocks, just
            freed, are the hits)."""
            with_output = [r for r in self.running if self.pair.impl.views[r].output_token_ids]
            rid = data.draw(st.sampled_from(with_output), label="running request")
            self._free(rid)
            self._admit(rid, chunk)

        def _free(self, rid: str) -> None:
            view = self.pair.impl.views[rid]
            self.pair.apply(free(rid))
            if rid in self.running:
                self.last_freed = list(view.token_ids)
                self.running.remove(rid)
                self.pending.append(rid)  # a freed request may come back (preemption)
                if view.output_token_ids:  # its prompt and answer: a later turn's prefix
                    self.prompts.append(list(view.token_ids))

        if "reset_prefix_cache" in caps:
            @rule(dice=st.integers(0, 9), drain=st.booleans())
            def reset_cache(self, dice: int, drain: bool) -> None:
                """Rarely, reset the prefix cache: refused while requests hold blocks; with
                ``drain`` every request is freed first (as between benchmark runs), so it
                succeeds."""
                # Rare: a rule without arguments is cheap for Hypothesis to pick, and resetting
                # often would leave nothing to hit (9, not 0: Hypothesis favours small values).
                if dice != 9:
                    return
                if drain:
                    for rid in list(self.running):
                        self._free(rid)
                got = self.pair.apply(reset())
                reached["reset_succeeded" if got.get("reset") else "reset_refused"] += 1

    # Hypothesis derives derandomized examples from the source of the factory it is given;
    # a fixed one-line factory keeps the examples the same when the machine's code changes.
    def factory() -> KVWorkload: return KVWorkload()
    if seed is not None:
        factory = hypothesis_seed(seed)(factory)
    try:
        # Hypothesis annotates the factory as type[RuleBasedStateMachine] but documents (and
        # accepts) any zero-argument callable returning a machine.
        run_state_machine_as_test(factory,  # type: ignore[arg-type]
                                  settings=Settings(settings, stateful_step_count=step_count))
    finally:
        REACHED.update(reached)
        if stats is not None:
            stats.update(reached)
