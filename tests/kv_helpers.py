"""Helpers shared by our own tests (importable because pyproject sets pythonpath = tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import pytest

try:
    import fcntl
except ImportError:  # not POSIX: each xdist worker makes a shared run itself
    fcntl = None  # type: ignore[assignment]

from kvcheck.adapters.reference import IMPL_INFO as REFERENCE_INFO
from kvcheck.conformance.protocol import VLLM_PROFILES
from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request
from kvcheck.results.schema import load_records

#: The reference's release profiles (the protocol's Literal spells the names once).
PROFILES = list(VLLM_PROFILES)


def make_manager(profile: str, num_blocks: int, block_size: int = 16,
                 **kwargs: object) -> KVCacheManager:
    kwargs.setdefault("pythonhashseed", "0")
    return KVCacheManager(num_blocks, block_size, profile=profile, **kwargs)  # type: ignore[arg-type]


def schedule(mgr: KVCacheManager, req: Request,
             num_new_tokens: int | None = None) -> list[int] | None:
    """One scheduler step on a one-group manager: look up hits for a new request, allocate,
    advance computed tokens.

    Returns the new block ids (group 0), or None when allocation failed (nothing advanced).
    """
    hits: tuple[list[KVCacheBlock], ...] | None = None
    num_hit = 0
    if not mgr.get_blocks(req.request_id)[0]:
        hits, num_hit = mgr.get_computed_blocks(req)
    if num_new_tokens is None:
        num_new_tokens = req.num_tokens - req.num_computed_tokens - num_hit
    new = mgr.allocate_slots(req, num_new_tokens, num_hit, hits)
    if new is None:
        return None
    req.num_computed_tokens += num_hit + num_new_tokens
    return [b.block_id for b in new[0]]


# ---------------------------------------------------------------------- stand-in capabilities
#: Capabilities an adapter keeps at module level: ``kernels()`` and the sizing functions of
#: ``kvcheck.conformance.sizing_protocol``, which the loader looks up on the module, not on the
#: manager. A stand-in that re-exports only the reference's factories lacks them, so it must
#: not declare them. Written here once because the loader keeps these names in private
#: constants (no public list to derive them from); ``test_loader_input`` pins them to it.
MODULE_LEVEL_CAPABILITIES: frozenset[str] = frozenset({"kernels", "sizing", "offload"})


def reference_capabilities(*, drop: Iterable[str] = ()) -> frozenset[str]:
    """What a stand-in built on the reference's factories may declare: the reference's
    capabilities less the module-level ones and ``drop`` (e.g. ``block_pool`` for one with no
    ``make_block_pool``)."""
    return REFERENCE_INFO.capabilities - MODULE_LEVEL_CAPABILITIES - frozenset(drop)


def reference_capabilities_source(capabilities: str, *, drop: Iterable[str] = ()) -> str:
    """``reference_capabilities(drop=drop)`` as Python source, for an adapter module a test
    writes out (it may run in a process that cannot import this module): ``capabilities``, the
    expression naming the reference's capabilities there, less a set literal."""
    names = ", ".join(f'"{name}"' for name in sorted(MODULE_LEVEL_CAPABILITIES | set(drop)))
    return f"{capabilities} - {{{names}}}"


# ------------------------------------------------------------------------- pytester adapters
REF_NO_KERNELS = """
from dataclasses import replace
import kvcheck.adapters.reference as _ref
IMPL_INFO = replace(_ref.IMPL_INFO, name={name!r},
                    capabilities={capabilities})
make_block_pool = _ref.make_block_pool
{body}
"""
PLAIN_FACTORY = "make_kv_cache_manager = _ref.make_kv_cache_manager\n"


def reference_without_kernels(name: str | None = None, doc: str = "") -> str:
    """Source of an adapter module that is kvcheck's reference, every factory and module hook
    included (``import *``), without its kernels (interpreted, the slowest area of a
    whole-suite run), under the reference's name or ``name``. Unlike ``make_ref``'s modules it
    keeps the module-level capabilities (sizing, offload)."""
    renamed = f"name={name!r},\n                    " if name else ""
    return (f'"""{doc}"""\n' if doc else "") + (
        "from dataclasses import replace\n\n"
        "from kvcheck.adapters.reference import *  # noqa: F403 (factories, module hooks)\n"
        "from kvcheck.adapters.reference import IMPL_INFO as _REFERENCE\n\n"
        f"IMPL_INFO = replace(_REFERENCE, {renamed}"
        'capabilities=_REFERENCE.capabilities - {"kernels"})\n')


def make_ref(pytester: pytest.Pytester, module: str = "refnk", name: str = "ref",
             body: str = PLAIN_FACTORY) -> str:
    """Write a module wrapping kvcheck's reference without the (slow, interpreted) kernel
    area, so a whole-suite run takes seconds; ``body`` defines its factory. Returns the
    ``--kv-impl=`` option naming it."""
    pytester.makepyfile(**{module: REF_NO_KERNELS.format(
        name=name, capabilities=reference_capabilities_source("_ref.IMPL_INFO.capabilities"),
        body=textwrap.dedent(body))})
    pytester.syspathinsert()
    return f"--kv-impl={module}"


class SharedRun(NamedTuple):
    """A run made once per test session (``_shared_run``)."""

    result: pytest.RunResult
    record: dict[str, Any]   # its --kv-report record, read
    record_text: str         # that file's text
    html_page: str           # its pytest-html page ("" when made without --html)


#: ``plain_full_run``'s run, made once per test session.
_PLAIN_FULL_RUN: list[SharedRun] = []


