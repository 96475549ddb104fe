"""The documentation's code is true: README.md and docs/ are read block by block.

* Every ```bash block, marked or not, is checked command by command: each `pytest` option
  `--kv-*` exists (against `pytest --help` of this environment), each `kvcheck SUB` exists
  with every option given to it, each `pip install` extra exists in pyproject.toml and each
  `scripts/...` exists and is executable.
* Every ```bash block is then **run**, from a fresh copy of the checkout (the files git tracks
  or would track), with this environment's `pytest` / `kvcheck` first on PATH, and must exit
  0; unless the line right before it is a marker saying why it cannot run here:
  `<!-- doc-test: skip (needs vLLM) -->` (a GPU, the network, vLLM, an adapter of your own, a
  package install: the reason is free text, and may not be empty).
* ```python blocks with `>>>` prompts run as doctests; ```yaml blocks and
  docs/workflows/*.yml parse, and the workflow's commands use real options.
* docs/writing-an-adapter.md: the tutorial's listing (`<!-- doc-test: file NAME -->`) runs
  through the suite and conforms to `generic`; its `<!-- doc-test: edit NAME -->` blocks,
  applied in order, make it conform to `vllm-0.33`.

What is *not* checked: the sample outputs (```text blocks) are not compared with real output.
"""

from __future__ import annotations

import argparse
import doctest
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from kvcheck.conformance.protocol import PROFILES
from kvcheck.plugin.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WORKFLOWS = sorted((ROOT / "docs" / "workflows").glob("*.yml"))
MARKER = re.compile(r"^<!--\s*doc-test:\s*(?P<what>[\w-]+)\s*(?P<arg>.*?)\s*-->$")
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    path: Path
    line: int          # 1-based line of the opening fence
    lang: str
    text: str
    marker: tuple[str, str] | None   # (what, arg) of a `<!-- doc-test: ... -->` right before

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Fenced code blocks of a Markdown file (top-level and indented ones)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i].removeprefix(indent))
            i += 1
        prev = lines[start - 1].strip() if start else ""
        mm = MARKER.match(prev)
        found.append(Block(path, start + 1, lang, "\n".join(body) + "\n",
                           (mm.group("what"), mm.group("arg")) if mm else None))
        i += 1
    return found


ALL = [b for p in DOCS for b in blocks(p)]
SHELL = [b for b in ALL if b.lang in ("bash", "sh")]


