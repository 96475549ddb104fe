"""Golden scenarios of two configuration knobs of vLLM's ``KVCacheManager``
(docs/semantics.md#decode-context-parallelism-and-prefix_match_unit): decode context
parallelism (``dcp_world_size``, both releases) and vLLM 0.33's ``prefix_match_unit``.

Each step states the answer of the op (``StepResult``) and the KV events it emitted
(``hybrid_partial_keys.show_events``) as vLLM's own ``KVCacheManager`` gave them: the
scenarios were replayed through kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)``,
``take_events()`` after every op) on vLLM 0.33.0 and 0.10.2 and the output copied here;
``--kv-impl=vllm`` replays them on vLLM again. ``KNOB_REFUSALS`` are the layouts vLLM refuses
(an assertion or a ValueError), which an implementation declining them must decline too.

What they pin down (each read in both releases' source and confirmed by these replays):

* DCP: a sharded group's block covers ``block_size * dcp_world_size`` tokens for allocation,
  hashing and hits (vLLM 0.33 ``SingleTypeKVCacheManager.block_size``,
  ``resolve_dcp_kv_block_size``; 0.10.2 ``kv_cache_manager.py:113-118``,
  ``single_type_kv_cache_manager.py:38-40``): a 10-token prompt at block size 2 and DCP 2
  takes 3 blocks, hits are whole 4-token blocks, ``BlockStored.block_size`` is 4; with
  caching off a window's skipped blocks are counted in 4-token blocks too;
* DCP beside a Mamba group: vLLM 0.33 does not shard Mamba (``MambaSpec`` is not
  ``dcp_sharded``): its block stays at its own size, the hash block is the gcd of the scaled
  attention blocks and the Mamba block, and a Mamba "align" block equal to the hash block
  already turns fine-grained hits on (``partial_hash_hits_enabled``: ``>=`` under DCP, ``>``
  without); vLLM 0.10.2 scales the Mamba block like every other but adds its speculative
  slots at the spec's own block size (``single_type_kv_cache_manager.py:580-583``);
* ``prefix_match_unit`` (0.33, several groups, caching on): the hash block is the unit instead
  of the gcd of the block sizes, so a full-attention group whose block is larger than the unit
  keys its last prompt boundary by a partial-block key at the unit
  (docs/semantics.md#partial-block-keys), and beside a Mamba "align" group larger than the
  unit fine-grained hits land on the unit's boundaries
  (docs/semantics.md#fine-grained-partial-hits).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.hybrid_partial_keys import PartialKeyStep
from kvcheck.conformance.ops import add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec

__all__ = ["KNOB_REFUSALS", "KNOB_SCENARIOS", "KnobRefusal", "KnobScenario", "knob_spec"]


@dataclass(frozen=True)
class KnobScenario:
    """``steps`` (``PartialKeyStep``: op, answer, events) as vLLM 0.33.0 gave them on a pool
    of ``num_blocks`` blocks in ``groups`` (the spec's ``block_size`` is 2, every group
    states its own) with these knobs, caching and KV events on unless said; ``steps_010``:
    vLLM 0.10.2's (None: a scenario 0.10.2 refuses or lacks); ``needs``: capabilities beyond
    the groups' kinds, ``events`` and the knob's own."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    steps: tuple[PartialKeyStep, ...]
    steps_010: tuple[PartialKeyStep, ...] | None = None
    dcp_world_size: int = 1
    prefix_match_unit: int | None = None
    enable_caching: bool = True
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class KnobRefusal:
    """A layout vLLM refuses under each profile of ``profiles``: ``rule`` names vLLM's
    assertion or error, ``words`` what the refusal's message must contain."""

    name: str
    rule: str
    words: str
    profiles: tuple[str, ...]
    groups: tuple[KVCacheGroupSpec, ...]
    dcp_world_size: int = 1
    prefix_match_unit: int | None = None
    enable_caching: bool = True


def knob_spec(sc: KnobScenario | KnobRefusal, profile: str) -> KVCacheSpec:
    """The spec of a scenario (or refusal) under ``profile``."""
    events = isinstance(sc, KnobScenario) and sc.enable_caching
    return KVCacheSpec(num_blocks=sc.num_blocks if isinstance(sc, KnobScenario) else 16,
                       block_size=2, profile=profile, kv_cache_groups=sc.groups,
                       enable_caching=sc.enable_caching, enable_kv_cache_events=events,
                       dcp_world_size=sc.dcp_world_size,
                       prefix_match_unit=sc.prefix_match_unit)


