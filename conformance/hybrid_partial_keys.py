"""Golden scenarios of vLLM 0.33's partial-block keys (docs/semantics.md#partial-block-keys):
a full-attention group whose block is larger than the hash block (the gcd of the groups' block
sizes) keys the block holding the prompt's last hash boundary by the hash at that boundary too.

Only KV events show these keys (vLLM never looks them up without a Mamba "align" group), so
each step states the answer of the op and the events it emitted, as vLLM 0.33.0's own
``KVCacheManager`` gave them: the scenarios were replayed through kvcheck's vLLM adapter
(``Driver(load_impl("vllm"), spec)``, ``take_events()`` after every op, printed with
``show_events``) and the output copied here. ``--kv-impl=vllm`` replays them on vLLM again.

What they pin down (each verified in vLLM 0.33.0's source and by these replays):

* only the last prompt boundary ``b = (num_prompt_tokens - 1) // hbs * hbs`` is keyed, and
  only when it is inside a block (``_cache_partial_tail_block``,
  ``single_type_kv_cache_manager.py:859-897``); the other boundaries inside blocks never are;
* the hybrid coordinator caches up to the scheduler block only (``get_num_cacheable_tokens``,
  ``kv_cache_coordinator.py:777-803``), so the block is keyed by the step that fills it: its
  full key first (``BlockStored``, ``block_size`` the group's), then the partial key as a
  secondary key (``BlockStored`` of one hash, ``block_size`` the hash block's, the hash block
  of tokens before ``b``, the hash before it as parent; ``block_pool.py:486-603``);
* evicting the block removes both keys, full key first, one ``BlockRemoved`` each
  (``_remove_cached_block_hashes``, ``block_pool.py:630-648``); ``evict_blocks`` on a running
  request's block removes both, and its next step keys the boundary again, now as the
  block's only (primary) key;
* a second request with the same boundary keys its own block by the same partial hash;
  ``reset_prefix_cache`` clears every key.

Event notation (``show_events``): ``S g<group> bs<block_size> <hashes> <parent> <tokens>`` and
``R g<group> <hashes>``, hashes named ``h0, h1, ...`` in order of first appearance over the
scenario (so the names do not depend on the hash algorithm), ``-`` for no parent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, decode, evict, free, reset, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["PARTIAL_KEY_SCENARIOS", "PartialKeyScenario", "PartialKeyStep", "show_events"]


@dataclass(frozen=True)
class PartialKeyStep:
    """One op, its answer (``StepResult``; ``{}`` for an op that calls nothing) and the
    events it emitted (``show_events``)."""

    op: Op
    answer: StepResult
    events: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartialKeyScenario:
    """``steps`` on a pool of ``num_blocks`` blocks in ``groups`` (KV events on; the spec's
    ``block_size`` is 2, every group states its own); ``needs``: capabilities beyond the
    groups' kinds and ``events``."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    steps: tuple[PartialKeyStep, ...]
    needs: tuple[str, ...] = ()


def show_events(events: Iterable[Mapping[str, object]], names: dict[object, str]) -> list[str]:
    """Events in this module's notation; ``names`` maps each hash seen so far to its name and
    is extended with the new ones (in order of appearance)."""
    def name(value: object) -> str:
        if value is None:
            return "-"
        key = bytes(value) if isinstance(value, (bytes, bytearray)) else value
        return names.setdefault(key, f"h{len(names)}")

    def hashes(event: Mapping[str, object]) -> str:
        values = event.get("block_hashes") or ()
        assert isinstance(values, (list, tuple)), values
        return ",".join(name(h) for h in values) or "[]"

    out = []
    for event in events:
        kind, group = event.get("type"), event.get("group_idx")
        if kind == "BlockStored":
            tokens = event.get("token_ids") or ()
            assert isinstance(tokens, (list, tuple)), tokens
            out.append(f"S g{group} bs{event.get('block_size')} {hashes(event)} "
                       f"{name(event.get('parent_block_hash'))} {list(tokens)}")
        elif kind == "BlockRemoved":
            out.append(f"R g{group} {hashes(event)}")
        else:
            out.append(str(kind))
    return out


#: Full attention in blocks of 4 beside a 4-token window in blocks of 2: hash block 2,
#: scheduler block 4.
_FULL4_SWA2 = (KVCacheGroupSpec("full_attention", 4),
               KVCacheGroupSpec("sliding_window", 2, sliding_window=4))
