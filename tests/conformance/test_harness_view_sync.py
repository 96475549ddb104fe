"""``RequestViewSync`` (kvcheck.conformance.view_sync): one engine request per request id, kept
in step with the views: built once, output tokens appended as they appear (only the new ones),
``num_computed_tokens`` copied on every sync, rebuilt for a new prompt under a known id, and
consistent with the Driver's views through allocate, decode, free and re-admission."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from harness_fakes import SPEC, FakeManager, handle

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.ops import add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.conformance.view_sync import RequestViewSync
from kvcheck.reference_impl.request import Request


class EngineRequest:
    """The engine request surface RequestViewSync needs, recording what it was asked."""

    def __init__(self, view: RequestView) -> None:
        self.request_id = view.request_id
        self.prompt_token_ids = list(view.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = -1
        self.appends: list[list[int]] = []

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.appends.append(token_ids)
        self.output_token_ids += token_ids


class Recorder:
    """``make`` and ``before_hashing`` for a RequestViewSync, logging the order of calls."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def make(self, view: RequestView) -> EngineRequest:
        self.log.append(f"make {view.request_id}")
        return EngineRequest(view)

    def before_hashing(self) -> None:
        self.log.append("hash")


def sync_and_log() -> tuple[RequestViewSync[EngineRequest], Recorder]:
    rec = Recorder()
    return RequestViewSync(rec.make, rec.before_hashing), rec


def test_one_engine_request_per_id_kept_in_step() -> None:
    sync, rec = sync_and_log()
    first = sync.sync(RequestView("a", (1, 2, 3)))
    assert first.num_computed_tokens == 0
    again = sync.sync(RequestView("a", (1, 2, 3), num_computed_tokens=3))
    assert again is first and first.num_computed_tokens == 3
    sync.sync(RequestView("a", (1, 2, 3), (7, 8), 3))
    sync.sync(RequestView("a", (1, 2, 3), (7, 8, 9), 5))
    assert first.appends == [[7, 8], [9]]  # only the tokens not seen yet
    assert first.output_token_ids == [7, 8, 9] and first.num_computed_tokens == 5
    # Hashing may happen on build and on each extension; never on a plain re-sync.
    assert rec.log == ["hash", "make a", "hash", "hash"]
    assert sync.get("a") is first and sync.get("b") is None


def test_a_new_prompt_under_a_known_id_is_a_new_request() -> None:
    sync, rec = sync_and_log()
    old = sync.sync(RequestView("a", (1, 2, 3), (7,)))
    new = sync.sync(RequestView("a", (4, 5)))
    assert new is not old and new.prompt_token_ids == [4, 5] and new.output_token_ids == []
    assert rec.log == ["hash", "make a", "hash", "hash", "make a"]


def test_views_may_only_grow() -> None:
    sync, _ = sync_and_log()
    sync.sync(RequestView("a", (1, 2), (7, 8)))
    with pytest.raises(ValueError, match=r"request 'a': output_token_ids shrank from 2 to 1; "
                                         r"views may only grow"):
        sync.sync(RequestView("a", (1, 2), (7,)))


def test_pop_forgets_the_request() -> None:
    sync, rec = sync_and_log()
    first = sync.sync(RequestView("a", (1, 2), (7,)))
    assert sync.pop("a") is first and sync.pop("a") is None
    rebuilt = sync.sync(RequestView("a", (1, 2), (7,)))
    assert rebuilt is not first and rebuilt.output_token_ids == [7]
    assert rec.log.count("make a") == 2


def test_works_with_the_reference_request() -> None:
    """The reference's ``Request`` has the needed surface (its all_token_ids follow)."""
    sync: RequestViewSync[Request] = RequestViewSync(
        lambda v: Request(v.request_id, v.prompt_token_ids))
    req = sync.sync(RequestView("a", (1, 2, 3), (9,), 2))
    assert req.all_token_ids == [1, 2, 3, 9] and req.num_computed_tokens == 2
    assert sync.sync(RequestView("a", (1, 2, 3), (9, 10), 4)).all_token_ids == [1, 2, 3, 9, 10]


# ---------------------------------------------------------------------- through the Driver
class SyncingManager(FakeManager):
    """The correct fake, keeping engine requests as adapters do (popped on free), and noting
    what each call's engine request held: (call, tokens, computed count, engine request)."""

    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        self.requests: RequestViewSync[EngineRequest] = RequestViewSync(EngineRequest)
        self.seen: list[tuple[str, list[int], int, EngineRequest]] = []

    def _note(self, call: str, view: RequestView) -> None:
        req = self.requests.sync(view)
        self.seen.append((call, req.prompt_token_ids + req.output_token_ids,
                          req.num_computed_tokens, req))

    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        self._note("lookup", request)
        return super().get_computed_blocks(request)

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        self._note("allocate", request)
        return super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                      new_computed_block_ids, num_lookahead_tokens)

    def free(self, request_id: str) -> None:
        self.requests.pop(request_id)
        super().free(request_id)


def test_engine_requests_follow_the_driver_through_preemption() -> None:
    d = Driver(handle(SyncingManager), SPEC)
    d.run([add("a", [1, 2, 3, 4, 5, 6]), schedule("a", 4), schedule("a"), decode("a", 2),
           free("a"), schedule("a")])
    raw: Any = d.manager._raw  # the fake behind the answer guard
    out = list(d.views["a"].output_token_ids)
    assert len(out) == 2
    prompt = [1, 2, 3, 4, 5, 6]
    assert [(call, tokens, computed) for call, tokens, computed, _ in raw.seen] == [
        ("lookup", prompt, 0),
        ("allocate", prompt, 0),
        ("allocate", prompt, 4),          # the rest of the chunked prefill
        ("allocate", prompt + out, 6),    # the decode: two sampled tokens
        ("lookup", prompt + out, 0),      # re-admitted after free: rebuilt, nothing computed
        ("allocate", prompt + out, 0),
    ]
    engine = [req for *_, req in raw.seen]
    assert all(req is engine[0] for req in engine[:4])
    assert engine[4] is not engine[0] and engine[5] is engine[4]
    assert engine[4].appends == [out]  # the rebuilt request got the sampled tokens at once
    # Block 0 was a hit on re-admission; the other 4 tokens were recomputed.
    assert d.views["a"].num_computed_tokens == 8
    assert raw.seen[-1][3].num_computed_tokens == 0  # the engine copy waits for the next sync