def commands(line: str) -> list[list[str]]:
    """Simple commands of one logical shell line: comments dropped, split at `&&`, `||`, `;`
    and `|`; leading `VAR=value` assignments dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = "#"
    out: list[list[str]] = [[]]
    for token in lex:
        if token in {"&&", "||", ";", "|", "&", ";;"}:
            out.append([])
        else:
            out[-1].append(token)
    cmds = []
    for cmd in out:
        while cmd and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd[0]):
            cmd = cmd[1:]
        if cmd:
            cmds.append(cmd)
    return cmds


def shell_lines(script: str) -> list[str]:
    """Logical lines (continuations joined, blank and comment-only lines dropped)."""
    return [ln for ln in script.replace("\\\n", " ").splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]


def line_commands(script: str) -> list[list[str]]:
    return [c for ln in shell_lines(script) for c in commands(ln)]


@pytest.fixture(scope="module")
def kv_options(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every `--kv-*` option pytest accepts in this environment (plugins included)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                          cwd=tmp_path_factory.mktemp("help"), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = set(re.findall(r"(--kv-[a-z0-9-]+)", proc.stdout))
    assert {"--kv-impl", "--kv-report", "--kv-profile", "--kv-bench"} <= found, found
    return found


def kvcheck_options() -> dict[str, set[str]]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    table = {"": {s for a in parser._actions for s in a.option_strings}}
    for name, p in sub.choices.items():
        table[name] = {s for a in p._actions for s in a.option_strings}
    return table


def extras() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(data["project"]["optional-dependencies"])


def check_command(cmd: list[str], kv_options: set[str]) -> list[str]:
    """Problems with one command line ([] if none)."""
    problems = []
    prog = cmd[0].rsplit("/", 1)[-1]
    args = cmd[1:]
    if prog.startswith("python") and args[:2] == ["-m", "pytest"]:
        prog, args = "pytest", args[2:]
    if prog == "pytest":
        for arg in args:
            if arg.startswith("--kv-"):
                name, _, value = arg.partition("=")
                if name not in kv_options:
                    problems.append(f"pytest has no option {name}")
                elif name == "--kv-profile" and value and value not in PROFILES:
                    problems.append(f"--kv-profile={value}: not one of {list(PROFILES)}")
    elif prog == "kvcheck":
        table = kvcheck_options()
        sub = args[0] if args and not args[0].startswith("-") else ""
        if sub not in table:
            return [f"kvcheck has no subcommand {sub!r}"]
        for arg in args[1 if sub else 0:]:
            if arg == "--":
                break
            if arg.startswith("-") and arg not in ("-", "..."):
                name = arg.partition("=")[0]
                if name not in table[sub]:
                    problems.append(f"kvcheck {sub} has no option {name}")
    elif prog == "pip" and args[:1] == ["install"]:
        for arg in args[1:]:
            m = re.match(r"^(?:\.|kvcheck)\[([\w,-]+)\]", arg)
            for extra in (m.group(1).split(",") if m else []):
                if extra not in extras():
                    problems.append(f"pip install {arg}: pyproject.toml has no extra {extra!r}")
    elif cmd[0].startswith("scripts/"):
        script = ROOT / cmd[0]
        if not (script.is_file() and os.access(script, os.X_OK)):
            problems.append(f"{cmd[0]} is not an executable file of the repository")
    return problems


def test_docs_have_shell_blocks() -> None:
    """The extraction itself works (a broken parser must not make every check vacuous)."""
    readme = [b for b in SHELL if b.path.name == "README.md"]
    assert len(readme) >= 4
    assert any("pip install . && pytest" in b.text for b in readme)
    cmds = line_commands("A=1 pytest --kv-impl=x -q \\\n  --kv-report=r.jsonl && kvcheck gate "
                    "--baseline b # comment\necho hi | cat")
    assert cmds == [["pytest", "--kv-impl=x", "-q", "--kv-report=r.jsonl"],
                    ["kvcheck", "gate", "--baseline", "b"], ["echo", "hi"], ["cat"]]


def test_the_checker_catches_wrong_commands(kv_options: set[str]) -> None:
    assert check_command(["pytest", "--kv-implementation=x"], kv_options) \
        == ["pytest has no option --kv-implementation"]
    assert check_command(["pytest", "--kv-profile=vllm-9"], kv_options) != []
    assert check_command(["kvcheck", "gates"], kv_options) != []
    assert check_command(["kvcheck", "gate", "--base", "x"], kv_options) != []
    assert check_command(["pip", "install", ".[kernel]"], kv_options) != []
    assert check_command(["scripts/nope.sh"], kv_options) != []
    assert check_command(["kvcheck", "run", "--impl", "x", "--", "--whatever"], kv_options) == []


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.where)
def test_every_command_uses_real_options(block: Block, kv_options: set[str]) -> None:
    problems = [f"{' '.join(c)}: {p}" for c in line_commands(block.text)
                for p in check_command(c, kv_options)]
    assert problems == [], f"{block.where}: " + "; ".join(problems)


@pytest.mark.parametrize("block", [b for b in ALL if b.marker], ids=lambda b: b.where)
def test_markers_are_known_and_say_why(block: Block) -> None:
    what, arg = block.marker  # type: ignore[misc]
    assert what in {"skip", "file", "edit"}, f"{block.where}: unknown doc-test marker {what!r}"
    if what == "skip":
        assert block.lang in ("bash", "sh"), f"{block.where}: skip marks shell blocks only"
        assert re.fullmatch(r"\(.*\S.*\)", arg), \
            f"{block.where}: say why in parentheses: <!-- doc-test: skip (needs vLLM) -->"


@pytest.fixture
def fresh_copy(tmp_path: Path) -> Path:
    """The checkout's files (those git tracks or would track) copied into a new folder."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the documented commands run from a clone")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    dest = tmp_path / "clone"
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


# Never run unmarked: these change the environment running the tests or need the network.
MUST_BE_MARKED = re.compile(r"\bpip3? install\b|=vllm(?![\w.-])|vllm-cpu-env|envs/vllm|"
                            r"\bgit clone\b|\bcurl\b|\bwget\b")


@pytest.mark.parametrize("block", [b for b in SHELL if not b.marker], ids=lambda b: b.where)
def test_unmarked_shell_blocks_run(block: Block, fresh_copy: Path) -> None:
    needs = MUST_BE_MARKED.search(block.text)
    assert needs is None, (
        f"{block.where} uses {needs.group(0)!r} (installs packages, needs vLLM or the network) "
        "and cannot run here: put <!-- doc-test: skip (why) --> on the line before it")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=fresh_copy,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (
        f"{block.where} exited {proc.returncode} (mark it <!-- doc-test: skip (why) --> if "
        f"it cannot run here):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "python" and ">>>" in b.text],
                         ids=lambda b: b.where)
def test_python_prompts_are_doctests(block: Block) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.text, {}, block.where, str(block.path), block.line)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    out: list[str] = []
    runner.run(test, out=out.append)
    assert test.examples and runner.failures == 0, "".join(out)


