"""Builders of synthetic result records for the results/ tests (the ``rec`` fixture)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

CPU = "cpu:Test CPU x4"
GPU = "gpu:NVIDIA H100 80GB HBM3"


def environment(hardware_key: str = CPU, **software: str | None) -> dict[str, Any]:
    env: dict[str, Any] = {"hardware_key": hardware_key, "cpu": "Test CPU", "cpu_count": 4,
                           "gpu": None, "gpu_model": None, "driver": None, "cuda": None,
                           "torch": "2.13.0", "triton": "3.9.0", "python": "3.11.7"}
    env.update(software)
    return env


def conformance(name: str = "mine", outcomes: dict[str, str] | None = None, *,
                profile: str = "vllm-0.33", hardware_key: str = CPU,
                timestamp: str = "2026-01-01T00:00:00+00:00", version: str = "1.0",
                incomplete: tuple[int, int, str] | None = None, legacy: bool = False,
                ) -> dict[str, Any]:
    """A schema-valid conformance record; areas are counted from the test file names.

    ``incomplete=(ran, applicable, reason)``: a version-2 record of an incomplete run
    (``conforms`` false). ``legacy``: a version-1 record (no completeness fields)."""
    if outcomes is None:
        outcomes = {f"conformance/test_eviction.py::test_lru[{name}]": "passed",
                    f"conformance/test_hashing.py::test_chain[{name}]": "passed"}
    areas: dict[str, dict[str, int]] = {}
    for test_id, outcome in outcomes.items():
        area = test_id.split("::")[0].rsplit("/", 1)[-1][len("test_"):-len(".py")]
        row = areas.setdefault(area, dict.fromkeys(
            ("passed", "failed", "skipped", "xfailed", "xpassed", "error"), 0))
        row[outcome] += 1
    failing = sorted(a for a, c in areas.items() if c["failed"] or c["error"])
    record = {
        "schema_version": 2, "kind": "conformance", "timestamp": timestamp,
        "suite_version": "0.1.0", "kvcheck_version": "0.1.0", "profile": profile, "seed": None,
        "implementation": {"name": name, "version": version, "commit": None},
        "outcomes": outcomes, "areas": areas,
        "verdict": f"{name} does NOT conform" if failing else f"{name} conforms to {profile}",
        "conforms": not failing, "metrics": [], "environment": environment(hardware_key),
        "complete": True,
        "completeness": {"applicable": len(outcomes), "ran": len(outcomes), "reasons": [],
                         "interrupted": False},
    }
    if incomplete is not None:
        ran, applicable, reason = incomplete
        record.update(complete=False, conforms=False,
                      verdict=f"incomplete: ran {ran} of {applicable} applicable tests ({reason})",
                      completeness={"applicable": applicable, "ran": ran, "reasons": [reason],
                                    "interrupted": False})
    if legacy:
        record["schema_version"] = 1
        del record["complete"], record["completeness"]
    return record


def metric(name: str, samples: Sequence[float] = (), value: float | None = None, *,
           unit: str = "us", direction: str = "lower_is_better", case: str | None = None,
           ) -> dict[str, Any]:
    """A metric; ``value`` defaults to the middle sample (tests pass odd-length lists or an
    explicit value, so nothing here depends on the code under test)."""
    if value is None:
        value = sorted(samples)[len(samples) // 2]
    m: dict[str, Any] = {"name": name, "unit": unit, "direction": direction, "value": value,
                         "samples": list(samples)}
    if case is not None:
        m["case"] = case
    return m


def benchmark(name: str, metrics: Iterable[dict[str, Any]], *, profile: str = "vllm-0.33",
              hardware_key: str = CPU, timestamp: str = "2026-01-01T00:00:00+00:00",
              **software: str | None) -> dict[str, Any]:
    return {
        "schema_version": 2, "kind": "benchmark", "timestamp": timestamp,
        "suite_version": "0.1.0", "kvcheck_version": "0.1.0", "profile": profile, "seed": 0,
        "implementation": {"name": name, "version": "1.0", "commit": "0123456789abcdef"},
        "metrics": list(metrics), "environment": environment(hardware_key, **software),
    }


@pytest.fixture
def rec(tmp_path: Path) -> SimpleNamespace:
    """Record builders plus ``write(filename, *records) -> Path`` into ``tmp_path``."""

    def write(filename: str, *records: dict[str, Any]) -> Path:
        path = tmp_path / filename
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        return path

    return SimpleNamespace(CPU=CPU, GPU=GPU, conformance=conformance, metric=metric,
                           benchmark=benchmark, environment=environment, write=write)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Headless Chromium's path, for the page tests (skipped, saying why, without one)."""
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("shutil.which('chromium') found no browser "
                    "(install Debian's package: apt-get install -y chromium)")
    return path
