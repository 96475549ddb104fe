#!/usr/bin/env bash
# The plugin matrix: kvcheck's main job (`pytest --kv-impl=reference --kv-report=...`) beside
# the pytest plugins CI pipelines carry, and on every supported Python this machine has.
#
#   scripts/plugin-matrix.sh            # from .ci/run; needs PyPI (pip), nothing else
#
# 1. The wheel is built once (pure Python: one wheel serves every version) and installed,
#    without the kernels extra, in a fresh venv per Python 3.10 to 3.13 found (on PATH or in
#    pyenv's versions); the newest also gets pytest-xdist, -randomly, -rerunfailures,
#    -timeout, -cov and -html.
# 2. The baseline: the main job, plain and serial, in the newest venv. Then the main job on
#    each Python, and under each plugin: every record must hold the baseline's outcomes,
#    areas and completeness (the jobs run outside the checkout). The pytest-cov run must
#    measure kvcheck without coverage's "previously imported" warning; the pytest-html report
#    and the JUnit XML file must carry the verdict.
#
# Fewer Hypothesis examples than the default keep it short (KV_MATRIX_EXAMPLES, default 10):
# the question is whether the plugins change the record, and every run uses the same number.
# Exits non-zero on the first difference, naming the run.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Bytecode written: the wheel is installed without compiling it (--no-compile, below), so the
# first run in each venv compiles what it imports and every later run there reuses it; with
# PYTHONDONTWRITEBYTECODE (set on some machines) each of the matrix's runs compiled kvcheck,
# pytest, Hypothesis and rich again.
unset PYTHONDONTWRITEBYTECODE
examples=${KV_MATRIX_EXAMPLES:-10}
versions=(3.10 3.11 3.12 3.13)
plugins=(pytest-xdist pytest-randomly pytest-rerunfailures pytest-timeout pytest-cov pytest-html)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS

find_python() {  # the first working interpreter for version $1: PATH, then pyenv's versions
  local candidate root
  root=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}
  for candidate in "$(command -v "python$1" || true)" "$root"/versions/"$1".*/bin/"python$1"; do
    # A pyenv shim exists for every installed version but fails for one not selected.
    if [ -n "$candidate" ] && [ -x "$candidate" ] \
        && "$candidate" -c 'import ensurepip, venv' >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

echo "== building the kvcheck wheel =="
python3 -m pip wheel -q --no-deps -w "$work/dist" "$repo"
wheel=$(ls "$work"/dist/kvcheck-*.whl)

main_job() {  # venv, record path, extra pytest arguments...: the main job, outside the checkout
  local venv=$1 record=$2
  shift 2
  (cd "$work" && "$venv/bin/pytest" -p no:cacheprovider -q --kv-impl=reference \
    --kv-max-examples="$examples" --kv-report="$record" "$@")
}

in_work() {  # a command run in $work: the checkout's own kvcheck/ folder must not shadow
  (cd "$work" && "$@")  # the installed package
}

same_as() {  # baseline, record, label: the record's results are the baseline's
  in_work "$newest/bin/python" - "$1" "$2" "$3" <<'EOF'
import sys

from kvcheck.results.schema import load_records

def results(path):
    (record,) = load_records(path)
    # Test ids without their folder: runs from other folders (or venvs) name files alike.
    outcomes = {t.rsplit("/", 1)[-1]: o for t, o in record["outcomes"].items()}
    return {"outcomes": outcomes, "areas": record["areas"], "complete": record["complete"],
            "conforms": record["conforms"], "completeness": record["completeness"]}

base, got, label = results(sys.argv[1]), results(sys.argv[2]), sys.argv[3]
problems = [key for key in base if base[key] != got[key]]
if problems:
    for key in problems:
        if key == "outcomes":
            diff = sorted(set(base[key].items()) ^ set(got[key].items()))
            print(f"{label}: outcomes differ: {diff[:10]}", file=sys.stderr)
        else:
            print(f"{label}: {key} differs: {base[key]} != {got[key]}", file=sys.stderr)
    sys.exit(1)
if not got["complete"] or not got["conforms"]:
    sys.exit(f"{label}: the reference must conform in a complete run: {got['completeness']}")
print(f"   same record as the serial run ({len(got['outcomes'])} tests)")
EOF
}

