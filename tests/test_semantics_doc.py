"""docs/semantics.md stays the target of the code's citations, and its test names stay true.

* Every ``docs/semantics.md#anchor`` written in a ``*.py`` / ``*.md`` file of the project trees
  (and every ``](#anchor)`` link inside the page) names an anchor the page has: the GitHub slug
  of one of its headings, or an explicit ``<a id="...">``.
* Every ``conformance/test_*.py::name`` (and ``tests/.../test_*.py::name``) the page names is a
  module-level function of that file.
* No citation of the old, unpublished behavioural spec ("spec", a section sign and a number)
  is left in those trees.

Each checker is a small pure function, and the last tests feed it broken input, so a checker
that silently accepts everything fails here too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "semantics.md"
TREES = ("reference_impl", "conformance", "gpu_kernels", "plugin", "bench", "results",
         "adapters", "kvcheck", "tests", "docs")
THIS_FILE = Path(__file__).resolve()

# A link into the page from elsewhere, and a link inside the page.
DOC_LINK = re.compile(r"docs/semantics\.md#([A-Za-z0-9_-]+)")
LOCAL_LINK = re.compile(r"\]\(#([^)\s]+)\)")
# ``conformance/test_x.py::test_y`` or ``tests/sub/test_x.py::test_y``.
TEST_REF = re.compile(r"\b((?:conformance|tests)/(?:[\w-]+/)*test_\w+\.py)::(\w+)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")
# Built from parts so this file does not cite the spec itself.
SPEC_CITATION = re.compile("(spec|hybrid-groups[.a-z]*|vllm-v1-semantics[.a-z]*) " + "\u00a7",
                           re.IGNORECASE)


def project_files() -> list[Path]:
    """The ``*.py`` and ``*.md`` files of the project trees, plus README.md (this file out)."""
    files = [ROOT / "README.md"]
    for tree in TREES:
        for pattern in ("*.py", "*.md"):
            files += [p for p in (ROOT / tree).rglob(pattern) if "__pycache__" not in p.parts]
    return sorted(p for p in set(files) if p.is_file() and p.resolve() != THIS_FILE)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline code and link markup reduced to their text,
    lower case, every character but letters, digits, ``_``, ``-`` and spaces dropped, spaces
    turned into ``-`` (runs are not collapsed)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "_- ")
    return text.replace(" ", "-")


def anchors_of(markdown: str) -> set[str]:
    """Every anchor a Markdown page defines: heading slugs (GitHub's ``-1``, ``-2`` suffixes for
    repeats) and explicit ``<a id>`` / ``<a name>``; lines inside fenced code are skipped."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        anchors.update(EXPLICIT_ANCHOR.findall(line))
        match = HEADING.match(line)
        if match:
            slug = github_slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(text: str, anchors: set[str], pattern: re.Pattern[str] = DOC_LINK
                 ) -> list[tuple[int, str]]:
    """``(line number, anchor)`` of each link in ``text`` whose anchor is not in ``anchors``."""
    return [(lineno, m.group(1)) for lineno, line in enumerate(text.splitlines(), 1)
            for m in pattern.finditer(line) if m.group(1) not in anchors]


def named_tests(markdown: str) -> list[tuple[str, str]]:
    """``(file, function)`` of every ``path/test_x.py::name`` the text mentions."""
    return [(m.group(1), m.group(2)) for m in TEST_REF.finditer(markdown)]



def module_functions(source: str) -> set[str]:
    """Names of the module-level functions (sync or async) of a Python source."""
    tree = ast.parse(source)
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def missing_tests(markdown: str, root: Path) -> list[str]:
    """``file::name`` references whose file does not exist or does not define ``name``."""
    missing = []
    defined: dict[str, set[str]] = {}
    for path, name in named_tests(markdown):
        if path not in defined:
            file = root / path
            defined[path] = (module_functions(file.read_text(encoding="utf-8"))
                             if file.is_file() else set())
        if name not in defined[path]:
            missing.append(f"{path}::{name}")
    return missing


def spec_citations(text: str) -> list[int]:
    """Line numbers of the lines citing the unpublished spec by section."""
    return [lineno for lineno, line in enumerate(text.splitlines(), 1)
            if SPEC_CITATION.search(line)]


