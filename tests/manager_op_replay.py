"""Replay a scenario recorded call by call from vLLM 0.33.0's own ``KVCacheManager`` on the
reference's, answering each op the way the recording scripts printed vLLM's answers (shared
by ``test_fine_grained_hits.py`` and ``test_boundary_state_offloads.py``).

Ops are tuples: ``("req", rid, tokens)``, ``("lookup", rid)``, ``("alloc", rid, num_new[,
lookahead])`` (with the last lookup's hits), ``("decode", rid, token)``, ``("step",)``,
``("copies",)`` (drained and the retained blocks released as vLLM's scheduler does),
``("offloads",)``, ``("finalize", rid)``, ``("tables",)``, ``("queue",)``, ``("refs",)``,
``("events",)`` and ``("free", rid)``. The invariants are checked after every op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcheck.reference_impl.events import BlockRemoved, BlockStored
from kvcheck.reference_impl.kv_cache_interface import KVCacheSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request

__all__ = ["block_ids", "build_033", "replay_ops"]


def _hex(value: bytes | None) -> str | None:
    return None if value is None else bytes(value).hex()[:8]


def _events(m: KVCacheManager) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for e in m.take_events():
        if isinstance(e, BlockStored):
            out.append(("S", e.group_idx, tuple(_hex(h) for h in e.block_hashes),
                        _hex(e.parent_block_hash), tuple(e.token_ids), e.block_size))
        else:
            assert isinstance(e, BlockRemoved), e
            out.append(("R", e.group_idx, tuple(_hex(h) for h in e.block_hashes)))
    return out


def block_ids(blocks: Any) -> list[list[int]]:
    return [[b.block_id for b in g] for g in blocks]


def replay_ops(m: KVCacheManager, ops: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``ops`` applied to ``m`` (a 0.33 manager built by the caller), one answer per op that
    answers (``req``, ``step`` and ``free`` answer nothing)."""
    reqs: dict[str, Request] = {}
    hits: dict[str, tuple[Any, int]] = {}
    out: list[tuple[Any, ...]] = []
    for op in ops:
        kind = op[0]
        if kind == "req":
            reqs[op[1]] = m.make_request(op[1], op[2])
        elif kind == "lookup":
            blocks, n = m.get_computed_blocks(reqs[op[1]])
            hits[op[1]] = (blocks, n)
            out.append(("lookup", op[1], block_ids(blocks), n))
        elif kind in ("alloc", "decode"):
            req = reqs[op[1]]
            if kind == "decode":
                req.append_output_token_ids([op[2]])
                blocks, n, num_new, look = None, 0, 1, 0
            else:
                blocks, n = hits.pop(op[1], (None, 0))
                num_new, look = op[2], (op[3] if len(op) > 3 else 0)
            new = m.allocate_slots(req, num_new, n, blocks, look)
            out.append((kind, op[1], None if new is None else block_ids(new)))
            if new is not None:
                req.num_computed_tokens += n + num_new
        elif kind == "step":
            m.new_step_starts()
        elif kind == "copies":
            copies, retained = m.take_kv_cache_block_copies()
            out.append(("copies", copies, [b.block_id for b in retained]))
            m.block_pool.free_retained_blocks(retained)
        elif kind == "offloads":
            out.append(("offloads", m.take_boundary_state_offloads()))
        elif kind == "finalize":
            out.append(("finalize", op[1], m.finalize_partial_tail_offloads(reqs[op[1]])))
        elif kind == "tables":
            out.append(("tables", {r: [list(g) for g in m.get_block_ids(r)] for r in reqs}))
        elif kind == "queue":
            out.append(("queue", [b.block_id for b in m.block_pool.free_block_queue]))
        elif kind == "refs":
            out.append(("refs", [b.ref_cnt for b in m.block_pool.blocks[1:]]))
        elif kind == "events":
            out.append(("events", _events(m)))
        elif kind == "free":
            m.free(reqs.pop(op[1]))
        else:
            raise AssertionError(f"unknown scenario op {op!r}")
        m.check_invariants()
    return out


def build_033(num_blocks: int, specs: Sequence[KVCacheSpec]) -> KVCacheManager:
    """The 0.33 manager the recordings used: events on, PYTHONHASHSEED 0."""
    return KVCacheManager(num_blocks, kv_cache_specs=list(specs), profile="vllm-0.33",
                          enable_kv_cache_events=True, pythonhashseed="0")
