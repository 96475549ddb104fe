#!/usr/bin/env bash
# Build a CPU-only environment in which kvcheck drives a released vLLM's own KV-cache code
# (KVCacheManager, BlockPool, the request block hasher, BlockTable) through
# `pytest --kv-impl=vllm`.
#
#   scripts/vllm-cpu-env.sh VERSION DIR      e.g. scripts/vllm-cpu-env.sh 0.33.0 envs/vllm-0.33
#
# What it does (nothing of vLLM is ever copied into this repository):
#   1. `pip download --no-deps vllm==VERSION` into a wheel cache that persists on the machine
#      ($KVCHECK_VLLM_WHEEL_CACHE, default ${XDG_CACHE_HOME:-$HOME/.cache}/kvcheck/vllm-wheels);
#      a cached wheel is reused, so only the first run downloads (~340 MB).
#   2. Extracts only vLLM's pure-Python part (vllm/**/*.py|.json|.jinja|.txt) and its
#      vllm-VERSION.dist-info/ into DIR/site. The compiled CUDA extensions are left out: the
#      KV-cache code kvcheck drives is plain Python. (Keep the dist-info: without it vLLM
#      cannot read its own version and disables features such as Triton.)
#   3. Creates DIR/venv with torch==2.13.0 (the CPU build), the pure-Python packages those
#      modules import, and kvcheck itself with its `bench` extra (editable, from this
#      checkout), and puts DIR/site on that venv's sys.path through a .pth file.
#
# Afterwards, either of:
#   DIR/venv/bin/pytest -p no:cacheprovider --kv-impl=vllm
#   . DIR/venv/bin/activate && pytest --kv-impl=vllm
# and the allocator benchmarks on vLLM's own KV-cache code:
#   DIR/venv/bin/pytest -p no:cacheprovider --kv-impl=vllm --kv-bench --kv-bench-report=bench.jsonl
# To check a patched vLLM instead of the released one, put your checkout's vllm/ in front:
#   PYTHONPATH=/path/to/your/vllm-checkout DIR/venv/bin/pytest --kv-impl=vllm
# (see "Checking a patched vLLM" in README.md).
#
# Environment: PYTHON (interpreter for the venv, default python3), KVCHECK_VLLM_WHEEL_CACHE.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 VERSION DIR   (e.g. $0 0.33.0 envs/vllm-0.33)" >&2
  exit 2
fi
version=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
cache=${KVCHECK_VLLM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcheck/vllm-wheels}
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$cache"

# ---------------------------------------------------------------- 1. the wheel (cached)
wheel=$(ls "$cache"/vllm-"$version"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "kvcheck: downloading vllm==$version (no dependencies) into $cache"
  if ! "$python" -m pip download -q --no-deps --only-binary=:all: "vllm==$version" \
      -d "$cache" >"$cache/download.log" 2>&1; then
    cat "$cache/download.log" >&2
    echo "kvcheck: could not download vllm==$version" >&2
    exit 1
  fi
  wheel=$(ls "$cache"/vllm-"$version"-*.whl | head -n 1)
else
  echo "kvcheck: using cached $wheel"
fi

# ---------------------------------------------------------------- 2. vllm/ + dist-info
stamp="$dir/site/.kvcheck-wheel"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$(basename "$wheel")" ]; then
  rm -rf "$dir/site"
  mkdir -p "$dir/site"
  "$python" - "$wheel" "$dir/site" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
keep = (".py", ".json", ".jinja", ".txt")
with zipfile.ZipFile(wheel) as zf:
    names = [n for n in zf.namelist()
             if (n.startswith("vllm/") and n.endswith(keep))
             or n.split("/", 1)[0].endswith(".dist-info")]
    zf.extractall(dest, names)
print(f"kvcheck: extracted {len(names)} files of {wheel.rsplit('/', 1)[-1]} into {dest}")
PY
  basename "$wheel" > "$stamp"
fi

# ---------------------------------------------------------------- 3. the venv
# The modules kvcheck imports (vllm.v1.core.*, vllm.v1.request, vllm.v1.worker.block_table and
# what they pull in: vLLM's config, platform, LoRA and multimodal layers). This list is the
# union of what 0.10.2, 0.20.0, 0.27.0 and 0.33.0 import, found by importing until nothing was
# missing; triton runs newer releases' slot-mapping kernel in Triton's interpreter on the CPU.
deps=(
  "torch==2.13.0" triton numpy msgspec pydantic regex psutil pyzmq pyyaml urllib3 requests
  aiohttp transformers huggingface-hub tokenizers protobuf openai openai-harmony cloudpickle
  pillow pybase64 cachetools uvloop py-cpuinfo prometheus_client xgrammar llguidance fastapi
  partial-json-parser setproctitle blake3 diskcache gguf cbor2 xxhash pytest-xdist
)
if [ ! -x "$dir/venv/bin/python" ]; then
  "$python" -m venv "$dir/venv"
fi
# vLLM's own pins (torch, xgrammar...) are for its GPU build and are not asked for here; pip
# may report conflicts with the vllm dist-info, which do not concern the modules kvcheck drives.
log="$dir/pip-install.log"
# kvcheck with its `bench` extra (pytest-benchmark), so `--kv-bench` runs here too.
if ! "$dir/venv/bin/python" -m pip install -q "${deps[@]}" -e "$repo[bench]" >"$log" 2>&1; then
  cat "$log" >&2
  echo "kvcheck: pip install into $dir/venv failed (log: $log)" >&2
  exit 1
fi
sitepkgs=$("$dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$dir/site" > "$sitepkgs/kvcheck-vllm-site.pth"

# ---------------------------------------------------------------- check and tell
"$dir/venv/bin/python" - <<'PY'
import vllm
from kvcheck.adapters import vllm as adapter
print(f"kvcheck: vLLM {vllm.__version__} from {vllm.__path__[0]}")
print(f"kvcheck: profile {adapter.IMPL_INFO.profile}: {adapter.PROFILE_NOTE}")
print(f"kvcheck: capabilities {', '.join(sorted(adapter.IMPL_INFO.capabilities))}")
if adapter.XFAILS_FILE is not None:
    print(f"kvcheck: known vLLM bugs for --kv-xfails-file: {adapter.XFAILS_FILE}")
PY
cat <<MSG
kvcheck: ready. Run the suite on vLLM $version with either of
  $dir/venv/bin/pytest -p no:cacheprovider --kv-impl=vllm
  . $dir/venv/bin/activate && pytest --kv-impl=vllm
and its benchmarks with
  $dir/venv/bin/pytest -p no:cacheprovider --kv-impl=vllm --kv-bench --kv-bench-report=bench.jsonl
(DIR/site is on that venv's path; elsewhere: export PYTHONPATH=$dir/site)
MSG
