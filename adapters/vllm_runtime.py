"""The installed vLLM, imported as kvcheck's vLLM adapter needs it, and how this release spells
its constructors (the lowest module of ``kvcheck.adapters.vllm``; docs in that module).

Importing it makes the process-wide settings ``kvcheck.adapters.vllm`` documents
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, vLLM's general plugins loaded first, the CPU-only
Triton settings), imports vLLM's KV-cache classes, refuses releases older than 0.10.2 with an
``ImportError`` naming the recipe, and exposes feature detection by parameter name
(``accepting``), since constructor and signature differences between releases are handled by
inspecting parameter names, never by parsing the version.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

__all__ = ["BLOCK_TABLE_ERROR", "CPU_ONLY", "HASH_ALGOS", "HAS_TRITON", "HINT", "MANAGER_PARAMS",
           "VERSION", "BlockPool", "BlockTable", "ChunkedLocalAttentionSpec", "CrossAttentionSpec",
           "FullAttentionSpec",
           "KVCacheBlocks", "KVCacheConfig", "KVCacheGroupSpec", "KVCacheManager", "KVEventBatch",
           "LoRARequest", "MambaSpec",
           "MultiModalFeatureSpec", "PlaceholderRange", "Request", "RequestStatus",
           "SamplingParams",
           "SlidingWindowSpec", "accepting", "get_hash_fn_by_name", "kcu", "not_installed",
           "params", "torch", "vllm"]

HINT = ("build an environment with vLLM in it with scripts/vllm-cpu-env.sh VERSION DIR (from a "
        "kvcheck checkout; see 'Checking a patched vLLM' in README.md), then run "
        "DIR/venv/bin/pytest --kv-impl=vllm")


def not_installed() -> ImportError | None:
    """The ``ImportError`` to raise when vLLM is not installed here, or None when it is."""
    if importlib.util.find_spec("vllm") is None:
        return ImportError("vLLM is not installed in this environment; " + HINT)
    return None


if (_missing := not_installed()) is not None:
    raise _missing


# ------------------------------------------------------------------------------ import vLLM
def _prepare_environment() -> bool:
    """Set the process-wide variables described in kvcheck.adapters.vllm; True on CPU only."""
    os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"
    import torch

    if torch.cuda.is_available():
        return False
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return True


@contextmanager
def _lenient_triton_check(cpu_only: bool) -> Iterator[None]:
    """vLLM disables Triton unless exactly one GPU driver is active, except when
    CUDA_VISIBLE_DEVICES is set and empty; on a CPU-only machine running Triton's interpreter,
    present it that way while vLLM is imported."""
    hide = (cpu_only and os.environ.get("TRITON_INTERPRET") == "1"
            and "CUDA_VISIBLE_DEVICES" not in os.environ)
    if hide:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if hide:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)


CPU_ONLY = _prepare_environment()
try:
    with _lenient_triton_check(CPU_ONLY):
        import torch
        import vllm
        # As the engine does at start-up: vLLM general plugins (entry points in the
        # ``vllm.general_plugins`` group, narrowed by VLLM_PLUGINS) may patch the KV-cache
        # classes, so they are loaded before those classes are imported and driven.
        try:
            from vllm.plugins import load_general_plugins
        except ImportError:
            load_general_plugins = None  # type: ignore[assignment]
        if load_general_plugins is not None:
            load_general_plugins()
        from vllm.distributed.kv_events import KVEventBatch
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core import kv_cache_utils as kcu
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec,
            CrossAttentionSpec,
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.request import Request, RequestStatus
        try:
            from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
        except ImportError:  # older releases: no MultiModalFeatureSpec (mm keys undeclared)
            MultiModalFeatureSpec = None  # type: ignore[assignment,misc]
            from vllm.multimodal.inputs import PlaceholderRange
        try:
            from vllm.v1.worker.block_table import BlockTable
            BLOCK_TABLE_ERROR = None
        except Exception as exc:  # noqa: BLE001 - reported in PROFILE_NOTE
            BlockTable = None  # type: ignore[assignment,misc]
            BLOCK_TABLE_ERROR = f"{type(exc).__name__}: {exc}"
        try:
            from vllm.triton_utils import HAS_TRITON
        except ImportError:
            HAS_TRITON = False
except ImportError as exc:
    _version = "(unknown version)"
    try:
        from importlib.metadata import version as _dist_version

        _version = _dist_version("vllm")
    except Exception:  # noqa: BLE001
        pass
    raise ImportError(
        f"vLLM {_version} is installed but its KV-cache modules cannot be imported "
        f"({type(exc).__name__}: {exc}); install the missing package, or " + HINT) from exc

# The suite resets the prefix cache on purpose, in use or not, hundreds of times a run; vLLM's
# block pool logs each one ("Failed to reset prefix cache because some blocks (5) are not freed
# yet", "Successfully reset prefix cache"), which buried the rest of a run's output. Only its
# errors are kept (the answer, True or False, is what the suite checks).
logging.getLogger("vllm.v1.core.block_pool").setLevel(logging.ERROR)


def _hash_fn_lookup() -> Callable[[str], Callable[[object], bytes]]:
    """``get_hash_fn_by_name`` wherever this release keeps it."""
    for module_name in ("vllm.utils.hashing", "vllm.utils"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        fn = getattr(module, "get_hash_fn_by_name", None)
        if fn is not None:
            return cast("Callable[[str], Callable[[object], bytes]]", fn)
    raise ImportError(
        f"vLLM {vllm.__version__} has no get_hash_fn_by_name / request block hasher (0.10.0 "
        "hashed blocks inside the manager, as integers): kvcheck's vLLM adapter supports "
        "0.10.2 and later (scripts/vllm-cpu-env.sh 0.10.2 DIR builds an environment with it)")


get_hash_fn_by_name = _hash_fn_lookup()
VERSION: str = vllm.__version__
if isinstance(getattr(kcu, "BlockHash", None), type) and issubclass(kcu.BlockHash, tuple):
    raise ImportError(
        f"vLLM {VERSION} hashes blocks as integers inside BlockHash named tuples (0.10.1 and "
        "older), a scheme kvcheck's profiles do not model: kvcheck's vLLM adapter supports "
        "0.10.2 and later (scripts/vllm-cpu-env.sh 0.10.2 DIR builds an environment with it)")
_ALL_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def _offered_algos() -> tuple[str, ...]:
    out = []
    for name in _ALL_ALGOS:
        try:
            get_hash_fn_by_name(name)
        except Exception:  # noqa: BLE001 - unknown name or missing optional package
            continue
        out.append(name)
    return tuple(out)


HASH_ALGOS = _offered_algos()


# ------------------------------------------------------------------------------ signatures
def params(fn: Callable[..., object]) -> set[str]:
    """The parameter names of ``fn``."""
    return set(inspect.signature(fn).parameters)


def accepting(fn: Callable[..., object], **candidates: object) -> dict[str, object]:
    """The subset of ``candidates`` that ``fn`` takes (feature detection by name)."""
    accepted = params(fn)
    return {k: v for k, v in candidates.items() if k in accepted}


MANAGER_PARAMS = params(KVCacheManager.__init__)