# ------------------------------------------------------------------------------- YAML
yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extra: pip install -e '.[test]'")


@pytest.mark.parametrize("block", [b for b in ALL if b.lang in ("yaml", "yml")],
                         ids=lambda b: b.where)
def test_yaml_blocks_parse(block: Block) -> None:
    assert yaml.safe_load(block.text) is not None


def workflow_runs(path: Path) -> list[str]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [step["run"] for job in data["jobs"].values() for step in job["steps"]
            if "run" in step]


def test_a_workflow_ships() -> None:
    assert "kvcheck.yml" in [p.name for p in WORKFLOWS]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_a_valid_github_actions_workflow(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    on = data.get("on", data.get(True))      # YAML 1.1 reads a bare `on` key as True
    assert isinstance(on, dict) and "pull_request" in on
    assert data["name"] and isinstance(data["jobs"], dict) and data["jobs"]
    for name, job in data["jobs"].items():
        assert job["runs-on"], name
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), step
            if "uses" in step:
                assert re.fullmatch(r"[\w-]+/[\w-]+@v\d+", step["uses"]), step["uses"]
    uses = [s["uses"] for j in data["jobs"].values() for s in j["steps"] if "uses" in s]
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    runs = "\n".join(workflow_runs(path))
    assert "--kv-report=" in runs and "kvcheck gate" in runs and "--baseline" in runs


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_commands_use_real_options(path: Path, kv_options: set[str]) -> None:
    checked = 0
    for script in workflow_runs(path):
        proc = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0, f"{path.name}: shell syntax: {proc.stderr}\n{script}"
        for cmd in line_commands(script):
            assert check_command(cmd, kv_options) == [], f"{path.name}: {' '.join(cmd)}"
            checked += cmd[0] in ("pytest", "kvcheck")
    assert checked >= 5


# ------------------------------------------------------------------------------- tutorial
TUTORIAL = ROOT / "docs" / "writing-an-adapter.md"


def tutorial_module() -> tuple[str, str, list[str]]:
    """(module name, the listing, the edit blocks in order)."""
    found = blocks(TUTORIAL)
    (listing,) = [b for b in found if b.marker and b.marker[0] == "file"]
    edits = [b.text for b in found if b.marker and b.marker[0] == "edit"]
    assert all(b.marker[1] == listing.marker[1] for b in found  # type: ignore[index]
               if b.marker and b.marker[0] == "edit")
    return listing.marker[1].removesuffix(".py"), listing.text, edits  # type: ignore[index]


def apply_edit(code: str, edit: str) -> str:
    """A one-line edit replaces the line with the same start up to its `=`; a `def NAME`
    block replaces that method (up to the next definition at its indentation)."""
    lines = edit.rstrip("\n").splitlines()
    m = re.match(r"^(\s*)def (\w+)\(", lines[0])
    if m:
        pattern = re.compile(rf"^{m.group(1)}def {m.group(2)}\(.*?(?=^{m.group(1)}\S|\Z)",
                             re.MULTILINE | re.DOTALL)
        assert len(pattern.findall(code)) == 1, lines[0]
        return pattern.sub(lambda _: edit.rstrip("\n") + "\n\n", code)
    assert len(lines) == 1, edit
    head = lines[0][:lines[0].index("=") + 1]
    hits = [ln for ln in code.splitlines() if ln.startswith(head)]
    assert len(hits) == 1, f"{head!r} matches {hits}"
    return code.replace(hits[0], lines[0])


def run_suite(folder: Path, module: str, code: str) -> subprocess.CompletedProcess[str]:
    (folder / f"{module}.py").write_text(code, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--kv-impl={module}",
         "--kv-max-examples=10"],
        cwd=folder, env={**os.environ, "PYTHONPATH": str(folder)}, capture_output=True,
        text=True, timeout=600, check=False)


def test_tutorial_listing_conforms_to_generic(tmp_path: Path) -> None:
    module, code, _ = tutorial_module()
    proc = run_suite(tmp_path, module, code)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"verdict: {module} conforms to generic" in proc.stdout


def test_tutorial_edits_make_it_conform_to_vllm_0_33(tmp_path: Path) -> None:
    module, code, edits = tutorial_module()
    assert len(edits) == 3
    for edit in edits:
        code = apply_edit(code, edit)
    proc = run_suite(tmp_path, module, code)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"verdict: {module} conforms to vllm-0.33" in proc.stdout


def test_tutorial_needs_its_last_edit(tmp_path: Path) -> None:
    """The free-order edit is what the vLLM profile checks: without it the suite fails (so the
    test above is not passing by accident)."""
    module, code, edits = tutorial_module()
    for edit in edits[:-1]:
        code = apply_edit(code, edit)
    proc = run_suite(tmp_path, module, code)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "free queue (head first) differs" in proc.stdout
