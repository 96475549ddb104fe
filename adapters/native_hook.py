"""What the adapters' manager-level benchmark hooks share (``kvcheck.bench.replay.native``).

An adapter module's ``make_native_manager(spec)`` exposes one engine manager with the
engine's own request and block objects, for single-group specs only. ``SingleGroupNativeManager``
is the common part of those hooks; the engine-specific methods are the subclass's.
"""

from __future__ import annotations

from typing import Any

from kvcheck.conformance.protocol import KVCacheSpec, UnsupportedSpec

__all__ = ["SingleGroupNativeManager"]


class SingleGroupNativeManager:
    """Base of a ``kvcheck.bench.replay.native.NativeManager``: keeps ``spec``, refuses a
    multi-group one, and frees through the engine manager the subclass stores in ``manager``.

    Raises:
        UnsupportedSpec: ``spec.kv_cache_groups`` is set (the hook covers single-group specs).
    """

    manager: Any

    def __init__(self, spec: KVCacheSpec) -> None:
        if spec.kv_cache_groups:
            raise UnsupportedSpec("the manager-level benchmark hook covers single-group "
                                  "specs only (kv_cache_groups is set)")
        self.spec = spec

    def free(self, request: Any) -> None:
        self.manager.free(request)
