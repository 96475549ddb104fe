#!/usr/bin/env bash
# kvcheck's GPU benchmark set on one CUDA GPU, in well under 8 minutes on an H200.
#
#   bash bench/run_gpu.sh OUT_DIR [KV_IMPL] [extra pytest args...]
#
# Runs `pytest --kv-impl=KV_IMPL --kv-bench --kv-bench-device=cuda` from the repository root
# (KV_IMPL defaults to "reference": kvcheck's Triton kernels, the torch references, vLLM and
# FlashInfer when importable, plus the allocator benchmarks on this machine's CPU) and writes
#   OUT_DIR/kvcheck-bench.jsonl      kvcheck result records (raw samples, full environment)
#   OUT_DIR/pytest-benchmark.json    pytest-benchmark's JSON (figures in extra_info)
#   OUT_DIR/bench.log                the whole terminal output, tables included
#   OUT_DIR/nvidia-smi.csv           clocks, temperature and power before and after
#
# Needs python3 with torch (CUDA), triton, pytest, pytest-benchmark, numpy, rich, xxhash,
# hypothesis and cbor2. Nothing is installed: kvcheck is made importable from this tree through
# a folder of symlinks in a scratch folder (mktemp -d). A missing pure dependency (cbor2 on a bare CUDA image) can be
# carried as wheels in .whl/ (pip download --no-deps cbor2 ...); they are unpacked into
# the scratch folder. Set KVCHECK_COMMIT=<sha> when the tree arrives without .git, so the
# records name the commit. KV_BENCH_DEVICE=cpu is a dry run without a GPU (torch references
# only); KV_BENCH_NO_INSTALL=1 takes the symlink route even where kvcheck is installed.
# Exit codes: 2 missing dependency, 3 no CUDA device, else pytest's.
set -euo pipefail

out=${1:?usage: bash bench/run_gpu.sh OUT_DIR [KV_IMPL] [pytest args...]}
impl=${2:-reference}
shift $(( $# >= 2 ? 2 : 1 ))
cd "$(dirname "$0")/.."
repo=$(pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

scratch=$(mktemp -d -t kvcheck-gpu.XXXXXX)  # symlinked package and carried wheels
device=${KV_BENCH_DEVICE:-cuda}  # KV_BENCH_DEVICE=cpu: a dry run of this script without a GPU

plugins=()
if [ -n "${KV_BENCH_NO_INSTALL:-}" ] || ! "$py" -c "import sys
from importlib.metadata import entry_points as e
sys.exit(0 if any(p.name == 'kvcheck-bench' for p in e(group='pytest11')) else 1)"; then
  # kvcheck is not installed: a package of symlinks, $scratch/pkg/kvcheck/<sub> -> ./<sub>,
  # and the plugins named explicitly with entry-point autoloading off (so an installed copy,
  # if any, is not registered twice).
  pkg=$scratch/pkg
  rm -rf "$pkg" && mkdir -p "$pkg/kvcheck"
  ln -s "$repo/kvcheck/__init__.py" "$pkg/kvcheck/__init__.py"
  for sub in reference_impl conformance gpu_kernels plugin bench results adapters; do
    ln -s "$repo/$sub" "$pkg/kvcheck/$sub"
  done
  export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
  plugins=(-p pytest_benchmark.plugin -p kvcheck.plugin.plugin -p kvcheck.bench.plugin)
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$scratch/site" .whl/*.whl
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$scratch/site"
fi

if ! "$py" -c "import torch, triton, numpy, rich, xxhash, cbor2, hypothesis, pytest_benchmark" \
    2>"$out/import-error.txt"; then
  echo "run_gpu.sh: a dependency is missing ($(tail -n 1 "$out/import-error.txt"))." >&2
  echo "  Fix: carry its wheel in .whl/ (see the header of this script)." >&2
  exit 2
fi
rm -f "$out/import-error.txt"
if [ "$device" = cuda ] && ! "$py" -c "import torch, sys
sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "run_gpu.sh: torch sees no CUDA device; nothing to benchmark." >&2
  exit 3
fi

fields=timestamp,name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw
smi() {
  nvidia-smi --query-gpu="$fields" --format=csv${1:+,noheader} >>"$out/nvidia-smi.csv" \
    2>/dev/null || true
}
smi
status=0
# 420 s for pytest leaves room for the start-up above inside the 8-minute budget.
timeout 420 "$py" -m pytest -p no:cacheprovider ${plugins[@]+"${plugins[@]}"} \
  --kv-impl="$impl" --kv-bench --kv-bench-device="$device" \
  --kv-bench-report="$out/kvcheck-bench.jsonl" \
  --benchmark-json="$out/pytest-benchmark.json" -rs "$@" 2>&1 | tee "$out/bench.log" \
  || status=${PIPESTATUS[0]}
smi noheader
[ -s "$out/nvidia-smi.csv" ] || rm -f "$out/nvidia-smi.csv"
exit "$status"
