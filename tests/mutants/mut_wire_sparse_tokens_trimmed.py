"""Bug (sparse groups): a window group's ``BlockStored.token_ids`` cut to its hashes' blocks.

In a sliding-window group the tokens of a store span the null blocks the window dropped,
while ``block_hashes`` names only the blocks it keeps (vLLM ``block_pool.py``; spec
kv-events-wire.md §3). Producers and consumers that assume ``len(token_ids) ==
len(block_hashes) * block_size`` pair tokens with the wrong hashes (AMD Infera #98,
llm-d-router #2363). Here the producer trims the span to the kept blocks' tokens.
"""

from __future__ import annotations

from dataclasses import replace

from _wire_mutant_base import build_wire, encode_as_reference

from kvcheck.reference_impl.events import BlockStored


def trimmed(adapter, events, ts):  # type: ignore[no-untyped-def]
    out = []
    for event in events:
        sent = event
        if isinstance(event, BlockStored):
            keep = len(event.block_hashes) * event.block_size
            if len(event.token_ids) > keep:
                # BUG: the tokens of the dropped (null) blocks are cut off.
                sent = replace(event, token_ids=event.token_ids[len(event.token_ids) - keep:])
        out.append(sent)
    return encode_as_reference(adapter, out, ts)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_wire(
    "mut_wire_sparse_tokens_trimmed", trimmed)
