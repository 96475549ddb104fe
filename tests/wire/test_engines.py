"""The two engines in other languages (``engines/``), built and checked over the wire as a
user would check theirs: the Rust one (a design of its own) conforms to ``generic``; the
JavaScript one (vLLM 0.33's semantics, ``sha256_cbor`` hashes) passes the hashing area
byte-exact and conforms to ``vllm-0.33``. A missing toolchain skips, saying which."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUST = ROOT / "engines" / "rust"
JS = ROOT / "engines" / "js" / "vllmkv.mjs"


def _suite(tmp_path: Path, impl: str, profile: str, *args: str) -> dict:
    """Run the shipped suite on ``impl``; its record."""
    report = tmp_path / "record.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(ROOT),
         str(ROOT / "conformance"), f"--kv-impl={impl}", f"--kv-profile={profile}",
         f"--kv-report={report}", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=1500, check=False)
    record = json.loads(report.read_text().splitlines()[-1])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "still running" not in run.stdout, run.stdout[-2000:]
    return record


@pytest.fixture(scope="module")
def rust_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not on PATH: the Rust engine cannot be built")
    target = tmp_path_factory.mktemp("cargo-target")
    build = subprocess.run(
        [cargo, "build", "--release", "--offline", "--manifest-path", str(RUST / "Cargo.toml")],
        env={**os.environ, "CARGO_TARGET_DIR": str(target)}, capture_output=True, text=True,
        timeout=900, check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    return target / "release" / "rustkv"


def test_rust_engine_conforms_to_generic(rust_engine: Path, tmp_path: Path) -> None:
    record = _suite(tmp_path, f"exec:{rust_engine}", "generic")
    assert record["implementation"]["name"] == "rustkv"
    assert record["conforms"] is True and record["complete"] is True, record["verdict"]
    assert record["verdict"].startswith("rustkv conforms to generic (")
    ran = sum(c["passed"] for c in record["areas"].values())
    assert ran >= 50, record["verdict"]  # the generic laws, not a handful of tests


@pytest.fixture(scope="module")
def node() -> str:
    found = shutil.which("node")
    if found is None:
        pytest.skip("node is not on PATH: the JavaScript engine cannot run")
    return found


def test_js_engine_hashes_byte_exact(node: str, tmp_path: Path) -> None:
    record = _suite(tmp_path, f"exec:{node} {JS}", "vllm-0.33", "-k", "test_hashing")
    hashing = record["areas"]["hashing"]
    assert hashing["failed"] == 0 and hashing["passed"] >= 10, hashing
    golden = {t: o for t, o in record["outcomes"].items()
              if "test_golden_block_hashes" in t and "sha256_cbor" in t}
    assert golden and set(golden.values()) == {"passed"}, golden


def test_js_engine_conforms_to_vllm_033(node: str, tmp_path: Path) -> None:
    # Fewer random examples here; .ci/run checks both engines with the default.
    record = _suite(tmp_path, f"exec:{node} {JS}", "vllm-0.33", "--kv-max-examples=8")
    assert record["implementation"]["name"] == "jsvllmkv"
    assert record["conforms"] is True and record["complete"] is True, record["verdict"]