# ------------------------------------------------------------------------------ the real tree
def test_every_semantics_link_resolves() -> None:
    anchors = anchors_of(DOC.read_text(encoding="utf-8"))
    broken, total = [], 0
    for path in project_files():
        text = path.read_text(encoding="utf-8")
        total += len(DOC_LINK.findall(text))
        broken += [f"{path.relative_to(ROOT)}:{lineno}: #{anchor}"
                   for lineno, anchor in broken_links(text, anchors)]
    assert not broken, (
        "links into docs/semantics.md whose anchor the page does not define (headings give "
        "GitHub slugs; add a heading or an <a id> there, or fix the link):\n" + "\n".join(broken))
    # The code cites the page in dozens of places; far fewer means the scan found nothing.
    assert total >= 40, f"only {total} docs/semantics.md# links found in the project trees"


def test_page_internal_links_resolve() -> None:
    text = DOC.read_text(encoding="utf-8")
    broken = broken_links(text, anchors_of(text), LOCAL_LINK)
    assert not broken, f"docs/semantics.md links to anchors it lacks: {broken}"
    assert len(LOCAL_LINK.findall(text)) >= 20


def test_named_tests_exist() -> None:
    text = DOC.read_text(encoding="utf-8")
    refs = named_tests(text)
    assert len(refs) >= 100, f"only {len(refs)} test references found in docs/semantics.md"
    assert {path for path, _ in refs if path.startswith("conformance/")} >= {
        "conformance/test_allocation.py", "conformance/test_eviction.py",
        "conformance/test_hashing.py", "conformance/test_events.py",
        "conformance/test_prefix_caching.py", "conformance/test_slot_mapping.py"}
    missing = missing_tests(text, ROOT)
    assert not missing, "docs/semantics.md names tests that do not exist:\n" + "\n".join(missing)


def test_no_spec_section_citations_left() -> None:
    left = [f"{path.relative_to(ROOT)}:{lineno}"
            for path in project_files() if path.resolve() != DOC.resolve()
            for lineno in spec_citations(path.read_text(encoding="utf-8"))]
    assert not left, (
        "citations of the unpublished spec remain; link the matching section of "
        "docs/semantics.md instead:\n" + "\n".join(left))


# ------------------------------------------------------------------------------ the checkers
@pytest.mark.parametrize(("heading", "slug"), [
    ("Free order", "free-order"),
    ("Running vLLM's own code", "running-vllms-own-code"),
    ("NONE_HASH and PYTHONHASHSEED", "none_hash-and-pythonhashseed"),
    ("What kvcheck checks: vLLM V1 paged KV-cache semantics",
     "what-kvcheck-checks-vllm-v1-paged-kv-cache-semantics"),
    ("`get_computed_blocks` and [hits](#x)", "get_computed_blocks-and-hits"),
    ("A -- B", "a----b"),
])
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_anchors_of_counts_repeats_and_skips_code() -> None:
    page = ("# Title\n## Part\n## Part\n<a id=\"kept\"></a>\n\n```bash\n# not a heading\n```\n"
            "### Part\n")
    assert anchors_of(page) == {"title", "part", "part-1", "part-2", "kept"}


def test_broken_link_is_reported() -> None:
    anchors = anchors_of("# Free order\n")
    text = "ok (docs/semantics.md#free-order)\nbad (docs/semantics.md#free-orders)\n"
    assert broken_links(text, anchors) == [(2, "free-orders")]
    assert broken_links("[x](#nope) [y](#free-order)", anchors, LOCAL_LINK) == [(1, "nope")]


def test_missing_test_is_reported(tmp_path: Path) -> None:
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "test_x.py").write_text(
        "def test_here():\n    pass\n\nclass C:\n    def test_method(self):\n        pass\n")
    page = ("`conformance/test_x.py::test_here`, `conformance/test_x.py::test_gone`, "
            "`conformance/test_x.py::test_method`, `tests/sub/test_none.py::test_a`")
    assert missing_tests(page, tmp_path) == [
        "conformance/test_x.py::test_gone", "conformance/test_x.py::test_method",
        "tests/sub/test_none.py::test_a"]


def test_spec_citation_is_reported() -> None:
    text = "fine\n# free order (spec " + "\u00a74)\nSpec " + "\u00a72.7 table\n\u00a7 alone\n"
    assert spec_citations(text) == [2, 3]
