"""The random-workload state machine shared by the differential and invariant tests.

Hypothesis generates scheduler-like workloads (requests with shared prefixes, chunked prefill,
decode, frees, resets, pool pressure) as ``kvcheck.conformance.ops`` dicts and feeds them to a
``Pair``; every op is checked there (laws, and the oracle when there is one). Hypothesis
shrinks a failure to a short op list, whose trace the ``Pair`` writes for ``kvcheck replay``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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

from kvcheck.conformance.ops import add, decode, free, reset, schedule
from kvcheck.conformance.protocol import (
    DESIGN_CAPABILITIES,
    ImplInfo,
    KVCacheSpec,
    UnsupportedSpec,
    effective_capabilities,
    reserved_block_ids,
)

if TYPE_CHECKING:
    from kvcheck.plugin.loader import ImplHandle

__all__ = ["run_workload_machine", "supported_block_sizes"]

# Block sizes random workloads draw from (the first is what Hypothesis shrinks towards).
_BLOCK_SIZES = (4, 2, 8, 1)

# System prompts of different lengths so random requests share (and partially share) prefixes;
# the longer ones are extensions of the shorter ones, as in multi-turn chat. Hypothesis favours
# the first entry of sampled_from, so the most reusable prompt comes first.
# 16 tokens first: block-aligned for every block size drawn, which exercises the hit cap.
_PREFIXES = [list(range(1, 17)), list(range(1, 20)), list(range(1, 9)), list(range(1, 33)),
             list(range(1, 5)), [], [7] * 6]
# Token ids of every pickle/CBOR width (spec §2.1), to exercise hash encodings.
_TOKENS = st.sampled_from([0, 1, 2, 3, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 151643])


def supported_block_sizes(info: ImplInfo) -> list[int]:
    """The block sizes random workloads use for ``info``: the usual small ones it supports,
    else its smallest declared ones (workload prompts are tens of tokens). Every size is
    drawn about equally often."""
    if info.block_sizes is None:
        return list(_BLOCK_SIZES)
    usual = [b for b in _BLOCK_SIZES if b in info.block_sizes]
    return usual or sorted(b for b in set(info.block_sizes) if b >= 1)[:3]


def run_workload_machine(make_pair: Callable[..., Any], settings: Settings, seed: int | None,
                         *, extras: bool, events: bool, step_count: int = 30,
                         impl: ImplHandle | None = None, profile: str | None = None) -> None:
    """Run the machine under ``settings``; ``make_pair(**spec_fields)`` builds each example's
    ``Pair``. ``extras`` adds salts / LoRA / multimodal items; ``events`` may enable KV events.

    With ``impl`` (and the active ``profile``) the workloads stay within what the design
    declares: block and pool sizes ``ImplInfo.supports`` (a spec the factory still declines
    with ``UnsupportedSpec`` is rejected and another drawn), and only the design features of
    ``effective_capabilities``: resets (``reset_prefix_cache``), caching off
    (``caching_off``), prompt-logprobs requests (``skip_reading_prefix_cache``) and decode
    steps of several tokens (``multi_token_decode``). Without ``impl``: everything.
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
    # A hash algorithm the implementation reproduces (its own scheme ignores the field).
    algos = () if info is None else tuple(info.hash_algos)
    hash_algo = "sha256" if not algos or "sha256" in algos else algos[0]
    multi_token = "multi_token_decode" in caps
    caching_draw = (st.sampled_from([True, True, True, False]) if "caching_off" in caps
                    else st.just(True))
    skip_read_draw = st.booleans() if "skip_reading_prefix_cache" in caps else st.just(False)

    class KVWorkload(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pair: Any = None
            self.pending: list[str] = []   # added, not holding blocks
            self.running: list[str] = []   # holding blocks
            self.prompts: list[list[int]] = []  # every prompt seen, for resubmission
            self.next_id = 0

        # Pools sized to the workload (a few requests fit, pressure still happens) and caching
        # mostly on: otherwise most allocations fail and prefix hits never occur.
        @initialize(block_size=st.sampled_from(block_sizes), pool_tokens=st.integers(24, 96),
                    caching=caching_draw, with_events=st.booleans())
        def setup(self, block_size: int, pool_tokens: int, caching: bool,
                  with_events: bool) -> None:
            num_blocks = num_reserved + max(2, pool_tokens // block_size)
            if info is not None and info.num_blocks_range is not None:
                low, high = info.num_blocks_range
                num_blocks = min(max(num_blocks, low), high)
            spec_fields = {"num_blocks": num_blocks, "block_size": block_size,
                           "hash_algo": hash_algo}
            assume(info is None or info.supports(KVCacheSpec(**spec_fields)))
            try:
                self.pair = make_pair(**spec_fields, enable_caching=caching,
                                      enable_kv_cache_events=events and with_events)
            except UnsupportedSpec:
                assume(False)  # the factory declined it: draw another spec

        @rule(prefix=st.sampled_from(_PREFIXES), tail=st.lists(_TOKENS, max_size=10),
              skip_read=skip_read_draw, extra=st.sampled_from(["", "salt", "lora", "mm"]))
        def add_request(self, prefix: list[int], tail: list[int], skip_read: bool,
                        extra: str) -> None:
            self._add(prefix + tail, skip_read, extra)

        @precondition(lambda self: bool(self.prompts))
        @rule(data=st.data(), tail=st.lists(_TOKENS, max_size=6))
        def resubmit(self, data: st.DataObject, tail: list[int]) -> None:
            """A new request repeating an earlier prompt (plus a new tail): the prefix-hit path,
            often on blocks that were freed and sit in the free queue."""
            prompt = data.draw(st.sampled_from(self.prompts), label="earlier prompt")
            self._add(prompt + tail, False, "")

        def _add(self, prompt: list[int], skip_read: bool, extra: str) -> None:
            if not prompt:
                return
            self.prompts.append(prompt)
            rid = f"r{self.next_id}"
            self.next_id += 1
            kwargs: dict[str, Any] = {"skip_read": skip_read} if skip_read else {}
            if extras and extra == "salt":
                kwargs["salt"] = "tenant-a"
            elif extras and extra == "lora":
                kwargs["lora"] = ("adapter", 1, "/lora/adapter")
            elif extras and extra == "mm" and len(prompt) >= 3:
                kwargs["mm"] = [("img0", 1, min(4, len(prompt) - 1))]
            self.pair.apply(add(rid, prompt, **kwargs))
            self.pending.append(rid)

        @precondition(lambda self: bool(self.pending))
        @rule(data=st.data(), chunk=st.one_of(st.none(), st.integers(1, 12)))
        def admit(self, data: st.DataObject, chunk: int | None) -> None:
            rid = data.draw(st.sampled_from(self.pending), label="pending request")
            got = self.pair.apply(schedule(rid, chunk))
            if got.get("new") is not None:
                self.pending.remove(rid)
                self.running.append(rid)

        @precondition(lambda self: bool(self.running))
        @rule(data=st.data(), num_tokens=st.integers(1, 6),
              is_decode=st.sampled_from([True, False]))
        def step(self, data: st.DataObject, num_tokens: int, is_decode: bool) -> None:
            rid = data.draw(st.sampled_from(self.running), label="running request")
            view = self.pair.impl.views[rid]
            if not multi_token and (is_decode or view.num_computed_tokens >= view.num_tokens):
                num_tokens = 1  # a decode step of one token: all the design promises
            self.pair.apply(decode(rid, num_tokens) if is_decode else schedule(rid, num_tokens))

        @precondition(lambda self: bool(self.running or self.pending))
        @rule(data=st.data())
        def finish(self, data: st.DataObject) -> None:
            rid = data.draw(st.sampled_from(self.running + self.pending), label="request")
            self.pair.apply(free(rid))
            if rid in self.running:
                self.running.remove(rid)
                self.pending.append(rid)  # a freed request may come back (preemption)

        if "reset_prefix_cache" in caps:
            @rule(dice=st.integers(0, 9))
            def reset_cache(self, dice: int) -> None:
                # Rare: a rule without arguments is cheap for Hypothesis to pick, and resetting
                # often would leave nothing to hit (9, not 0: Hypothesis favours small values).
                if dice == 9:
                    self.pair.apply(reset())

    # Hypothesis derives derandomized examples from the source of the factory it is given;
    # a fixed one-line factory keeps the examples the same when the machine's code changes.
    def factory() -> KVWorkload: return KVWorkload()
    if seed is not None:
        factory = hypothesis_seed(seed)(factory)
    run_state_machine_as_test(factory, settings=Settings(settings,
                                                         stateful_step_count=step_count))
