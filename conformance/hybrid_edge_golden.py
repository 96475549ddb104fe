"""Golden scenarios of hybrid layouts that mutation testing asked for (docs/mutation.md): vLLM
0.33's paths that the other goldens and the random workloads did not reach, each pinned by
one scenario recorded from vLLM 0.33.0: sparse retention with EAGLE where a prompt ends on a
scheduler block (a resend's and an extension's replay boundaries differ) or at block size 1
(the boundaries reach 0), a Mamba group's copy-on-write and partial tail in chunked prefills,
a preempted request admitted again under its id (Mamba speculative blocks, prefill
checkpoints), prefill checkpoints on an alignment finer than the Mamba block, external tokens
beside a window, beside a Mamba group (its table: the external state block, nulls, the running
state's block) and beside two full-attention groups of different block sizes, multi-token
decodes around a reset with fine-grained hits, speculative slots beside a full-attention block
coarser than the hash block, the full-sequence gate with prefill checkpoints, multi-module MTP
at block size 1 (one group, and beside a window), vLLM 0.33's per-group EAGLE flag on a lone
group and on one member of a spec group, a preempted request and an asynchronous load admitted
through the full-sequence gate beside two Mamba groups (a hit block one group releases handed to
another as a new block in the same call), a window listed before full attention, and an
asynchronous load after a hit ending inside a Mamba block (its copy-on-write block replaces the
hit in place, outside the answer); and, on pools of 24 blocks, a lone Mamba group refusing hits on
a block cached in the same step, one request's pending prefill checkpoint kept apart from
another's, a short prompt that caches no Mamba block beside speculative blocks, and a gated step
that reserves no checkpoint beside a second Mamba group; and, asked for by later mutation runs,
tokens in flight beside a window of one token, ungated and through the gates, an
asynchronous load through the full-sequence gate, an encoder-decoder model (caching off) with a
reserve of blocks and with external tokens beside a window, Mamba prefill checkpoints on a
chunk one token short of the prefill's end and on a resumed request's, and EAGLE's drops in
0.33's fixed point after evictions (``evict_blocks``), and a prefix-cache reset between
partial-block keys of the same blocks; and external tokens past a hit ending inside a Mamba
block (no copy-on-write), fine-grained hits after one block of a prompt was evicted (the
full-block scan stops at it; the partial probe stays inside it), the admission caps of a window
(its ``w - 1`` tokens, MTP's retained tokens) and of chunked local attention without a
``max_model_len`` under the full-sequence gate, a partial-block key at a prompt's first token
(hash block 1), EAGLE's drop rounded down to the scheduler block beside a window of another
block size, no prefill checkpoint from a query that starts after external tokens, and a request
allocated from a first step that adds no Mamba block; and a hit trimmed for a load (its Mamba hit
a null) beside a state block the retention mask left unkeyed in the same step, the shared-prefix
junction (none at token 1 without a lookup, none where an asynchronous load ends, one at a resumed
request's prompt end), a copy-on-write block counted beside a new Mamba block, and prefill
checkpoints that are transient inside a block, kept at a retained segment end and placed at
token 1. Two scenarios are vLLM 0.10.2's
(``profile``): chunked local attention freeing the blocks of past chunks, caching off, and
keeping the last cached block.

``recorded`` is what vLLM's own ``KVCacheManager`` answered to each op, replayed through
kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)``, sha256, ``PYTHONHASHSEED=0``, on
vLLM 0.33.0; the driver marks the scheduler steps and drains the copies where vLLM's scheduler
does) and copied here as literals, as in ``kvcheck.conformance.eagle_golden``: each op's
``StepResult`` (hits and new block ids per group, 0 the null block; ``new`` None: refused;
``{}`` for an op that calls nothing), every ``(src, dst)`` copy drained, in order, and the
free queue after the last op, head first. The reference answers the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.eagle_golden import Recorded
from kvcheck.conformance.ops import Op, add, cache, decode, evict, free, reset, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec
from kvcheck.reference_impl.profiles import get_profile

__all__ = ["HYBRID_EDGE_SCENARIOS", "HybridEdgeScenario"]


@dataclass(frozen=True)
class HybridEdgeScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included) with prefix caching
    on (off where ``caching`` is False), under ``profile`` (vLLM 0.33 by default):
    ``groups`` the ``kv_cache_groups`` (``()``: one group), ``block_size`` the spec's,
    ``use_eagle``, ``retention`` (``prefix_cache_retention_interval``),
    ``num_prefill_lookahead`` (multi-module MTP) and ``max_model_len`` as named,
    ``shared_prefix_checkpoint`` (``mamba_shared_prefix_checkpoint``), ``caching``
    (``enable_caching``), ``max_in_flight_tokens`` (the admission caps' in-flight tokens);
    ``recorded`` the answers of the vLLM release of ``profile`` (0.33.0 unless it says
    ``vllm-0.10``: 0.10.2)."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    ops: tuple[Op, ...]
    use_eagle: bool
    retention: int | None
    block_size: int
    recorded: Recorded
    num_prefill_lookahead: int = 0
    max_model_len: int | None = None
    shared_prefix_checkpoint: bool = False
    caching: bool = True
    max_in_flight_tokens: int | None = None
    profile: str = "vllm-0.33"

    @property
    def source(self) -> str:
        """The vLLM release ``recorded`` comes from, as messages name it."""
        return f"vLLM {get_profile(self.profile).vllm_version}"

    def spec(self) -> KVCacheSpec:
        """The scenario's ``KVCacheSpec`` under its ``profile``."""
        return KVCacheSpec(num_blocks=self.num_blocks, block_size=self.block_size,
                           profile=self.profile, use_eagle=self.use_eagle,
                           kv_cache_groups=self.groups,
                           prefix_cache_retention_interval=self.retention,
                           num_prefill_lookahead=self.num_prefill_lookahead,
                           max_model_len=self.max_model_len,
                           mamba_shared_prefix_checkpoint=self.shared_prefix_checkpoint,
                           enable_caching=self.caching,
                           max_in_flight_tokens=self.max_in_flight_tokens)


_P = tuple(range(100, 170))