_BOTH = ("vllm-0.33", "vllm-0.10")
_F2 = KVCacheGroupSpec("full_attention", 2)
_F4 = KVCacheGroupSpec("full_attention", 4)
_S = PartialKeyStep

_SWA2 = KVCacheGroupSpec("sliding_window", 2, sliding_window=4)
_SWA4 = KVCacheGroupSpec("sliding_window", 4, sliding_window=8)
_M4 = KVCacheGroupSpec("mamba", 4, mamba_cache_mode="align")
_M2 = KVCacheGroupSpec("mamba", 2, mamba_cache_mode="align")
_M2_SPEC = KVCacheGroupSpec("mamba", 2, num_speculative_blocks=1)

KNOB_SCENARIOS: tuple[KnobScenario, ...] = (
    KnobScenario(
        "dcp_blocks_cover_block_size_times_dcp",
        "one full-attention group of 2-token blocks at DCP 2: 4 tokens per block for "
        "allocation, hashing (BlockStored block_size 4) and hits",
        (_F2,), 12,
        (
            _S(add('a', [100, 101, 102, 103, 104, 105, 106, 107, 108, 109]), {}),
            _S(schedule('a'), {'hits': ([[]], 0), 'new': [[1, 2, 3]]},
               ('S g0 bs4 h0,h1 - [100, 101, 102, 103, 104, 105, 106, 107]',)),
            _S(decode('a'), {'new': [[]]}),
            _S(decode('a', 2), {'new': [[4]]},
               ('S g0 bs4 h2 h1 [108, 109, 52707, 52714]',)),
            _S(free('a'), {}),
            _S(add('b', [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 7, 7]), {}),
            _S(schedule('b'), {'hits': ([[1, 2]], 8), 'new': [[4]]},
               ('S g0 bs4 h3 h1 [108, 109, 7, 7]',)),
            _S(free('b'), {}),
        ),
        steps_010=(
            _S(add('a', [100, 101, 102, 103, 104, 105, 106, 107, 108, 109]), {}),
            _S(schedule('a'), {'hits': ([[]], 0), 'new': [[1, 2, 3]]},
               ('S gNone bs4 h0,h1 - [100, 101, 102, 103, 104, 105, 106, 107]',)),
            _S(decode('a'), {'new': [[]]}),
            _S(decode('a', 2), {'new': [[4]]},
               ('S gNone bs4 h2 h1 [108, 109, 52707, 52714]',)),
            _S(free('a'), {}),
            _S(add('b', [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 7, 7]), {}),
            _S(schedule('b'), {'hits': ([[1, 2]], 8), 'new': [[5]]},
               ('S gNone bs4 h3 h1 [108, 109, 7, 7]',)),
            _S(free('b'), {}),
        ),
        dcp_world_size=2),
    KnobScenario(
        "dcp_two_full_attention_groups",
        "full attention in blocks of 2 and 4 at DCP 2: 4- and 8-token blocks, the hash block "
        "4, hits on the 8-token scheduler block",
        (_F2, _F4), 16,
        (
            _S(add('a', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212]), {}),
            _S(schedule('a'), {'hits': ([[], []], 0), 'new': [[1, 2, 3, 4], [5, 6]]},
               ('S g0 bs4 h0,h1 - [200, 201, 202, 203, 204, 205, 206, 207]',
                'S g1 bs8 h1 - [200, 201, 202, 203, 204, 205, 206, 207]')),
            _S(free('a'), {}),
            _S(add('b', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212]), {}),
            _S(schedule('b'), {'hits': ([[1, 2], [5]], 8), 'new': [[6, 4], [3]]}),
            _S(free('b'), {}),
        ),
        dcp_world_size=2),
    KnobScenario(
        "dcp_window_with_caching_off",
        "full attention and a 4-token window in blocks of 2 at DCP 2, caching off: the window "
        "nulls whole 4-token blocks",
        (_F2, _SWA2), 16,
        (
            _S(add('a', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212]), {}),
            _S(schedule('a'), {'hits': ([[], []], 0), 'new': [[1, 2, 3, 4], [5, 6, 7, 8]]}),
            _S(decode('a'), {'new': [[], []]}),
            _S(decode('a', 3), {'new': [[6], [5]]}),
            _S(decode('a', 4), {'new': [[7], [9]]}),
            _S(free('a'), {}),
        ),
        steps_010=(
            _S(add('a', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212]), {}),
            _S(schedule('a'), {'hits': ([[], []], 0), 'new': [[1, 2, 3, 4], [5, 6, 7, 8]]}),
            _S(decode('a'), {'new': [[], []]}),
            _S(decode('a', 3), {'new': [[9], [10]]}),
            _S(decode('a', 4), {'new': [[11], [12]]}),
            _S(free('a'), {}),

        ),
        dcp_world_size=2, enable_caching=False),
    KnobScenario(
        "prefix_match_unit_finer_than_the_blocks",
        "full attention and an 8-token window in blocks of 4, prefix_match_unit 2: hashes "
        "every 2 tokens, the prompt's last boundary (6) keyed inside block 1",
        (_F4, _SWA4), 16,
        (
            _S(add('a', [100, 101, 102, 103, 104, 105, 106]), {}),
            _S(schedule('a'), {'hits': ([[], []], 0), 'new': [[1, 2], [3, 4]]},
               ('S g0 bs4 h0 - [100, 101, 102, 103]',
                'S g1 bs4 h0 - [100, 101, 102, 103]')),
            _S(decode('a'), {'new': [[], []]},
               ('S g0 bs4 h1 h0 [104, 105, 106, 52707]',
                'S g0 bs2 h2 h0 [104, 105]',
                'S g1 bs4 h1 h0 [104, 105, 106, 52707]')),
            _S(decode('a'), {'new': [[5], [6]]}),
            _S(free('a'), {}),
            _S(add('b', [100, 101, 102, 103, 104, 105, 106, 1, 1]), {}),
            _S(schedule('b'), {'hits': ([[1], [3]], 4), 'new': [[6, 5], [7, 8]]},
               ('S g0 bs4 h3 h0 [104, 105, 106, 1]',
                'S g1 bs4 h3 h0 [104, 105, 106, 1]')),
            _S(free('b'), {}),
        ),
        prefix_match_unit=2),
    KnobScenario(
        "prefix_match_unit_fine_grained_hits",
        "full attention and a Mamba 'align' group in blocks of 4, prefix_match_unit 2: the "
        "Mamba block is larger than the hash block, so the hit ends at 10, inside a block "
        "(copied on write)",
        (_F4, _M4), 16,
        (
            _S(add('a', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210]), {}),
            _S(schedule('a', 10), {'hits': ([[], []], 0), 'new': [[1, 2, 3], [0, 0, 4]]},
               ('S g0 bs4 h0,h1 - [200, 201, 202, 203, 204, 205, 206, 207]',
                'S g0 bs2 h2 h1 [208, 209]',
                'S g1 bs4 [] - [200, 201, 202, 203, 204, 205, 206, 207]',
                'S g1 bs2 h2 h1 [208, 209]')),
            _S(schedule('a'), {'new': [[], []]}),
            _S(decode('a'), {'new': [[], []]},
               ('R g0 h2',
                'S g0 bs4 h3 h1 [208, 209, 210, 52707]',
                'S g0 bs2 h2 h1 [208, 209]',
                'S g1 bs4 h3 h1 [208, 209, 210, 52707]')),
            _S(free('a'), {}),
            _S(add('b', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 1, 1]), {}),
            _S(schedule('b'), {'hits': ([[1, 2, 3], [0, 0, 5]], 10), 'new': [[6, 7], [8, 9]]},
               ('S g0 bs4 h4 h1 [208, 209, 210, 1]',
                'S g1 bs4 h4 h1 [208, 209, 210, 1]')),
            _S(free('b'), {}),
        ),
        prefix_match_unit=2, needs=("fine_grained_hits",)),
    # A Mamba group under DCP (capability mamba_dcp): vLLM 0.33 does not shard it.
    KnobScenario(
        "dcp_full_and_mamba_fine_grained_hits",
        "full attention and a Mamba 'align' group in blocks of 2 at DCP 2: full attention's "
        "blocks cover 4 tokens, Mamba's stay at 2 (MambaSpec is not DCP-sharded), the hash "
        "block is 2 and equal to the Mamba block, which under DCP turns fine-grained hits on: "
        "the hit ends at 10, inside full attention's block 3 (copied on write)",
        (_F2, _M2), 16,
        (
            _S(add('a', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210]), {}),
            _S(schedule('a', 10), {'hits': ([[], []], 0),
                                   'new': [[1, 2, 3], [0, 0, 0, 0, 4]]},
               ('S g0 bs4 h0,h1 - [200, 201, 202, 203, 204, 205, 206, 207]',
                'S g0 bs2 h2 h1 [208, 209]',
                'S g1 bs2 h2 - [200, 201, 202, 203, 204, 205, 206, 207, 208, 209]')),
            _S(schedule('a'), {'new': [[], [5]]}),
            _S(decode('a'), {'new': [[], []]},
               ('R g0 h2',
                'S g0 bs4 h3 h1 [208, 209, 210, 52707]',
                'S g0 bs2 h2 h1 [208, 209]',
                'S g1 bs2 h3 h2 [210, 52707]')),
            _S(free('a'), {}),
            _S(add('b', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 1, 1]), {}),
            _S(schedule('b'), {'hits': ([[1, 2, 3], [0, 0, 0, 0, 4]], 10),
                               'new': [[6, 7], [0, 8]]},
               ('S g0 bs4 h4 h1 [208, 209, 210, 1]',
                'S g1 bs2 [] h2 [210, 1]')),
            _S(free('b'), {}),
        ),
        dcp_world_size=2, needs=("mamba_dcp", "fine_grained_hits")),
    KnobScenario(
        "dcp_mamba_speculative_block_with_caching_off",
        "full attention and a Mamba group with one speculative block, blocks of 2 at DCP 2, "
        "caching off: vLLM 0.33 keeps the Mamba block at 2 tokens (10 + 2 speculative slots: "
        "6 blocks); 0.10.2 scales it to 4 but adds the speculative slots at the spec's 2 "
        "(12 slots: 3 blocks)",
        (_F2, _M2_SPEC), 16,
        (
            _S(add('a', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209]), {}),
            _S(schedule('a'), {'hits': ([[], []], 0), 'new': [[1, 2, 3], [4, 5, 6, 7, 8, 9]]}),
            _S(decode('a'), {'new': [[], [7]]}),
            _S(decode('a', 3), {'new': [[8], [6]]}),
            _S(decode('a', 4), {'new': [[9], [5, 4]]}),
            _S(free('a'), {}),
        ),
        steps_010=(
            _S(add('a', [200, 201, 202, 203, 204, 205, 206, 207, 208, 209]), {}),
            _S(schedule('a'), {'hits': ([[], []], 0), 'new': [[1, 2, 3], [4, 5, 6]]}),
            _S(decode('a'), {'new': [[], [7]]}),
            _S(decode('a', 3), {'new': [[8], []]}),
            _S(decode('a', 4), {'new': [[9], [10]]}),
            _S(free('a'), {}),
        ),
        dcp_world_size=2, enable_caching=False, needs=("mamba_dcp",)),
)

