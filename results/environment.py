"""The environment block of a result record, including the ``hardware_key``.

Records are compared (gates, leaderboards) only when their hardware keys are equal: the GPU
model when a CUDA device is visible, else the CPU model and core count.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

__all__ = ["collect_environment"]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu() -> dict[str, Any] | None:
    # Only look if torch is already imported: collecting a conformance record must not pull
    # in (or initialise) CUDA.
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "cuda": torch.version.cuda,
            "memory_bytes": int(props.total_memory), "count": torch.cuda.device_count()}


def collect_environment() -> dict[str, Any]:
    """Versions and hardware of this process's machine (no network, no CUDA init)."""
    gpu = _gpu()
    cpu = _cpu_model()
    cores = os.cpu_count() or 0
    key = f"gpu:{gpu['name']}" if gpu else f"cpu:{cpu} x{cores}"
    return {
        "hardware_key": key,
        "cpu": cpu,
        "cpu_count": cores,
        "gpu": gpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "packages": {name: _version(name) for name in
                     ("kvcheck", "pytest", "hypothesis", "numpy", "torch", "triton", "vllm")},
    }
