"""One adapter from the offload protocol (``kvcheck.conformance.offload_protocol``) to a
manager with vLLM's ``OffloadingManager`` API: the reference's
``kvcheck.reference_impl.offload_manager.CPUOffloadingManager`` and vLLM 0.33's own
``vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager`` take the same calls, so both adapters
are this class with another manager and another request-context type.

It keeps one request context per ``req_id`` (as vLLM's scheduler keeps one ``ReqContext`` per
request) and turns answers into primitive types: enums to their names, slot arrays to lists,
events to dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, Protocol

from kvcheck.conformance.offload_protocol import EVENT_FIELDS, StoreAnswer

__all__ = ["OffloadTier"]


def _plain(value: object) -> object:
    """An enum member as its value (vLLM's ``Medium.CPU`` -> ``"CPU"``), anything else as is."""
    return value.value if isinstance(value, Enum) else value


class _Context(Protocol):
    """What the tier writes on the manager's per-request context (``ReqContext``)."""

    def set_offload_key_position(self, key: bytes, end_token: int, /) -> None: ...


class OffloadTier:
    """The protocol over ``manager`` (vLLM's API); ``make_context(req_id)`` builds the
    manager's per-request context."""

    # Any: vLLM's CPUOffloadingManager (untyped: vLLM is imported at run time) or the
    # reference's, driven through the one API they share.
    def __init__(self, manager: Any, make_context: Callable[[str], _Context]) -> None:
        self.manager = manager
        self._make_context = make_context
        self._contexts: dict[str, _Context] = {}

    def _context(self, req_id: str) -> _Context:
        context = self._contexts.get(req_id)
        if context is None:
            context = self._contexts[req_id] = self._make_context(req_id)
        return context

    def on_new_request(self, req_id: str) -> None:
        self.manager.on_new_request(self._context(req_id))

    def set_key_positions(self, req_id: str, positions: Mapping[bytes, int]) -> None:
        context = self._context(req_id)
        for key, end_token in positions.items():
            context.set_offload_key_position(key, end_token)

    def lookup(self, key: bytes, req_id: str) -> str:
        return str(self.manager.lookup(key, self._context(req_id)).name)

    def prepare_load(self, keys: Sequence[bytes], req_id: str) -> list[int]:
        spec = self.manager.prepare_load(list(keys), self._context(req_id))
        return [int(i) for i in spec.block_ids]

    def touch(self, keys: Sequence[bytes], req_id: str) -> None:
        self.manager.touch(list(keys), self._context(req_id))

    def complete_load(self, keys: Sequence[bytes], req_id: str) -> None:
        self.manager.complete_load(list(keys), self._context(req_id))

    def prepare_store(self, keys: Sequence[bytes], req_id: str) -> StoreAnswer | None:
        out = self.manager.prepare_store(list(keys), self._context(req_id))
        if out is None:
            return None
        return {"keys_to_store": list(out.keys_to_store),
                "evicted_keys": list(out.evicted_keys),
                "chunk_ids": [int(i) for i in out.store_spec.block_ids]}

    def complete_store(self, keys: Sequence[bytes], req_id: str, success: bool = True) -> None:
        self.manager.complete_store(list(keys), self._context(req_id), success)

    def on_request_finished(self, req_id: str) -> None:
        self.manager.on_request_finished(self._context(req_id))

    def take_events(self) -> list[dict[str, object]]:
        return [{name: (list(event.keys) if name == "keys" else _plain(getattr(event, name)))
                 for name in EVENT_FIELDS} for event in self.manager.take_events()]

    def reset_cache(self) -> None:
        self.manager.reset_cache()
