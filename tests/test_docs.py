"""The documentation's code is true: README.md and docs/ are read block by block.

* Every ```bash block, marked or not, is checked command by command: each `pytest` option
  `--kv-*` exists (against `pytest --help` of this environment), each `kvcheck SUB` exists
  with every option given to it, each `pip install` extra exists in pyproject.toml and each
  `scripts/...` exists and is executable.
* Every document is then **run**, block after block, from a fresh copy of the checkout (the
  files git tracks or would track), as a reader at a terminal would: this environment's
  `pytest` / `kvcheck` first on PATH, each shell block starting in the folder the previous one
  ended in, `<!-- doc-test: file NAME -->` blocks written and `<!-- doc-test: edit NAME -->`
  blocks applied where the reader is. Each shell block must exit 0, or the code its
  `<!-- doc-test: exit N (why) -->` marker names. A ```text sample right after a shell block is
  its output: the sample's `verdict:` lines must be what the command prints now, and so must
  the paragraphs of its breakdown that the example count does not change (``BREAKDOWN_HEADS``:
  the tests not applicable and why, the skip reasons, the passed tests per law family).
* Only blocks that need a GPU, the network or vLLM are left out, each marked
  `<!-- doc-test: skip (needs vLLM: why) -->`; a skip for any other reason fails. A block
  marked `<!-- doc-test: needs valgrind (why) -->` runs where that program is installed (the
  document is skipped, saying so, where it is not).
* Files the docs tell readers to write themselves (`mypkg/kv_adapter.py`,
  `known-deviations.txt`) get stand-ins (``STAND_INS``), and runs are scaled down
  (``SCALED_DOWN``: fewer random examples, a smaller benchmark scale) to take minutes.
* ```python blocks with `>>>` prompts run as doctests; ```yaml blocks and
  docs/workflows/*.yml parse, and the workflow's commands use real options.
* docs/writing-an-adapter.md: without its last edit, the tutorial's module fails the
  `vllm-0.33` profile (so the run of the whole tutorial cannot pass by accident).

What is *not* checked: the rest of the sample outputs (progress, tables, timings, the block
sizes each area ran at).
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
from kv_helpers import reference_without_kernels

from kvcheck.bench.cli import TOOLS as BENCH_TOOLS
from kvcheck.bench.cli import tool_parser
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
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


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
    for words in out:
        start = 0
        while start < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[start]):
            start += 1
        if words[start:]:
            cmds.append(words[start:])
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
    """Options per subcommand, nested ones spelled ``"events check"``."""
    table: dict[str, set[str]] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        table[prefix] = {s for a in parser._actions for s in a.option_strings}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(f"{prefix} {name}".strip(), child)

    walk("", build_parser())
    # `kvcheck bench` hands its words to kvcheck.bench.cli, which reads --help and a tool's
    # name, and the tool's own parser reads the rest.
    table["bench"] = {"-h", "--help"}
    for name in BENCH_TOOLS:
        walk(f"bench {name}", tool_parser(name))
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
        sub, used = "", 0
        while used < len(args) and f"{sub} {args[used]}".strip() in table:
            sub, used = f"{sub} {args[used]}".strip(), used + 1
        nested = any(name.startswith(f"{sub} ") for name in table) or not sub
        if used < len(args) and nested and not args[used].startswith("-"):
            return [f"kvcheck {sub + ' ' if sub else ''}has no subcommand {args[used]!r}"]
        for arg in args[used:]:
            if arg == "--":
                break
            if arg.startswith("-") and arg not in ("-", "..."):
                name = arg.partition("=")[0]
                if name not in table[sub]:
                    problems.append(f"kvcheck {sub} has no option {name}")
    elif prog == "pip" and args[:1] == ["install"]:
        for arg in args[1:]:
            m = re.match(r"^(?:\.|kvcheck)\[([\w,-]+)\]", arg)
            problems.extend(f"pip install {arg}: pyproject.toml has no extra {extra!r}"
                            for extra in (m.group(1).split(",") if m else [])
                            if extra not in extras())
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
    # kvcheck bench: each tool's own options.
    assert check_command(["kvcheck", "bench", "stabilty"], kv_options) \
        == ["kvcheck bench has no subcommand 'stabilty'"]
    assert check_command(["kvcheck", "bench", "sweep", "--round", "3"], kv_options) \
        == ["kvcheck bench sweep has no option --round"]
    assert check_command(["kvcheck", "bench", "sweep", "--quick", "--rounds", "3"],
                         kv_options) == []
    assert check_command(["kvcheck", "bench", "--help"], kv_options) == []
    assert check_command(["kvcheck", "bench", "--rounds", "3"], kv_options) != []


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.where)
def test_every_command_uses_real_options(block: Block, kv_options: set[str]) -> None:
    problems = [f"{' '.join(c)}: {p}" for c in line_commands(block.text)
                for p in check_command(c, kv_options)]
    assert problems == [], f"{block.where}: " + "; ".join(problems)


@pytest.mark.parametrize("block", [b for b in ALL if b.marker], ids=lambda b: b.where)
def test_markers_are_known_and_say_why(block: Block) -> None:
    what, arg = block.marker  # type: ignore[misc]
    assert what in {"skip", "exit", "needs", "file", "edit"}, \
        f"{block.where}: unknown doc-test marker {what!r}"
    if what == "skip":
        assert block.lang in ("bash", "sh"), f"{block.where}: skip marks shell blocks only"
        assert re.fullmatch(r"\(.*\S.*\)", arg), \
            f"{block.where}: say why in parentheses: <!-- doc-test: skip (needs vLLM) -->"
    if what == "needs":
        assert block.lang in ("bash", "sh") and re.fullmatch(r"[\w.-]+ \(.*\S.*\)", arg), \
            f"{block.where}: <!-- doc-test: needs TOOL (why) --> on a shell block"
    if what == "exit":
        assert block.lang in ("bash", "sh") and re.fullmatch(r"\d+ \(.*\S.*\)", arg), \
            f"{block.where}: <!-- doc-test: exit CODE (why) --> on a shell block"


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
#: The only reasons a documented command may be left out: it needs what a test machine lacks.
SKIP_REASON = re.compile(r"\b(GPU|CUDA|network|vLLM)\b")

#: Files the documentation tells readers to write themselves (their adapter, their list of
#: known deviations). The doc test puts stand-ins for them in the fresh copy, so that the
#: commands naming them run exactly as written: the adapter is kvcheck's reference under the
#: name ``mypkg``, without its Triton kernels (a reader's KV-cache manager rarely ships any;
#: the interpreted kernel area is a third of a whole-suite run, and the documented commands
#: on ``--kv-impl=reference`` run it).
STAND_INS = {
    "mypkg/__init__.py": "",
    "mypkg/kv_adapter.py": reference_without_kernels(
        "mypkg", "Stand-in for a reader's own adapter (tests/test_docs.py): the reference's\n"
        "allocator, without its kernels."),
    "known-deviations.txt": "# test ids this implementation is known to fail, one per line\n",
}
#: Smaller than the defaults, so that the documented commands run in minutes: fewer random
#: examples, a smaller benchmark scale and one timed round without warm-up (every benchmark
#: still runs each of its paths once; an option a block gives itself still wins).
SCALED_DOWN = ("--kv-max-examples=1 --kv-bench-scale=0.05 --kv-bench-rounds=1 "
               "--kv-bench-warmup=0")


#: The block sizes a verdict names ("at 9 block sizes from 1 to 32", "at block sizes 4, 16"):
#: which sizes the random workloads drew depends on the example count, and the samples show
#: a run at the defaults while the doc test runs ``SCALED_DOWN``.
BLOCK_SIZES_CLAUSE = re.compile(
    r" at (?:\d+ block sizes from \d+ to \d+|block sizes? \d+(?:, \d+)*)")


def _sizes_elided(verdict: str) -> str:
    """``verdict`` with its block-size clause replaced by `` at <sizes>``."""
    return BLOCK_SIZES_CLAUSE.sub(" at <sizes>", verdict, count=1)


#: The parts of a verdict's breakdown that do not depend on the example count (which tests
#: were not applicable, and why; the skip reasons; the passed tests per law family): a
#: sample's paragraph starting with one of these must be what the command prints now.
BREAKDOWN_HEADS = ("  not applicable, ", "  skipped ", "  law families ")


def breakdown(lines: list[str]) -> list[str]:
    """The paragraphs of a verdict breakdown that start with one of ``BREAKDOWN_HEADS``,
    each with its continuation lines (indented deeper) joined by single spaces."""
    out: list[str] = []
    inside = False
    for line in lines:
        if line.startswith(BREAKDOWN_HEADS):
            out.append(line.strip())
            inside = True
        elif inside and line.startswith("      ") and line.strip():
            out[-1] += " " + line.strip()
        else:
            inside = False
    return out


def sample_after(doc: list[Block], index: int, lines: list[str]) -> Block | None:
    """The ```text block showing the output of shell block ``doc[index]``: the next block,
    when only blank lines separate the two."""
    if index + 1 >= len(doc) or doc[index + 1].lang != "text":
        return None
    shell, sample = doc[index], doc[index + 1]
    closing = shell.line + shell.text.count("\n") + 1     # the closing fence's line, 1-based
    between = lines[closing:sample.line - 1]
    return sample if all(not ln.strip() for ln in between) else None


def run_documented_session(path: Path, clone: Path) -> list[str]:
    """Run a document's blocks in order, as a reader at a terminal would, from ``clone``:
    shell blocks run with bash (each starts in the folder the previous one ended in) and must
    exit 0, or the code a `<!-- doc-test: exit N (why) -->` marker names; `file NAME` blocks
    are written and `edit NAME` blocks applied in that folder; `skip` blocks are left out.
    A ```text sample right after a shell block is that block's output: its `verdict:` lines
    must be in the real output. Returns the problems found."""
    for name, text in STAND_INS.items():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_text(text, encoding="utf-8")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTEST_ADDOPTS": SCALED_DOWN}
    env.pop("PYTHONPATH", None)
    doc, lines = blocks(path), path.read_text(encoding="utf-8").splitlines()
    cwd, state, problems = clone, clone.parent / "cwd-after-block", []
    for i, block in enumerate(doc):
        what, arg = block.marker or ("", "")
        if what == "file":
            (cwd / arg).write_text(block.text, encoding="utf-8")
            continue
        if what == "edit":
            target = cwd / arg
            target.write_text(apply_edit(target.read_text(encoding="utf-8"), block.text),
                              encoding="utf-8")
            continue
        if block.lang not in ("bash", "sh") or what == "skip":
            continue
        expected = int(arg.split()[0]) if what == "exit" else 0
        script = f"trap 'pwd > {shlex.quote(str(state))}' EXIT\n{block.text}"
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != expected:
            problems.append(f"{block.where} exited {proc.returncode}, expected {expected}:\n"
                            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            break       # later blocks build on this one
        cwd = Path(state.read_text(encoding="utf-8").strip())
        sample = sample_after(doc, i, lines)
        printed = proc.stdout.splitlines()
        now = [line for line in printed if line.startswith("verdict:")]
        verdicts = {_sizes_elided(line) for line in now}
        problems.extend(f"{sample.where}: the sample's {line!r} is not what {block.where} "
                        f"prints now ({now}): regenerate the sample"
                        for line in (sample.text.splitlines() if sample else [])
                        if line.startswith("verdict:") and _sizes_elided(line) not in verdicts)
        printed_breakdown = set(breakdown(printed))
        problems.extend(f"{sample.where}: the sample's {part!r} is not what {block.where} "
                        "prints now: regenerate the sample"
                        for part in (breakdown(sample.text.splitlines()) if sample else [])
                        if part not in printed_breakdown)
        if sample and os.environ.get("KVCHECK_DOCS_SHOW_OUTPUT"):
            print(f"--- {block.where} printed:\n{proc.stdout}")  # to regenerate samples
    return problems


RUNNABLE_DOCS = [p for p in DOCS if any(b.lang in ("bash", "sh") and
                                        (b.marker or ("",))[0] != "skip"
                                        for b in blocks(p))]


def test_only_blocks_needing_a_gpu_the_network_or_vllm_are_skipped() -> None:
    skipped = [b for b in SHELL if b.marker and b.marker[0] == "skip"]
    wrong = [f"{b.where}: {b.marker[1]}" for b in skipped   # type: ignore[index]
             if not SKIP_REASON.search(b.marker[1])]        # type: ignore[index]
    assert wrong == [], "a documented command left out for another reason: " + "; ".join(wrong)


@pytest.mark.parametrize("path", RUNNABLE_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_commands_run(path: Path, fresh_copy: Path) -> None:
    # `<!-- doc-test: needs valgrind (why) -->`: a program the machine may lack, as a GPU; the
    # document's later blocks build on that one, so the whole document waits for it.
    missing = sorted({b.marker[1].split()[0] for b in blocks(path)
                      if b.marker and b.marker[0] == "needs"
                      and shutil.which(b.marker[1].split()[0]) is None})
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)} on PATH")
    for block in blocks(path):
        needs = MUST_BE_MARKED.search(block.text) if block.lang in ("bash", "sh") else None
        assert needs is None or (block.marker or ("",))[0] == "skip", (
            f"{block.where} uses {needs.group(0)!r} (installs packages, needs vLLM or the "
            "network) and cannot run here: put <!-- doc-test: skip (why) --> before it")
    assert run_documented_session(path, fresh_copy) == []


def test_the_session_runner_catches_failures(tmp_path: Path) -> None:
    """A block that exits 1 unmarked, an exit marker that does not match, and a stale sample
    each fail (so the test above cannot pass vacuously); a `cd` carries to the next block."""
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\nmkdir sub && cd sub\n```\n\n```bash\ntest \"$(basename "
                   "$PWD)\" = sub\necho 'verdict: x conforms'\n```\n\n```text\n"
                   "verdict: x conforms\n```\n", encoding="utf-8")
    clone = tmp_path / "clone"
    clone.mkdir()
    assert run_documented_session(doc, clone) == []
    doc.write_text("```bash\necho 'verdict: x conforms'\n```\n\n```text\n"
                   "verdict: x does NOT conform\n```\n", encoding="utf-8")
    assert ["regenerate the sample" in p for p in run_documented_session(doc, clone)] == [True]
    # The breakdown too: a stale count in a wrapped "not applicable" paragraph is caught, the
    # same paragraph wrapped elsewhere is not.
    printed = ("verdict: x conforms\n  not applicable, undeclared capabilities: 3 tests: a 2,\n"
               "      b 1\n  skipped 2 (a 2): x does not declare capability 'a'\n")
    for sample, stale in ((printed, False),
                          (printed.replace("a 2,\n      b 1", "a 2, b 1"), False),
                          (printed.replace("b 1", "b 2"), True),
                          (printed.replace("skipped 2 (a 2)", "skipped 1 (a 1)"), True)):
        doc.write_text(f"```bash\nprintf '%s' {shlex.quote(printed)}\n```\n\n```text\n"
                       f"{sample}```\n", encoding="utf-8")
        found = run_documented_session(doc, clone)
        assert ["regenerate the sample" in p for p in found] == [True] * stale, found
    doc.write_text("```bash\nfalse\n```\n", encoding="utf-8")
    assert "exited 1, expected 0" in run_documented_session(doc, clone)[0]
    doc.write_text("<!-- doc-test: exit 1 (fails) -->\n```bash\ntrue\n```\n",
                   encoding="utf-8")
    assert "exited 0, expected 1" in run_documented_session(doc, clone)[0]


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


def test_tutorial_needs_its_last_edit(tmp_path: Path) -> None:
    """The free-order edit is what the vLLM profile checks: without it the suite fails (so the
    test above is not passing by accident)."""
    module, code, edits = tutorial_module()
    for edit in edits[:-1]:
        code = apply_edit(code, edit)
    proc = run_suite(tmp_path, module, code)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "free queue (head first) differs" in proc.stdout