found=() pythons=()
for version in "${versions[@]}"; do
  if python=$(find_python "$version"); then
    found+=("$version") pythons+=("$python")
  else
    echo "== Python $version: not on this machine, skipped =="
  fi
done
if [ "${#found[@]}" -eq 0 ]; then
  echo "plugin-matrix: no Python from ${versions[*]} found" >&2
  exit 2
fi
newest=$work/py${found[-1]}

echo "== a venv per Python (${found[*]}) with the wheel; the newest also gets the plugins =="
# In parallel (pip mostly waits for downloads), without byte-compiling what it installs (the
# CPU time of the whole step). A venv's log is shown if it fails.
pids=()
for i in "${!found[@]}"; do
  venv=$work/py${found[$i]} extra=()
  [ "$venv" = "$newest" ] && extra=("${plugins[@]}")
  ( "${pythons[$i]}" -m venv "$venv" \
      && "$venv/bin/pip" install -q --no-compile "$wheel" "${extra[@]}" ) \
    > "$venv.log" 2>&1 &
  pids+=($!)
done
for i in "${!found[@]}"; do
  if ! wait "${pids[$i]}"; then
    cat "$work/py${found[$i]}.log" >&2
    echo "plugin-matrix: installing kvcheck for Python ${found[$i]} failed" >&2
    exit 1
  fi
done
echo "($((SECONDS - start)) s)"

run_variant() {  # venv, name, pytest arguments...: the main job, then compare with $base
  local venv=$1 name=$2 began=$SECONDS
  shift 2
  if ! main_job "$venv" "$work/$name.jsonl" "$@" > "$work/$name.out" 2>&1; then
    tail -n 60 "$work/$name.out"
    echo "plugin-matrix: the main job failed: $name" >&2
    exit 1
  fi
  echo "-- $name: $(tail -n 1 "$work/$name.out" | tr -d '=') ($((SECONDS - began)) s)"
  same_as "$base" "$work/$name.jsonl" "$name"
}

echo "== the main job, serial, on Python ${found[-1]} with the plugins installed (the baseline) =="
base=$work/serial.jsonl
main_job "$newest" "$base" -p no:randomly | tail -n 1

echo "== the main job on each other Python =="
for version in "${found[@]:0:${#found[@]}-1}"; do
  run_variant "$work/py$version" "python$version" -p no:randomly
done

echo "== the main job beside each plugin (Python ${found[-1]}) =="
run_variant "$newest" randomly -p randomly
run_variant "$newest" xdist -n 2 --dist loadgroup
run_variant "$newest" rerunfailures --reruns 2 -p no:randomly
run_variant "$newest" timeout-signal --timeout=900 --timeout-method=signal
run_variant "$newest" timeout-thread --timeout=900 --timeout-method=thread
run_variant "$newest" cov --cov=kvcheck --cov-report=term
grep "^TOTAL" "$work/cov.out"
if grep -q "CoverageWarning\|previously imported" "$work/cov.out"; then
  echo "pytest-cov: coverage warns that kvcheck was imported before it started" >&2
  exit 1
fi
run_variant "$newest" html-junitxml --html="$work/report.html" --junitxml="$work/junit.xml"
in_work "$newest/bin/python" - "$work/html-junitxml.jsonl" "$work/report.html" \
  "$work/junit.xml" <<'EOF'
import html
import sys
import xml.etree.ElementTree as ET

from kvcheck.results.schema import load_records

(record,) = load_records(sys.argv[1])
page = open(sys.argv[2], encoding="utf-8").read()
if html.escape(record["verdict"]) not in page:
    sys.exit("pytest-html: the verdict is not in the report")
props = {p.get("name"): p.get("value") for p in ET.parse(sys.argv[3]).iter("property")}
if props.get("kvcheck.reference.verdict") != record["verdict"]:
    sys.exit("junitxml: no kvcheck.reference.verdict property with the verdict")
print("pytest-html and junitxml: both carry the verdict")
EOF
echo "plugin matrix passed in $((SECONDS - start)) s (Pythons: ${found[*]})"
