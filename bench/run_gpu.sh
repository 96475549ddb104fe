#!/usr/bin/env bash
# kvcheck's GPU benchmark set on one CUDA GPU, in well under 8 minutes on an H200.
#
#   bash bench/run_gpu.sh OUT_DIR [KV_IMPL] [extra pytest args...]
#
# Installs this tree as the README does (pip install -e ".[kernels,bench,test]") into a venv,
# then runs `pytest --kv-impl=KV_IMPL --kv-bench --kv-bench-device=cuda` from the repository
# root (KV_IMPL defaults to "reference": kvcheck's Triton kernels, the torch references, vLLM and
# FlashInfer when importable, plus the allocator benchmarks on this machine's CPU) and writes
#   OUT_DIR/kvcheck-bench.jsonl      kvcheck result records (raw samples, full environment)
#   OUT_DIR/pytest-benchmark.json    pytest-benchmark's JSON (figures in extra_info)
#   OUT_DIR/bench.log                the whole terminal output, tables included
#   OUT_DIR/pip.log                  the install's output
#   OUT_DIR/nvidia-smi.csv           clocks, temperature and power before and after
#
# The venv is created with --system-site-packages from $PYTHON (default python3), so the CUDA
# build of torch and triton already on the machine is used, not replaced (pip finds the
# `kernels` extra satisfied). An editable install keeps `kvcheck.__file__` in this tree, so the
# records name its git commit. Settings, all optional:
#   PYTHON=python3.12        the interpreter the venv is made from
#   KV_BENCH_VENV=DIR        the venv to use (created if missing; reused across runs); the
#                            default is a scratch one (mktemp -d); KV_BENCH_VENV=current
#                            installs into $PYTHON's own environment instead
#   .whl/*.whl               wheels pip may take (--find-links .whl), e.g. cbor2 on a bare CUDA
#                            image; on a machine without network add PIP_NO_INDEX=1 and carry
#                            every missing distribution there, setuptools and wheel included
#                            (the build backend pip installs for the build)
#   KVCHECK_COMMIT=<sha>     the commit the records name when the tree arrives without .git
#   KV_BENCH_DEVICE=cpu      a dry run without a GPU (torch references only)
# Exit codes: 2 install failed or a dependency is missing, 3 no CUDA device, else pytest's.
set -euo pipefail

out=${1:?usage: bash bench/run_gpu.sh OUT_DIR [KV_IMPL] [pytest args...]}
impl=${2:-reference}
shift $(( $# >= 2 ? 2 : 1 ))
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
device=${KV_BENCH_DEVICE:-cuda}  # KV_BENCH_DEVICE=cpu: a dry run of this script without a GPU

venv=${KV_BENCH_VENV:-}
if [ "$venv" = current ]; then
  py=${PYTHON:-python3}
else
  if [ -z "$venv" ]; then
    scratch=$(mktemp -d -t kvcheck-gpu.XXXXXX)
    trap 'rm -rf "$scratch"' EXIT
    venv=$scratch/venv
  fi
  if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv --system-site-packages "$venv"
  fi
  py=$venv/bin/python
fi

find_links=()
if ls .whl/*.whl >/dev/null 2>&1; then
  find_links=(--find-links .whl)
fi
echo "run_gpu.sh: pip install -e '.[kernels,bench,test]' with $py (log: $out/pip.log)"
if ! "$py" -m pip install -e ".[kernels,bench,test]" ${find_links[@]+"${find_links[@]}"} \
    >"$out/pip.log" 2>&1; then
  tail -n 20 "$out/pip.log" >&2
  echo "run_gpu.sh: installing kvcheck failed (see $out/pip.log)." >&2
  echo "  Fix: carry the missing wheels in .whl/ (see the header of this script)." >&2
  exit 2
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
timeout 420 "$py" -m pytest -p no:cacheprovider \
  --kv-impl="$impl" --kv-bench --kv-bench-device="$device" \
  --kv-bench-report="$out/kvcheck-bench.jsonl" \
  --benchmark-json="$out/pytest-benchmark.json" -rs "$@" 2>&1 | tee "$out/bench.log" \
  || status=${PIPESTATUS[0]}
smi noheader
[ -s "$out/nvidia-smi.csv" ] || rm -f "$out/nvidia-smi.csv"
exit "$status"
