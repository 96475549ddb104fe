#!/usr/bin/env bash
# Static checks: ruff over every Python file, mypy over the kvcheck package (strict for the
# reference, the harness, the plugin and the results layer; see pyproject.toml). Exits non-zero
# on any finding.
#
#   pip install -e '.[lint]'    # ruff and mypy, pinned
#   scripts/lint.sh
#
# PYTHON selects the interpreter whose ruff and mypy run (default: python3). mypy checks the
# package against that interpreter's installed packages (torch's types when installed).
#
# The package is mapped from top-level folders (reference_impl/ -> kvcheck.reference_impl...),
# which mypy cannot follow through an editable install, so mypy checks a temporary tree of
# links laid out as the installed package.
set -euo pipefail
python=${PYTHON:-python3}
if [[ $python == */* ]]; then  # a path: absolute, since mypy runs from another folder
  python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")"
fi
cd "$(dirname "$0")/.."
repo=$PWD

tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/kvcheck"
for file in kvcheck/*.py; do
  ln -s "$repo/$file" "$tree/kvcheck/"
done
# Every kvcheck.<name> subpackage, from pyproject.toml's package-dir table.
subpackages=$("$python" - <<'EOF'
import re
text = open("pyproject.toml", encoding="utf-8").read()
table = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
for name, folder in re.findall(r'^"kvcheck\.(\w+)" = "([^"]+)"', table, re.M):
    print(name, folder)
EOF
)
if [ -z "$subpackages" ]; then
  echo "scripts/lint.sh: no kvcheck subpackages found in pyproject.toml" >&2
  exit 2
fi
paths=()  # sed expressions: mypy's kvcheck/<name>/ paths back to the checkout's folders
while read -r name folder; do
  ln -s "$repo/$folder" "$tree/kvcheck/$name"
  paths+=(-e "s#^kvcheck/$name/#$folder/#")
done <<< "$subpackages"

status=0
echo "== ruff check"
"$python" -m ruff check . || status=1
echo "== mypy"
# The cache stays in the checkout (mypy writes a .gitignore into it) so repeated runs are fast;
# MYPY_CACHE_DIR moves it (two checks running at once must not share one cache).
(cd "$tree" && "$python" -m mypy --config-file "$repo/pyproject.toml" \
  --cache-dir "${MYPY_CACHE_DIR:-$repo/.mypy_cache}" -p kvcheck) | sed "${paths[@]}" || status=1
exit "$status"
