"""``RequestViewSync``: for adapter authors, one engine request per request id, kept in step
with the immutable ``RequestView`` snapshots the suite passes on every call.

The suite only ever grows a view (decode appends output tokens) and advances
``num_computed_tokens``; a view with a different prompt under a known id is a new request
(the old one was freed). The engine request type needs ``prompt_token_ids``,
``output_token_ids``, ``append_output_token_ids(list)`` and a writable
``num_computed_tokens``, as vLLM's ``Request`` and kvcheck's reference ``Request`` have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from kvcheck.conformance.protocol import RequestView
from kvcheck.errors import KVCheckInputError

__all__ = ["EngineRequest", "RequestViewSync"]


class EngineRequest(Protocol):
    """What ``RequestViewSync`` needs of an engine's request type."""

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...

    num_computed_tokens: int

    def append_output_token_ids(self, token_ids: list[int], /) -> None: ...


R = TypeVar("R", bound=EngineRequest)


class RequestViewSync(Generic[R]):
    """Maps request ids to engine requests built by ``make(view)``.

    Args:
        make: builds the engine request for a view seen for the first time.
        before_hashing: called before a request is built or extended (both hash new full
            blocks); e.g. vLLM's adapter reinstalls its module-global NONE_HASH there.
    """

    def __init__(self, make: Callable[[RequestView], R],
                 before_hashing: Callable[[], None] | None = None) -> None:
        self._make = make
        self._before_hashing = before_hashing or (lambda: None)
        self.requests: dict[str, R] = {}

    def sync(self, view: RequestView) -> R:
        """The engine request for ``view``, its tokens and computed count brought up to date.

        Raises:
            KVCheckInputError: the view has fewer output tokens than already seen (views only
                grow).
        """
        req = self.requests.get(view.request_id)
        if req is None or tuple(req.prompt_token_ids) != view.prompt_token_ids:
            self._before_hashing()
            req = self._make(view)
            self.requests[view.request_id] = req
        known = len(req.output_token_ids)
        if len(view.output_token_ids) < known:
            raise KVCheckInputError(
                f"request {view.request_id!r}: output_token_ids shrank from {known} to "
                f"{len(view.output_token_ids)}; views may only grow")
        if len(view.output_token_ids) > known:
            self._before_hashing()
            req.append_output_token_ids(list(view.output_token_ids[known:]))
        req.num_computed_tokens = view.num_computed_tokens
        return req

    def get(self, request_id: str) -> R | None:
        return self.requests.get(request_id)

    def pop(self, request_id: str) -> R | None:
        return self.requests.pop(request_id, None)