def _basic(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt in chunks of 9 and the rest, decoded; an extension, a resend
    and a longer extension in chunks of 5 and the rest."""
    p = _P[:n]
    return (add("a", p), schedule("a", 9), schedule("a"), decode("a"), decode("a", 3),
            add("b", (*p, 7, 7, 7)), schedule("b"), decode("b"), free("a"), add("c", p),
            schedule("c"), free("b"), free("c"), add("d", (*p, 7, 7, 7, 8)), schedule("d", 5),
            schedule("d"), decode("d", 2), free("d"))


def _preempted(n: int) -> tuple[Op, ...]:
    """A request freed after five decode tokens (preempted) and admitted again with them under
    its id, in chunks of 6 and the rest, beside a sibling; then a shorter prompt under that id."""
    p = _P[:n]
    return (add("a", p), schedule("a"), decode("a", 5), free("a"),
            add("a", (*p, 1, 2, 3, 4, 5)), schedule("a", 6), schedule("a"), decode("a"),
            add("b", (*p, 1, 2, 3)), schedule("b"), free("a"), free("b"),
            add("a", p[:n - 3]), schedule("a"), decode("a"), free("a"))


def _chunked(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt in chunks of 3, 5, 8 and the rest; a resend in chunks of 4 and
    the rest; a request diverging half-way; a resend in chunks of 1 and the rest."""
    p = _P[:n]
    return (add("a", p), schedule("a", 3), schedule("a", 5), schedule("a", 8), schedule("a"),
            decode("a"), add("b", p), schedule("b", 4), schedule("b"), free("a"),
            add("c", (*p[:n // 2], 9, 9)), schedule("c"), free("b"), free("c"), add("e", p),
            schedule("e", 1), schedule("e"), free("e"))


def _siblings(n: int) -> tuple[Op, ...]:
    """Siblings of an ``n``-token prompt diverging 2, 5 and 7 tokens before its end, an
    extension, and a longer extension after all are freed."""
    p = _P[:n]
    return (add("a", p), schedule("a"), decode("a"), decode("a"),
            add("b", (*p[:n - 2], 7, 7, 7)), schedule("b"), add("c", (*p, 9)), schedule("c"),
            add("d", p[:n - 5]), schedule("d"), decode("d", 4), free("a"), free("b"),
            add("e", (*p[:n - 7], *[3] * 9)), schedule("e", 6), schedule("e"), free("c"),
            free("d"), free("e"), add("f", (*p, 9, 1, 1, 1, 1)), schedule("f"), free("f"))


def _external(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt computed and freed; extensions of it (one diverging 3 tokens
    before its end) with 6, 9 and 13 external tokens after their local hits."""
    p = _P[:n]
    return (add("a", p), schedule("a"), decode("a"), free("a"), add("b", (*p, *[5] * 6)),
            schedule("b", external=6), decode("b"), add("c", (*p[:n - 3], *[8] * 8)),
            schedule("c", external=9), free("b"), free("c"), add("d", (*p, *[2] * 12)),
            schedule("d", external=13), free("d"))


def _replayed(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt, a resend, extensions by 1 and 5 tokens, all freed; an extension
    by 4."""
    p = _P[:n]
    return (add("a", p), schedule("a"), decode("a"), add("b", p), schedule("b"),
            add("c", (*p, 5)), schedule("c"), add("e", (*p, 6, 6, 6, 6, 6)), schedule("e"),
            free("a"), free("b"), free("c"), free("e"), add("g", (*p, 5, 5, 5, 5)),
            schedule("g"))


def _decodes(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt decoded 1, 1, 2, 3 and 1 tokens at a time beside two extensions
    of it; a reset once one is freed; an extension after it, decoded."""
    p = _P[:n]
    return (add("a", p), schedule("a"), decode("a"), decode("a"), decode("a", 2), decode("a", 3),
            decode("a"), add("b", (*p, 200, 201)), schedule("b"), decode("b", 4), decode("b"),
            decode("b", 2), add("c", (*p, *range(200, 208))), schedule("c"), decode("c"),
            free("b"), reset(), add("d", (*p, 200)), schedule("d"), free("a"), free("c"),
            free("d"), add("e", (*p, 200, 201, 202)), schedule("e"), decode("e", 5), free("e"))


def _lookahead(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt in chunks of 5 and the rest with 3 and 2 speculative slots,
    decoded with 3; a resend with 4; an extension with 1."""
    p = _P[:n]
    return (add("a", p), schedule("a", 5, lookahead=3), schedule("a", lookahead=2),
            decode("a", 1, lookahead=3), decode("a", 2, lookahead=3), add("b", p),
            schedule("b", lookahead=4), decode("b", lookahead=4), free("a"), free("b"),
            add("c", (*p, 1, 1)), schedule("c", lookahead=1), free("c"))


#: The full-sequence gate (``allocate_slots(..., full_sequence_must_fit=True)``).
_GATES: dict[str, bool | int | list[int]] = {"full_sequence_must_fit": True}


def _gated(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt and two extensions, in chunks, each step through the
    full-sequence gate (``full_sequence_must_fit``; one decode with a reserve of 1 block)."""
    p = _P[:n]
    return (add("a", p), schedule("a", 6, gates=_GATES), schedule("a", gates=_GATES),
            decode("a", gates=_GATES), add("b", (*p, 1, 2)), schedule("b", 5, gates=_GATES),
            schedule("b", gates=_GATES), add("c", (*p, *[3] * 10)), schedule("c", 7, gates=_GATES),
            free("a"), schedule("c", gates=_GATES),
            decode("c", gates={**_GATES, "reserved_blocks": 1}), free("b"), free("c"),
            add("d", (*p, 1, 2, 4)), schedule("d", 3, gates=_GATES), schedule("d", gates=_GATES),
            free("d"))


def _gated_preempted(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt decoded twice, freed (preempted) and admitted again with its two
    output tokens in chunks of 5 and the rest, beside an extension; then a sibling with a
    reserve of 2 blocks; every step through the full-sequence gate."""
    p = _P[:n]
    return (add("a", p), schedule("a", gates=_GATES), decode("a", gates=_GATES),
            decode("a", gates=_GATES), free("a"), add("a", (*p, 1, 2)),
            schedule("a", 5, gates=_GATES), schedule("a", gates=_GATES),
            decode("a", gates=_GATES), add("b", (*p, *range(1, 10))), schedule("b", gates=_GATES),
            free("a"), free("b"), add("c", (*p[:n - 2], *[4] * 12)),
            schedule("c", gates={**_GATES, "reserved_blocks": 2}), free("c"))


def _gated_async_load(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt computed and freed; an extension whose 7 external tokens load
    asynchronously, admitted through the full-sequence gate, then finished and decoded; a
    sibling with 5 external tokens loaded at once."""
    p = _P[:n]
    return (add("a", p), schedule("a"), free("a"), add("b", (*p, *[6] * 9)),
            schedule("b", external=7, delay=True, gates=_GATES), cache("b", n + 7),
            schedule("b", gates=_GATES), decode("b", gates=_GATES), add("c", (*p, *[6] * 9)),
            schedule("c", external=5, gates=_GATES), free("b"), free("c"))


def _async_load(n: int) -> tuple[Op, ...]:
    """An ``n``-token prompt computed and freed; an extension whose 7 external tokens load
    asynchronously, then finished and decoded; a sibling with 5 external tokens loaded at
    once; a second extension whose 2 external tokens load asynchronously and fail (only the
    prompt's ``n`` tokens are valid)."""
    p = _P[:n]
    return (add("a", p), schedule("a"), free("a"), add("b", (*p, *[6] * 9)),
            schedule("b", external=7, delay=True), cache("b", n + 7), schedule("b"),
            decode("b"), add("c", (*p, *[6] * 5)), schedule("c", external=5), decode("c", 3),
            free("b"), free("c"), add("d", (*p, 6, 6)), schedule("d", external=2, delay=True),
            cache("d", n), schedule("d"), free("d"))


def _in_flight(gates: dict[str, bool | int | list[int]]) -> tuple[Op, ...]:
    """A 6-token prompt in chunks of 2, 2 and the rest, each step after the first with the
    previous step's tokens still in flight (asynchronous scheduling), then a decode with its
    token in flight; ``gates`` on every step."""
    p = _P[:6]
    return (add("a", p), schedule("a", 2, gates=gates),
            schedule("a", 2, gates={"num_in_flight_tokens": 2, **gates}),
            schedule("a", gates={"num_in_flight_tokens": 2, **gates}),
            decode("a", gates={"num_in_flight_tokens": 1, **gates}), free("a"))


def _external_after_a_chunk(n: int, chunk: int, external: int) -> tuple[Op, ...]:
    """An ``n``-token prompt computed in a chunk of ``chunk`` tokens and the rest, decoded and
    freed; an extension of it that loads ``external`` tokens after its hits."""
    p = _P[:n]
    return (add("a", p), schedule("a", chunk), schedule("a"), decode("a"), free("a"),
            add("b", (*p, *[5] * (external + 3))), schedule("b", external=external),
            decode("b"), free("b"))


def _evicted_inside(n: int, evicted: int) -> tuple[Op, ...]:
    """An ``n``-token prompt computed in a chunk of 8 tokens and the rest, decoded and freed;
    block ``evicted`` dropped from the prefix cache (``evict_blocks``); an extension of the
    prompt."""
    p = _P[:n]
    return (add("a", p), schedule("a", 8), schedule("a"), decode("a"), free("a"),
            evict([evicted]), add("b", (*p, *[5] * 6)), schedule("b"), decode("b"), free("b"))


def _full_sequence_gated(n: int, chunk: int) -> tuple[Op, ...]:
    """An ``n``-token prompt in a chunk of ``chunk`` tokens and the rest, each step through
    the full-sequence gate (``full_sequence_must_fit``), then freed."""
    gate: dict[str, bool | int | list[int]] = {"full_sequence_must_fit": True}
    return (add("a", _P[:n]), schedule("a", chunk, gates=gate), schedule("a", gates=gate),
            free("a"))


def _chunked_local_decodes(n: int, chunk: int | None) -> tuple[Op, ...]:
    """An ``n``-token prompt (in a chunk of ``chunk`` tokens and the rest, when given), nine
    decodes; a request extending it, five decodes; both freed."""
    p = _P[:n]
    first = (schedule("a", chunk),) if chunk else ()
    return (add("a", p), *first, schedule("a"), *[decode("a")] * 9, add("b", (*p, 7, 7, 7)),
            schedule("b"), *[decode("b")] * 5, free("a"), free("b"))


def _reserve(n: int) -> dict[str, bool | int | list[int]]:
    """``reserved_blocks`` = ``n`` (vLLM 0.33's gate)."""
    return {"reserved_blocks": n}


#: vLLM 0.33.0's answers to ``_in_flight`` beside a window of one token at block size 1, the
#: same with the gates (a reserve of 0 blocks) and without.
_IN_FLIGHT_WINDOW_OF_ONE = Recorded(
    answers=({}, {"hits": ([[], []], 0), "new": [[1, 2], [3, 4]]}, {"new": [[5, 6], [7, 8]]},
             {"new": [[4, 3], [9, 10]]}, {"new": [[9], [8]]}, {}),
    copies=(),
    free_queue=(8, 10, 7, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
                29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 9, 3, 4, 6, 5, 2, 1))

#: A reserve of 0 blocks: ``allocate_slots`` through vLLM 0.33's gated path.
_RESERVE_0 = _reserve(0)

_FULL4 = KVCacheGroupSpec("full_attention", 4)
_ALIGN8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")
_CHECKPOINTS8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align",
                                 num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=4)
_CHECKPOINTS8_AT_8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align",
                                      num_prefill_checkpoint_blocks=1,
                                      prefill_checkpoint_alignment=8)
_ALIGN8_SPEC2 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align", num_speculative_blocks=2)
_ALIGN16 = KVCacheGroupSpec("mamba", 16, mamba_cache_mode="align")
_ALIGN12 = KVCacheGroupSpec("mamba", 12, mamba_cache_mode="align")
_ALIGN3 = KVCacheGroupSpec("mamba", 3, mamba_cache_mode="align")
_CHECKPOINTS1 = KVCacheGroupSpec("mamba", 1, mamba_cache_mode="align",
                                 num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
_FULL8 = KVCacheGroupSpec("full_attention", 8)
_FULL16 = KVCacheGroupSpec("full_attention", 16)
_WINDOW4_8 = KVCacheGroupSpec("sliding_window", 4, sliding_window=8)
_WINDOW4_8_EAGLE = KVCacheGroupSpec("sliding_window", 4, sliding_window=8, is_eagle_group=True)
_WINDOW6 = KVCacheGroupSpec("sliding_window", 4, sliding_window=6)
_WINDOW5 = KVCacheGroupSpec("sliding_window", 4, sliding_window=5)
_CHUNKED4 = KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=4)
_WINDOW8 = KVCacheGroupSpec("sliding_window", 8, sliding_window=8)
_WINDOW12 = KVCacheGroupSpec("sliding_window", 4, sliding_window=12)
_FULL1 = KVCacheGroupSpec("full_attention", 1)
_WINDOW1 = KVCacheGroupSpec("sliding_window", 1, sliding_window=1)
_WINDOW2 = KVCacheGroupSpec("sliding_window", 1, sliding_window=2)
_FULL2 = KVCacheGroupSpec("full_attention", 2)
_WINDOW2_AT_2 = KVCacheGroupSpec("sliding_window", 2, sliding_window=2)
_CROSS2 = KVCacheGroupSpec("cross_attention", 2)
_WINDOW4_8_FLAGGED = KVCacheGroupSpec("sliding_window", 4, sliding_window=8, is_eagle_group=True)


#: Every scenario, with what vLLM 0.33.0 answered.
HYBRID_EDGE_SCENARIOS: tuple[HybridEdgeScenario, ...] = (
    HybridEdgeScenario(
        "eagle_retention_chunked_prefill_on_a_block_boundary",
        "EAGLE and sparse retention (interval 0), full attention at 4 beside a Mamba align "
        "group at 8: a 24-token prompt, a multiple of the scheduler block, prefilled in "
        "chunks, so a resend's and an extension's replay boundaries differ; a sibling's "
        "copy-on-write block",
        (_FULL4, _ALIGN8),
        num_blocks=64, ops=_chunked(24), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3], []]},
                {"new": [[4, 5], [6]]}, {"new": [[7, 8], [9]]}, {"new": [[10], [11]]}, {},
                {"hits": ([[1, 3, 4, 5], [0, 6]], 16), "new": [[12], [13]]}, {"new": [[14], []]},
                {}, {}, {"hits": ([[1, 3], [2]], 8), "new": [[11, 9], [10]]}, {}, {}, {},
                {"hits": ([[1, 3, 4, 5, 7], [0, 0, 15]], 20), "new": None},
                {"hits": ([[1, 3, 4, 5, 7], [0, 0, 15]], 20), "new": [[10], [9]]}, {}),
            copies=((13, 15), (15, 9)),
            free_queue=(
                9, 13, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,
                52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 6, 8, 14, 12, 11, 2, 15, 10,
                7, 5, 4, 3, 1))),
    HybridEdgeScenario(
        "eagle_retention_window_with_external_tokens",
        "EAGLE and retention 0, full attention at 8 beside a window of 12 at 4: requests with "
        "external tokens after a freed prompt's hits (the window's search after EAGLE's drop, "
        "full attention's partial tail)",
        (_FULL8, _WINDOW12),
        num_blocks=80, ops=_external(23), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [4, 5, 6, 7, 8, 9]]},
                {"new": [[], []]}, {}, {},
                {"hits": ([[], []], 0), "new": [[9, 10, 11, 12], [8, 7, 13, 14, 15, 16, 17, 18]]},
                {"new": [[], []]}, {},
                {"hits": ([[], []], 0), "new": [[19, 20, 24, 25], [21, 22, 23, 26, 27, 28, 29]]},
                {}, {}, {},
                {"hits": ([[], []], 0),
                 "new": [[29, 28, 31, 32, 33], [18, 17, 16, 30, 34, 35, 36, 37, 38]]},
                {}),
            copies=(),
            free_queue=(
                38, 37, 33, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54,
                55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73,
                74, 75, 76, 77, 78, 79, 6, 5, 4, 3, 2, 1, 14, 13, 7, 8, 12, 11, 10, 9, 15,
                25, 24, 20, 19, 27, 26, 23, 22, 21, 32, 31, 28, 29, 36, 35, 34, 30, 16, 17,
                18))),
    HybridEdgeScenario(
        "eagle_retention_speculative_mamba_preempted",
        "EAGLE and retention 0, a Mamba align group with two speculative blocks: a request "
        "freed after five decode tokens (preempted) and admitted again with them, in two "
        "chunks",
        (_FULL4, _ALIGN8_SPEC2),
        num_blocks=64, ops=_preempted(24), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 7, 8, 9]]},
                {"new": [[10, 11], [12]]}, {}, {},
                {"hits": ([[], []], 0), "new": [[12, 9], [8, 7, 11]]},
                {"new": [[13, 14, 15, 16, 17, 18], [7, 11, 19]]}, {"new": [[], []]}, {},
                {"hits": ([[1, 2], [8]], 8), "new": [[20, 21, 22, 23, 24], [0, 0, 25, 26, 27]]},
                {}, {}, {},
                {"hits": ([[1, 2], [8]], 8), "new": [[27, 26, 25, 24], [0, 19, 11, 7]]},
                {"new": [[], []]}, {}),
            copies=(),
            free_queue=(
                7, 11, 19, 24, 18, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60,
                61, 62, 63, 10, 6, 5, 4, 3, 17, 16, 15, 14, 13, 9, 12, 23, 22, 21, 20, 8,
                25, 26, 27, 2, 1))),
    HybridEdgeScenario(
        "checkpoints_at_alignment_4",
        "Mamba prefill checkpoints at alignment 4 (block 8) beside full attention at 4: a "
        "13-token prompt in chunks of 9 and 4, its extensions and resend",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=64, ops=_basic(13), use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [4, 5]]}, {"new": [[6], []]},
                {"new": [[], []]}, {"new": [[7], [8]]}, {},
                {"hits": ([[1, 2], [4]], 8), "new": [[9, 10], [11]]}, {"new": [[12], [13]]}, {},
                {}, {"hits": ([[1, 2], [4]], 8), "new": [[8, 7], [14]]}, {}, {}, {},
                {"hits": ([[1, 2, 3, 10], [0, 11]], 16), "new": [[14], [7]]}, {"new": [[], []]},
                {"new": [[], []]}, {}),
            copies=(),
            free_queue=(
                7, 13, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
                31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49,
                50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 6, 5, 9, 8, 4, 11,
                14, 10, 3, 2, 1))),
    HybridEdgeScenario(
        "retention_window_siblings",
        "retention 0, full attention at 4 beside a window of 8 at 8: siblings diverging at "
        "several points of a 23-token prompt (full attention's hit cut to the scheduler block "
        "of 8)",
        (_FULL4, _WINDOW8),
        num_blocks=80, ops=_siblings(23), use_eagle=False, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9]]},
                {"new": [[], []]}, {"new": [[7], [10]]}, {},
                {"hits": ([[1, 2, 3, 4], [0, 8]], 16), "new": [[11, 12], [13]]}, {},
                {"hits": ([[1, 2, 3, 4], [0, 8]], 16), "new": [[14, 15], [16]]}, {},
                {"hits": ([[1, 2, 3, 4], [0, 8]], 16), "new": [[17], [18]]}, {"new": [[19], []]},
                {}, {}, {}, {"hits": ([[1, 2, 3, 4], [0, 8]], 16), "new": [[13, 10], [9]]},
                {"new": [[7], [20]]}, {}, {}, {}, {},
                {"hits": ([[1, 2, 3, 4], [0, 8]], 16), "new": [[20, 7, 18], [19, 17]]}, {}),
            copies=(),
            free_queue=(
                17, 18, 16, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36,
                37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55,
                56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74,
                75, 76, 77, 78, 79, 6, 5, 12, 11, 15, 14, 10, 13, 9, 7, 20, 4, 3, 2, 1, 19,
                8))),
    HybridEdgeScenario(
        "eagle_retention_mamba_partial_tail_chunked",
        "EAGLE and retention 0, full attention at 4 beside a Mamba align group at 8: a "
        "13-token prompt in chunks of 3, 5 and 5 (the Mamba partial tail's key)",
        (_FULL4, _ALIGN8),
        num_blocks=64, ops=_chunked(13), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3], []]},
                {"new": [[4, 5], [6]]}, {"new": [[], []]}, {"new": [[], []]}, {},
                {"hits": ([[1, 3], [2]], 8), "new": [[7], [8]]}, {"new": [[9], []]}, {}, {},
                {"hits": ([[], []], 0), "new": [[6, 5], [10]]}, {}, {}, {},
                {"hits": ([[1, 3], [2]], 8), "new": [[10], [8]]}, {"new": [[9], []]}, {}),
            copies=(),
            free_queue=(
                8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46,
                47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 4, 7, 5,
                6, 2, 10, 3, 1))),
    HybridEdgeScenario(
        "eagle_two_full_groups_with_external_tokens",
        "EAGLE and retention 0, full attention at 4 and at 8 beside Mamba at 16 (fine-grained "
        "hits at 4): requests with external tokens (0.33's EAGLE drop of one hash block)",
        (_FULL4, _FULL8, _ALIGN16),
        num_blocks=80, ops=_external(23), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], [], []], 0), "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9], [0, 10]]},
                {"new": [[], [], []]}, {}, {},
                {"hits": ([[], [], []], 0),
                 "new": [[10, 11, 14, 15, 16, 17, 18, 19], [12, 20, 21, 22], [13, 23]]},
                {"new": [[], [], []]}, {},
                {"hits": ([[1, 2, 3, 4], [7, 8], [13]], 16),
                 "new": [[24, 25, 26], [27, 28], [29]]},
                {}, {}, {},
                {"hits": ([[1, 2, 3, 4], [7, 8], [13]], 16),
                 "new": [[29, 23, 19, 30, 34], [31, 32, 35], [33, 36]]},
                {}),
            copies=(),
            free_queue=(
                36, 33, 35, 34, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,
                52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70,
                71, 72, 73, 74, 75, 76, 77, 78, 79, 6, 5, 9, 13, 18, 17, 16, 15, 14, 11, 10,
                22, 21, 20, 12, 26, 25, 24, 28, 27, 30, 19, 23, 29, 4, 3, 2, 1, 32, 31, 8, 7))),
    HybridEdgeScenario(
        "checkpoints_retention_preempted",
        "Mamba prefill checkpoints and retention 0: a request freed (preempted) and admitted "
        "again under the same id, then a shorter one under that id again",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=64, ops=_preempted(13), use_eagle=False, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [5, 6]]}, {"new": [[7], [8]]},
                {}, {}, {"hits": ([[1, 2, 3], [0, 5]], 12), "new": [[8, 6], [7, 9]]},
                {"new": [[], []]}, {"new": [[], []]}, {},
                {"hits": ([[1, 2, 3], [0, 5]], 12), "new": [[10], [11]]}, {}, {}, {},
                {"hits": ([[], []], 0), "new": [[11, 9, 12], [13, 14]]}, {"new": [[], []]}, {}),
            copies=((5, 7), (5, 11)),
            free_queue=(
                14, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,
                51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 4, 7, 5, 6, 8, 10, 3, 2,
                1, 13, 9, 11))),
    HybridEdgeScenario(
        "checkpoints_long_prefill",
        "Mamba prefill checkpoints at alignment 4: a 31-token prompt in chunks of 9 and 22, "
        "its extensions and resend (a checkpoint reserved for one step and released at the "
        "next)",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=64, ops=_basic(31), use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [4, 5]]},
                {"new": [[6, 7, 8, 9, 10], [0, 11]]}, {"new": [[], []]}, {"new": [[12], [13]]},
                {},
                {"hits": ([[1, 2, 3, 6], [0, 5]], 16),
                 "new": [[14, 15, 16, 17, 18], [0, 19, 20]]},
                {"new": [[], []]}, {}, {},
                {"hits": ([[1, 2, 3, 6], [0, 5]], 16), "new": [[13, 12, 21, 22], [23, 24]]}, {},
                {}, {},
                {"hits": ([[1, 2, 3, 6, 7, 8, 9, 17], [0, 0, 0, 19]], 32), "new": [[24], [22]]},
                {"new": [[], []]}, {"new": [[20], []]}, {}),
            copies=(),
            free_queue=(
                22, 20, 18, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
                41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
                60, 61, 62, 63, 4, 10, 11, 16, 15, 14, 21, 12, 13, 23, 5, 19, 24, 17, 9, 8,
                7, 6, 3, 2, 1))),
    HybridEdgeScenario(
        "eagle_retention_mamba_partial_tail_with_lookahead",
        "EAGLE and retention 0, full attention at 16 beside a Mamba align group at 8 (hash "
        "block 8): an 11-token prompt in chunks with speculative slots (the Mamba partial "
        "tail's key)",
        (_FULL16, _ALIGN8),
        num_blocks=120, ops=_lookahead(11), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[], [3]]},
                {"new": [[], []]}, {"new": [[2], []]}, {},
                {"hits": ([[], []], 0), "new": [[4], [0, 5]]}, {"new": [[], []]}, {}, {}, {},
                {"hits": ([[], []], 0), "new": [[5], [0, 4]]}, {}),
            copies=(),
            free_queue=(
                4, 5, 3, 2, 1, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
                41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
                60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78,
                79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97,
                98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112,
                113, 114, 115, 116, 117, 118, 119))),
    HybridEdgeScenario(
        "eagle_retention_fine_grained_decodes_and_reset",
        "EAGLE and retention 0, full attention and Mamba at 16 beside a window of 6 at 4 "
        "(fine-grained hits at 4): decodes of several tokens, extensions and a reset in "
        "between (the partial search from the longest candidate down)",
        (_FULL16, _ALIGN16, _WINDOW6),
        num_blocks=120, ops=_decodes(11), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], [], []], 0), "new": [[1], [2], [3, 4, 5]]},
                {"new": [[], [], []]}, {"new": [[], [], [6]]}, {"new": [[], [], []]},
                {"new": [[4], [7], [8]]}, {"new": [[], [], []]}, {},
                {"hits": ([[], [], []], 0), "new": [[5], [2], [9, 10, 11, 12]]},
                {"new": [[13], [14], [15]]}, {"new": [[], [], []]}, {"new": [[], [], []]}, {},
                {"hits": ([[], [], []], 0), "new": [[11, 2], [0, 16], [17, 18, 19, 20, 21]]},
                {"new": [[], [], []]}, {}, {'reset': False}, {},
                {"hits": ([[], [], []], 0), "new": [[15], [12], [14, 13, 22]]}, {}, {}, {}, {},
                {"hits": ([[], [], []], 0), "new": [[12], [21], [20, 16, 2, 8]]},
                {"new": [[6], [7], [4]]}, {}),
            copies=(),
            free_queue=(
                4, 8, 7, 21, 6, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37,
                38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56,
                57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75,
                76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94,
                95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110,
                111, 112, 113, 114, 115, 116, 117, 118, 119, 3, 10, 9, 19, 18, 17, 5, 1, 11,
                15, 22, 13, 14, 16, 20, 12, 2))),
    HybridEdgeScenario(
        "eagle_retention_window_decodes_and_reset",
        "EAGLE and retention 0, full attention at 4 beside a window of 8 at 8: decodes of "
        "several tokens, extensions and a reset in between (full attention's hit realigned "
        "after the drop)",
        (_FULL4, _WINDOW8),
        num_blocks=80, ops=_decodes(11), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [4, 5]]}, {"new": [[], []]},
                {"new": [[6], []]}, {"new": [[], []]}, {"new": [[7], [8]]}, {"new": [[], []]}, {},
                {"hits": ([[], []], 0), "new": [[9, 10, 11, 12], [13, 14]]},
                {"new": [[15], [16]]}, {"new": [[], []]}, {"new": [[], []]}, {},
                {"hits": ([[], []], 0), "new": [[17, 18, 19, 20, 21], [22, 23, 24]]},
                {"new": [[], []]}, {}, {'reset': False}, {},
                {"hits": ([[], []], 0), "new": [[16, 14, 25], [26, 27]]}, {}, {}, {}, {},
                {"hits": ([[], []], 0), "new": [[27, 24, 8, 5], [7, 28]]}, {"new": [[29], [30]]},
                {}),
            copies=(),
            free_queue=(
                30, 29, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
                48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66,
                67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 4, 13, 22, 15, 12, 11,
                10, 9, 6, 3, 2, 1, 21, 20, 19, 18, 17, 23, 25, 14, 16, 26, 5, 8, 24, 27, 28,
                7))),
    HybridEdgeScenario(
        "mamba_hits_below_the_full_attention_block",
        "full attention at 16 beside a Mamba align group at 8: a 24-token prompt with "
        "speculative slots, resent and extended (Mamba's hits on the hit alignment of 16)",
        (_FULL16, _ALIGN8),
        num_blocks=120, ops=_lookahead(24), use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3], [0, 4]]},
                {"new": [[], [5]]}, {"new": [[], []]}, {},
                {"hits": ([[], []], 0), "new": [[4, 6], [0, 0, 7]]}, {"new": [[], [8]]}, {}, {},
                {}, {"hits": ([[], []], 0), "new": [[8, 7], [0, 0, 0, 6]]}, {}),
            copies=(),
            free_queue=(
                6, 7, 5, 3, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
                25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
                44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62,
                63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81,
                82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100,
                101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115,
                116, 117, 118, 119, 2, 1, 4, 8))),
    HybridEdgeScenario(
        "eagle_window_beside_a_coarser_full_attention_block",
        "EAGLE, full attention at 16 beside a window of 6 at 4: a 37-token prompt with "
        "speculative slots, resent and extended (the window's reachable blocks one block past "
        "each boundary)",
        (_FULL16, _WINDOW6),
        num_blocks=120, ops=_lookahead(37), use_eagle=True, retention=None, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1], [2, 3]]},
                {"new": [[4, 5], [6, 7, 8, 9, 10, 11, 12, 13]]}, {"new": [[], [9]]},
                {"new": [[], []]}, {},
                {"hits": ([[1], [0, 0, 6, 7]], 16),
                 "new": [[3, 2], [14, 15, 16, 17, 18, 19, 20]]},
                {"new": [[], []]}, {}, {}, {},
                {"hits": ([[1], [0, 0, 6, 7]], 16), "new": [[20, 19], [9, 13, 15, 21, 22, 23]]},
                {}),
            copies=(),
            free_queue=(
                23, 13, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
                41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
                60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78,
                79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97,
                98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112,
                113, 114, 115, 116, 117, 118, 119, 11, 10, 8, 17, 16, 14, 5, 4, 12, 2, 3,
                18, 19, 20, 1, 22, 21, 15, 9, 7, 6))),
    HybridEdgeScenario(
        "mtp_window_at_block_size_1_chunked",
        "multi-module MTP (num_prefill_lookahead 2) at block size 1, full attention beside a "
        "window of 2: a 13-token prompt in chunks (the window freeing one skipped block at a "
        "time)",
        (_FULL1, _WINDOW2),
        num_blocks=24, ops=_chunked(13), use_eagle=False, retention=None, block_size=1,
        num_prefill_lookahead=2,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [4, 5, 6]]},
                {"new": [[7, 8, 9, 10, 11], [12, 13, 14, 15, 16]]},
                {"new": [[17, 18, 19, 20, 21], [22, 23, 4, 14, 13]]}, {"new": [[12], [6]]},
                {"new": [[5], [4]]}, {},
                {"hits": ([[1, 2, 3, 7, 8, 9, 10, 11, 17, 18, 19, 20],
                           [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 14]],
                          12),
                 "new": [[23], [22]]},
                {"new": [[16], [15]]}, {}, {}, {"hits": ([[], []], 0), "new": None}, {}, {}, {},
                {"hits": ([[1, 2, 3, 7, 8, 9, 10, 11, 17, 18, 19, 20],
                           [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 14]],
                          12),
                 "new": [[5], [12]]},
                {"new": [[21], [4]]}, {}),
            copies=(),
            free_queue=(
                6, 13, 16, 23, 15, 22, 21, 5, 20, 19, 18, 17, 11, 10, 9, 8, 7, 3, 2, 1, 4,
                12, 14))),
    HybridEdgeScenario(
        "checkpoints_beside_a_window_through_the_gates",
        "Mamba prefill checkpoints and retention 0 beside a window of 8 at 4, on a pool of 24 "
        "blocks: chunks admitted through the full-sequence gate (the checkpoint block each "
        "chunk reserves counted at admission)",
        (_FULL4, _WINDOW4_8, _CHECKPOINTS8),
        num_blocks=24, ops=_gated(13), use_eagle=False, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], [], []], 0), "new": [[1, 2], [3, 4], [5]]},
                {"new": [[6, 7], [8, 9], [10]]}, {"new": [[], [], []]}, {},
                {"hits": ([[], [], []], 0), "new": [[3, 11], [12, 13], [14]]},
                {"new": [[15, 16], [17, 18], [19]]}, {}, {"hits": ([[], [], []], 0), "new": None},
                {}, {"hits": ([[], [], []], 0), "new": None},
                {"hits": ([[], [], []], 0), "new": None}, {}, {}, {},
                {"hits": ([[], [], []], 0), "new": [[19], [18], [12]]},
                {"new": [[16, 10, 9], [7, 20, 21], [22]]}, {}),
            copies=(),
            free_queue=(
                22, 21, 18, 23, 5, 6, 2, 1, 8, 4, 15, 11, 3, 17, 13, 14, 9, 10, 16, 19, 20,
                7, 12))),
    HybridEdgeScenario(
        "mtp_one_group_at_block_size_1_replayed",
        "multi-module MTP (num_prefill_lookahead 2), one group at block size 1: a 24-token "
        "prompt resent and extended (the last tokens cached a step later, at the finalized "
        "length)",
        (),
        num_blocks=24, ops=_replayed(24), use_eagle=False, retention=None, block_size=1,
        num_prefill_lookahead=2,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[]], 0), "new": None}, {"hits": ([[]], 0), "new": [[1]]}, {},
                {"hits": ([[]], 0), "new": None}, {}, {"hits": ([[]], 0), "new": None}, {},
                {"hits": ([[]], 0), "new": None}, {}, {}, {}, {}, {},
                {"hits": ([[]], 0), "new": None},),
            copies=(),
            free_queue=(
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                22, 23))),
    HybridEdgeScenario(
        "mamba_with_external_tokens",
        "full attention at 4 beside a Mamba align group at 8: requests with external tokens "
        "after local hits; the Mamba table holds its external state block, then nulls, then "
        "the running state's block",
        (_FULL4, _ALIGN8),
        num_blocks=64, ops=_external(24), use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 7]]},
                {"new": [[8], [9]]}, {}, {},
                {"hits": ([[1, 2, 3, 4, 5, 6], [0, 0, 7]], 24), "new": [[9, 8], [10]]},
                {"new": [[], []]}, {},
                {"hits": ([[], []], 0), "new": [[11, 12, 13, 15, 16, 17, 18, 19], [14, 20]]}, {},
                {}, {},
                {"hits": ([[1, 2, 3, 4, 5, 6], [0, 0, 7]], 24), "new": [[20, 19, 10], [8]]}, {}),
            copies=(),
            free_queue=(
                8, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38,
                39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57,
                58, 59, 60, 61, 62, 63, 7, 9, 18, 17, 16, 15, 13, 12, 11, 14, 10, 19, 20, 6,
                5, 4, 3, 2, 1))),
    HybridEdgeScenario(
        "eagle_flag_on_a_single_window_group",
        "EAGLE and retention 0, one group, a window of 8 at 4 flagged is_eagle_group: a "
        "14-token prompt resent and extended (the one group's flag read)",
        (_WINDOW4_8_EAGLE,),
        num_blocks=120, ops=_replayed(14), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]}, {"new": [[]]}, {},
                {"hits": ([[1, 2]], 8), "new": [[5, 6]]}, {},
                {"hits": ([[1, 2]], 8), "new": [[7, 8]]}, {},
                {"hits": ([[1, 2]], 8), "new": [[9, 10, 11]]}, {}, {}, {}, {}, {},
                {"hits": ([[1, 2]], 8), "new": [[11, 8, 6]]},),
            copies=(),
            free_queue=(
                4, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29,
                30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48,
                49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67,
                68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86,
                87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104,
                105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119,
                3, 5, 7, 10, 9))),
    HybridEdgeScenario(
        "eagle_flag_through_one_member_of_a_spec_group",
        "EAGLE and retention 0, full attention beside two windows of one spec, only the "
        "second flagged is_eagle_group: the spec group drops, flagged through one member",
        (_FULL4, _WINDOW4_8, _WINDOW4_8_EAGLE),
        num_blocks=120, ops=_replayed(14), use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=(
                {},
                {"hits": ([[], [], []], 0), "new": [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]},
                {"new": [[], [], []]}, {},
                {"hits": ([[1, 2], [5, 6], [9, 10]], 8), "new": [[13, 14], [15, 16], [17, 18]]},
                {},
                {"hits": ([[1, 2], [5, 6], [9, 10]], 8), "new": [[19, 20], [21, 22], [23, 24]]},
                {},
                {"hits": ([[1, 2], [5, 6], [9, 10]], 8),
                 "new": [[25, 26, 27], [28, 29, 30], [31, 32, 33]]},
                {}, {}, {}, {}, {},
                {"hits": ([[1, 2], [5, 6], [9, 10]], 8),
                 "new": [[33, 30, 27], [24, 22, 20], [18, 16, 14]]},),
            copies=(),
            free_queue=(
                12, 8, 4, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49,
                50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68,
                69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87,
                88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104,
                105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119,
                3, 7, 11, 13, 15, 17, 19, 21, 23, 26, 25, 29, 28, 32, 31))),
    HybridEdgeScenario(
        "gated_preempted_request_two_mamba_groups",
        "full attention at 4 beside two Mamba align groups at 8, max_model_len 256, on a pool "
        "of 12 blocks: every step through the full-sequence gate; a request freed (preempted) "
        "and admitted again with its output tokens; a reserve of 2 blocks",
        (_FULL4, _ALIGN8, _ALIGN8),
        num_blocks=12, ops=_gated_preempted(24), use_eagle=False, retention=None, block_size=4,
        max_model_len=256,
        recorded=Recorded(
            answers=(
                {},
                {"hits": ([[], [], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 7], [0, 0, 8]]},
                {"new": [[9], [10], [11]]}, {"new": [[], [], []]}, {}, {},
                {"hits": ([[1, 2, 3, 4, 5, 6], [0, 0, 7], [0, 0, 8]], 24),
                 "new": [[11], [10], [9]]},
                {"new": [[], [], []]}, {"new": [[], [], []]}, {},
                {"hits": ([[1, 2, 3, 4, 5, 6], [0, 0, 7], [0, 0, 8]], 24), "new": None}, {}, {},
                {}, {"hits": ([[], [], []], 0), "new": None}, {}),
            copies=(),
            free_queue=(
                9, 10, 7, 8, 11, 6, 5, 4, 3, 2, 1))),
    HybridEdgeScenario(
        "gated_async_load_two_mamba_groups",
        "full attention at 4 beside two Mamba align groups at 8, max_model_len 256, on a pool "
        "of 20 blocks: an asynchronous load admitted through the full-sequence gate; a "
        "sibling with external tokens, whose first Mamba group releases its hit block and "
        "whose second gets that block as a new one in the same call",
        (_FULL4, _ALIGN8, _ALIGN8),
        num_blocks=20, ops=_gated_async_load(13), use_eagle=False, retention=None, block_size=4,
        max_model_len=256,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], [], []], 0), "new": [[1, 2, 3, 4], [0, 5], [0, 6]]}, {}, {},
                {"hits": ([[], [], []], 0), "new": [[6, 5], [4], [7]]}, {},
                {"new": [[8, 9, 10, 11], [0, 12], [0, 13]]}, {"new": [[], [], []]}, {},
                {"hits": ([[1, 2], [4], [7]], 8), "new": [[14, 15, 18, 19], [16, 3], [17, 4]]},
                {}, {}),
            copies=(),
            free_queue=(
                4, 3, 19, 13, 12, 11, 7, 10, 9, 8, 5, 6, 18, 15, 14, 2, 1, 16, 17))),
    HybridEdgeScenario(
        "eagle_retention_block_size_1",
        "EAGLE and retention 0 at block size 1, a window of 1 listed before full attention: a "
        "one-token prompt resent and extended (replay boundaries at 0; full attention "
        "searched first whatever the order of the groups)",
        (_WINDOW1, _FULL1),
        num_blocks=48, ops=_replayed(1), use_eagle=True, retention=0, block_size=1,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3], [4]]}, {},
                {"hits": ([[], []], 0), "new": [[5], [6]]}, {},
                {"hits": ([[], []], 0), "new": [[7, 8], [9, 10]]}, {},
                {"hits": ([[], []], 0),
                 "new": [[11, 12, 13, 14, 15, 16], [17, 18, 19, 20, 21, 22]]},
                {}, {}, {}, {}, {},
                {"hits": ([[0], [2]], 1), "new": [[14, 13, 12, 11], [3, 23, 24, 25]]},),
            copies=(),
            free_queue=(
                26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
                45, 46, 47, 1, 4, 5, 6, 8, 7, 10, 9, 16, 15, 22, 21, 20, 19, 18, 17))),
    HybridEdgeScenario(
        "checkpoint_partial_hit_with_an_async_load",
        "Mamba prefill checkpoints at alignment 4 (block 8) beside full attention at 4: an "
        "asynchronous load after a 12-token hit, which ends inside the Mamba block (its "
        "checkpoint key), so the hit block is copied on write in place, after the hits, while "
        "the answer lists only the blocks after them",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=80, ops=_async_load(13), use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [5, 6]]}, {}, {},
                {"hits": ([[1, 2, 3], [0, 5]], 12), "new": None}, {},
                {"hits": ([[1, 2, 3], [0, 5]], 12), "new": [[6, 4, 7], [8, 9]]},
                {"new": [[], []]}, {},
                {"hits": ([[1, 2, 3, 6], [0, 8]], 16), "new": [[10], [11]]},
                {"new": [[12], []]}, {}, {}, {},
                {"hits": ([[1, 2, 3], [0, 5]], 12), "new": [[11], []]}, {},
                {"new": [[], []]}, {}),
            copies=((5, 8), (5, 12)),
            free_queue=(
                12, 11, 9, 7, *range(13, 80), 8, 4, 10, 6, 5, 3, 2, 1))),
    HybridEdgeScenario(
        "lone_mamba_group_refuses_what_the_pool_cannot_hold",
        "EAGLE, a Mamba align group alone at 8 (block size 4) with the shared-prefix "
        "checkpoint, on a pool of 24 blocks: a 24-token prompt's resend and extensions hit its "
        "state block, cached in this same step, and are refused (vLLM counts the pool plus "
        "one block for them, more than a nearly empty pool has free)",
        (_ALIGN8,),
        num_blocks=24, ops=_replayed(24), use_eagle=True, retention=None, block_size=4,
        shared_prefix_checkpoint=True,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[]], 0), "new": [[0, 0, 1]]}, {"new": [[2]]}, {},
                {"hits": ([[]], 0), "new": [[0, 0, 3]]}, {},
                {"hits": ([[0, 0, 1]], 24), "new": None}, {},
                {"hits": ([[0, 0, 1]], 24), "new": None}, {}, {}, {}, {}, {},
                {"hits": ([[0, 0, 1]], 24), "new": None}),
            copies=(),
            free_queue=(
                2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 1,
                3))),
    HybridEdgeScenario(
        "checkpoint_of_one_request_only",
        "retention 0 and multi-module MTP (num_prefill_lookahead 2), full attention at 4 "
        "beside Mamba prefill checkpoints on an alignment of 8, on a pool of 24 blocks: "
        "siblings of a 16-token prompt, one request's pending checkpoint never counted for "
        "another's blocks",
        (_FULL4, _CHECKPOINTS8_AT_8),
        num_blocks=24, ops=_siblings(16), use_eagle=False, retention=0, block_size=4,
        num_prefill_lookahead=2,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [0, 5]]}, {"new": [[6], [7]]},
                {"new": [[], []]}, {},
                {"hits": ([[], []], 0), "new": [[5, 8, 9, 10, 11], [0, 12, 13]]}, {},
                {"hits": ([[], []], 0), "new": [[14, 15, 16, 17, 18], [0, 19, 20]]}, {},
                {"hits": ([[], []], 0), "new": None}, {"hits": ([[], []], 0), "new": [[21], [22]]},
                {}, {}, {}, {"hits": ([[], []], 0), "new": [[13, 11], [7]]},
                {"new": [[6, 23, 4], [0, 3]]}, {}, {}, {}, {},
                {"hits": ([[1, 2, 9, 17], [0, 19]], 16), "new": [[3, 4], [22]]}, {}),
            copies=(),
            free_queue=(
                22, 4, 20, 18, 10, 8, 5, 12, 16, 15, 14, 21, 23, 6, 11, 13, 7, 3, 17, 9, 2, 1,
                19))),
    HybridEdgeScenario(
        "short_prompt_caches_no_mamba_block",
        "retention 8 and the shared-prefix checkpoint, full attention at 4 beside a Mamba "
        "align group at 8 with two speculative blocks, on a pool of 24 blocks: a 7-token "
        "prompt in chunks caches no full Mamba block",
        (_FULL4, _ALIGN8_SPEC2),
        num_blocks=24, ops=_chunked(7), use_eagle=False, retention=8, block_size=4,
        shared_prefix_checkpoint=True,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], []], 0), "new": [[1], [2, 3, 4]]}, {"new": [[5], []]},
                {"new": [[6, 7], [8]]}, {"new": [[], []]}, {"new": [[9], [10]]}, {},
                {"hits": ([[], []], 0), "new": [[11], [12, 13, 14]]}, {"new": [[15], []]}, {}, {},
                {"hits": ([[], []], 0), "new": [[10, 8], [4, 9, 17]]}, {}, {}, {},
                {"hits": ([[1], [16]], 4), "new": None},
                {"hits": ([[1], [16]], 4), "new": [[17], [9, 4, 8]]}, {}),
            copies=((12, 16), (16, 9)),
            free_queue=(
                8, 4, 9, 17, 14, 13, 12, 15, 18, 19, 20, 21, 22, 23, 2, 7, 6, 5, 3, 11, 10, 16,
                1))),
    HybridEdgeScenario(
        "gated_checkpoint_beside_a_second_mamba_group",
        "full attention at 4 beside a Mamba group with prefill checkpoints and a plain Mamba "
        "align group, on a pool of 24 blocks: a 31-token prompt and its extensions through "
        "the full-sequence gate (a step reserving no checkpoint block)",
        (_FULL4, _CHECKPOINTS8, _ALIGN8),
        num_blocks=24, ops=_gated(31), use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=(
                {}, {"hits": ([[], [], []], 0), "new": [[1, 2], [3], [4]]},
                {"new": [[5, 6, 7, 8, 9, 10], [0, 0, 11], [0, 0, 12]]}, {"new": [[], [], []]}, {},
                {"hits": ([[1, 2], [3], [4]], 8), "new": [[13, 14], [15], [16]]},
                {"new": [[17, 18, 19, 20, 21], [0, 0, 22], [0, 0, 23]]}, {},
                {"hits": ([[1, 2, 5, 6], [0, 15], [0, 16]], 16), "new": None}, {},
                {"hits": ([[1, 2, 5, 6], [0, 15], [0, 16]], 16), "new": None},
                {"hits": ([[1, 2, 5, 6], [0, 15], [0, 16]], 16), "new": None}, {}, {}, {},
                {"hits": ([[1, 2, 5, 6], [0, 15], [0, 16]], 16), "new": [[23], [22], [21]]},
                {"new": [[3, 4, 10, 9], [0, 8], [0, 7]]}, {}),
            copies=(),
            free_queue=(
                7, 8, 9, 11, 12, 20, 19, 18, 17, 14, 13, 15, 16, 10, 4, 3, 23, 6, 5, 2, 1, 22,
                21))),

    HybridEdgeScenario(
        "in_flight_tokens_hold_a_window_of_one",
        "full attention beside a window of 1 token at block size 1, asynchronous scheduling: "
        "a step whose computed tokens are all still in flight frees no window block (the "
        "processed-token basis is 0, not 1)",
        (_FULL1, _WINDOW1),
        num_blocks=40, ops=_in_flight({}), use_eagle=False, retention=None, block_size=1,
        recorded=_IN_FLIGHT_WINDOW_OF_ONE),
    HybridEdgeScenario(
        "in_flight_tokens_hold_a_window_through_the_gates",
        "the same with every step through the gates (a reserve of 0 blocks): the gated path "
        "frees the window's blocks on the processed-token basis too",
        (_FULL1, _WINDOW1),
        num_blocks=40, ops=_in_flight(_RESERVE_0), use_eagle=False, retention=None,
        block_size=1,
        recorded=_IN_FLIGHT_WINDOW_OF_ONE),
    HybridEdgeScenario(
        "async_load_through_the_gates_caches_nothing_yet",
        "two full-attention groups at 4 and 8: an extension of a freed 16-token prompt whose 8 "
        "external tokens load asynchronously, admitted through the full-sequence gate: its "
        "blocks are not cached before the load ends (a sibling admitted meanwhile hits 16 "
        "tokens, not 24)",
        (_FULL4, _FULL8),
        num_blocks=40,
        ops=(add("a", _P[:16]), schedule("a"), free("a"), add("b", (*_P[:16], *[5] * 16)),
             schedule("b", 0, external=8, delay=True, gates={"full_sequence_must_fit": True}),
             add("c", (*_P[:16], *[5] * 16)), schedule("c", gates=_RESERVE_0), free("c"),
             cache("b", 24), schedule("b", gates=_RESERVE_0), free("b")),
        use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [5, 6]]}, {}, {},
                     {"hits": ([[1, 2, 3, 4], [5, 6]], 16), "new": [[7, 8], [9]]}, {},
                     {"hits": ([[1, 2, 3, 4], [5, 6]], 16), "new": [[10, 11, 12, 13], [14, 15]]},
                     {}, {}, {"new": [[16, 17], [18]]}, {}),
            copies=(),
            free_queue=(
                19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38,
                39, 13, 12, 11, 10, 15, 14, 17, 16, 8, 7, 4, 3, 2, 1, 18, 9, 6, 5))),
    HybridEdgeScenario(
        "cross_attention_reserved_blocks",
        "an encoder-decoder model (full attention and cross attention at 2, caching off) on 8 "
        "free blocks: a 5-token prompt with 6 encoder tokens (6 blocks) is refused with a "
        "reserve of 3 blocks and admitted with 2",
        (_FULL2, _CROSS2),
        num_blocks=9,
        ops=(add("a", _P[:5], encoder=6), schedule("a", gates=_reserve(3)),
             schedule("a", gates=_reserve(2)), decode("a", gates=_reserve(1)),
             decode("a", gates=_RESERVE_0), free("a")),
        use_eagle=False, retention=None, block_size=2, caching=False,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": None},
                     {"hits": ([[], []], 0), "new": [[1, 2, 3], [4, 5, 6]]}, {"new": [[], []]},
                     {"new": [[7], []]}, {}),
            copies=(),
            free_queue=(
                6, 5, 4, 7, 3, 2, 1, 8))),
    HybridEdgeScenario(
        "cross_attention_window_external_tokens",
        "an encoder-decoder model with full attention, a window of 2 and cross attention at "
        "2, caching off: 8 external tokens of a 12-token prompt (the window's table holds "
        "them as computed blocks before its new ones)",
        (_FULL2, _WINDOW2_AT_2, _CROSS2),
        num_blocks=30,
        ops=(add("a", _P[:12], encoder=4), schedule("a", external=8), decode("a"), free("a")),
        use_eagle=False, retention=None, block_size=2, caching=False,
        recorded=Recorded(
            answers=({},
                     {"hits": ([[], [], []], 0), "new": [[1, 2, 3, 4, 6, 7], [5, 8, 9], [10, 11]]},
                     {"new": [[8], [5], []]}, {}),
            copies=(),
            free_queue=(
                11, 10, 5, 9, 8, 7, 6, 4, 3, 2, 1, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
                24, 25, 26, 27, 28, 29))),
    HybridEdgeScenario(
        "checkpoint_not_before_the_prompt_end",
        "Mamba prefill checkpoints at alignment 4 and retention 0 beside full attention at 4: "
        "an 18-token prompt in chunks of 17 and 1; the first chunk stops one token before "
        "the prefill's end and reserves no checkpoint",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=64,
        ops=(add("a", _P[:18]), schedule("a", 17), schedule("a"), decode("a"),
             add("b", (*_P[:18], 1, 2, 3)), schedule("b"), free("a"), free("b")),
        use_eagle=False, retention=0, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5], [0, 0, 6]]},
                     {"new": [[], []]}, {"new": [[], []]}, {},
                     {"hits": ([[], []], 0), "new": [[7, 8, 9, 10, 11, 12], [0, 13, 14]]}, {}, {}),
            copies=(),
            free_queue=(
                14, 12, 6, 5, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,
                52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 4, 3, 2, 1, 11, 10, 9, 8, 7, 13))),
    HybridEdgeScenario(
        "checkpoint_of_a_resumed_request_at_its_prefill_end",
        "the same layout: a 21-token prompt decoded 5 tokens, freed (preempted), the cache "
        "reset, and admitted again in chunks of 25 and 1: its prefill ends one token before "
        "its 26 tokens, so the first chunk reserves the checkpoint",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=64,
        ops=(add("a", _P[:21]), schedule("a"), decode("a"), decode("a"), decode("a"),
             decode("a"), decode("a"), free("a"), reset(), schedule("a", 25), schedule("a"),
             decode("a"), add("b", (*_P[:21], *[9] * 6)), schedule("b"), free("a"),
             free("b")),
        use_eagle=False, retention=0, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 7, 8]]},
                     {"new": [[], []]}, {"new": [[], []]}, {"new": [[], []]}, {"new": [[9], [10]]},
                     {"new": [[], []]}, {}, {"reset": True},
                     {"hits": ([[], []], 0), "new": [[10, 9, 8, 11, 12, 13, 14], [0, 0, 15, 16]]},
                     {"new": [[], []]}, {"new": [[], []]}, {},
                     {"hits": ([[], []], 0),
                      "new": [[15, 17, 18, 19, 20, 21, 22], [0, 0, 23, 24]]},
                     {}, {}),
            copies=(),
            free_queue=(
                24, 22, 16, 14, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
                41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60,
                61, 62, 63, 7, 6, 5, 4, 3, 2, 1, 13, 12, 11, 8, 9, 10, 21, 20, 19, 18, 17, 15,
                23))),
    HybridEdgeScenario(
        "eagle_drops_again_after_another_group_cuts_the_hit",
        "EAGLE on a window of 8 flagged is_eagle_group, beside full attention and a window of "
        "12 at 4: a's blocks 7 and 13 evicted (one of each window), b's search drops EAGLE's "
        "block, the window of 12 cuts the candidate, and the next round drops again at the "
        "shorter candidate (no hit is left)",
        (_FULL4, _WINDOW4_8_FLAGGED, _WINDOW12),
        num_blocks=30,
        ops=(add("a", _P[:20]), schedule("a"), free("a"), evict([7, 13]),
             add("b", (*_P[:20], *[7] * 6)), schedule("b"), free("b")),
        use_eagle=True, retention=None, block_size=4,
        recorded=Recorded(
            answers=({},
                     {"hits": ([[], [], []], 0),
                      "new": [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]},
                     {}, {}, {},
                     {"hits": ([[], [], []], 0),
                      "new": [[16, 17, 18, 19, 20, 21, 22], [23, 24, 25, 26, 27, 28, 29],
                              [5, 4, 3, 2, 1, 10, 9]]},
                     {}),
            copies=(),
            free_queue=(
                9, 29, 22, 8, 7, 6, 15, 14, 13, 12, 11, 21, 20, 19, 18, 17, 16, 28, 27, 26, 25,
                24, 23, 10, 1, 2, 3, 4, 5))),
    HybridEdgeScenario(
        "eagle_drops_once_per_candidate",
        "EAGLE on every group, full attention beside windows of 8 and 12 at 4: four of a's "
        "blocks evicted; each window drops EAGLE's block once per candidate length, not at "
        "every round of the search",
        (_FULL4, _WINDOW4_8, _WINDOW12),
        num_blocks=60,
        ops=(add("a", _P[:22]), schedule("a"), free("a"), evict([6, 8, 12, 15]),
             add("b", (*_P[:22], *[7] * 8)), schedule("b"), free("b")),
        use_eagle=True, retention=None, block_size=4,
        recorded=Recorded(
            answers=({},
                     {"hits": ([[], [], []], 0),
                      "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12],
                              [13, 14, 15, 16, 17, 18]]},
                     {}, {}, {},
                     {"hits": ([[1], [7], [13]], 4),
                      "new": [[18, 12, 6, 19, 20, 21, 22], [23, 24, 25, 26, 27, 28, 29],
                              [30, 31, 32, 33, 34, 35, 36]]},
                     {}),
            copies=(),
            free_queue=(
                36, 29, 22, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53,
                54, 55, 56, 57, 58, 59, 5, 4, 3, 2, 11, 10, 9, 8, 17, 16, 15, 14, 21, 20, 19, 6,
                12, 18, 1, 28, 27, 26, 25, 24, 23, 7, 35, 34, 33, 32, 31, 30, 13))),
    HybridEdgeScenario(
        "reset_forgets_partial_key_lengths",
        "EAGLE, full attention at 8 and 4 beside a Mamba align group at 16 (fine-grained hits), "
        "on a pool of 24 blocks: a prompt in chunks of 10 and the rest keys blocks at partial "
        "lengths, the prefix cache is reset, and later requests reuse those blocks: the "
        "lengths went with the keys (a boundary state offered for 20 tokens of a request that "
        "computed 16 is an error)",
        (_FULL8, _ALIGN16, _FULL4),
        num_blocks=24,
        ops=(add("a", (*_P[:13], 1, 2, 8, 4, 3, 9, 2)), schedule("a", 10), schedule("a"),
             free("a"), reset(),
             add("b", (*_P[:15], 3, 1, 1, 1, 1, 2, 3, 2, 4, 3, 6, 9, 8, 9, 7, 8)),
             schedule("b"), add("c", (*_P[:13], 6, 2, 1, 1, 2, 7, 1, 3, 5, 1, 1, 1, 9, 5, 8)),
             schedule("c", 10), free("c"), add("d", (*_P[:24], 3, 1, 4, 9)), schedule("d", 16),
             free("d"), free("b")),
        use_eagle=True, retention=None, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], [], []], 0), "new": [[1, 2], [3], [4, 5, 6]]},
                     {"new": [[7], [8], [9, 10]]}, {}, {"reset": True}, {},
                     {"hits": ([[], [], []], 0),
                      "new": [[8, 11, 12, 13], [0, 14], [15, 16, 17, 18, 19, 20, 21, 22]]},
                     {}, {"hits": ([[], [], []], 0), "new": [[23, 7], [2], [1, 3, 10]]}, {}, {},
                     {"hits": ([[], [], []], 0), "new": [[10, 2], [7], [9, 6, 5, 4]]}, {}, {}),
            copies=(),
            free_queue=(
                22, 14, 23, 3, 1, 2, 10, 7, 4, 5, 6, 9, 13, 12, 11, 8, 21, 20, 19, 18, 17, 16,
                15))),
    HybridEdgeScenario(
        "external_tokens_past_a_partial_mamba_hit",
        "full attention at 4 beside a Mamba align group at 16 (fine-grained hits): a 12-token "
        "hit ends inside the Mamba block and 5 external tokens follow it; the Mamba group "
        "skips every hit block for the external state, so nothing is copied on write for "
        "it (the one copy drained keeps the first request's state after its chunk)",
        (_FULL4, _ALIGN16),
        num_blocks=64, ops=_external_after_a_chunk(13, 12, 5), use_eagle=False,
        retention=None, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [4]]}, {"new": [[5], []]},
                     {"new": [[], []]}, {}, {},
                     {"hits": ([[1, 2, 3], [6]], 12), "new": [[4, 5, 8], [7]]}, {"new": [[], []]},
                     {}),
            copies=((4, 6),),
            free_queue=(*range(7, 64), 6, 5, 4, 3, 2, 1))),
    HybridEdgeScenario(
        "full_scan_stops_at_an_evicted_block",
        "full attention at 8 beside a Mamba align group at 12 (fine-grained hits, hash block "
        "4): the first block of a 26-token prompt is evicted, so the full-block scan stops "
        "there although later blocks are still cached",
        (_FULL8, _ALIGN12),
        num_blocks=64, ops=_evicted_inside(26, 1), use_eagle=False, retention=None,
        block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3, 4, 5], [0, 6]]},
                     {"new": [[], []]}, {}, {}, {},
                     {"hits": ([[], []], 0), "new": [[6, 5, 7, 8], [0, 0, 9]]},
                     {"new": [[10], []]}, {}),
            copies=(),
            free_queue=(*range(9, 64), 2, 4, 3, 1, 8, 7, 5, 6))),
    HybridEdgeScenario(
        "partial_probe_stays_inside_the_missed_block",
        "full attention at 8 beside a Mamba align group at 12 (fine-grained hits, hash block "
        "4): a 22-token prompt's second full-attention block is evicted; the probe for a "
        "partial key looks inside that block only, not at the keys of the block after it",
        (_FULL8, _ALIGN12),
        num_blocks=64, ops=_evicted_inside(22, 3), use_eagle=False, retention=None,
        block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3, 4], [5]]},
                     {"new": [[], []]}, {}, {}, {},
                     {"hits": ([[], []], 0), "new": [[5, 6, 7, 8], [0, 0, 9]]}, {"new": [[], []]},
                     {}),
            copies=(),
            free_queue=(9, 8, *range(10, 64), 2, 4, 3, 1, 7, 6, 5))),
    HybridEdgeScenario(
        "window_admission_cap_counts_the_window_less_one_token",
        "full attention at 4 beside a window of 5 tokens, 4 tokens in flight at most, on a "
        "pool of 9 blocks: a 20-token prompt through the full-sequence gate; the window "
        "counts at most cdiv(5 - 1 + 4, 4) + 1 = 3 blocks of the full sequence, so 5 + 3 "
        "blocks fit the 8 free ones and the first chunk is admitted (the next is refused)",
        (_FULL4, _WINDOW5),
        num_blocks=9, ops=_full_sequence_gated(20, 4), use_eagle=False, retention=None,
        block_size=4, max_model_len=64, max_in_flight_tokens=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": None}, {}),
            copies=(),
            free_queue=(*range(3, 9), 1, 2))),
    HybridEdgeScenario(
        "window_admission_cap_adds_the_mtp_tail",
        "EAGLE with multi-module MTP (num_prefill_lookahead 2), full attention at 4 beside a "
        "window of 5 tokens, 4 tokens in flight at most, on a pool of 9 blocks: a 20-token "
        "prompt through the full-sequence gate; the window's admission cap adds the tokens "
        "MTP retains, so the full sequence no longer fits the 8 free blocks: refused",
        (_FULL4, _WINDOW5),
        num_blocks=9, ops=_full_sequence_gated(20, 4), use_eagle=True, retention=None,
        block_size=4, num_prefill_lookahead=2, max_model_len=64, max_in_flight_tokens=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": None},
                     {"hits": ([[], []], 0), "new": None}, {}),
            copies=(),
            free_queue=(*range(1, 9),))),
    HybridEdgeScenario(
        "chunked_local_admission_cap_without_max_model_len",
        "full attention at 4 beside chunked local attention (chunks of 4), 3 tokens in "
        "flight at most and no max_model_len, on a pool of 6 blocks: a 20-token prompt "
        "through the full-sequence gate; the chunked group counts at most cdiv(4 + 3, 4) = 2 "
        "blocks (no length to clamp that to), and 5 + 2 do not fit the 5 free ones: refused",
        (_FULL4, _CHUNKED4),
        num_blocks=6, ops=_full_sequence_gated(20, 4), use_eagle=False, retention=None,
        block_size=4, max_in_flight_tokens=3,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": None},
                     {"hits": ([[], []], 0), "new": None}, {}),
            copies=(),
            free_queue=(1, 2, 3, 4, 5))),
    HybridEdgeScenario(
        "partial_tail_key_at_the_first_token",
        "full attention at 2 beside a Mamba align group at 3 (hash block 1): a 2-token prompt "
        "in chunks of 1 and 1 keys its full-attention block at 1 token, the prompt's last "
        "hash boundary, so requests sharing its first token hit 1 token",
        (_FULL2, _ALIGN3),
        num_blocks=40,
        ops=(add("a", _P[:2]), schedule("a", 1), schedule("a"), decode("a"), free("a"),
             add("b", (_P[0], 7, 7, 7)), schedule("b"), free("b"), add("c", (*_P[:2], 9, 9)),
             schedule("c"), free("c")),
        use_eagle=False, retention=None, block_size=1,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[], []]},
                     {"new": [[4], []]}, {}, {},
                     {"hits": ([[1], [3]], 1), "new": [[4, 5], [6, 7]]}, {}, {},
                     {"hits": ([[1], [3]], 1), "new": [[7, 8], [9, 10]]}, {}),
            copies=((2, 3), (1, 4), (3, 6), (1, 7), (3, 9)),
            free_queue=(*range(10, 40), 2, 5, 4, 6, 1, 3, 8, 7, 9))),
    HybridEdgeScenario(
        "eagle_drop_rounded_to_the_scheduler_block",
        "EAGLE and retention 0, full attention at 4 beside a window at block size 8 (no "
        "fine-grained hits) and a Mamba align group at 16: extensions of a 28-token prompt; "
        "the full-attention hit, after EAGLE's drop, is rounded down to the scheduler block "
        "of 8 before it counts toward the longest prefix the groups share",
        (_FULL4, _WINDOW8, _ALIGN16),
        num_blocks=60,
        ops=(add("a", _P[:28]), schedule("a"), decode("a"), free("a"),
             add("b", (*_P[:28], *[7] * 5)), schedule("b"), decode("b"), free("b"),
             add("c", (*_P[:28], *[7] * 5, 1, 2)), schedule("c"), free("c"),
             add("d", (*_P[:26], *[3] * 6)), schedule("d"), free("d")),
        use_eagle=True, retention=0, block_size=4,
        recorded=Recorded(
            answers=({},
                     {"hits": ([[], [], []], 0),
                      "new": [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11], [0, 12]]},
                     {"new": [[9], [], []]}, {}, {},
                     {"hits": ([[], [], []], 0),
                      "new": [[12, 11, 10, 9, 7, 6, 13, 14, 15], [16, 17, 18, 19, 20],
                              [0, 0, 21]]},
                     {"new": [[], [], []]}, {}, {},
                     {"hits": ([[], [], []], 0),
                      "new": [[21, 20, 19, 15, 22, 23, 24, 25, 26], [27, 28, 29, 30, 31],
                              [0, 0, 32]]},
                     {}, {},
                     {"hits": ([[], [], []], 0),
                      "new": [[32, 31, 30, 26, 33, 34, 35, 36], [37, 38, 39, 40], [0, 41]]},
                     {}),
            copies=(),
            free_queue=(41, 40, *range(42, 60), 8, 5, 4, 3, 2, 1, 18, 17, 16, 14, 13, 6, 7, 9, 10,
                        11, 12, 25, 24, 23, 22, 15, 19, 20, 21, 29, 28, 27, 36, 35, 34, 33, 26, 30,
                        31, 32, 39, 38, 37))),
    HybridEdgeScenario(
        "no_checkpoint_from_a_query_after_external_tokens",
        "Mamba prefill checkpoints at alignment 4 (block 8) beside full attention at 4: an "
        "8-token hit, 6 external tokens and the rest of a 21-token prompt; the forward's "
        "query starts after the external tokens (at 14, off the hash-block grid), so it "
        "exports no checkpoint, and the next drain hands off the block holding the state at "
        "16 (kvcheck's own law once took the external tokens for computed ones)",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=64, ops=_external_after_a_chunk(12, 4, 6), use_eagle=False,
        retention=None, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3, 4], [5]]},
                     {"new": [[6], []]}, {}, {},
                     {"hits": ([[1, 3], [2]], 8), "new": [[5, 6, 8, 9], [7, 10]]},
                     {"new": [[], []]}, {}),
            copies=(),
            free_queue=(10, 9, *range(11, 64), 2, 4, 7, 8, 6, 5, 3, 1))),
    HybridEdgeScenario(
        "allocated_from_a_first_step_inside_the_external_block",
        "full attention at 4 beside a Mamba align group at 8 (fine-grained hits): a 13-token "
        "prompt admitted with 9 external tokens and 3 computed ones, which end inside the "
        "Mamba block the external tokens took (the first allocation adds no Mamba block); "
        "the request counts as allocated from then on, so the next step's copy-on-write of "
        "its own partial-block key leaves its table as it is",
        (_FULL4, _ALIGN8),
        num_blocks=64,
        ops=(add("a", _P[:13]), schedule("a", 3, external=9), schedule("a"), decode("a"),
             decode("a"), decode("a"), free("a"), add("b", (*_P[:13], 9, 9, 9)), schedule("b"),
             decode("b"), free("b")),
        use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [4]]}, {"new": [[5], []]},
                     {"new": [[], []]}, {"new": [[], []]}, {"new": [[], []]}, {}, {},
                     {"hits": ([[1, 2, 3], [0, 6]], 12), "new": [[7], [8]]}, {"new": [[9], [10]]},
                     {}),
            copies=((4, 6), (6, 8)),
            free_queue=(10, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                        28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46,
                        47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 5, 4,
                        6, 7, 3, 2, 1, 8))),
    HybridEdgeScenario(
        "null_trimmed_hit_beside_an_unkeyed_state_block",
        "retention 16, full attention at 4 beside a Mamba align group at 8 (fine-grained "
        "hits): a 20-token prompt's first chunk of 8 leaves its Mamba state block unkeyed (the "
        "mask keeps every second block); in the same step a sibling whose 12-token hit ends "
        "inside a Mamba block loads 8 tokens past 8 asynchronously, its hits trimmed at 8 "
        "(its Mamba hit a null block): a null is no block cached in this step, so the sibling "
        "is admitted",
        (_FULL4, _ALIGN8),
        num_blocks=32,
        ops=(add("a", _P[:14]), schedule("a", 12), schedule("a"), add("c", range(500, 520)),
             add("b", (*_P[:14], *range(900, 910))), schedule("c", 8),
             schedule("b", external=8, delay=True, truncate=8), cache("b", 16), schedule("b"),
             free("a"), free("b"), free("c")),
        use_eagle=False, retention=16, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]}, {"new": [[5], []]},
                     {}, {}, {"hits": ([[], []], 0), "new": [[7, 8], [9]]},
                     {"hits": ([[1, 2, 3], [0, 6]], 12), "new": [[10, 11], [12]]}, {},
                     {"new": [[13, 14], [15]]}, {}, {}, {}),
            copies=((4, 6),),
            free_queue=(9, 15, 4, 5, *range(16, 32), 6, 3, 14, 13, 11, 10, 2, 1, 12, 8, 7))),
    HybridEdgeScenario(
        "no_mamba_junction_at_token_one_without_a_lookup",
        "EAGLE, full attention at 1 beside a Mamba align group at 3 (hash block 1) with the "
        "shared-prefix checkpoint: a 4-token prompt that skips reading the prefix cache has no "
        "shared-prefix boundary (0), so its first chunk of 1 token keys no Mamba state there "
        "and its next step copies nothing on write",
        (_FULL1, _ALIGN3),
        num_blocks=16,
        ops=(add("a", _P[:4], skip_read=True), schedule("a", 1), schedule("a"), free("a")),
        use_eagle=True, retention=None, block_size=1, shared_prefix_checkpoint=True,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3, 4, 5], [6]]}, {}),
            copies=(),
            free_queue=(*range(6, 16), 5, 4, 3, 1, 2))),
    HybridEdgeScenario(
        "load_ending_at_the_shared_prefix_boundary_keys_no_junction",
        "EAGLE, full attention at 4 beside a Mamba align group at 8 with the shared-prefix "
        "checkpoint: a sibling sharing 8 tokens of a cached 12-token prompt hits nothing in "
        "common but has a shared-prefix boundary at 4 tokens; its asynchronous load of 4 "
        "tokens ends there, and vLLM caches the loaded prefix with the request's computed "
        "tokens already at 4, so no junction state is keyed inside the Mamba block (only a "
        "chunk computed past the computed tokens keys one) and the next step copies nothing",
        (_FULL4, _ALIGN8),
        num_blocks=32,
        ops=(add("a", _P[:12]), schedule("a"), free("a"),
             add("b", (*_P[:8], *range(400, 408))), schedule("b", external=4, delay=True),
             cache("b", 4), schedule("b"), free("b")),
        use_eagle=True, retention=None, block_size=4, shared_prefix_checkpoint=True,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]}, {}, {},
                     {"hits": ([[], []], 0), "new": [[4], [5]]}, {}, {"new": [[6, 7, 8], [9]]},
                     {}),
            copies=(),
            free_queue=(*range(10, 32), 3, 2, 1, 8, 7, 6, 4, 9, 5))),
    HybridEdgeScenario(
        "resumed_request_keys_the_junction_at_its_prompt_end",
        "EAGLE, full attention at 4 beside a Mamba align group at 8 with the shared-prefix "
        "checkpoint: a 12-token prompt decoded 4 tokens, freed (preempted) and admitted again "
        "with them has its shared-prefix boundary at 12, its prompt's end; its first chunk of "
        "12 ends there, still inside the prompt, so the state at 12 is keyed inside a Mamba "
        "block and copied on write in the next step",
        (_FULL4, _ALIGN8),
        num_blocks=32,
        ops=(add("a", _P[:12]), schedule("a"), decode("a"), decode("a"), decode("a"),
             decode("a"), free("a"), schedule("a", 12), schedule("a"), free("a")),
        use_eagle=True, retention=None, block_size=4, shared_prefix_checkpoint=True,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]}, {"new": [[5], []]},
                     {"new": [[], []]}, {"new": [[], []]}, {"new": [[], []]}, {},
                     {"hits": ([[], []], 0), "new": [[6, 7, 8], [0, 9]]}, {"new": [[10], []]}, {}),
            copies=((9, 11),),
            free_queue=(*range(12, 32), 5, 3, 2, 1, 4, 11, 10, 8, 7, 6, 9))),
    HybridEdgeScenario(
        "copy_on_write_block_counted_beside_a_new_mamba_block",
        "full attention at 4 beside a Mamba align group at 8 (fine-grained hits), on a pool of "
        "9 blocks: a 24-token sibling whose 12-token hit ends inside a Mamba block needs a new "
        "Mamba block past its hit and the copy-on-write block; vLLM counts both (3 Mamba "
        "blocks with the evictable hit, 6 for full attention: 9 against 8 free) and refuses",
        (_FULL4, _ALIGN8),
        num_blocks=9,
        ops=(add("a", _P[:14]), schedule("a", 12), schedule("a"), decode("a"), free("a"),
             add("b", (*_P[:14], *range(900, 910))), schedule("b"), free("b")),
        use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]}, {"new": [[5], []]},
                     {"new": [[], []]}, {}, {}, {"hits": ([[1, 2, 3], [0, 6]], 12), "new": None},
                     {}),
            copies=((4, 6),),
            free_queue=(4, 5, 7, 8, 6, 3, 2, 1))),
    HybridEdgeScenario(
        "transient_checkpoint_inside_a_block_drops_its_keys",
        "full attention at 4 beside a Mamba align group at 8 with prefill checkpoints on an "
        "alignment of 4: a 30-token prompt's first chunk of 14 exports the state at 12 to its "
        "checkpoint block; 12 is not the prompt's checkpoint (28) and ends no Mamba block, so "
        "vLLM drops every key of that block (the full key it was just given too): a sibling "
        "sharing 12 tokens hits nothing",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=64,
        ops=(add("a", _P[:30]), schedule("a", 14), schedule("a"), free("a"),
             add("b", (*_P[:12], *range(700, 710))), schedule("b"), free("b")),
        use_eagle=False, retention=None, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [5, 6]]},
                     {"new": [[5, 7, 8, 9], [0, 10]]}, {}, {},
                     {"hits": ([[], []], 0), "new": [[10, 9, 11, 12, 13, 14], [0, 15, 16]]}, {}),
            copies=(),
            free_queue=(16, 14, *range(17, 64), 8, 7, 5, 4, 3, 2, 1, 6, 13, 12, 11, 9, 10, 15))),
    HybridEdgeScenario(
        "checkpoint_at_a_retained_segment_end_keeps_its_key",
        "retention 24, the same layout: a 30-token prompt's first chunk of 26 exports the state "
        "at 24 to its checkpoint block, the end of Mamba block 2, which retention keeps (the "
        "last of every three); the block keeps its key, so a sibling sharing 28 tokens hits "
        "at 24",
        (_FULL4, _CHECKPOINTS8),
        num_blocks=64,
        ops=(add("a", _P[:30]), schedule("a", 26), schedule("a"), free("a"),
             add("b", (*_P[:28], *range(700, 710))), schedule("b"), free("b")),
        use_eagle=False, retention=24, block_size=4,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6, 7], [0, 0, 8, 9]]},
                     {"new": [[10], []]}, {}, {},
                     {"hits": ([[1, 2, 3, 4, 5, 6], [0, 0, 8]], 24),
                      "new": [[9, 10, 11, 12], [13, 14]]},
                     {}),
            copies=(),
            free_queue=(14, 12, *range(15, 64), 7, 11, 10, 9, 6, 5, 4, 3, 2, 1, 13, 8))),
    HybridEdgeScenario(
        "checkpoint_at_token_one_without_a_lookup",
        "retention 2, full attention at 1 beside a Mamba align group at 1 with prefill "
        "checkpoints on an alignment of 1: an 8-token prompt that skips reading the prefix "
        "cache reserves a checkpoint block for the state at 1 in its first chunk of 2; 1 is "
        "not the prompt's checkpoint, retention keeps every second block (not the first), and "
        "the request has no shared-prefix boundary (0), so the block is left unkeyed",
        (_FULL1, _CHECKPOINTS1),
        num_blocks=32,
        ops=(add("a", _P[:8], skip_read=True), schedule("a", 2), schedule("a"), free("a"),
             add("b", (*_P[:3], 9, 9, 9)), schedule("b"), free("b")),
        use_eagle=False, retention=2, block_size=1,
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2], [3, 4]]},
                     {"new": [[3, 5, 6, 7, 8, 9], [0, 0, 0, 0, 10, 11]]}, {}, {},
                     {"hits": ([[1, 2], [0, 4]], 2), "new": [[12, 13, 14, 15], [0, 0, 16, 17]]},
                     {}),
            copies=(),
            free_queue=(*range(18, 32), 9, 8, 7, 6, 5, 3, 11, 10, 15, 14, 13, 12, 2, 1, 17, 16,
                        4))),
    HybridEdgeScenario(
        "chunked_local_without_caching_frees_past_chunks",
        "vLLM 0.10.2, caching off, full attention at 4 beside chunked local attention (chunks "
        "of 4): a 6-token prompt decoded past several chunks; with no block cached, every "
        "block before the current chunk is freed",
        (_FULL4, _CHUNKED4),
        num_blocks=40, ops=_chunked_local_decodes(6, None), use_eagle=False, retention=None,
        block_size=4, caching=False, profile="vllm-0.10",
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1, 2], [3, 4]]}, {"new": [[], []]},
                     {"new": [[], []]}, {"new": [[5], [6]]}, {"new": [[], []]}, {"new": [[], []]},
                     {"new": [[], []]}, {"new": [[7], [8]]}, {"new": [[], []]}, {"new": [[], []]},
                     {}, {"hits": ([[], []], 0), "new": [[9, 10, 11], [12, 13, 14]]},
                     {"new": [[], []]}, {"new": [[], []]}, {"new": [[], []]},
                     {"new": [[15], [16]]}, {"new": [[], []]}, {}, {}),
            copies=(),
            free_queue=(*range(17, 40), 3, 4, 6, 13, 12, 14, 7, 5, 2, 1, 8, 15, 11, 10, 9, 16))),
    HybridEdgeScenario(
        "chunked_local_keeps_the_one_cached_block",
        "vLLM 0.10.2, full attention at 4 beside chunked local attention (chunks of 4): a "
        "12-token prompt in a chunk of 4 and the rest; after the first chunk one block is "
        "cached, and 0.10.2 keeps the last cached block although the chunk passed it",
        (_FULL4, _CHUNKED4),
        num_blocks=40, ops=_chunked_local_decodes(12, 4), use_eagle=False, retention=None,
        block_size=4, profile="vllm-0.10",
        recorded=Recorded(
            answers=({}, {"hits": ([[], []], 0), "new": [[1], [2]]}, {"new": [[3, 4], [5, 6]]},
                     {"new": [[7], [8]]}, {"new": [[], []]}, {"new": [[], []]}, {"new": [[], []]},
                     {"new": [[9], [10]]}, {"new": [[], []]}, {"new": [[], []]}, {"new": [[], []]},
                     {"new": [[11], [12]]}, {},
                     {"hits": ([[1, 3, 4], [0, 0, 0]], 12), "new": [[13], [14]]},
                     {"new": [[], []]}, {"new": [[15], [16]]}, {"new": [[], []]},
                     {"new": [[], []]}, {"new": [[], []]}, {}, {}),
            copies=(),
            free_queue=(*range(17, 40), 5, 2, 6, 8, 11, 9, 7, 12, 10, 15, 13, 4, 3, 1, 16, 14))),
)