#: Full attention in blocks of 4 beside a 6-token window in blocks of 6: hash block 2,
#: scheduler block 12 (past the full group's block).
_FULL4_SWA6 = (KVCacheGroupSpec("full_attention", 4),
               KVCacheGroupSpec("sliding_window", 6, sliding_window=6))
_A7 = list(range(100, 107))  # boundary 6: inside full-attention block 1 (tokens 4-7)
#: _A7 and the first five tokens 'a' samples.
_A12 = "[100, 101, 102, 103, 104, 105, 106, 52707, 52714, 52721, 52728, 52735]"

_S = PartialKeyStep

PARTIAL_KEY_SCENARIOS: tuple[PartialKeyScenario, ...] = (
    PartialKeyScenario(
        "prompt_ends_inside_a_block",
        "a 7-token prompt: its last boundary (6) is inside block 1, keyed by the decode that "
        "fills the block, after the block's full key; later steps key nothing again",
        _FULL4_SWA2, 16,
        (
            _S(add("a", _A7), {}),
            _S(schedule("a"), {"hits": ([[], []], 0), "new": [[1, 2], [3, 4, 5, 6]]},
               ("S g0 bs4 h0 - [100, 101, 102, 103]",
                "S g1 bs2 h1,h0 - [100, 101, 102, 103]")),
            _S(decode("a"), {"new": [[], []]},
               ("S g0 bs4 h2 h0 [104, 105, 106, 52707]",
                "S g0 bs2 h3 h0 [104, 105]",
                "S g1 bs2 h3,h2 h0 [104, 105, 106, 52707]")),
            _S(decode("a"), {"new": [[7], [8]]}),
            _S(decode("a"), {"new": [[], []]}),
            _S(free("a"), {}),
        )),
    PartialKeyScenario(
        "chunked_prefill_keys_only_the_last_boundary",
        "an 11-token prompt in chunks of 4, 4, 2 and 1: boundaries 2 and 6 are inside blocks "
        "too but only the last one (10) is keyed, by the decode that fills block 2",
        _FULL4_SWA2, 16,
        (
            _S(add("a", list(range(100, 111))), {}),
            _S(schedule("a", 4), {"hits": ([[], []], 0), "new": [[1], [2, 3]]},
               ("S g0 bs4 h0 - [100, 101, 102, 103]",
                "S g1 bs2 h1,h0 - [100, 101, 102, 103]")),
            _S(schedule("a", 4), {"new": [[4], [5, 6]]},
               ("S g0 bs4 h2 h0 [104, 105, 106, 107]",
                "S g1 bs2 h3,h2 h0 [104, 105, 106, 107]")),
            _S(schedule("a", 2), {"new": [[7], [8]]}),
            _S(schedule("a"), {"new": [[], [9]]}),
            _S(decode("a"), {"new": [[], []]},
               ("S g0 bs4 h4 h2 [108, 109, 110, 52707]",
                "S g0 bs2 h5 h2 [108, 109]",
                "S g1 bs2 h5,h4 h2 [108, 109, 110, 52707]")),
            _S(decode("a"), {"new": [[10], [11]]}),
            _S(free("a"), {}),
            _S(reset(), {"reset": True}, ("AllBlocksCleared",)),
        )),
    PartialKeyScenario(
        "eviction_removes_both_keys",
        "a 9-block pool: 'b' (7 other tokens) reuses 'a''s freed blocks; block 2, keyed by "
        "its full key and 'a''s partial key, loses both, full key first",
        _FULL4_SWA2, 9,
        (
            _S(add("a", _A7), {}),
            _S(schedule("a"), {"hits": ([[], []], 0), "new": [[1, 2], [3, 4, 5, 6]]},
               ("S g0 bs4 h0 - [100, 101, 102, 103]",
                "S g1 bs2 h1,h0 - [100, 101, 102, 103]")),
            _S(decode("a"), {"new": [[], []]},
               ("S g0 bs4 h2 h0 [104, 105, 106, 52707]",
                "S g0 bs2 h3 h0 [104, 105]",
                "S g1 bs2 h3,h2 h0 [104, 105, 106, 52707]")),
            _S(free("a"), {}),
            _S(add("b", list(range(300, 307))), {}),
            _S(schedule("b"), {"hits": ([[], []], 0), "new": [[7, 8], [4, 3, 2, 1]]},
               ("R g1 h0", "R g1 h1", "R g0 h2", "R g0 h3", "R g0 h0",
                "S g0 bs4 h4 - [300, 301, 302, 303]",
                "S g1 bs2 h5,h4 - [300, 301, 302, 303]")),
            _S(free("b"), {}),
        )),
    PartialKeyScenario(
        "second_request_keys_its_own_block",
        "'b' extends 'a''s 7-token prompt by one token: it hits block 1 (4 tokens), and its "
        "boundary (6) is 'a''s, so its own block 9 is keyed by the partial hash 'a''s freed "
        "block 2 still carries (two blocks under one key); the reset clears both",
        _FULL4_SWA2, 16,
        (
            _S(add("a", _A7), {}),
            _S(schedule("a"), {"hits": ([[], []], 0), "new": [[1, 2], [3, 4, 5, 6]]},
               ("S g0 bs4 h0 - [100, 101, 102, 103]",
                "S g1 bs2 h1,h0 - [100, 101, 102, 103]")),
            _S(decode("a"), {"new": [[], []]},
               ("S g0 bs4 h2 h0 [104, 105, 106, 52707]",
                "S g0 bs2 h3 h0 [104, 105]",
                "S g1 bs2 h3,h2 h0 [104, 105, 106, 52707]")),
            _S(decode("a"), {"new": [[7], [8]]}),
            _S(decode("a"), {"new": [[], []]}),
            _S(decode("a"), {"new": [[], [9]]}),
            _S(free("a"), {}),
            _S(add("b", [*_A7, 900]), {}),
            _S(schedule("b"), {"hits": ([[1], [3, 4]], 4), "new": [[9], [8, 7]]},
               ("S g0 bs4 h4 h0 [104, 105, 106, 900]",
                "S g0 bs2 h3 h0 [104, 105]",
                "S g1 bs2 h3,h4 h0 [104, 105, 106, 900]")),
            _S(free("b"), {}),
            _S(reset(), {"reset": True}, ("AllBlocksCleared",)),
        )),
    PartialKeyScenario(
        "evicted_partial_key_comes_back_as_primary",
        "evict_blocks on the running 'a''s block 2 removes its full and partial keys; the "
        "next step keys the boundary again, now the block's only key (its full key is not "
        "restored: the block counts as cached)",
        _FULL4_SWA2, 16,
        (
            _S(add("a", _A7), {}),
            _S(schedule("a"), {"hits": ([[], []], 0), "new": [[1, 2], [3, 4, 5, 6]]},
               ("S g0 bs4 h0 - [100, 101, 102, 103]",
                "S g1 bs2 h1,h0 - [100, 101, 102, 103]")),
            _S(decode("a"), {"new": [[], []]},
               ("S g0 bs4 h2 h0 [104, 105, 106, 52707]",
                "S g0 bs2 h3 h0 [104, 105]",
                "S g1 bs2 h3,h2 h0 [104, 105, 106, 52707]")),
            _S(evict([2]), {}, ("R g0 h2", "R g0 h3")),
            _S(decode("a"), {"new": [[7], [8]]}, ("S g0 bs2 h3 h0 [104, 105]",)),
            _S(free("a"), {}),
        ),
        needs=("evict_blocks",)),
    PartialKeyScenario(
        "scheduler_block_past_the_block",
        "full attention in blocks of 4 beside a window in blocks of 6 (scheduler block 12): "
        "the boundary (6) is keyed only at 12 computed tokens, after the full keys of "
        "blocks 0-2",
        _FULL4_SWA6, 16,
        (
            _S(add("a", _A7), {}),
            _S(schedule("a"), {"hits": ([[], []], 0), "new": [[1, 2], [3, 4]]}),
            _S(decode("a"), {"new": [[], []]}),
            _S(decode("a"), {"new": [[5], []]}),
            _S(decode("a"), {"new": [[], []]}),
            _S(decode("a"), {"new": [[], []]}),
            _S(decode("a"), {"new": [[], []]},
               (f"S g0 bs4 h0,h1,h2 - {_A12}",
                "S g0 bs2 h3 h0 [104, 105]",
                f"S g1 bs6 h2 - {_A12}")),
            _S(free("a"), {}),
        )),
)
