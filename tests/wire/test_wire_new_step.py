"""The optional manager methods on the wire (docs/wire-protocol.md): ``new_step_starts``
(``SupportsNewStep``) and ``take_kv_cache_block_copies`` (``SupportsBlockCopies``). An
engine's manager that has the method is called; one without it answers the call as a no-op
(a design with no per-step state) or as "no copies" (a design that never copies a block),
never an error."""

from __future__ import annotations

from dataclasses import replace

from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, spec_to_dict
from kvcheck.wire.serve import Server

SPEC = KVCacheSpec(num_blocks=12, block_size=4,
                   kv_cache_groups=(KVCacheGroupSpec("mamba", 4, mamba_cache_mode="align"),))


class _NoStep:
    """A manager without ``new_step_starts`` (only what the test calls)."""

    def num_free_blocks(self) -> int:
        return 11


class _Step(_NoStep):
    def __init__(self) -> None:
        self.steps = 0

    def new_step_starts(self) -> None:
        self.steps += 1


def _serve(manager: object) -> tuple[Server, int]:
    handle = load_impl("reference", call_timeout=0)
    server = Server(replace(handle, factory=lambda spec: manager))
    made = server.answer({"id": 1, "method": "make_kv_cache_manager",
                          "params": {"spec": spec_to_dict(SPEC)}})
    result = made["result"]
    assert isinstance(result, dict), made
    return server, int(result["handle"])


def test_new_step_starts_reaches_a_manager_that_has_it() -> None:
    manager = _Step()
    server, handle = _serve(manager)
    answer = server.answer({"id": 2, "handle": handle, "method": "new_step_starts",
                            "params": {}})
    assert answer == {"id": 2, "result": None} and manager.steps == 1


def test_new_step_starts_is_a_no_op_without_the_method() -> None:
    server, handle = _serve(_NoStep())
    answer = server.answer({"id": 2, "handle": handle, "method": "new_step_starts",
                            "params": {}})
    assert answer == {"id": 2, "result": None}
    missing = server.answer({"id": 3, "handle": handle, "method": "free_block_ids",
                             "params": {}})
    assert missing["id"] == 3 and "error" in missing  # other methods are not optional


class _Copies(_NoStep):
    """A manager with ``take_kv_cache_block_copies`` (capability ``fine_grained_hits``)."""

    def __init__(self) -> None:
        self.pending = [(3, 7), (5, 8)]

    def take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        copies, self.pending = self.pending, []
        return copies


def test_take_kv_cache_block_copies_reaches_a_manager_that_has_it() -> None:
    """The copies cross as arrays of two block ids, drained once."""
    server, handle = _serve(_Copies())
    first = server.answer({"id": 2, "handle": handle, "method": "take_kv_cache_block_copies",
                           "params": {}})
    again = server.answer({"id": 3, "handle": handle, "method": "take_kv_cache_block_copies",
                           "params": {}})
    assert first == {"id": 2, "result": [(3, 7), (5, 8)]}, first
    assert again == {"id": 3, "result": []}, again


def test_take_kv_cache_block_copies_is_no_copies_without_the_method() -> None:
    """A design that never copies a block need not have the method: "no copies", a fresh
    list each time (never one the server shares)."""
    server, handle = _serve(_NoStep())
    first = server.answer({"id": 2, "handle": handle, "method": "take_kv_cache_block_copies",
                           "params": {}})
    assert first == {"id": 2, "result": []}, first
    first["result"].append((1, 2))
    again = server.answer({"id": 3, "handle": handle, "method": "take_kv_cache_block_copies",
                           "params": {}})
    assert again == {"id": 3, "result": []}, again


class _Offloads(_NoStep):
    """A manager with the boundary-state hand-offs (capability ``boundary_state_offloads``)."""

    def __init__(self) -> None:
        self.pending = {"a": [(1, 6, 12)]}

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        offloads, self.pending = self.pending, {}
        return offloads

    def finalize_partial_tail_offloads(self, request: object) -> list[tuple[int, int, int]]:
        return [(1, 4, 12)]


def test_boundary_state_offloads_reach_a_manager_that_has_them() -> None:
    """The hand-offs cross by request id as arrays of three ints, drained once; the partial
    tails of the request sent."""
    server, handle = _serve(_Offloads())
    first = server.answer({"id": 2, "handle": handle, "method": "take_boundary_state_offloads",
                           "params": {}})
    again = server.answer({"id": 3, "handle": handle, "method": "take_boundary_state_offloads",
                           "params": {}})
    assert first == {"id": 2, "result": {"a": [(1, 6, 12)]}}, first
    assert again == {"id": 3, "result": {}}, again
    tails = server.answer({"id": 4, "handle": handle, "method": "finalize_partial_tail_offloads",
                           "params": {"request": {"request_id": "a",
                                                  "prompt_token_ids": [1, 2]}}})
    assert tails == {"id": 4, "result": [(1, 4, 12)]}, tails


def test_boundary_state_offloads_are_none_without_the_methods() -> None:
    """A design that keeps no Mamba "align" states need not have the methods: "no hand-offs"
    and "no partial tail", fresh each time (never shared by the server)."""
    server, handle = _serve(_NoStep())
    first = server.answer({"id": 2, "handle": handle, "method": "take_boundary_state_offloads",
                           "params": {}})
    assert first == {"id": 2, "result": {}}, first
    first["result"]["a"] = []
    again = server.answer({"id": 3, "handle": handle, "method": "take_boundary_state_offloads",
                           "params": {}})
    assert again == {"id": 3, "result": {}}, again
    tails = server.answer({"id": 4, "handle": handle, "method": "finalize_partial_tail_offloads",
                           "params": {"request": {"request_id": "a",
                                                  "prompt_token_ids": [1, 2]}}})
    assert tails == {"id": 4, "result": []}, tails

