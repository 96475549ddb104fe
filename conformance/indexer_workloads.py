"""Random clusters for the ``indexer`` area: Hypothesis strategies of ``ClusterPlan``.

What a plan draws, within what the indexer declares (``ImplInfo``):

* workers (1 to ``max_workers``), each with its own pool, small enough that prompts evict
  (``BlockRemoved``) and sometimes large; the workers share system prompts, so several of
  them cache the same hashes (a removal must touch only its sender's);
* steps: new prompts (system prompt + user turn), multi-turn chats (a running request's
  tokens + the next turn), decodes, finishes, prefix-cache resets (``AllBlocksCleared``),
  engine restarts (the sequence back to 0), the router removing a worker;
* contexts: LoRA adapters (``lora``), salts (``cache_salt``), an image at the prompt's start
  (``multimodal``);
* with ``kv_cache_groups`` (vLLM 0.33's wire): a second group beside full attention, whose
  stores and removals carry the same hashes in another group: a sliding window (sparse with
  a retention interval), or a Mamba group in "align" mode (stores naming only the blocks it
  keeps); the second group's block is sometimes a divisor of the full-attention block (the
  hash block), so the full-attention group also publishes partial-block keys;
* with ``lookahead_hashes`` (0.33 only): in one cluster in two, workers hashing with hash
  lookahead ``L`` of 1 to 3 tokens (``IndexerConfig.num_hash_lookahead_tokens``), drawn
  last;
* with ``replay``: lost batches replayed later (racing the live stream, overlapping batches
  already received) and duplicated deliveries;
* probes: prompts the workers ran (whole or cut), the same tokens in another context, and a
  system prompt alone.

Hypothesis shrinks a failing plan to fewer workers, steps and probes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from hypothesis import strategies as st

from kvcheck.conformance.indexer_cluster import (
    LORAS,
    SALTS,
    ClusterPlan,
    Probe,
    PromptPlan,
    WorkerOp,
)
from kvcheck.conformance.indexer_protocol import HashForm, IndexerConfig, MatchContext
from kvcheck.reference_impl.profiles import get_profile

__all__ = ["cluster_plans", "release_of"]

_TOKENS = st.integers(0, 40)
_KINDS = ("admit",) * 5 + ("turn", "turn", "decode", "decode", "decode", "finish", "finish",
                          "reset", "restart", "remove")


def release_of(profile: str) -> str:
    """The wire release a profile's workers publish (``generic``: 0.33's)."""
    return "vllm-0.10" if profile == "vllm-0.10" else "vllm-0.33"


def _contexts(capabilities: Collection[str]) -> st.SearchStrategy[MatchContext]:
    lora = st.sampled_from((None, None, *LORAS)) if "lora" in capabilities else st.none()
    salt = st.sampled_from((None, None, *SALTS)) if "cache_salt" in capabilities else st.none()
    image = (st.sampled_from(((), (), (("img-0", 0, 2),), (("img-1", 0, 2),)))
             if "multimodal" in capabilities else st.just(()))
    return st.builds(MatchContext, lora=lora, cache_salt=salt, mm_features=image)


@st.composite
def cluster_plans(draw: st.DrawFn, *, capabilities: Collection[str], profile: str,
                  hash_form: HashForm, hash_algos: Sequence[str],
                  block_sizes: Sequence[int] | None, max_workers: int = 4,
                  max_steps: int = 40, min_workers: int = 1, min_steps: int = 12) -> ClusterPlan:
    """A ``ClusterPlan`` an indexer declaring ``capabilities`` (and ``hash_algos``,
    ``block_sizes``) is checked on under ``profile``, its batches in ``hash_form``."""
    release = release_of(profile)
    sizes = [s for s in (4, 8) if block_sizes is None or s in block_sizes] or \
        sorted(block_sizes or (4,))[:1]
    block_size = draw(st.sampled_from(sizes))
    offered = get_profile(release).hash_algos
    algos = [a for a in offered if a in hash_algos] if hash_algos else list(offered)
    config = IndexerConfig(block_size=block_size, release=release, hash_form=hash_form,
                           hash_algo=draw(st.sampled_from(algos or ["sha256"])),
                           pythonhashseed=str(draw(st.integers(0, 3))))
    workers = draw(st.integers(min_workers, max_workers))
    # Pools of 4 to 12 blocks of requests (one extra for the null block): prompts of 1 to 4
    # blocks evict in the small ones.
    num_blocks = tuple(draw(st.integers(5, 13)) for _ in range(workers))
    window = retention = None
    mamba = False
    # Drawn only under kv_cache_groups on 0.33 (short-circuited before any draw otherwise), so
    # the plans of an index that does not declare it are the ones they always were.
    if "kv_cache_groups" in capabilities and release == "vllm-0.33" and draw(st.booleans()):
        layout = draw(st.sampled_from(("window", "partial_keys", "mamba")))
        # The second group's block: the match group's, or (partial keys) a proper divisor of
        # it, which becomes the hash block and makes the full-attention group publish
        # partial-block keys. A Mamba group must have the layout's smallest block.
        divisors = [d for d in (2, 4) if block_size % d == 0 and block_size // d >= 2]
        scale = (draw(st.sampled_from(divisors)) if layout == "partial_keys" and divisors
                 else draw(st.sampled_from((1, *divisors[:1]))) if layout == "mamba" else 1)
        small = block_size // scale
        if scale > 1:
            config = dataclasses.replace(config, hash_block_size=small)
        if layout == "mamba":
            mamba = True
        else:
            window = small * draw(st.integers(1, 3))
            retention = draw(st.sampled_from((None, 0, block_size, 2 * block_size)))
    systems = tuple(
        tuple(draw(st.lists(_TOKENS, min_size=block_size // 2,
                            max_size=block_size * 3 + 1)))
        for _ in range(draw(st.integers(1, 3))))
    contexts = _contexts(capabilities)
    prompt = st.builds(PromptPlan, system=st.integers(0, len(systems) - 1),
                       user=st.lists(_TOKENS, max_size=block_size * 2 + 1).map(tuple),
                       context=contexts, skip_read=st.sampled_from((False,) * 5 + (True,)))
    faults: st.SearchStrategy[str] = (st.sampled_from(("none",) * 4 + ("drop", "duplicate"))
                                      if "replay" in capabilities else st.just("none"))
    op = st.builds(WorkerOp, worker=st.integers(0, workers - 1), kind=st.sampled_from(_KINDS),
                   index=st.integers(0, 7), count=st.integers(1, block_size + 1),
                   prompt=prompt, fault=faults, delay=st.integers(1, 6),
                   overlap=st.integers(0, 2))
    # At least ``min_steps`` (Hypothesis draws short lists otherwise: few evictions, gaps or
    # restarts); shrinking stops there too.
    ops = tuple(draw(st.lists(op, min_size=min(min_steps, max_steps), max_size=max_steps)))
    probes = draw(_probes(ops, systems, contexts))
    # Drawn last, and only for an index declaring it on 0.33, so every other plan stays.
    if "lookahead_hashes" in capabilities and release == "vllm-0.33" and draw(st.booleans()):
        config = dataclasses.replace(config, num_hash_lookahead_tokens=draw(st.integers(1, 3)))
    return ClusterPlan(config, num_blocks, systems, ops, probes,
                       sliding_window=window, retention=retention, mamba=mamba)


@st.composite
def _probes(draw: st.DrawFn, ops: Sequence[WorkerOp], systems: Sequence[tuple[int, ...]],
            contexts: st.SearchStrategy[MatchContext]) -> tuple[Probe, ...]:
    prompts = [op.prompt for op in ops if op.kind == "admit" and op.prompt is not None]
    probes: list[Probe] = []
    for _ in range(draw(st.integers(1, 5))):
        if prompts and draw(st.integers(0, 4)) > 0:
            plan = draw(st.sampled_from(prompts))
            tokens = systems[plan.system] + plan.user
            if draw(st.booleans()):  # cut short, or run on past the prompt
                cut: int = draw(st.integers(0, len(tokens)))
                more: list[int] = draw(st.lists(_TOKENS, max_size=3))
                tokens = tokens[:cut] + tuple(more)
            context = plan.context if draw(st.integers(0, 2)) else draw(contexts)
        else:
            tokens, context = draw(st.sampled_from(systems)), draw(contexts)
        if context.mm_features and len(tokens) < 2:
            context = MatchContext(context.lora, context.cache_salt)  # the image needs room
        probes.append(Probe(tuple(tokens), context))
    return tuple(probes)
