"""Scheduler-like workloads for an offload tier: abstract actions (small integer triples, which
hypothesis draws and shrinks) turned into the calls vLLM's offloading connector makes.

Requests read prompts that share prefixes (three documents over a key space of 32-byte hashes,
one key per block and KV-cache group, the group index in the last 4 bytes as vLLM's
``make_offload_key`` appends it; a block's position is where it ends, 16 tokens per block).
An action, interpreted against the model's state so that every call is legal:

======  ===============================================================================
0-1     a new request: ``on_new_request``, ``set_key_positions`` for its blocks
2-6     an offer of a run of the request's keys (``prepare_store``); what it stores
        completes at once (``complete_store``, one in seven failing) two times in three,
        else stays a job in flight
7-8     a lookup scan from a block until the first key that is not ``HIT``; loads the hits
        (``prepare_load``, a job left in flight) when asked
9-10    a job completes: ``complete_load``, or ``complete_store`` (one in four fails)
11      ``touch`` on a run of the request's keys
12      ``on_request_finished`` (its jobs may still complete)
13      ``take_events``
14      ``reset_cache`` (one time in four; otherwise ``take_events``): jobs in flight are
        dropped, as vLLM's scheduler drops jobs of before a reset
======  ===============================================================================

The workload ends with ``take_events`` and a lookup of every key it used.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import strategies as st

from kvcheck.conformance.offload_driver import OffloadRun

__all__ = ["ACTIONS", "BLOCK_TOKENS", "block_keys", "run_actions"]

#: Tokens per block (a key's position is a multiple of it).
BLOCK_TOKENS = 16
_DOCUMENTS = 3
_MAX_BLOCKS = 10
#: How many leading blocks documents 0 and 1 share (document 2 shares none).
_SHARED = 4

#: Hypothesis strategy for a workload's actions.
ACTIONS = st.lists(st.tuples(st.integers(0, 14), st.integers(0, 255), st.integers(0, 255)),
                   min_size=8, max_size=80)


def block_keys(document: int, num_blocks: int, groups: int) -> list[tuple[bytes, int]]:
    """``(key, end_position)`` of a document's first ``num_blocks`` blocks, for each of
    ``groups`` KV-cache groups (block by block, group by group)."""
    out: list[tuple[bytes, int]] = []
    for i in range(num_blocks):
        root = 0 if document < 2 and i < _SHARED else document + 1
        block_hash = hashlib.sha256(f"kvcheck-offload:{root}:{i}".encode()).digest()
        out.extend((block_hash + group.to_bytes(4, "big"), (i + 1) * BLOCK_TOKENS)
                   for group in range(groups))
    return out


@dataclass
class _Request:
    req_id: str
    keys: list[bytes]
    finished: bool = False


@dataclass
class _Job:
    kind: str  # "load" or "store"
    req_id: str
    keys: list[bytes]


@dataclass
class _State:
    requests: list[_Request] = field(default_factory=list)
    jobs: list[_Job] = field(default_factory=list)
    used: dict[bytes, None] = field(default_factory=dict)


def _span(keys: Sequence[bytes], a: int, b: int) -> list[bytes]:
    start = a % len(keys)
    return list(keys[start:start + 1 + b % (len(keys) - start)])


def run_actions(run: OffloadRun, actions: Sequence[tuple[int, int, int]],
                groups: int = 1) -> None:
    """Interpret ``actions`` on ``run`` (see the module docstring)."""
    state = _State()
    for kind, a, b in actions:
        _act(run, state, kind, a, b, groups)
    run.call("take_events")
    probe = "probe"
    run.call("on_new_request", probe)
    for key in state.used:
        run.call("lookup", key, probe)


def _act(run: OffloadRun, state: _State, kind: int, a: int, b: int, groups: int) -> None:
    open_requests = [r for r in state.requests if not r.finished]
    if kind <= 1 or not state.requests:
        blocks = block_keys(a % _DOCUMENTS, 1 + b % _MAX_BLOCKS, groups)
        request = _Request(f"r{len(state.requests)}", [key for key, _ in blocks])
        state.requests.append(request)
        state.used.update(dict.fromkeys(request.keys))
        run.call("on_new_request", request.req_id)
        run.call("set_key_positions", request.req_id, dict(blocks))
    elif kind in (9, 10):
        if state.jobs:
            job = state.jobs.pop(a % len(state.jobs))
            if job.kind == "load":
                run.call("complete_load", job.keys, job.req_id)
            else:
                run.call("complete_store", job.keys, job.req_id, b % 4 != 0)
    elif kind == 13 or (kind == 14 and b % 4):
        run.call("take_events")
    elif kind == 14:
        run.call("reset_cache")
        state.jobs.clear()
    elif kind == 11:
        request = state.requests[a % len(state.requests)]
        run.call("touch", _span(request.keys, a // 8, b), request.req_id)
    elif open_requests:
        request = open_requests[a % len(open_requests)]
        if kind == 12:
            request.finished = True
            run.call("on_request_finished", request.req_id)
        elif kind in (7, 8):
            _scan(run, state, request, b)
        else:
            _offer(run, state, request, a, b)


def _scan(run: OffloadRun, state: _State, request: _Request, b: int) -> None:
    hits = []
    for key in request.keys[(b // 2) % len(request.keys):]:
        if run.call("lookup", key, request.req_id) != "HIT":
            break
        hits.append(key)
    if hits and b % 2:
        run.call("prepare_load", hits, request.req_id)
        state.jobs.append(_Job("load", request.req_id, hits))


def _offer(run: OffloadRun, state: _State, request: _Request, a: int, b: int) -> None:
    answer = run.call("prepare_store", _span(request.keys, a // 8, b), request.req_id)
    if answer is None or not answer["keys_to_store"]:
        return
    stored = list(answer["keys_to_store"])
    if b % 3:  # most writes complete before the next action (one in seven fails)
        run.call("complete_store", stored, request.req_id, b % 7 != 0)
    else:
        state.jobs.append(_Job("store", request.req_id, stored))
