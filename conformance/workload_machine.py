"""The random-workload state machine shared by the differential and invariant tests.

Hypothesis generates scheduler-like workloads (requests with shared prefixes, chunked prefill,
decode, frees, resets, pool pressure) as ``kvcheck.conformance.ops`` dicts and feeds them to a
``Pair``; every op is checked there (laws, and the oracle when there is one). Hypothesis
shrinks a failure to a short op list, whose trace the ``Pair`` writes for ``kvcheck replay``.

One machine for one and many KV-cache groups: without ``group_kinds`` each engine gets a
single-group spec (no ``kv_cache_groups``: what a single-group adapter is built for); with
them, a multi-group layout of those kinds (``kvcheck.conformance.layouts``) chosen by the
drawn pool size, the pool grown with the number of groups (``spec_fields``). Its bookkeeping
reads every answer in the harness's per-group form (``answer_block_ids``: the groups' lists
joined, a multi-group spec's null block left out), so the same rules run on both. Multi-group
runs have one rule more (``window_rehit``: a prefix comes back after pool pressure evicted
part of what the windows dropped), which with the layouts of three or more kinds reaches
hit lengths that need several rounds over the groups in the first examples.

The machine counts the workload features it reaches (``FEATURES``: lookahead during chunked
prefill and decode, successful and refused resets, each hash algorithm, caching off, prompt
logprobs, extra keys, preempt-and-resume, hits on evicted-and-reused blocks, touches at both
ends of the free queue, a full pool, a max_model_len, PYTHONHASHSEED unset);
``scripts/coverage_report.py`` prints them, ``docs/coverage.md`` explains them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from hypothesis import Phase, assume
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    RuleStrategy,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvcheck.conformance.boundary_offloads import CAPABILITY as OFFLOADS
from kvcheck.conformance.fine_grained import CAPABILITY as FINE_GRAINED
from kvcheck.conformance.groups import null_of
from kvcheck.conformance.laws import eagle_drop_groups
from kvcheck.conformance.layouts import (
    KNOBS,
    events_crash,
    has_cross_attention,
    knobs_for,
    layout_for,
)
from kvcheck.conformance.mamba_checkpoints import CAPABILITY as CHECKPOINTS
from kvcheck.conformance.ops import RequestExtras, add, decode, free, lookup, reset, schedule
from kvcheck.conformance.protocol import (
    DESIGN_CAPABILITIES,
    EXTRA_KEY_KINDS,
    HASH_ALGOS,
    ImplInfo,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheSpecFields,
    KVCacheSpecOptions,
    UnsupportedSpec,
    effective_capabilities,
    reserved_block_ids,
)
from kvcheck.conformance.scaled_workloads import (
    USUAL_BLOCK_SIZES,
    scaled_tokens,
    workload_scale,
)
from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from kvcheck.conformance.differential import Pair
    from kvcheck.conformance.driver import Driver, StepResult
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.protocol import RequestView

__all__ = ["FEATURES", "OFFERED_HASH_ALGOS", "REACHED", "WORKLOAD_FEATURES", "answer_block_ids",
           "declared_features", "extra_draws", "last_hash_boundary", "run_workload_machine",
           "same_extras", "spec_fields", "supported_block_sizes", "workload_hash_algos"]

# Block sizes random workloads draw from (the first is what Hypothesis shrinks towards); their
# lengths are written for 4-token blocks, scaled at a larger declared size (workload_scale).
_BLOCK_SIZES = USUAL_BLOCK_SIZES

# System prompts of different lengths so random requests share (and partially share) prefixes;
# the longer ones are extensions of the shorter ones, as in multi-turn chat. Hypothesis favours
# the first entry of sampled_from, so the most reusable prompt comes first.
# 16 tokens first: block-aligned for every block size drawn, which exercises the hit cap.
_PREFIXES = [list(range(1, 17)), list(range(1, 20)), list(range(1, 9)), list(range(1, 33)),
             list(range(1, 5)), [], [7] * 6]
# Token ids of every pickle/CBOR integer width (docs/semantics.md#serialization-bytes).
_TOKENS = st.sampled_from([0, 1, 2, 3, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 151643])
# A prefill chunk: the rest of the prompt (None) or up to n tokens (chunked prefill).
_CHUNKS = st.one_of(st.none(), st.integers(1, 8))

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
    "lookahead_chunked_prefill",  # speculative slots filling a block of uncomputed prompt
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
    "max_model_len",  # an engine whose spec caps the slots per request
    "pythonhashseed_unset",  # an engine whose NONE_HASH comes from an unset PYTHONHASHSEED
)

# Where NONE_HASH with PYTHONHASHSEED unset is the same in every manager (docs/semantics.md
# #none-hash: from vLLM 0.29 the sha256 pair hashes a fixed seed; elsewhere it is random).
_UNSET_SEED_ALGOS: dict[str, tuple[str, ...]] = {"vllm-0.33": ("sha256", "sha256_cbor")}

#: The ``add`` keyword each extra-key kind (``EXTRA_KEY_KINDS``) sets, in the order requests
#: draw them (``""``: no extra key).
_EXTRA_OPS: dict[str, str] = {"cache_salt": "salt", "lora": "lora", "multimodal": "mm"}
_EXTRA_DRAWS: tuple[str, ...] = ("", *_EXTRA_OPS.values())


def extra_draws(extras: bool | Collection[str]) -> tuple[str, ...]:
    """What a new request's extra key is drawn from (``""``, ``"salt"``, ``"lora"``,
    ``"mm"``) for ``extras``: True or every kind of ``EXTRA_KEY_KINDS`` draws all of them,
    a subset of the kinds only those (a design keying LoRA and images but no salt never
    gets a salt). With none, the full list is still drawn and the choice ignored, so the
    examples of a run do not depend on it."""
    kinds = set(EXTRA_KEY_KINDS) if extras is True else set(extras or ())
    unknown = sorted(kinds - set(EXTRA_KEY_KINDS))
    if unknown:
        raise KVCheckInputError(f"extras: {unknown} are not extra-key kinds {EXTRA_KEY_KINDS}")
    if not kinds or kinds == set(EXTRA_KEY_KINDS):
        return _EXTRA_DRAWS
    return ("", *(op for kind, op in _EXTRA_OPS.items() if kind in kinds))


#: Features reached by every run in this process (``run_workload_machine`` adds to it).
REACHED: Counter[str] = Counter()


def _coin_index(n: int) -> st.SearchStrategy[int]:
    """An index in ``range(n)`` made of coin flips (shrinking to 0). Hypothesis draws the
    first choices of an example (the ``@initialize`` arguments) far from uniformly with
    ``sampled_from`` or ``integers`` (in 40 derandomized examples one of four values may never
    come up) but evenly with ``booleans``."""
    bits = max(1, (n - 1).bit_length())
    flips = st.lists(st.booleans(), min_size=bits, max_size=bits)
    return flips.map(lambda f: sum(b << i for i, b in enumerate(f)) % n)


def same_extras(view: RequestView) -> RequestExtras:
    """``add``'s keyword arguments for a request with ``view``'s extra keys (LoRA, multimodal
    items, cache salt; in that order, the order the op prints them), so that it hits what
    ``view`` cached: a duplicate (parallel sampling, or the same question twice)."""
    extras: RequestExtras = {}
    if view.lora is not None:
        extras["lora"] = view.lora
    if view.mm_features:
        extras["mm"] = view.mm_features
    if view.cache_salt is not None:
        extras["salt"] = view.cache_salt
    return extras


def supported_block_sizes(info: ImplInfo) -> list[int]:
    """The block sizes random workloads use for ``info``: the usual small ones it supports,
    else its smallest declared ones (workload prompts are tens of tokens). Every size is
    drawn about equally often."""
    if info.block_sizes is None:
        return list(_BLOCK_SIZES)
    usual = [b for b in _BLOCK_SIZES if b in info.block_sizes]
    return usual or sorted(b for b in set(info.block_sizes) if b >= 1)[:3]


def answer_block_ids(groups: Sequence[Sequence[int]], null: int | None) -> list[int]:
    """The block ids of an answer (hits, new blocks) or a block table in the harness's form,
    one list per KV-cache group, joined in group order with the spec's null block
    (``groups.null_of``: id 0 on a multi-group spec, none on a single-group one, whose one
    list is the answer as it is) left out."""
    return [b for ids in groups for b in ids if b != null]


def spec_fields(num_blocks: int, block_size: int, *, group_kinds: Sequence[str] = (),
                profile: str = "", scale: int = 1, fine_grained: bool = False,
                offloads: bool = False, eagle: bool = False, knobs: Collection[str] = (),
                checkpoints: bool = False, prefill_lookahead: int = 0,
                hash_lookahead: int = 0, eagle_flags: int = 3,
                **fields: Unpack[KVCacheSpecOptions]) -> KVCacheSpecFields:
    """The spec fields of one engine (``make_pair(**fields)``): ``num_blocks`` blocks of
    ``block_size`` tokens as drawn, plus ``fields`` (hash algorithm, caching, events, model
    length, PYTHONHASHSEED). Without ``group_kinds``: a single-group spec. With them: the
    multi-group layout of those kinds that the drawn pool size picks
    (``layouts.layout_for`` under ``profile``, sliding windows ``scale`` times ``WINDOWS``),
    its pool grown with the number of groups (each token needs a slot in every group), KV
    events off where ``profile``'s vLLM crashes on them (``layouts.events_crash``), and prefix
    caching off for an encoder-decoder layout (``layouts.has_cross_attention``);
    ``fine_grained``: layouts with fine-grained partial hits among the Mamba ones;
    ``offloads``: layouts of two Mamba groups after them (boundary-state hand-offs);
    ``checkpoints``: Mamba prefill checkpoint and sparse retention layouts last.
    ``eagle``: EAGLE/MTP (``KVCacheSpec.use_eagle``, set only when True), except beside a
    chunked local group whose hits would drop with caching on (``_chunked_local_drops``:
    vLLM asserts; with ``eagle_flags`` flagging only groups of other specs, vLLM 0.33 runs
    it), or Mamba prefill checkpoint blocks with caching on, where vLLM 0.33.0 fails an
    assertion (the reference refuses both).
    ``knobs``: the ``layouts.KNOBS`` both sides declare (DCP world sizes and
    ``prefix_match_unit`` in some draws, ``layouts.knobs_for``).
    ``prefill_lookahead``: multi-module MTP's ``K`` (``KVCacheSpec.num_prefill_lookahead``,
    set only when above 1, not under ``vllm-0.10``, which has none), lowered to the scheduler
    block size with EAGLE and caching on (vLLM 0.33 raises ValueError past it).
    ``hash_lookahead``: hash lookahead ``L`` (``KVCacheSpec.num_hash_lookahead_tokens``), set
    only under ``vllm-0.33`` with caching on, where it clears ``use_eagle`` as vLLM's scheduler
    does (``_set_hash_lookahead``).
    ``eagle_flags``: which groups are flagged ``is_eagle_group`` (vLLM 0.33's per-group EAGLE
    flag) when ``use_eagle`` is still set at the end, only under ``vllm-0.33``
    (``_set_eagle_flags``: 0 the first group, 1 the last, 2 the even-numbered, 3 none)."""
    out: KVCacheSpecFields = {"num_blocks": num_blocks, "block_size": block_size, **fields}
    if not group_kinds:
        if eagle:
            out["use_eagle"] = True
        _set_prefill_lookahead(out, profile, prefill_lookahead)
        _set_hash_lookahead(out, profile, hash_lookahead)
        return out
    groups, retention = layout_for(profile, group_kinds, block_size, num_blocks, scale,
                                   enable_caching=fields.get("enable_caching", True),
                                   fine_grained=fine_grained, offloads=offloads,
                                   checkpoints=checkpoints)
    knobbed = knobs_for(profile, groups, block_size, num_blocks,
                        enable_caching=fields.get("enable_caching", True), knobs=knobs,
                        group_kinds=group_kinds)
    if knobbed is not None:
        if knobbed[0] is not groups:  # a DCP layout of its own: no window, no retention
            retention = None
        groups, out["dcp_world_size"], out["prefix_match_unit"] = knobbed
    per_group = max(2, num_blocks - 1)
    out["num_blocks"] = 1 + sum(max(2, per_group * block_size // (g.block_size or 1))
                                for g in groups)
    out["kv_cache_groups"] = groups
    out["prefix_cache_retention_interval"] = retention
    if events_crash(profile, groups, block_size):
        out["enable_kv_cache_events"] = False
    if has_cross_attention(groups):
        out["enable_caching"] = False
    if eagle and not (out.get("enable_caching", True)
                      and (any(g.kind == "mamba" and g.num_prefill_checkpoint_blocks
                               for g in groups)
                           or _chunked_local_drops(out, profile, eagle_flags))):
        out["use_eagle"] = True
    _set_prefill_lookahead(out, profile, prefill_lookahead)
    _set_hash_lookahead(out, profile, hash_lookahead)
    _set_eagle_flags(out, profile, eagle_flags)
    return out


def _set_eagle_flags(out: KVCacheSpecFields, profile: str, pattern: int) -> None:
    """``spec_fields``'s per-group EAGLE flags (``KVCacheGroupSpec.is_eagle_group``), as vLLM
    0.33's KV-cache planning sets them on the groups holding the drafter's layers: only with
    ``use_eagle`` (vLLM flags none without EAGLE's block drop; hash lookahead clears it),
    only under ``vllm-0.33`` (0.10.2 has no flag). ``pattern`` 0: the first group, 1: the
    last, 2: the even-numbered ones; 3: none (every group drops, vLLM's fallback). None is
    the rarest, not the first choice: Hypothesis draws the coin flips after an EAGLE engine's
    mostly as zeros, and the fallback is what every design without ``eagle_groups`` runs."""
    groups = tuple(out.get("kv_cache_groups", ()))
    flagged = _flagged(groups, profile, pattern) if out.get("use_eagle") else groups
    if flagged != groups:
        out["kv_cache_groups"] = flagged


def _flagged(groups: Sequence[KVCacheGroupSpec], profile: str,
             pattern: int) -> tuple[KVCacheGroupSpec, ...]:
    """``groups`` with ``_set_eagle_flags``' ``pattern`` flagged ``is_eagle_group`` (as they
    are, for pattern 3, outside ``vllm-0.33`` and for fewer than two groups)."""
    groups = tuple(groups)
    if pattern == 3 or profile != "vllm-0.33" or len(groups) < 2:
        return groups
    picked = {0: {0}, 1: {len(groups) - 1}}.get(pattern, set(range(0, len(groups), 2)))
    return tuple(dataclasses.replace(g, is_eagle_group=True) if i in picked else g
                 for i, g in enumerate(groups))


def _chunked_local_drops(out: KVCacheSpecFields, profile: str, pattern: int) -> bool:
    """Whether with ``use_eagle`` and ``_set_eagle_flags``' ``pattern`` a chunked local group
    of ``out``'s layout would drop EAGLE's block (flagged, of a flagged group's spec, or every
    group when none is flagged: always under ``vllm-0.10``): vLLM asserts 'Hybrid KV cache is
    not supported for eagle + chunked local attention' on its first lookup (the reference
    refuses it). vLLM 0.33 runs an unflagged one beside a flagged group of another spec."""
    groups = out.get("kv_cache_groups", ())
    if not any(g.kind == "chunked_local_attention" for g in groups):
        return False
    trial = dataclasses.replace(KVCacheSpec(**out), use_eagle=True,
                                kv_cache_groups=_flagged(groups, profile, pattern))
    return any(groups[i].kind == "chunked_local_attention" for i in eagle_drop_groups(trial))


def _set_hash_lookahead(out: KVCacheSpecFields, profile: str, lookahead: int) -> None:
    """``spec_fields``'s hash lookahead ``L``, as vLLM 0.33's config and scheduler pass it: only
    with prefix caching on (``VllmConfig.num_hash_lookahead_tokens`` is 0 without), and then
    without EAGLE's drop (``sched/scheduler.py:342-360`` clears ``use_eagle``); never under
    ``vllm-0.10`` (no lookahead hashing) or ``generic``; at most 1 without a full-attention
    group (vLLM 0.33.0 raises IndexError beyond)."""
    if not lookahead or profile != "vllm-0.33" or not out.get("enable_caching", True):
        return
    groups = out.get("kv_cache_groups", ())
    if groups and not any(g.kind == "full_attention" for g in groups):
        # vLLM 0.33.0 raises IndexError past L = 1 there (the reference refuses it).
        lookahead = 1
    out["num_hash_lookahead_tokens"] = lookahead
    out.pop("use_eagle", None)


def async_keys_stale_checkpoints(fields: KVCacheSpecFields) -> bool:
    """Whether asynchronous scheduling is kept off an engine of ``fields``: a Mamba "align"
    group with prefill checkpoint blocks under hash lookahead ``L >= 2``, where vLLM 0.33.0
    keys a checkpoint block with the full-block key on the decode step after the chunk that
    wrote it and hands it to a KV connector, though it holds the state of fewer tokens: with
    tokens in flight the skip boundary (``n - k``) keeps the block that the synchronous rule
    frees before caching (docs/semantics.md#not-covered-yet; the reference reproduces it).
    ``run_workload_machine`` decides this after the draws, so no example's draws move."""
    return (fields.get("num_hash_lookahead_tokens", 0) >= 2
            and any(g.kind == "mamba" and g.mamba_cache_mode == "align"
                    and g.num_prefill_checkpoint_blocks
                    for g in fields.get("kv_cache_groups", ())))


def _set_prefill_lookahead(out: KVCacheSpecFields, profile: str, lookahead: int) -> None:
    """``spec_fields``'s multi-module MTP ``K``: kept at or below the scheduler block size
    (the LCM of the groups' block sizes) with EAGLE and caching on, set only above 1, and not
    beside a Mamba "align" group of several groups with EAGLE, where vLLM 0.33.0 keys stale
    states (refused); one Mamba "align" group alone takes it."""
    if lookahead < 2 or profile == "vllm-0.10":
        return
    caching = out.get("enable_caching", True)
    groups = out.get("kv_cache_groups", ())
    if caching and out.get("use_eagle") and len(groups) > 1 and any(
            g.kind == "mamba" and g.mamba_cache_mode == "align" for g in groups):
        return  # refused: vLLM 0.33.0 would key stale Mamba states (docs/semantics.md)
    if out.get("use_eagle") and caching:
        spec = KVCacheSpec(**out)
        scheduler = math.lcm(*(spec.group_block_size(i) for i in range(len(spec.groups))))
        lookahead = min(lookahead, scheduler)
    if lookahead > 1:
        out["num_prefill_lookahead"] = lookahead


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


def last_hash_boundary(num_tokens: int, hash_block_size: int,
                       num_hash_lookahead_tokens: int) -> int:
    """The last hash-block boundary, in tokens, that a prompt of ``num_tokens`` tokens can be
    prefilled to and keyed at: a multiple of ``hash_block_size`` with at least
    ``max(1, num_hash_lookahead_tokens)`` prompt tokens after it (a block's key needs its
    ``L`` lookahead tokens; without lookahead the last token is still to compute). 0 when
    there is none: the prompt is no longer than that (a one-token prompt under ``L = 2``:
    not -1, which a driver would read as "schedule every token")."""
    lag = max(1, num_hash_lookahead_tokens)
    return max(0, (num_tokens - lag) // hash_block_size * hash_block_size)


#: The capabilities that switch on draws or rules of the workload machine
#: (``run_workload_machine``'s ``features``; see its docstring for each).
WORKLOAD_FEATURES: tuple[str, ...] = (
    "eagle", "eagle_groups", "prefill_lookahead", "hash_lookahead", "admission_gates",
    "async_scheduling", "block_zeroing", "mamba_shared_prefix_checkpoint", FINE_GRAINED,
    OFFLOADS, CHECKPOINTS, *KNOBS)


def declared_features(impl: ImplHandle, oracle: ImplHandle | None = None,
                      names: Iterable[str] = WORKLOAD_FEATURES) -> frozenset[str]:
    """The capabilities of ``names`` that ``impl`` declares under its active profile
    (``ImplHandle.has``) and, when given, ``oracle`` too: ``run_workload_machine``'s
    ``features`` for a differential (both sides) or a laws-only run (``impl`` alone)."""
    return frozenset(n for n in names if impl.has(n) and (oracle is None or oracle.has(n)))


def run_workload_machine(make_pair: Callable[..., Pair], settings: Settings, seed: int | None,
                         *, extras: bool | Collection[str], events: bool,
                         step_count: int = 30,
                         impl: ImplHandle | None = None, profile: str | None = None,
                         stats: Counter[str] | None = None, random_roots: bool = False,
                         group_kinds: Sequence[str] = (),
                         features: Collection[str] = ()) -> None:
    """Run the machine under ``settings``; ``make_pair(**spec_fields)`` builds each example's
    ``Pair`` (``spec_fields``: a single-group spec, or with ``group_kinds`` a multi-group
    layout of those attention kinds, ``layouts.declared_kinds``). ``extras`` adds salts /
    LoRA / multimodal items: True all of them, else the extra-key kinds named
    (``EXTRA_KEY_KINDS``, see ``extra_draws``); ``events`` may enable KV events.

    With ``impl`` (and the active ``profile``) the workloads stay within what the design
    declares: block and pool sizes ``ImplInfo.supports``, every group's for a layout (a spec
    outside them, or one the factory still declines with ``UnsupportedSpec``, is rejected
    and another drawn), the hash algorithms of
    ``workload_hash_algos``, and only the design features of ``effective_capabilities``:
    resets (``reset_prefix_cache``), caching off (``caching_off``), prompt-logprobs requests
    (``skip_reading_prefix_cache``), speculative slots (``lookahead``) and decode steps of
    several tokens (``multi_token_decode``). Without ``impl``: everything. Lookups the scheduler
    does not follow with an allocation (``lookup`` ops) only for a design declaring
    ``pinning_lookup`` (they test its ``release_computed``; other designs' examples stay the
    same).

    At a declared block size larger than the usual ones (``generic``: ``workload_scale``)
    every length the machine draws in tokens is scaled by ``block_size // 4``, so a design
    supporting only 256-token blocks gets the block-level workloads a design gets at 4:
    hits, shared blocks, a full pool and eviction. Everywhere else the examples are those
    of the machine as written.

    ``random_roots``: PYTHONHASHSEED may be left unset even where NONE_HASH is then random per
    manager, for runs whose pairs have no oracle (nothing compares hashes across managers).

    ``features``: the capabilities of ``WORKLOAD_FEATURES`` whose draws and rules this run
    uses, those both sides declare (``declared_features``; a laws-only run: the
    implementation's). Each one adds its draws after every earlier one, so a run's examples
    move only when its set does:

    ``fine_grained_hits``: the Mamba layouts include those
    with fine-grained partial hits (``layouts.layout_for``), and a rule only then,
    ``partial_hit_share``, prefills a request to its last hash boundary inside a block and
    sends one sharing it, so partial hits and their copies happen (counted as
    ``fine_grained_partial_hit``).

    ``boundary_state_offloads``: the Mamba layouts include
    two-Mamba-group ones after the others (``layouts.layout_for``), and with fine-grained hits
    a rule only then, ``producer_finishes``, prefills a request exactly to its last hash
    boundary and frees it at once (the driver asks for its partial tail first:
    ``finalize_partial_tail_offloads``).

    ``eagle``: one engine in four runs with ``use_eagle``
    (EAGLE/MTP: hits drop their last block), drawn after every other engine draw, so the
    examples of a run without it stay the same (counted as ``eagle``).

    ``mamba_checkpoints``: the Mamba layouts end with
    layouts of Mamba prefill checkpoint blocks and sparse retention (``layouts.layout_for``).

    ``prefill_lookahead``: one engine in four runs
    multi-module MTP with ``num_prefill_lookahead`` 2 to 4 (``spec_fields``), drawn after
    every other engine draw, EAGLE's included (counted as ``prefill_lookahead``).

    ``hash_lookahead``: one engine in two under
    ``vllm-0.33`` with caching on hashes with lookahead ``num_hash_lookahead_tokens`` 1 to 3
    (``spec_fields``; EAGLE's drop then off, as vLLM's scheduler does), drawn after every other
    engine draw (counted as ``hash_lookahead``).

    ``admission_gates``: one engine in two under
    ``vllm-0.33`` admits as vLLM 0.33's scheduler does, each admission (a new or preempted
    request's) passing ``full_sequence_must_fit=True``, ``has_scheduled_reqs`` (whether
    another request runs) and a drawn ``reserved_blocks`` (0 to 2), with a drawn
    ``watermark`` (0, 0.1 or 0.2) and ``max_in_flight_tokens`` (unset, or 4 to 16 drawn
    tokens), drawn after every other engine draw (counted as ``admission_gates``).

    ``eagle_groups`` (with ``eagle``): under
    ``vllm-0.33`` three EAGLE engines in four of several groups flag some groups
    ``is_eagle_group`` (``spec_fields``' ``eagle_flags``), drawn after every other engine
    draw (counted as ``eagle_groups``); a flag on a group of another spec than the chunked
    local groups' lets a caching-on chunked layout run EAGLE too (counted as
    ``eagle_groups_chunked_local``).

    ``async_scheduling``: under ``vllm-0.33`` one
    engine in two schedules asynchronously, as vLLM 0.33's async scheduler does: a running
    request's step is scheduled before the output of its previous step is processed, so each
    ``allocate_slots`` of a running request passes ``num_in_flight_tokens``, the tokens its
    previous step scheduled (``computed`` counts them optimistically), and a request is freed
    with its last step's tokens in flight (``free(rid, in_flight=k)``: a KV producer's
    ``finalize_partial_tail_offloads`` gets them), drawn after every other engine draw
    (counted as ``async_scheduling``; ``async_in_flight_step``: steps that passed tokens in
    flight); an engine drawing it on a layout where vLLM 0.33.0 keys stale checkpoint states
    (``async_keys_stale_checkpoints``) schedules synchronously.

    ``mamba_shared_prefix_checkpoint`` (with ``fine_grained_hits``): under ``vllm-0.33`` one
    engine in two with a Mamba group runs with ``mamba_shared_prefix_checkpoint`` and then
    EAGLE where ``spec_fields`` allows it (vLLM narrows the flag off itself outside EAGLE
    layouts), drawn after every other engine draw (counted as ``shared_prefix_checkpoint``,
    ``shared_prefix_checkpoint_kept`` where vLLM keeps it), and the rule ``junction_share``
    prefills a sibling a hash block a step so a chunk ends at its
    junction, then admits another sibling (counted as ``shared_prefix_junction``,
    ``shared_prefix_junction_kept``).

    ``block_zeroing``: under ``vllm-0.33`` one engine in two runs with
    ``needs_kv_cache_zeroing``, drawn after every other engine draw (counted as
    ``block_zeroing``): the driver drains ``take_new_block_ids`` after every allocation
    and the guard judges each drain (``kvcheck.conformance.block_zeroing``).

    ``layouts.KNOBS`` (``dcp``, ``prefix_match_unit``, ``mamba_dcp``): some layouts run with a
    DCP world size or a ``prefix_match_unit`` (``layouts.knobs_for``, which also reads
    ``fine_grained_hits``); without them the draws are unchanged.

    The workload features reached (``FEATURES``) are counted into ``stats`` when given, and
    into the process-wide ``REACHED`` in any case, also when the run fails.
    """
    wanted = frozenset(features)
    unknown = sorted(wanted - set(WORKLOAD_FEATURES))
    if unknown:
        raise KVCheckInputError(f"run_workload_machine(features=...): {unknown} not among "
                                f"WORKLOAD_FEATURES {list(WORKLOAD_FEATURES)}")
    fine_grained, offloads = FINE_GRAINED in wanted, OFFLOADS in wanted
    checkpoints, eagle = CHECKPOINTS in wanted, "eagle" in wanted
    prefill_lookahead, hash_lookahead = "prefill_lookahead" in wanted, "hash_lookahead" in wanted
    admission_gates, eagle_groups = "admission_gates" in wanted, "eagle_groups" in wanted
    async_scheduling, block_zeroing = "async_scheduling" in wanted, "block_zeroing" in wanted
    shared_prefix = "mamba_shared_prefix_checkpoint" in wanted
    knobs = [k for k in (*KNOBS, FINE_GRAINED) if k in wanted]
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
    active_profile = profile or (None if info is None else info.profile)
    hash_algos = workload_hash_algos(info, profile or (None if info is None else info.profile))
    multi_token = "multi_token_decode" in caps
    # Caching off in about one example in four: two coin flips (see _coin_index).
    caching_draw = (_coin_index(4).map(lambda i: i != 3) if "caching_off" in caps
                    else st.just(True))
    hash_algo_draw = _coin_index(len(hash_algos)).map(hash_algos.__getitem__)
    # A model length cap in one engine in four (about as long as the longest prompts), and
    # PYTHONHASHSEED unset in one in four (where allowed: see _start).
    max_model_len_draw = _coin_index(4).flatmap(
        lambda i: st.integers(16, 48) if i == 3 else st.none())
    seed_unset_draw = _coin_index(4).map(lambda i: i == 3)
    # KV events (when ``events``) in three engines in four: they show when each block is
    # cached and evicted, op by op.
    events_draw = _coin_index(4).map(lambda i: i != 3)
    skip_read_draw = st.booleans() if "skip_reading_prefix_cache" in caps else st.just(False)
    # Speculative slots as an EAGLE/MTP scheduler reserves them (0 first: Hypothesis shrinks
    # towards it); 4 can span a whole block of the sizes drawn.
    lookahead_draw = (st.sampled_from([0, 1, 2, 4]) if "lookahead" in caps else st.just(0))
    # EAGLE in one engine in four, only where both sides declare it. Without it the keyword
    # is not drawn at all: even a st.just() among a rule's arguments moves Hypothesis's choice
    # sequence, and with it every example the earlier designs and mutants were checked on.
    # Any: Hypothesis's @initialize/@rule overloads take **kwargs only as an untyped mapping.
    eagle_kw: dict[str, Any] = (
        {"use_eagle": _coin_index(4).map(lambda i: i == 3)} if eagle else {})
    # Multi-module MTP's K in one engine in four, drawn last and only when declared (as EAGLE).
    if prefill_lookahead:
        eagle_kw["num_prefill_lookahead"] = _coin_index(4).flatmap(
            lambda i: st.integers(2, 4) if i == 3 else st.just(0))
    # Hash lookahead in one engine in two, drawn last and only when declared (as EAGLE).
    if hash_lookahead:
        eagle_kw["num_hash_lookahead_tokens"] = _coin_index(2).flatmap(
            lambda i: st.integers(1, 3) if i == 1 else st.just(0))
    # vLLM 0.33's admission gates in one engine in two, drawn last and only when declared (as
    # EAGLE): (watermark in tenths, max_in_flight_tokens in drawn tokens, reserved_blocks).
    if admission_gates and active_profile == "vllm-0.33":
        eagle_kw["admission"] = _coin_index(2).flatmap(
            lambda i: st.tuples(st.integers(0, 2), st.sampled_from([None, 4, 8, 16]),
                                st.integers(0, 2)) if i == 1 else st.just(None))
    # vLLM 0.33's per-group EAGLE flags (spec_fields' eagle_flags), drawn last and only when
    # declared (as EAGLE), so no other design's examples move.
    if eagle and eagle_groups and active_profile == "vllm-0.33":
        eagle_kw["eagle_flags"] = _coin_index(4)
    # vLLM 0.33's asynchronous scheduling in one engine in two, drawn last and only when
    # declared (as EAGLE), so no other design's examples move.
    if async_scheduling and active_profile == "vllm-0.33":
        eagle_kw["async_mode"] = _coin_index(2).map(lambda i: i == 1)
    # vLLM 0.33's Mamba shared-prefix checkpoint in one fine-grained engine in two, drawn last
    # and only when declared (as EAGLE), so no other design's examples move.
    if shared_prefix and fine_grained and active_profile == "vllm-0.33":
        eagle_kw["shared_prefix_checkpoint"] = _coin_index(2).map(lambda i: i == 1)
    # vLLM 0.33's worker-side block zeroing in one engine in two, drawn last and only when
    # declared (as EAGLE), so no other design's examples move.
    if block_zeroing and active_profile == "vllm-0.33":
        eagle_kw["zeroing"] = _coin_index(2).map(lambda i: i == 1)
    extra_draw = extra_draws(extras)
    drawn_extras = frozenset(extra_draw) - {""} if extras else frozenset()
    reached: Counter[str] = Counter()

    class KVWorkload(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pair: Pair  # set by setup (the @initialize rule), which runs before any other
            self.null: int | None = None  # the engine's null block id (set by _start)
            self.pending: list[str] = []   # added, not holding blocks
            self.running: list[str] = []   # holding blocks
            self.prompts: list[list[int]] = []  # every prompt seen, for resubmission
            self.next_id = 0
            self.max_model_len: int | None = None  # the engine's (set by _start)
            self.caching = True  # the engine's (set by _start)
            self.encoder = 0  # encoder tokens per request (set by _start; 0: decoder-only)
            self.scale = 1  # tokens per drawn token at the engine's block size (_start)
            # block id -> how often allocate_slots handed it out as new (2+: it left the free
            # queue, was evicted and reused)
            self.handed_out: Counter[int] = Counter()
            # blocks answered as hits (so cached) and not handed out as new since
            self.hit_blocks: set[int] = set()

        # Pools sized to the workload (a few requests fit, pressure still happens) and caching
        # mostly on: otherwise most allocations fail and prefix hits never occur.
        @initialize(block_size=st.sampled_from(block_sizes), pool_tokens=st.integers(24, 96),
                    with_events=events_draw, hash_algo=hash_algo_draw, caching=caching_draw,
                    max_model_len=max_model_len_draw, seed_unset=seed_unset_draw, **eagle_kw)
        def setup(self, block_size: int, pool_tokens: int, caching: bool, with_events: bool,
                  hash_algo: str, max_model_len: int | None, seed_unset: bool,
                  use_eagle: bool = False, num_prefill_lookahead: int = 0,
                  num_hash_lookahead_tokens: int = 0,
                  admission: tuple[int, int | None, int] | None = None,
                  eagle_flags: int = 3, async_mode: bool = False,
                  shared_prefix_checkpoint: bool = False,
                  zeroing: bool = False) -> None:
            self._start(block_size, pool_tokens, caching, with_events, hash_algo, max_model_len,
                        seed_unset, use_eagle, num_prefill_lookahead, num_hash_lookahead_tokens,
                        admission, eagle_flags, async_mode, shared_prefix_checkpoint, zeroing)

        @rule(dice=_coin_index(8), block_size=st.sampled_from(block_sizes),
              pool_tokens=st.integers(24, 96), with_events=events_draw,
              hash_algo=hash_algo_draw, caching=caching_draw,
              max_model_len=max_model_len_draw, seed_unset=seed_unset_draw, **eagle_kw)
        def restart(self, dice: int, block_size: int, pool_tokens: int, caching: bool,
                    with_events: bool, hash_algo: str, max_model_len: int | None,
                    seed_unset: bool, use_eagle: bool = False,
                    num_prefill_lookahead: int = 0, num_hash_lookahead_tokens: int = 0,
                    admission: tuple[int, int | None, int] | None = None,
                    eagle_flags: int = 3, async_mode: bool = False,
                    shared_prefix_checkpoint: bool = False,
                  zeroing: bool = False) -> None:
            """Rarely, a new engine with another spec. Hypothesis varies an example's first
            draws (``setup``'s) little between the examples of a run, so the specs a run sees,
            hash algorithms and caching off among them, come mostly from here."""
            if dice == 7:  # 1 in 8 (not 0: what shrinking favours): engines need some steps
                self.pending, self.running, self.prompts = [], [], []
                self.handed_out.clear()
                self.hit_blocks.clear()
                self._start(block_size, pool_tokens, caching, with_events, hash_algo,
                            max_model_len, seed_unset, use_eagle, num_prefill_lookahead,
                            num_hash_lookahead_tokens, admission, eagle_flags, async_mode,
                            shared_prefix_checkpoint, zeroing)

        def _start(self, block_size: int, pool_tokens: int, caching: bool, with_events: bool,
                   hash_algo: str, max_model_len: int | None, seed_unset: bool,
                   use_eagle: bool = False, num_prefill_lookahead: int = 0,
                   num_hash_lookahead_tokens: int = 0,
                   admission: tuple[int, int | None, int] | None = None,
                   eagle_flags: int = 3, async_mode: bool = False,
                   shared_prefix_checkpoint: bool = False,
                  zeroing: bool = False) -> None:
            """A new ``Pair`` for this spec (its failure trace starts here). PYTHONHASHSEED is
            left unset (``seed_unset``) only where NONE_HASH then stays comparable: the
            deterministic default root of vllm-0.33's sha256 pair, or no oracle at all."""
            # Drawn lengths are in tokens of 4-token blocks: scaled to this block size.
            self.scale = workload_scale(block_size, info, active_profile)
            pool_tokens *= self.scale
            if max_model_len is not None:
                max_model_len *= self.scale
            num_blocks = num_reserved + max(2, pool_tokens // block_size)
            if info is not None and info.num_blocks_range is not None:
                low, high = info.num_blocks_range
                num_blocks = min(max(num_blocks, low), high)
            spec = KVCacheSpec(num_blocks=num_blocks, block_size=block_size, hash_algo=hash_algo)
            assume(info is None or info.supports(spec))
            unset = seed_unset and (random_roots or hash_algo in _UNSET_SEED_ALGOS.get(
                profile or (info.profile if info is not None else ""), ()))
            layout = functools.partial(
                spec_fields, num_blocks, block_size, group_kinds=group_kinds,
                fine_grained=fine_grained, offloads=offloads,
                knobs=knobs, checkpoints=checkpoints,
                prefill_lookahead=num_prefill_lookahead,
                hash_lookahead=num_hash_lookahead_tokens,
                eagle_flags=eagle_flags,
                profile=active_profile or "", scale=self.scale,
                hash_algo=hash_algo, enable_caching=caching,
                enable_kv_cache_events=events and with_events,
                max_model_len=max_model_len,
                pythonhashseed=None if unset else spec.pythonhashseed)
            fields = layout(eagle=use_eagle)
            if shared_prefix_checkpoint and not use_eagle and any(
                    g.kind == "mamba" for g in fields.get("kv_cache_groups", ())):
                # vLLM keeps the flag only with an EAGLE group: the engine drawing it beside a
                # Mamba group runs EAGLE (where spec_fields allows it), so the junction is
                # keyed in most of them, not one in four.
                fields = layout(eagle=True)
            #: vLLM 0.33's admission gates (None: admissions pass none): reserved_blocks.
            self.reserved: int | None = None
            if admission is not None:
                tenths, in_flight, self.reserved = admission
                if tenths:
                    fields["watermark"] = tenths / 10
                if in_flight is not None:
                    fields["max_in_flight_tokens"] = in_flight * self.scale
            # Only beside a Mamba group: vLLM's flag changes nothing elsewhere.
            if shared_prefix_checkpoint and any(
                    g.kind == "mamba" for g in fields.get("kv_cache_groups", ())):
                fields["mamba_shared_prefix_checkpoint"] = True
            if zeroing:
                fields["needs_kv_cache_zeroing"] = True
            if async_mode and async_keys_stale_checkpoints(fields):
                async_mode = False  # vLLM 0.33.0 keys a stale checkpoint state (refused)
            # A layout's group block sizes and grown pool must be declared too.
            assume(info is None or not group_kinds or info.supports(KVCacheSpec(**fields)))
            try:
                self.pair = make_pair(**fields)
            except UnsupportedSpec:
                assume(False)  # the factory declined it: draw another spec
            self.null = null_of(self.pair.spec)
            self.max_model_len = max_model_len
            caching = self.pair.spec.enable_caching  # off for an encoder-decoder layout
            self.caching = caching
            # An encoder-decoder layout's requests carry encoder tokens (as many for each,
            # as Whisper pads its input), 3 to 8 drawn tokens' worth, from the pool size.
            self.encoder = (self.scale * (3 + num_blocks % 6)
                            if has_cross_attention(self.pair.spec.groups) else 0)
            if self.encoder:
                reached["encoder_decoder"] += 1
            if any(g.kind == "mamba" for g in self.pair.spec.kv_cache_groups):
                reached["mamba"] += 1
            if self.pair.spec.use_eagle:
                reached["eagle"] += 1
                if any(g.is_eagle_group for g in self.pair.spec.kv_cache_groups):
                    reached["eagle_groups"] += 1
                    # An unflagged chunked local group beside a flagged one (caching on).
                    if caching and any(g.kind == "chunked_local_attention"
                                       for g in self.pair.spec.kv_cache_groups):
                        reached["eagle_groups_chunked_local"] += 1
            if self.pair.spec.num_prefill_lookahead > 1:
                reached["prefill_lookahead"] += 1
            if self.pair.spec.num_hash_lookahead_tokens:
                reached["hash_lookahead"] += 1
            if self.pair.spec.mamba_shared_prefix_checkpoint:
                reached["shared_prefix_checkpoint"] += 1
                if self._shared_prefix_kept():
                    reached["shared_prefix_checkpoint_kept"] += 1
            if self.pair.spec.needs_kv_cache_zeroing:
                reached["block_zeroing"] += 1
            if self.reserved is not None:
                reached["admission_gates"] += 1
            #: Asynchronous scheduling (None: off): request id -> the tokens its last step
            #: scheduled, in flight at its next step.
            self.in_flight: dict[str, int] | None = {} if async_mode else None
            if async_mode:
                reached["async_scheduling"] += 1
            if self.pair.spec.dcp_world_size > 1:
                reached["dcp"] += 1
                if any(g.kind == "mamba" for g in self.pair.spec.kv_cache_groups):
                    reached["mamba_dcp_caching_on" if caching else "mamba_dcp_caching_off"] += 1
            if self.pair.spec.prefix_match_unit is not None:
                reached["prefix_match_unit"] += 1
            reached[f"hash_algo:{hash_algo}"] += 1
            reached["caching_off" if not caching else "caching_on"] += 1
            if unset:
                reached["pythonhashseed_unset"] += 1
            if max_model_len is not None:
                reached["max_model_len"] += 1

        @rule(prefix=st.sampled_from(_PREFIXES), tail=st.lists(_TOKENS, max_size=10),
              skip_read=skip_read_draw, extra=st.sampled_from(extra_draw),
              admit_now=st.booleans(), chunk=_CHUNKS)
        def add_request(self, prefix: list[int], tail: list[int], skip_read: bool,
                        extra: str, admit_now: bool, chunk: int | None) -> None:
            """A new request; with ``admit_now`` the scheduler admits it in the same step, as
            vLLM does whenever the pool has room (free-queue order is observed right away)."""
            rid = self._add(self._scaled(prefix + tail), skip_read, extra)
            if rid is not None and admit_now:
                self._admit(rid, self._chunk(chunk))

        @precondition(lambda self: bool(self.prompts))
        @rule(data=st.data(), tail=st.lists(_TOKENS, max_size=6), admit_now=st.booleans())
        def resubmit(self, data: st.DataObject, tail: list[int], admit_now: bool) -> None:
            """A new request repeating an earlier prompt (plus a new tail), or an earlier
            request's prompt and output (the next turn of a chat): the prefix-hit path, often
            on blocks that were freed and sit in the free queue, or were evicted and reused."""
            prompt = data.draw(st.sampled_from(self.prompts), label="earlier prompt")
            rid = self._add(prompt + self._scaled(tail), False, "")
            if rid is not None and admit_now:
                self._admit(rid, None)

        @rule(prefix=st.sampled_from(_PREFIXES), tail=st.lists(_TOKENS, min_size=8, max_size=24),
              chunk=st.integers(1, 8), lookahead=lookahead_draw)
        def long_prefill(self, prefix: list[int], tail: list[int], chunk: int,
                         lookahead: int) -> None:
            """A long prompt prefilled ``chunk`` tokens a step (a token budget), each step
            after the first reserving ``lookahead`` speculative slots (a draft model): the
            slots reach into prompt blocks not computed yet, which must not be cached before
            they are."""
            rid = self._add(self._scaled(prefix + tail), False, "")
            if rid is None:
                return
            chunk, lookahead = self._tokens(chunk), self._tokens(lookahead)
            self._admit(rid, chunk)
            while rid in self.running and self._in_prefill(rid):
                self._step(rid, chunk, lookahead)

        @precondition(lambda self: bool(self.running))
        @rule(data=st.data(), chunk=_CHUNKS)
        def duplicate(self, data: st.DataObject, chunk: int | None) -> None:
            """A request with the same prompt and extra keys as a running one (parallel
            sampling, or the same question twice), preferably one still in its chunked
            prefill: it hits exactly the blocks already computed and cached, no further."""
            rids = [r for r in self.running if self._in_prefill(r)] or self.running
            view = self.pair.impl.views[data.draw(st.sampled_from(rids), label="original")]
            rid = f"r{self.next_id}"
            self.next_id += 1
            self.pair.apply(add(rid, view.prompt_token_ids, **same_extras(view)))
            self.pending.append(rid)
            self._admit(rid, self._chunk(chunk))

        @rule(chain=st.integers(1, 3), full=st.booleans())
        def fill_pool(self, chain: int, full: bool) -> None:
            """Eviction under pool pressure, then a prefix comes back. A request of fresh
            tokens (``chain`` full blocks and one token) runs and finishes: its cached blocks
            wait at the tail of the free queue, last block first. A long request of tokens
            nobody shares takes every other free block (``full``: every one, evicting those
            too) and finishes. Then the first request's prompt comes back: its blocks are now
            the head of the queue, the long request's behind them, so its hits touch the head
            and its new block evicts one of the long request's."""
            block_size = self.pair.spec.block_size
            base = 100_000 + 1_000 * self.next_id  # token ids no other request uses
            # In drawn tokens (one token of a block: ``scale`` at a large declared size).
            drawn = [base + i for i in range(chain * (block_size // self.scale) + 1)]
            prompt = self._scaled(drawn)
            if not self._run_and_finish(prompt):
                return
            size = self._observer().manager.num_free_blocks() - (0 if full else chain)
            if size > 0:
                tokens = size * block_size
                if self.max_model_len is not None:  # as long as the engine allows
                    tokens = min(tokens, self.max_model_len - self.scale)
                self._run_and_finish([base + 999] * tokens)
            rid = self._add(prompt, False, "")
            if rid is not None:
                self._admit(rid, None)

        if group_kinds:  # a rule only here: single-group examples stay the same
            @rule(data=st.data())
            def window_rehit(self, data: st.DataObject) -> None:
                """A long prompt prefilled a chunk a step, then a decode step: sliding windows
                and chunks drop its early blocks as it runs (cached, in the free queue). Fresh
                tokens take every free block but a few (evicting the oldest of the dropped
                ones) and finish, then a request sharing the prompt up to a few blocks before
                its end comes back while it still runs: each group holds a different part of
                the prefix, so the common hit length is cut group by group, and iterated to a
                fixed point under vllm-0.33
                (docs/semantics.md#hits-per-group-and-the-common-hit-length). One argument
                (Hypothesis tries rules of fewer arguments first): the rest is drawn here."""
                prefix = data.draw(st.sampled_from(_PREFIXES), label="prefix")
                tail = data.draw(st.lists(_TOKENS, min_size=8, max_size=24), label="tail")
                chunk = data.draw(st.integers(4, 16), label="chunk")
                spare = data.draw(st.integers(0, 8), label="spare blocks")
                cut = data.draw(st.integers(0, 6), label="blocks cut")
                prompt = self._scaled(prefix + tail)
                rid = self._add(prompt, False, "")
                if rid is None:
                    return
                self._admit(rid, self._tokens(chunk))
                while rid in self.running and self._in_prefill(rid):
                    self._step(rid, self._tokens(chunk), 0)
                if rid in self.running:  # a decode step frees what the last chunk left behind
                    self._step(rid, self._tokens(1), 0)
                if rid not in self.running:
                    return
                block_size = self.pair.spec.block_size
                base = 200_000 + 1_000 * self.next_id  # token ids no other request uses
                free_blocks = self._observer().manager.num_free_blocks() - spare
                blocks = free_blocks // len(self.pair.spec.groups)
                if blocks > 0:
                    tokens = blocks * block_size
                    if self.max_model_len is not None:
                        tokens = min(tokens, self.max_model_len - self.scale)
                    self._run_and_finish([base + i for i in range(tokens)])
                keep = max(1, len(prompt) - cut * block_size)
                again = self._add([*prompt[:keep], base + 999], False, "")
                if again is not None:
                    self._admit(again, None)

        if fine_grained:  # a rule only here: the other examples stay the same
            @rule(data=st.data())
            def partial_hit_share(self, data: st.DataObject) -> None:
                """Fine-grained partial hits (``kvcheck.conformance.fine_grained``): a prompt
                prefilled up to its last hash boundary, then the rest and two decode steps (vLLM
                0.33 caches that boundary's state, inside a Mamba block, and copies it before
                the request goes on), then a request sharing the prompt up to that boundary
                or a few tokens past it: its hit ends inside a block, which is copied on write.
                One argument (Hypothesis tries rules of fewer arguments first)."""
                hashed = self.pair.impl.fine_hash
                if not hashed:
                    return  # not a fine-grained layout
                prefix = data.draw(st.sampled_from(_PREFIXES), label="prefix")
                tail = data.draw(st.lists(_TOKENS, min_size=1, max_size=10), label="tail")
                past = data.draw(st.integers(0, hashed - 1), label="tokens shared past it")
                prompt = self._scaled(prefix + tail)
                # 0 (admitted whole) when the prompt is no longer than its lookahead.
                boundary = last_hash_boundary(len(prompt), hashed,
                                              self.pair.spec.num_hash_lookahead_tokens)
                rid = self._add(prompt, False, "")
                if rid is None:
                    return
                self._admit(rid, boundary or None)
                if rid in self.running and self._in_prefill(rid):
                    self._step(rid, len(prompt) - boundary, 0)
                for _ in range(2):
                    if rid in self.running:
                        self._step(rid, self._tokens(1), 0)
                again = self._add([*prompt[:min(boundary + past, len(prompt))], 150_001],
                                  False, "")
                if again is not None:
                    self._admit(again, None)

        if shared_prefix and fine_grained:  # a rule only here: the other examples stay the same
            @rule(data=st.data())
            def junction_share(self, data: st.DataObject) -> None:
                """The Mamba shared-prefix checkpoint (``mamba_shared_prefix_checkpoint``;
                docs/semantics.md#the-shared-prefix-checkpoint): a prompt of fresh tokens
                admitted whole and freed (Mamba keys only its checkpoint), a sibling sharing
                part of it prefilled a hash block a step (so one chunk ends at its lookup's
                junction, as vLLM's scheduler ends one there), then another sibling sharing
                the same part admitted whole: it hits the junction's state where the flag is
                kept. One argument (Hypothesis tries rules of fewer arguments first)."""
                hashed = self.pair.impl.fine_hash
                if not hashed or not self.pair.spec.mamba_shared_prefix_checkpoint:
                    return  # not a fine-grained layout with the flag
                length = data.draw(st.integers(4, 24), label="prompt length")
                share = data.draw(st.integers(1, length), label="tokens shared")
                tail = data.draw(st.integers(1, 8), label="sibling tail")
                base = 400_000 + 1_000 * self.next_id  # token ids no other request uses
                prompt = self._scaled([base + i for i in range(length)])
                if not self._run_and_finish(prompt):
                    return
                shared = prompt[:share * self.scale]
                sibling = self._add([*shared, *self._scaled([base + 500 + i
                                                             for i in range(tail)])], False, "")
                if sibling is None:
                    return
                self._admit(sibling, hashed)
                while sibling in self.running and self._in_prefill(sibling):
                    self._step(sibling, hashed, 0)
                again = self._add([*shared, base + 999], False, "")
                if again is not None:
                    self._admit(again, None)
                    reached["shared_prefix_junction"] += 1
                    if self._shared_prefix_kept():
                        reached["shared_prefix_junction_kept"] += 1

            def _shared_prefix_kept(self) -> bool:
                """Whether vLLM keeps the engine's flag (for the counts only): an EAGLE
                group, fine-grained hits, no re-prefillable tail."""
                spec = self.pair.spec
                return (bool(self.pair.impl.fine_hash) and spec.num_prefill_lookahead <= 1
                        and (spec.use_eagle or any(g.is_eagle_group
                                                   for g in spec.kv_cache_groups)))

        if offloads and fine_grained:  # a rule only here: the other examples stay the same
            @rule(length=st.integers(2, 40))
            def producer_finishes(self, length: int) -> None:
                """Boundary-state hand-offs (``kvcheck.conformance.boundary_offloads``): a
                prompt of tokens no other request uses, prefilled exactly to its last hash
                boundary (often inside a Mamba block, where vLLM 0.33 keys that state), then
                freed before its next step: the driver asks for its partial tail, which its
                own table block still holds."""
                hashed = self.pair.impl.fine_hash
                if not hashed:
                    return  # not a fine-grained layout
                base = 300_000 + 1_000 * self.next_id  # token ids no other request uses
                prompt = self._scaled([base + i for i in range(length)])
                boundary = last_hash_boundary(len(prompt), hashed,
                                              self.pair.spec.num_hash_lookahead_tokens)
                if not boundary:  # no boundary before the lookahead tokens
                    return
                rid = self._add(prompt, False, "")
                if rid is None:
                    return
                self._admit(rid, boundary)
                if rid in self.running:
                    self._free(rid)

        def _run_and_finish(self, prompt: list[int]) -> bool:
            """A request admitted whole and freed at once (not resubmitted later); whether
            it got its blocks."""
            rid = self._add(prompt, False, "", remember=False)
            if rid is None:
                return False
            self._admit(rid, None)
            if rid not in self.running:
                return False
            self.pair.apply(free(rid))
            self.running.remove(rid)
            return True

        def _add(self, prompt: list[int], skip_read: bool, extra: str,
                 remember: bool = True) -> str | None:
            """Add a request (None: an empty prompt, or one the engine's max_model_len
            rejects, as vLLM does: it must leave room for one output token)."""
            if not prompt or (self.max_model_len is not None
                              and len(prompt) >= self.max_model_len):
                return None
            if remember:
                self.prompts.append(prompt)
            rid = f"r{self.next_id}"
            self.next_id += 1
            kwargs: RequestExtras = {"skip_read": skip_read} if skip_read else {}
            if self.encoder:
                kwargs["encoder"] = self.encoder
            # Only the kinds the design declares (extra_draws still draws the others when
            # there are none, so that the examples stay the same).
            extra = extra if extra in drawn_extras else ""
            if extra == "salt":
                kwargs["salt"] = "tenant-a"
            elif extra == "lora":
                kwargs["lora"] = ("adapter", 1, "/lora/adapter")
            elif extra == "mm" and len(prompt) >= 3 * self.scale:
                s = self.scale  # an image of up to one 4-token block's worth, from token 1
                kwargs["mm"] = [("img0", s, min(4 * s, len(prompt) - s))]
            self.pair.apply(add(rid, prompt, **kwargs))
            self.pending.append(rid)
            return rid

        @precondition(lambda self: bool(self.pending))
        @rule(data=st.data(), chunk=_CHUNKS)
        def admit(self, data: st.DataObject, chunk: int | None) -> None:
            rid = data.draw(st.sampled_from(self.pending), label="pending request")
            self._admit(rid, self._chunk(chunk))

        def _admit(self, rid: str, chunk: int | None) -> None:
            """Schedule a pending request: prefix lookup, then its first chunk (or all)."""
            view = self.pair.impl.views[rid]
            queue = self._free_queue()
            gates: dict[str, bool | int | list[int]] | None = None
            if self.reserved is not None:  # as vLLM 0.33's scheduler admits
                gates = {"full_sequence_must_fit": True}
                if self.reserved:
                    gates["reserved_blocks"] = self.reserved
                if not self.running:
                    gates["has_scheduled_reqs"] = False
            got = self.pair.apply(schedule(rid, chunk, gates=gates))
            if not self._allocated(got):
                return
            self.pending.remove(rid)
            self.running.append(rid)
            if self.in_flight is not None:  # the admission's tokens: in flight at its next step
                self.in_flight[rid] = (self.pair.impl.views[rid].num_computed_tokens
                                       - (got["hits"][1] if "hits" in got else 0))
            hits = self._ids(got["hits"][0]) if "hits" in got else []
            reached["preempt_resume" if view.output_token_ids else "admitted"] += 1
            if self._in_prefill(rid):
                reached["chunked_prefill"] += 1
            if view.skip_reading_prefix_cache:
                reached["skip_read"] += 1
            for key, value in (("salt", view.cache_salt), ("lora", view.lora),
                               ("mm", view.mm_features)):
                if value:
                    reached[f"extra_keys:{key}"] += 1
            if hits:
                reached["prefix_hit"] += 1
                if self.pair.spec.use_eagle:
                    reached["eagle_hit"] += 1  # a hit that dropped its last block
                if self.pair.impl.fine and any(
                        got["hits"][1] % self.pair.spec.group_block_size(g)
                        for g, ids in enumerate(got["hits"][0]) if ids):
                    reached["fine_grained_partial_hit"] += 1  # a hit ending inside a block
                self.hit_blocks.update(hits)
                if not set(hits).isdisjoint(self._held_by_others(rid)):
                    reached["shared_block_hit"] += 1  # a hit another running request holds
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
            answer = got.get("new")
            if answer is None:
                reached["allocation_refused"] += 1
                return False
            new = self._ids(answer)
            self.handed_out.update(new)
            if not self.hit_blocks.isdisjoint(new):
                # a block that was a hit (cached) handed out as new: its content evicted (or
                # dropped by a reset)
                reached["cached_block_evicted"] += 1
                self.hit_blocks.difference_update(new)
            if self._observer().manager.num_free_blocks() == 0:
                reached["full_pool"] += 1
            return True

        def _held_by_others(self, rid: str) -> set[int]:
            """The blocks the running requests other than ``rid`` hold (every group's)."""
            side = self._observer()
            return {b for other, table in side.tables().items() if other != rid
                    for b in self._ids(table)}

        def _ids(self, answer: Sequence[Sequence[int]]) -> list[int]:
            """An answer's or a table's block ids (``answer_block_ids`` for this engine)."""
            return answer_block_ids(answer, self.null)

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
            self._step(rid, self._tokens(num_tokens), self._tokens(lookahead))

        @precondition(lambda self: bool(self.running))
        @rule(data=st.data(), lookahead=lookahead_draw)
        def schedule_all(self, data: st.DataObject, lookahead: int) -> None:
            """A scheduler step over every running request, in admission order: chunked
            prefills take their next chunk, the others decode; each reserves ``lookahead``
            speculative slots, as vLLM does for all running requests when a draft model is
            configured."""
            for rid in list(self.running):
                if rid in self.running:  # not preempted to make room for an earlier one
                    num_tokens = data.draw(st.integers(1, 6), label=f"tokens for {rid}")
                    self._step(rid, self._tokens(num_tokens), self._tokens(lookahead))

        def _tokens(self, n: int) -> int:
            """A drawn length (decode step, speculative slots) at this block size."""
            return n * self.scale

        def _chunk(self, chunk: int | None) -> int | None:
            """A drawn prefill chunk (None: the rest of the prompt) at this block size."""
            return None if chunk is None else chunk * self.scale

        def _scaled(self, tokens: list[int]) -> list[int]:
            """Drawn tokens (a prompt, a tail) at this block size (``scaled_tokens``)."""
            return scaled_tokens(tokens, self.scale)

        def _in_prefill(self, rid: str) -> bool:
            view = self.pair.impl.views[rid]
            return view.num_computed_tokens < view.num_tokens

        def _step(self, rid: str, num_tokens: int, lookahead: int) -> None:
            view = self.pair.impl.views[rid]
            prefill = view.num_computed_tokens < view.num_tokens
            if not multi_token and not prefill:
                num_tokens = 1  # a decode step of one token: all the design promises
            if not prefill and self.max_model_len is not None:
                room = self.max_model_len - view.num_tokens
                if room <= 0:  # the request reached max_model_len: it finishes
                    reached["finished_at_max_model_len"] += 1
                    self._free(rid)
                    return
                num_tokens = min(num_tokens, room)
            # Asynchronous scheduling: the previous step's tokens are still in flight.
            in_flight = 0 if self.in_flight is None else self.in_flight.get(rid, 0)
            gates: dict[str, bool | int | list[int]] | None = (
                {"num_in_flight_tokens": in_flight} if in_flight else None)
            op = (schedule(rid, num_tokens, lookahead, gates=gates) if prefill
                  else decode(rid, num_tokens, lookahead, gates=gates))
            computed = view.num_computed_tokens
            # As vLLM's scheduler: when the pool is short, preempt the running request admitted
            # last (recompute: freed, resumed later with its output) and try again, until the
            # step fits or the request itself was the one preempted.
            while not self._allocated(self.pair.apply(op)):
                victim = self.running[-1]
                reached["preempted_for_room"] += 1
                self._free(victim, preempt=True)
                if victim == rid:
                    return
                # The tokens a refused decode sampled stay in the request: the retry only
                # schedules them (sampling again would lengthen the request twice).
                op = schedule(rid, num_tokens, lookahead, gates=gates)
            if self.in_flight is not None:
                if in_flight:
                    reached["async_in_flight_step"] += 1
                self.in_flight[rid] = self.pair.impl.views[rid].num_computed_tokens - computed
            if not lookahead:
                return
            after = self.pair.impl.views[rid]
            computed, block_size = after.num_computed_tokens, self.pair.spec.block_size
            if not prefill:
                reached["lookahead_decode"] += 1
            elif self.caching and (min(computed + lookahead, after.num_tokens) // block_size
                                   > computed // block_size):
                # The speculative slots fill a block whose prompt tokens are not computed yet:
                # caching it now would let another request hit KV never written.
                reached["lookahead_chunked_prefill"] += 1

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
            self._admit(rid, self._chunk(chunk))

        def _free(self, rid: str, preempt: bool = False) -> None:
            """Free ``rid``; ``preempt``: inside the step, to make room (``FreeOp``)."""
            view = self.pair.impl.views[rid]
            # Asynchronous scheduling: freed while its last step is in flight (a KV
            # producer's finalize_partial_tail_offloads then finalizes nothing).
            in_flight = 0 if self.in_flight is None else self.in_flight.pop(rid, 0)
            self.pair.apply(free(rid, in_flight=in_flight, preempt=preempt))
            if rid in self.running:
                self.running.remove(rid)
                self.pending.append(rid)  # a freed request may come back (preemption)
                if view.output_token_ids:  # its prompt and answer: a later turn's prefix
                    self.prompts.append(list(view.token_ids))

        if "reset_prefix_cache" in caps:
            @rule(dice=_coin_index(4), drain=st.booleans())
            def reset_cache(self, dice: int, drain: bool) -> None:
                """Rarely, reset the prefix cache: refused while requests hold blocks; with
                ``drain`` every request is then freed (as between benchmark runs) and the reset
                asked again, which succeeds."""
                # Rare (1 in 4): a rule without arguments is cheap for Hypothesis to pick, and
                # resetting often would leave nothing to hit (3, not 0: what shrinking favours).
                if dice != 3:
                    return
                if self.running or not drain:
                    self._reset()  # refused while requests hold blocks (none: succeeds)
                if drain:
                    for rid in list(self.running):
                        self._free(rid)
                    self._reset()

        if "pinning_lookup" in caps:  # a rule only here: other designs' examples stay the same
            @precondition(lambda self: bool(self.pending))
            @rule(data=st.data())
            def look_only(self, data: st.DataObject) -> None:
                """A scheduler that looks a waiting request up and then schedules nothing
                for it (its token budget ran out): the lookup's pins are released
                (``pinning_lookup``), and the blocks they held are free again."""
                rid = data.draw(st.sampled_from(self.pending), label="pending request")
                got = self.pair.apply(lookup(rid))
                if "hits" in got and self._ids(got["hits"][0]):
                    reached["pinned_lookup_released"] += 1

        def _reset(self) -> None:
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
        # No explain phase: it re-runs each span of the shrunk workload many times (minutes
        # for a workload that fills the pool) to print which lines only failures ran.
        phases = tuple(p for p in settings.phases if p is not Phase.explain)
        run_state_machine_as_test(factory,  # type: ignore[arg-type]
                                  settings=Settings(settings, stateful_step_count=step_count,
                                                    phases=phases))
    finally:
        _forget_machine_class(KVWorkload)
        REACHED.update(reached)
        if stats is not None:
            stats.update(reached)


def _forget_machine_class(machine: type[RuleBasedStateMachine]) -> None:
    """Drop what Hypothesis caches for ``machine``, a class made for one run.

    Hypothesis keeps each machine class's rules in a dict keyed by the class, and the
    sorted rule strategy in an LRU cache (128 classes): a class of ``run_workload_machine``,
    its rules closing over the run's pairs, implementation and settings (and, in a pytest
    run, through the test module's loader, the whole session), would live as long as the
    process. Both are private to Hypothesis: a release that renamed them leaves the classes
    alive, no more (``tests/conformance/test_workload_coverage.py`` notices)."""
    per_class = getattr(RuleBasedStateMachine, "_setup_state_per_class", None)
    if isinstance(per_class, dict):
        per_class.pop(machine, None)
    setup_for = getattr(vars(RuleStrategy).get("_setup_for"), "__func__", None)
    cache_clear = getattr(setup_for, "cache_clear", None)
    if cache_clear is not None:  # an LRU cache has no per-key removal: the whole, then
        cache_clear()
