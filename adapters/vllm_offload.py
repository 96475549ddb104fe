"""vLLM's own offload tier behind the offload protocol (capability ``offload``): the installed
vLLM's ``vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager`` (0.33; releases without
``v1/kv_offload`` do not declare the capability) through ``offload_tier.OffloadTier``."""

from __future__ import annotations

import importlib
from types import ModuleType

from kvcheck.adapters.offload_tier import OffloadTier
from kvcheck.conformance.offload_protocol import OffloadSpec
from kvcheck.conformance.protocol import UnsupportedSpec

__all__ = ["HAS_OFFLOAD", "make_offloading_manager"]


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_manager_module = _import("vllm.v1.kv_offload.cpu.manager")
_base_module = _import("vllm.v1.kv_offload.base")
#: This release ships the CPU offloading manager (0.33 does, 0.10.2 does not).
HAS_OFFLOAD: bool = _manager_module is not None and _base_module is not None


def make_offloading_manager(spec: OffloadSpec) -> OffloadTier:
    """A fresh vLLM ``CPUOffloadingManager`` for ``spec``.

    Raises:
        UnsupportedSpec: this vLLM has no offload tier.
    """
    if not HAS_OFFLOAD:
        raise UnsupportedSpec("this vLLM release has no vllm.v1.kv_offload (CPU offloading "
                              "arrived after 0.10.2)")
    manager_module, base_module = _manager_module, _base_module
    assert manager_module is not None and base_module is not None  # HAS_OFFLOAD
    manager = manager_module.CPUOffloadingManager(
        spec.num_chunks, cache_policy=spec.cache_policy, enable_events=spec.enable_events,
        store_threshold=spec.store_threshold, max_tracker_size=spec.max_tracker_size)
    req_context = base_module.ReqContext
    return OffloadTier(manager, lambda req_id: req_context(req_id=req_id))
