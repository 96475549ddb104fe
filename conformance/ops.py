"""Tiny constructors for workload ops (see ``kvcheck.conformance.driver``), and their types.

An op is a plain JSON-serialisable dict (traces store them as they are); the TypedDicts below
say which fields each kind of op has.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, TypedDict

from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:  # typing.Unpack is 3.11+; only mypy reads these annotations
    from typing_extensions import Unpack

__all__ = [
    "AddOp",
    "CacheOp",
    "DecodeOp",
    "EvictOp",
    "FreeOp",
    "LookupOp",
    "Op",
    "RequestExtras",
    "ResetOp",
    "ScheduleOp",
    "StepResult",
    "add",
    "cache",
    "decode",
    "evict",
    "free",
    "lookup",
    "one_token_decodes",
    "reset",
    "schedule",
]


class _AddFields(TypedDict):
    op: Literal["add"]
    rid: str
    prompt: list[int]


class AddOp(_AddFields, total=False):
    """A new request. ``lora``: ``[name, int id, path]``; ``mm``: ``[identifier, offset,
    length]`` per multimodal item; ``salt``: the cache salt; ``skip_read``: prompt logprobs
    requested (no prefix-cache reads); ``encoder``: the encoder tokens of an encoder-decoder
    request (a ``cross_attention`` layout), passed as ``num_encoder_tokens`` when the request
    is admitted, as vLLM's scheduler passes them with the step that schedules the encoder
    input. Absent when not set."""

    lora: list[str | int] | None
    mm: list[list[str | int]]
    salt: str | None
    skip_read: bool
    encoder: int


class _ScheduleFields(TypedDict):
    op: Literal["schedule"]
    rid: str
    num_tokens: int | None


class ScheduleOp(_ScheduleFields, total=False):
    """One prefill step of up to ``num_tokens`` prompt tokens (None: the rest);
    ``lookahead``: ``num_lookahead_tokens`` (speculative slots) passed to ``allocate_slots``,
    absent when 0. ``external``: for a request holding no blocks, a KV connector has this
    many tokens after its local hit (``num_external_computed_tokens``, capability
    ``external_kv``); ``delay``: their load is asynchronous (``delay_cache_blocks``, no new
    tokens computed in this step). Both absent when 0 / false. ``gates``: vLLM 0.33's
    admission gates passed to ``allocate_slots`` as keyword arguments
    (``full_sequence_must_fit``, ``reserved_blocks``, ``has_scheduled_reqs``; capability
    ``admission_gates``), ``num_in_flight_tokens`` (capability ``async_scheduling``) and
    ``skip_zeroing_group_ids`` (a list of group ids, with ``delay``; capability
    ``block_zeroing``), absent when none."""

    lookahead: int
    external: int
    delay: bool
    gates: dict[str, bool | int | list[int]]
    #: vLLM 0.33's ``truncate_computed_blocks``: the hits of the request's lookup trimmed at
    #: this many tokens (aligned to every group's block) before ``allocate_slots``, as its
    #: scheduler trims a local hit ending inside a block when a connector loads past it.
    truncate: int


class _DecodeFields(TypedDict):
    op: Literal["decode"]
    rid: str
    num_tokens: int


class DecodeOp(_DecodeFields, total=False):
    """Sample ``num_tokens`` tokens and allocate their slots (plus ``lookahead`` speculative
    slots, absent when 0); ``gates``: ``num_in_flight_tokens`` (asynchronous scheduling,
    capability ``async_scheduling``), absent when none."""

    lookahead: int
    gates: dict[str, bool | int | list[int]]


class _FreeFields(TypedDict):
    op: Literal["free"]
    rid: str


class FreeOp(_FreeFields, total=False):
    """Free a request; ``in_flight``: its tokens in flight (``async_scheduling``: a
    KV producer's ``finalize_partial_tail_offloads`` gets them), absent when 0; ``preempt``:
    preempted inside the scheduler's step (vLLM's ``_preempt_request`` in ``schedule()``,
    when a step does not fit), so before the step's copies and boundary-state hand-offs are
    drained and without finalizing its partial tail, absent when False."""

    in_flight: int
    preempt: bool


class CacheOp(TypedDict):
    """An asynchronous external load of ``rid`` ended with its first ``num_tokens`` tokens
    valid (all of them: the load arrived; fewer: it failed past there): the request's
    computed tokens become ``num_tokens`` and ``cache_blocks(view, num_tokens)`` caches them,
    as vLLM's scheduler does (then a whole-prompt hit is rewound by one token)."""

    op: Literal["cache"]
    rid: str
    num_tokens: int


class EvictOp(TypedDict):
    """``evict_blocks(block_ids)``: the blocks whose external load failed lose their cache
    keys (capability ``evict_blocks``)."""

    op: Literal["evict"]
    block_ids: list[int]


class ResetOp(TypedDict):
    op: Literal["reset"]


class LookupOp(TypedDict):
    """``get_computed_blocks`` of a waiting request that is then not scheduled (with
    ``pinning_lookup``, followed by ``release_computed``)."""

    op: Literal["lookup"]
    rid: str


#: A workload op of any kind; ``op["op"]`` tells which.
Op = AddOp | ScheduleOp | DecodeOp | FreeOp | ResetOp | LookupOp | CacheOp | EvictOp


