"""What the adapters' manager-level benchmark hooks share (``kvcheck.bench.replay.native``).

An adapter module's ``make_native_manager(spec)`` exposes one engine manager with the
engine's own request and block objects, for single-group specs only. ``SingleGroupNativeManager``
is the common part of those hooks; the engine-specific methods are the subclass's.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from kvcheck.conformance.protocol import KVCacheSpec, UnsupportedSpec

__all__ = ["SingleGroupNativeManager"]

#: The engine's request type.
Req = TypeVar("Req")
_Req_contra = TypeVar("_Req_contra", contravariant=True)


class _FreeingManager(Protocol[_Req_contra]):
    """What the base calls on the engine manager."""

    def free(self, request: _Req_contra, /) -> None: ...


class SingleGroupNativeManager(Generic[Req]):
    """Base of a ``kvcheck.bench.replay.native.NativeManager``: keeps ``spec``, refuses a
    multi-group one, and frees through the engine manager the subclass stores in ``manager``.

    Raises:
        UnsupportedSpec: ``spec.kv_cache_groups`` is set (the hook covers single-group specs).
    """

    manager: _FreeingManager[Req]

    def __init__(self, spec: KVCacheSpec) -> None:
        if spec.kv_cache_groups:
            raise UnsupportedSpec("the manager-level benchmark hook covers single-group "
                                  "specs only (kv_cache_groups is set)")
        self.spec = spec

    def free(self, request: Req) -> None:
        self.manager.free(request)
