"""What one ``schedule`` / ``decode`` op asks of ``allocate_slots``, as vLLM's scheduler
computes it: written once, for the conformance ``Driver`` and the recorded-corpus benchmark
(``kvcheck.bench.replay.recorded``), which must make the same calls.

The planning is pure: the caller has already made the lookup (a request that holds no blocks
is admitted with ``num_hit`` hit tokens; a running one passes none) and makes the call itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvcheck.conformance.protocol import RequestView

__all__ = ["SchedulePlan", "output_token", "plan_schedule"]


def output_token(rid: str, index: int) -> int:
    """The deterministic token a request 'samples' at output position ``index``."""
    return 50_000 + (sum(map(ord, rid)) * 131 + index * 7) % 10_000


@dataclass(frozen=True, slots=True)
class SchedulePlan:
    """One step's ``allocate_slots`` arguments besides the hits.

    ``view``: the request as the call sees it (with the tokens it just sampled when
    ``decoded``); ``num_new``: ``num_new_tokens``; ``external`` / ``delay``: the
    connector's tokens at admission and whether their load is asynchronous (no new tokens
    computed in this step)."""

    view: RequestView
    num_new: int
    external: int
    delay: bool
    decoded: bool


def plan_schedule(rid: str, view: RequestView, num_tokens: int | None, num_hit: int, *,
                  running: bool, decode: bool, external: int = 0,
                  delay: bool = False) -> SchedulePlan:
    """Plan one step of request ``rid`` (``view``: its state before the step).

    ``num_tokens``: the tokens the op schedules (None: all that remain); ``num_hit``: the hit
    tokens of its lookup (0 when ``running``). A running request that decodes, or has no prompt
    token left, first samples ``num_tokens`` tokens (1 when None) and asks for their slots.
    External tokens count only at admission and within the prompt: a synchronous load leaves
    at least one token to compute, an asynchronous one (``delay``) computes none in this
    step."""
    remaining = view.num_tokens - view.num_computed_tokens - num_hit
    decoded = running and (decode or remaining <= 0)
    if decoded:
        num_tokens = 1 if num_tokens is None else num_tokens
        out = view.output_token_ids
        view = replace(view, output_token_ids=out + tuple(
            output_token(rid, len(out) + i) for i in range(num_tokens)))
        remaining = num_tokens
    external = 0 if running else max(0, min(external, remaining - (not delay)))
    delay = delay and external > 0
    remaining -= external
    num_new = 0 if delay else max(
        0, remaining if num_tokens is None else min(num_tokens, remaining))
    return SchedulePlan(view, num_new, external, delay, decoded)
