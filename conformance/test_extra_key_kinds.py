"""Extra keys by kind: LoRA adapters, multimodal items and cache salts each isolate the prefix
cache (capabilities ``lora``, ``multimodal``, ``cache_salt``; ``extra_keys`` declares all
three, see ``kvcheck.conformance.protocol.extra_key_kinds``).

One scripted scenario per kind, profile-independent (``kv_generic``): the same tokens under
two different contexts of that kind (another adapter, another image at the same place,
another salt; or that context against none) never share a block and never hit each other's
blocks, while the same context does hit (the positive control, so the isolation is not a
design that never hits). The scenario waits for a request to finish before its blocks are
looked up, so it holds for designs that cache only at finish (without
``caches_running_requests``) too, and keeps the requests of both contexts running while it
compares their block tables, so a design that rebinds a block to an identical one
(``dedup_on_insert``) is checked after its forward pass as well.

The hit-correctness law judges every hit of every test anyway; what these tests add is that
the workload certainly asks the question, at the design's own block size, in a few ops: a
design that leaves one kind out of its key fails here at any ``--kv-max-examples``, where the
random workloads find it only by luck.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.groups import one_group, one_group_tables
from kvcheck.conformance.ops import RequestExtras, add, decode, free, schedule
from kvcheck.conformance.protocol import reserved_block_ids
from kvcheck.conformance.sizes import tokens

if TYPE_CHECKING:
    from kvcheck.conformance.differential import Pair, PairFactory
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.sizes import DeclaredSizes

#: Full blocks of the prompt (it has one token more, so a full hit is all of them).
NUM_FULL = 3
#: Blocks one request of the scenario may hold: its prompt's, one for a decode step, and one
#: for a design that reserves ahead.
_PER_REQUEST = NUM_FULL + 3
#: Requests holding blocks at once, at most.
_LIVE = 2

_LORA_A = ("adapter-a", 1, "/lora/adapter-a")
# Another name, id and path: a different adapter under every profile (vLLM 0.10 keys the id,
# 0.33 the name and path).
_LORA_B = ("adapter-b", 2, "/lora/adapter-b")
# Items at position 0 (2 tokens), so they are in block 0 at every block size: no block of the
# prompt may be shared. vLLM 0.10 keys the identifier, 0.33 the identifier and offset.
_MM_A = [("image-a", 0, 2)]
_MM_B = [("image-b", 0, 2)]

#: kind -> case -> (the context cached first, the other context asking for the same tokens).
CASES: dict[str, dict[str, tuple[RequestExtras, RequestExtras]]] = {
    "lora": {
        "another-adapter": ({"lora": _LORA_A}, {"lora": _LORA_B}),
        "adapter-vs-none": ({"lora": _LORA_A}, {}),
        "none-vs-adapter": ({}, {"lora": _LORA_A}),
    },
    "multimodal": {
        "another-image": ({"mm": _MM_A}, {"mm": _MM_B}),
        "image-vs-none": ({"mm": _MM_A}, {}),
        "none-vs-image": ({}, {"mm": _MM_A}),
    },
    "cache_salt": {
        "another-salt": ({"salt": "tenant-a"}, {"salt": "tenant-b"}),
        "salt-vs-none": ({"salt": "tenant-a"}, {}),
        "none-vs-salt": ({}, {"salt": "tenant-a"}),
    },
}


def _pair(kv_pair: PairFactory, kv_impl: ImplHandle, kv_profile: str,
          kv_sizes: DeclaredSizes) -> Pair:
    """A pool for the scenario: blocks of 4 tokens, or the size ``kv_sizes`` maps 4 to (under
    generic, the smallest declared size when 4 is not declared), with room for the live
    requests and a finished one's cached blocks; within ``num_blocks_range``, else not
    applicable."""
    reserved = len(reserved_block_ids(kv_impl.info, kv_profile))
    need = reserved + _LIVE * _PER_REQUEST
    num_blocks = kv_sizes.num_blocks(need + NUM_FULL + 1)
    if num_blocks < need:
        pytest.skip(f"{kv_impl.name} declares pools of at most {num_blocks} blocks "
                    f"(IMPL_INFO.num_blocks_range); this scenario needs {need}")
    return kv_pair(num_blocks=num_blocks, block_size=4)


def _shared(pair: Pair, a: str, b: str) -> list[int]:
    tables = one_group_tables(pair.impl.tables())
    return sorted(set(tables[a]) & set(tables[b]))


def check_contexts_isolated(pair: Pair, kind: str, mine: RequestExtras,
                            theirs: RequestExtras) -> None:
    """The scenario: ``first`` (context ``mine``) runs and finishes; ``same`` (``mine``)
    hits all its full blocks; ``other`` (``theirs``, the same tokens) hits nothing and shares
    no block with ``same``, also after a decode step of each; once ``other`` finishes,
    ``again`` (``theirs``) hits all of ``other``'s full blocks, none of ``same``'s."""
    bs = pair.spec.block_size
    prompt = list(range(40, 40 + tokens(NUM_FULL, bs, 1)))
    full = tokens(NUM_FULL, bs)
    where = f"{kind}: the same {len(prompt)} tokens (blocks of {bs}) under {mine} and {theirs}"
    pair.run([add("first", prompt, **mine), schedule("first"), free("first"),
              add("same", prompt, **mine)])
    hits, num = one_group(pair.apply(schedule("same")))["hits"]
    assert num == full, (
        f"{where}: a second request under {mine} hit {num} tokens ({list(hits)}) of the "
        f"first one's {NUM_FULL} full blocks, expected all {full} (the positive control: "
        "the same context must hit)\n" + pair.impl.snippet())
    pair.apply(add("other", prompt, **theirs))
    hits, num = one_group(pair.apply(schedule("other")))["hits"]
    assert num == 0 and not list(hits), (
        f"{where}: the request under {theirs} hit {num} tokens (blocks {list(hits)}) cached "
        f"under {mine}; a block's key must include the {kind} context (capability "
        f"{kind!r})\n" + pair.impl.snippet())
    shared = _shared(pair, "same", "other")
    assert not shared, (
        f"{where}: requests 'same' and 'other' share blocks {shared}\n" + pair.impl.snippet())
    pair.run([decode("same"), decode("other")])  # a dedup-on-insert design rebinds by now
    shared = _shared(pair, "same", "other")
    assert not shared, (
        f"{where}: after a decode step, requests 'same' and 'other' share blocks {shared}\n"
        + pair.impl.snippet())
    theirs_blocks = pair.impl.tables()["other"][0][:NUM_FULL]
    pair.run([free("other"), add("again", prompt, **theirs)])
    hits, num = one_group(pair.apply(schedule("again")))["hits"]
    reused = sorted(set(hits) & set(pair.impl.tables()["same"][0]))
    assert num == full and not reused, (
        f"{where}: a request under {theirs} after 'other' finished hit {num} tokens (blocks "
        f"{list(hits)}; 'other' held {theirs_blocks}), expected all {full}, none of 'same''s "
        f"blocks {pair.impl.tables()['same'][0]} (the positive control for {theirs})\n"
        + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching", "lora")
@pytest.mark.parametrize("case", list(CASES["lora"]))
def test_lora_contexts_never_share_blocks(kv_pair: PairFactory, kv_impl: ImplHandle,
                                          kv_profile: str, kv_sizes: DeclaredSizes,
                                          case: str) -> None:
    """The same tokens under another LoRA adapter (or none) never hit or share a block; the
    same adapter hits."""
    check_contexts_isolated(_pair(kv_pair, kv_impl, kv_profile, kv_sizes), "lora",
                            *CASES["lora"][case])


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching", "multimodal")
@pytest.mark.parametrize("case", list(CASES["multimodal"]))
def test_multimodal_contexts_never_share_blocks(kv_pair: PairFactory, kv_impl: ImplHandle,
                                                kv_profile: str, kv_sizes: DeclaredSizes,
                                                case: str) -> None:
    """The same tokens with another image at the same place (or none) never hit or share a
    block; the same image hits."""
    check_contexts_isolated(_pair(kv_pair, kv_impl, kv_profile, kv_sizes), "multimodal",
                            *CASES["multimodal"][case])


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching", "cache_salt")
@pytest.mark.parametrize("case", list(CASES["cache_salt"]))
def test_cache_salt_contexts_never_share_blocks(kv_pair: PairFactory, kv_impl: ImplHandle,
                                                kv_profile: str, kv_sizes: DeclaredSizes,
                                                case: str) -> None:
    """The same tokens under another cache salt (or none) never hit or share a block; the
    same salt hits."""
    check_contexts_isolated(_pair(kv_pair, kv_impl, kv_profile, kv_sizes), "cache_salt",
                            *CASES["cache_salt"][case])