def plain_full_run(pytester: pytest.Pytester) -> tuple[pytest.RunResult, dict[str, Any]]:
    """A complete in-process run of ``make_ref``'s reference without kernels (module
    ``refplain``, name ``ref``) under vllm-0.33 at ``--kv-max-examples=3``, and its
    ``--kv-report`` record (and, with pytest-html installed, its ``--html`` page:
    ``plain_full_html_page``): made once per test session, the first time a test asks. Runs are
    derandomized, so every test comparing a run of its own (partial, rerun, on xdist) with
    a plain complete one reads the same outcomes; each such test used to run it again.
    Under xdist the first worker to ask makes it and the others read it (``_shared_run``):
    the tests asking for it are spread over the workers."""
    if not _PLAIN_FULL_RUN:
        _PLAIN_FULL_RUN.append(_shared_run(pytester, _make_plain_full_run))
    return _PLAIN_FULL_RUN[0].result, _PLAIN_FULL_RUN[0].record


def plain_full_record_text(pytester: pytest.Pytester) -> str:
    """The ``--kv-report`` file ``plain_full_run``'s run wrote (a complete, conforming
    record), for a test that needs one on disk."""
    plain_full_run(pytester)
    return _PLAIN_FULL_RUN[0].record_text


def plain_full_html_page(pytester: pytest.Pytester) -> str:
    """The self-contained pytest-html page of ``plain_full_run``'s run ("" where pytest-html
    is not installed: the run was made without ``--html``)."""
    plain_full_run(pytester)
    return _PLAIN_FULL_RUN[0].html_page


def _make_plain_full_run(pytester: pytest.Pytester) -> tuple[pytest.RunResult, str, str]:
    impl = make_ref(pytester, module="refplain")
    page = pytester.path / "plain-full.html"
    html = ((f"--html={page}", "--self-contained-html")
            if importlib.util.find_spec("pytest_html") else ())
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly",
                                "--kv-max-examples=3", impl, "--kv-report=plain-full.jsonl",
                                *html)
    return (result, (pytester.path / "plain-full.jsonl").read_text(encoding="utf-8"),
            page.read_text(encoding="utf-8") if html else "")


def _shared_run(pytester: pytest.Pytester,
                make: Callable[[pytest.Pytester], tuple[pytest.RunResult, str, str]]) \
        -> SharedRun:
    """``make(pytester)``'s run (its result, the text of its record file and of its HTML
    page), made once for all the xdist workers of this session: the first worker makes it
    under a lock in the session's base temporary folder (the workers' own ``popen-gwN``
    folders are in it) and leaves it there as JSON, named with the session's xdist run id (a
    ``--basetemp`` folder outlives its session); the others wait for it and read it. Without
    xdist (or on a system without ``fcntl``) it is simply made."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    worker_base = pytester.path.parent
    if fcntl is None or not worker or not run_id or worker_base.name != f"popen-{worker}":
        result, text, page = make(pytester)
        return SharedRun(_lines_only(result), _one_record(pytester, text), text, page)
    shared = worker_base.parent / f"kvcheck-shared-{make.__name__.strip('_')}-{run_id}"
    with open(f"{shared}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if shared.exists():
                data = json.loads(shared.read_text(encoding="utf-8"))
                result = pytest.RunResult(data["ret"], data["outlines"], data["errlines"],
                                          data["duration"])
                text, page = data["record"], data["page"]
            else:
                result, text, page = make(pytester)
                result = _lines_only(result)
                shared.write_text(json.dumps({
                    "ret": int(result.ret), "outlines": result.outlines,
                    "errlines": result.errlines, "duration": result.duration,
                    "record": text, "page": page}), encoding="utf-8")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return SharedRun(result, _one_record(pytester, text), text, page)


def _lines_only(result: pytest.RunResult) -> pytest.RunResult:
    """``result`` without its in-process run's hook recorder (``reprec``): what the workers
    reading the shared run get. Kept for the session, the recorder would keep the run's
    every hook call, report and traceback alive (19 000 calls), and each of the worker's
    full garbage collections would walk them."""
    return pytest.RunResult(result.ret, result.outlines, result.errlines, result.duration)


def _one_record(pytester: pytest.Pytester, text: str) -> dict[str, Any]:
    """The one record of a ``--kv-report`` file's ``text``, read (and validated) by
    ``load_records`` from a copy in ``pytester``'s folder."""
    path = pytester.path / "shared-run.jsonl"
    path.write_text(text, encoding="utf-8")
    (rec,) = load_records(path)
    return rec


def assert_mutant_caught(result: pytest.RunResult, mutant: str, law: str) -> None:
    """A generic run of ``mutant`` failed (exit 1), never said it conforms, and a failure
    names ``law`` (tests/nano and tests/designs: each mutant is caught by its own law)."""
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, (
        f"{mutant}: exit {result.ret!r}, expected 1 (tests failed)\n" + text[-3000:])
    assert f"{mutant} conforms" not in text, text[-2000:]
    assert law in text, f"{mutant}: no failure names the law {law!r}\n" + text[-4000:]


# ------------------------------------------------------------------ a manager with one bug
#: The reference, but freeing in forward order (the bug vLLM's reversed() prevents), as the
#: source of a module named "forward" (written out by tests; it may be served over the wire).
FORWARD_FREE_SOURCE = f"""
from kvcheck.adapters.reference import IMPL_INFO as _R, ReferenceManager
from kvcheck.conformance.protocol import ImplInfo
IMPL_INFO = ImplInfo("forward", "0", {reference_capabilities_source("_R.capabilities",
                                                                     drop={"block_pool"})})
class M(ReferenceManager):
    def free(self, request_id):
        group = self.manager.coordinator.single_type_managers[0]
        blocks = group.req_to_blocks.pop(request_id, [])
        group.num_cached_block.pop(request_id, None)
        self.manager.block_pool.free_blocks(blocks)
def make_kv_cache_manager(spec):
    return M(spec)
"""
