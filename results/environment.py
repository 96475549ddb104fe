"""The environment block of a result record, including the ``hardware_key``.

Timings are compared (gates, leaderboards) only when their hardware keys are equal: the GPU
model when a CUDA device is visible (``"gpu:NVIDIA H100 80GB HBM3"``), else the CPU model
and core count (``"cpu:AMD EPYC x2"``); the gate compares conformance outcomes whatever
the key. Software versions (driver, CUDA, torch, triton, Python) are
recorded beside the key, not in it: a dependency bump must not silently turn a regression gate
into "no baseline"; the gate prints software differences instead.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import TypedDict

__all__ = ["SOFTWARE_FIELDS", "collect_environment", "hardware_key", "software_versions"]

# Environment fields that change timings but not the hardware key.
SOFTWARE_FIELDS = ("driver", "cuda", "torch", "triton", "python")


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


class _Gpu(TypedDict):
    name: str
    cuda: str | None
    memory_bytes: int
    count: int


def _gpu() -> _Gpu | None:
    # Only look if torch is already imported: collecting a conformance record must not pull
    # in (or initialise) CUDA.
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "cuda": torch.version.cuda,
            "memory_bytes": int(props.total_memory), "count": torch.cuda.device_count()}


def _nvidia_driver() -> str | None:
    # The kernel module reports its version here; no subprocess, no NVML binding needed.
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        return None
    for word in first.split():
        if word[:1].isdigit() and "." in word:
            return word
    return None


def hardware_key(environment: Mapping[str, object]) -> str:
    """The comparison key of an environment block (see the module docstring)."""
    return str(environment.get("hardware_key", ""))


def collect_environment() -> dict[str, object]:
    """Versions and hardware of this process's machine (no network, no CUDA init).

    Fields: ``hardware_key``, ``cpu``, ``cpu_count``, ``gpu`` (object or None), ``gpu_model``,
    ``driver``, ``cuda``, ``torch``, ``triton``, ``python``, ``platform``, ``implementation``
    and ``packages`` (distribution name -> version or None).
    """
    gpu = _gpu()
    cpu = _cpu_model()
    cores = os.cpu_count() or 0
    key = f"gpu:{gpu['name']}" if gpu else f"cpu:{cpu} x{cores}"
    packages = {name: _version(name) for name in
                ("kvcheck", "pytest", "hypothesis", "numpy", "torch", "triton", "vllm")}
    return {
        "hardware_key": key,
        "cpu": cpu,
        "cpu_count": cores,
        "gpu": gpu,
        "gpu_model": gpu["name"] if gpu else None,
        "driver": _nvidia_driver() if gpu else None,
        "cuda": gpu["cuda"] if gpu else None,
        "torch": packages["torch"],
        "triton": packages["triton"],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "packages": packages,
    }


def software_versions(environment: Mapping[str, object]) -> dict[str, str | None]:
    """driver, cuda, torch, triton and python of an environment block; older records that
    only have ``packages`` fall back to it."""
    packages = environment.get("packages") or {}
    out: dict[str, str | None] = {}
    for name in SOFTWARE_FIELDS:
        value = environment.get(name)
        if value is None and isinstance(packages, dict):
            value = packages.get(name)
        if value is None and name == "cuda":
            gpu = environment.get("gpu")
            if isinstance(gpu, dict):
                value = gpu.get("cuda")
        out[name] = None if value is None else str(value)
    return out