class RequestExtras(TypedDict, total=False):
    """The optional keyword arguments of ``add``."""

    lora: Sequence[str | int]
    mm: Iterable[Sequence[str | int]]
    salt: str
    skip_read: bool
    encoder: int


def add(rid: str, prompt: Sequence[int], **extras: Unpack[RequestExtras]) -> AddOp:
    """A new request; extras: lora=(name, id, path), mm=[(id, offset, length)], salt=str,
    skip_read=bool, encoder=int (encoder tokens, >= 1)."""
    op: AddOp = {"op": "add", "rid": rid, "prompt": list(prompt)}
    for key in extras:  # in the caller's order: the op prints and is stored that way
        if key == "lora":
            op["lora"] = list(extras["lora"])
        elif key == "mm":
            op["mm"] = [list(v) for v in extras["mm"]]
        elif key == "salt":
            op["salt"] = extras["salt"]
        elif key == "skip_read":
            op["skip_read"] = extras["skip_read"]
        elif key == "encoder":
            op["encoder"] = extras["encoder"]
        else:
            raise KVCheckInputError(f"unknown request extra {key!r}")
    return op


def schedule(rid: str, num_tokens: int | None = None, lookahead: int = 0, *,
             external: int = 0, delay: bool = False,
             gates: dict[str, bool | int | list[int]] | None = None,
             truncate: int | None = None) -> ScheduleOp:
    """One prefill step of up to ``num_tokens`` prompt tokens (default: the rest), with
    ``lookahead`` speculative slots (the ``lookahead`` capability; 0: the field is left out, so
    ops without it read as before); ``external`` tokens a connector has after the local hit,
    loaded asynchronously when ``delay`` (``external_kv``; see ``ScheduleOp``); ``truncate``:
    the lookup's hits trimmed at that many tokens first (see ``ScheduleOp``)."""
    op: ScheduleOp = {"op": "schedule", "rid": rid, "num_tokens": num_tokens}
    if lookahead:
        op["lookahead"] = lookahead
    if external:
        op["external"] = external
    if delay:
        op["delay"] = True
    if gates:
        op["gates"] = dict(gates)
    if truncate is not None:
        op["truncate"] = truncate
    return op


def cache(rid: str, num_tokens: int) -> CacheOp:
    """An asynchronous load of ``rid`` ended with ``num_tokens`` valid tokens (``CacheOp``)."""
    return {"op": "cache", "rid": rid, "num_tokens": num_tokens}


def evict(block_ids: Iterable[int]) -> EvictOp:
    """``evict_blocks(block_ids)`` (``EvictOp``)."""
    return {"op": "evict", "block_ids": list(block_ids)}


def decode(rid: str, num_tokens: int = 1, lookahead: int = 0, *,
           gates: dict[str, bool | int | list[int]] | None = None) -> DecodeOp:
    """Sample ``num_tokens`` tokens and allocate their slots, plus ``lookahead`` speculative
    ones (0: the field is left out); ``gates``: ``allocate_slots`` keyword arguments
    (``num_in_flight_tokens``, asynchronous scheduling), absent when none."""
    op: DecodeOp = {"op": "decode", "rid": rid, "num_tokens": num_tokens}
    if lookahead:
        op["lookahead"] = lookahead
    if gates:
        op["gates"] = dict(gates)
    return op


def free(rid: str, in_flight: int = 0, preempt: bool = False) -> FreeOp:
    """Free ``rid``; ``in_flight``: its tokens still in flight when it finishes
    (asynchronous scheduling: passed to ``finalize_partial_tail_offloads``; 0: the field is
    left out); ``preempt``: preempted inside the scheduler's step (see ``FreeOp``; False: the
    field is left out)."""
    op: FreeOp = {"op": "free", "rid": rid}
    if in_flight:
        op["in_flight"] = in_flight
    if preempt:
        op["preempt"] = True
    return op


def reset() -> ResetOp:
    return {"op": "reset"}


def lookup(rid: str) -> LookupOp:
    """A prefix lookup the scheduler does not follow with an allocation."""
    return {"op": "lookup", "rid": rid}


def one_token_decodes(ops: Iterable[Op], multi_token: bool) -> list[Op]:
    """``ops`` with every ``decode`` of n > 1 tokens split into n one-token decodes unless
    ``multi_token`` (the ``multi_token_decode`` capability). The sampled tokens are the same
    (they depend on the request and the output position only); only the step size changes."""
    out: list[Op] = []
    for op in ops:
        if op["op"] == "decode" and op["num_tokens"] > 1 and not multi_token:
            lookahead = op.get("lookahead", 0)
            # The step's in-flight tokens (asynchronous scheduling) go with its first token.
            out += [decode(op["rid"], 1, lookahead, gates=op.get("gates") if i == 0 else None)
                    for i in range(op["num_tokens"])]
        else:
            out.append(op)
    return out


class StepResult(TypedDict, total=False):
    """What the implementation answered to one op (compared with the oracle's answer), block
    ids one list per KV-cache group (one list for a single-group spec): ``hits`` is
    ``get_computed_blocks``'s ``(per-group block ids, num_computed_tokens)`` when the op
    admitted or looked up a request, ``new`` what ``allocate_slots`` returned (per-group new
    ids, or None), ``reset`` what ``reset_prefix_cache`` returned."""

    hits: tuple[list[list[int]], int]
    new: list[list[int]] | None
    reset: bool
