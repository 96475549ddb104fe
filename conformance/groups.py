"""KV-cache groups inside the harness: block ids are always one list per group.

The protocol has two forms (``kvcheck.conformance.protocol``): a single-group adapter
(``spec.kv_cache_groups`` empty) answers flat lists, a grouped one a list per group. The guard
(``kvcheck.conformance.guard``) turns a flat answer into the one-group case (``[answer]``) at the
adapter boundary, so the driver, the laws and the oracle comparison are written once, over
groups. What a person reads (repro snippets, mismatch reports, recorded answers) shows the
adapter's own form again: ``adapter_form`` and its helpers.

Block id 0 is vLLM's null block in a grouped spec: the position of a block a sliding window
(or a finished local chunk) no longer needs (docs/semantics.md#skipped-tokens-and-null-blocks).
A single-group spec has no null positions (under ``generic`` id 0 is an ordinary block).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

from kvcheck.conformance.ops import StepResult
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec

__all__ = ["NULL_BLOCK", "AdapterBlockIds", "OneGroupResult", "adapter_form", "null_floor",
           "null_of", "one_group", "one_group_tables", "shown_result", "shown_tables",
           "skipped_tokens", "window_slack"]

NULL_BLOCK = 0
#: Block ids in an adapter's own form: one list for a spec without ``kv_cache_groups``, one
#: list per group otherwise (what ``adapter_form`` gives).
AdapterBlockIds = list[int] | list[list[int]]


def null_of(spec: KVCacheSpec) -> int | None:
    """The id that marks a skipped position in ``spec``'s tables (None: there is none)."""
    return NULL_BLOCK if spec.kv_cache_groups else None


def skipped_tokens(group: KVCacheGroupSpec, num_tokens: int,
                   extra_retained_tokens: int = 0) -> int:
    """vLLM 0.33's ``get_num_skipped_tokens`` of ``group`` after ``num_tokens`` computed
    tokens (docs/semantics.md#skipped-tokens-and-null-blocks); a sliding window keeps
    ``extra_retained_tokens`` more below it (multi-module MTP,
    docs/semantics.md#multi-module-mtp)."""
    if group.kind == "sliding_window" and group.sliding_window is not None:
        return max(0, num_tokens - group.sliding_window + 1 - extra_retained_tokens)
    if group.kind == "chunked_local_attention" and group.attention_chunk_size is not None:
        return num_tokens // group.attention_chunk_size * group.attention_chunk_size
    if group.kind == "mamba":  # only the last computed token's state is read
        return max(0, num_tokens - 1)
    return 0


def null_floor(spec: KVCacheSpec, group: int, num_tokens: int, retained: bool = True) -> int:
    """The number of leading positions of ``group`` a request with ``num_tokens`` computed
    tokens no longer holds (its live blocks must all lie at or above it). vLLM 0.10.2's Mamba
    groups skip nothing (a request keeps its blocks until it is freed). A sliding window with
    multi-module MTP (``spec.num_prefill_lookahead`` K > 1) keeps ``K - 1`` more tokens
    below it (``extra_retained_tokens``); ``retained=False``: the floor without them, below
    which the window no longer reads (its nulls must all lie below that one: a hit brings
    none of the retained positions)."""
    if spec.profile == "vllm-0.10" and spec.groups[group].kind == "mamba":
        return 0
    extra = max(0, spec.num_prefill_lookahead - 1) if retained else 0
    return skipped_tokens(spec.groups[group], num_tokens, extra) // spec.group_block_size(group)


def window_slack(spec: KVCacheSpec, group: int) -> int:
    """Live blocks below the floor a profile keeps: vLLM 0.10.2's chunked-local removal keeps
    the last cached block (docs/semantics.md#skipped-tokens-and-null-blocks)."""
    kind = spec.groups[group].kind
    return 1 if spec.profile == "vllm-0.10" and kind == "chunked_local_attention" else 0


def adapter_form(spec: KVCacheSpec, groups: list[list[int]]) -> AdapterBlockIds:
    """Per-group block ids as the adapter itself answered them: the one list of a
    single-group spec, the per-group lists otherwise (no lists at all: ``[]``, the empty
    hits a running request passes)."""
    if spec.kv_cache_groups or not groups:
        return groups
    return groups[0]


def shown_result(spec: KVCacheSpec, result: StepResult) -> dict[str, object]:
    """A ``StepResult`` with its block ids in the adapter's form (for messages and records)."""
    out: dict[str, object] = dict(result)
    if "hits" in result:
        ids, num = result["hits"]
        out["hits"] = (adapter_form(spec, ids), num)
    new = result.get("new")
    if new is not None:
        out["new"] = adapter_form(spec, new)
    return out


def shown_tables(spec: KVCacheSpec,
                 tables: Mapping[str, list[list[int]]]) -> dict[str, AdapterBlockIds]:
    """``Driver.tables()`` in the adapter's form: ``{rid: table}`` for a single-group spec."""
    return {rid: adapter_form(spec, t) for rid, t in tables.items()}


class OneGroupResult(TypedDict, total=False):
    """A single-group ``StepResult`` in the adapter's flat form (``one_group``)."""

    hits: tuple[list[int], int]
    new: list[int] | None
    reset: bool


def one_group(result: StepResult) -> OneGroupResult:
    """A single-group spec's ``StepResult`` as the adapter answered it (flat lists): what the
    scripted single-group tests read and print."""
    # Keys in the StepResult's order (hits, new, reset), as a copy of it would have them.
    out: OneGroupResult = {}
    if "hits" in result:
        (ids,), num = result["hits"]
        out["hits"] = (ids, num)
    if "new" in result:
        new = result["new"]
        if new is None:
            out["new"] = None
        else:
            (out["new"],) = new
    if "reset" in result:
        out["reset"] = result["reset"]
    return out


def one_group_tables(tables: Mapping[str, Sequence[Sequence[int]]]) -> dict[str, list[int]]:
    """A single-group spec's ``Driver.tables()`` as flat tables (``{rid: table}``)."""
    return {rid: list(table) for rid, (table,) in tables.items()}