KNOB_REFUSALS: tuple[KnobRefusal, ...] = (
    KnobRefusal("dcp_beside_a_window", "vLLM 0.33's HybridKVCacheCoordinator asserts 'DCP "
                "with hybrid KV cache layouts only supports full-attention, Mamba, and "
                "replicated draft groups'",
                "DCP with hybrid KV cache layouts only supports", ("vllm-0.33",), (_F2, _SWA2),
                dcp_world_size=2),
    KnobRefusal("dcp_with_two_groups", "vLLM 0.10.2's KVCacheManager asserts one KV-cache "
                "group with DCP and prefix caching (kv_cache_manager.py:113-114)",
                "kv_cache_manager.py:113-114", ("vllm-0.10",), (_F2, _SWA2), dcp_world_size=2),
    KnobRefusal("dcp_one_window_group", "the sliding-window manager asserts 'DCP not support "
                "sliding window attn now.' at its first cache lookup",
                "DCP not support sliding window attn now.", _BOTH, (_SWA2,),
                dcp_world_size=2),
    KnobRefusal("prefix_match_unit_not_a_divisor", "vLLM 0.33's resolve_kv_cache_block_sizes: "
                "'Invalid prefix_match_unit=3; prefix-cacheable KV cache group block sizes "
                "must be divisible by prefix_match_unit' (ValueError)",
                "must be divisible by prefix_match_unit", ("vllm-0.33",),
                (_F4, _SWA4), prefix_match_unit=3),
    KnobRefusal("prefix_match_unit_one_group", "vLLM 0.33's resolve_kv_cache_block_sizes: "
                "'with a single KV cache group, prefix-cache hits land on the block size' "
                "(ValueError)", "with a single KV cache group, prefix-cache hits land on the "
                "block size", ("vllm-0.33",), (_F4,), prefix_match_unit=2),
    KnobRefusal("prefix_match_unit_under_010", "vLLM 0.10.2 has no prefix_match_unit (a vLLM "
                "0.33 CacheConfig field)", "0.33 CacheConfig field", ("vllm-0.10",),
                (_F2, _SWA2), prefix_match_unit=2),
)
