"""Whose fault it is, as whole sessions report it (issue 23 item 4): a tiny ``--kv-timeout``
does not make the reference non-conforming; a BaseException an adapter call raises fails that
test as the implementation's fault (op, trace, repro) and the session goes on to a verdict,
while a real SIGINT still stops the run as interrupted; the oracle is never the one a limit
fails; a spec mutation is reported as such."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kv_helpers import make_ref

import kvcheck.conformance

SUITE = Path(kvcheck.conformance.__file__).parent

#: Two tests of the allocation area: the first allocates 14 tokens (its allocate_slots is
#: the one the adapters below break), the second never asks for more than 12.
TWO_TESTS = "test_first_allocation or test_decode_within_block_allocates_nothing"

RAISES_IN_ALLOCATE = """
from dataclasses import replace
import kvcheck.adapters.reference as _ref
from kvcheck.adapters.reference import ReferenceManager
class Boom(BaseException):
    pass
IMPL_INFO = replace(_ref.IMPL_INFO, name={name!r}, capabilities=_ref.IMPL_INFO.capabilities
                    - {{"kernels", "sizing", "block_pool", "offload"}})
class M(ReferenceManager):
    def allocate_slots(self, request, *args):
        if request.num_tokens > 12:
            {statement}
        return super().allocate_slots(request, *args)
def make_kv_cache_manager(spec):
    return M(spec)
"""
RAISERS = {
    "ki": ("raise KeyboardInterrupt", "raised KeyboardInterrupt, not caused by a signal"),
    "exits": ("raise SystemExit(3)", "raised SystemExit(3)"),
    "genexit": ("raise GeneratorExit", "raised GeneratorExit"),
    "boom": ("raise Boom('x')", "raised Boom('x') (a BaseException subclass)"),
    "skips": ("import pytest; pytest.skip('hidden')", "called pytest.skip('hidden')"),
}


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", *args)


def test_a_tiny_timeout_is_raised_to_the_floor_and_the_reference_conforms(
        pytester: pytest.Pytester) -> None:
    """The whole suite (less the interpreted kernels) under --kv-timeout=0.001."""
    result = run(pytester, make_ref(pytester), "--kv-timeout=0.001")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        ("kvcheck: --kv-timeout=0.001 is below the floor of this machine, * s (10 x the "
         "slowest call of kvcheck's reference, * ms here, and at least 0.25 s): using "
         "--kv-timeout=*"),
        "verdict: ref conforms to vllm-0.33*",
        "kvcheck warning: --kv-timeout=0.001 is below the floor of this machine*"])
    assert "did not return within" not in result.stdout.str()
    assert not (pytester.path / ".kvcheck" / "repro").exists()  # nothing blamed


def test_base_exceptions_fail_their_test_and_the_session_goes_on(
        pytester: pytest.Pytester) -> None:
    """One adapter per kind, in one session: each fails the test whose call raised, with op,
    trace and repro; the other test of each runs and passes; every one gets a verdict."""
    for name, (statement, _) in RAISERS.items():
        pytester.makepyfile(**{f"{name}_impl": RAISES_IN_ALLOCATE.format(
            name=name, statement=statement)})
    pytester.syspathinsert()
    impls = ",".join(f"{name}_impl" for name in RAISERS)
    result = run(pytester, f"--kv-impl={impls}", "-k", TWO_TESTS)
    assert result.ret == 1
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 5 and outcomes["passed"] == 5, outcomes
    verdicts = [line for line in out.splitlines() if line.startswith("verdict: ")]
    assert len(verdicts) == 5 and not any("interrupted" in v or "no verdict" in v
                                          for v in verdicts)
    assert "!!! KeyboardInterrupt !!!" not in out
    for name, (_, words) in RAISERS.items():
        assert (f"after op #2 {{'op': 'schedule', 'rid': 'r0', 'num_tokens': None}}: "
                f"BaseException from the implementation: {name}.allocate_slots(RequestView("
                f"'r0', 14 tokens, num_computed_tokens=0), 14, 0, []) {words}") in out
        result.stdout.fnmatch_lines([
            (f"E * trace written to .kvcheck/repro/test_first_allocation_{name}_-*.json "
             f"(kvcheck replay * --kv-impl={name}_impl); repro: python .kvcheck/repro/*.py"),
        ])
        assert f"verdict: {name} does NOT conform to vllm-0.33: failing areas: allocation" in out
    repros = sorted(p.name for p in (pytester.path / ".kvcheck" / "repro").glob("*.py"))
    assert len(repros) == 5


SLEEPS_IN_ALLOCATE = """
import os, time
from dataclasses import replace
import kvcheck.adapters.reference as _ref
from kvcheck.adapters.reference import ReferenceManager
IMPL_INFO = replace(_ref.IMPL_INFO, name="sleeps", capabilities=_ref.IMPL_INFO.capabilities
                    - {"kernels", "sizing", "block_pool", "offload"})
class M(ReferenceManager):
    def allocate_slots(self, request, *args):
        if request.num_tokens > 12:
            open(os.environ["KV_MARKER"], "w").close()
            time.sleep(60)
        return super().allocate_slots(request, *args)
def make_kv_cache_manager(spec):
    return M(spec)
"""


def test_a_real_sigint_still_interrupts_the_run(tmp_path: Path) -> None:
    (tmp_path / "sleeps_impl.py").write_text(SLEEPS_IN_ALLOCATE)
    marker = tmp_path / "in-the-call"
    env = {**os.environ, "KV_MARKER": str(marker), "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kv-impl=sleeps_impl",
         "-k", TWO_TESTS], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 25
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), "the session never reached the sleeping call"
        os.kill(proc.pid, signal.SIGINT)  # the user's Ctrl-C, while the adapter runs
        out, _ = proc.communicate(timeout=25)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, out  # pytest's "interrupted"
    assert "verdict: sleeps: interrupted after 0 tests: no verdict" in out
    assert "BaseException from the implementation" not in out
    assert not (tmp_path / ".kvcheck" / "repro").exists()


SLOW_ORACLE = """
import os, time
from dataclasses import replace
import kvcheck.adapters.reference as _ref
from kvcheck.adapters.reference import ReferenceManager
IMPL_INFO = replace(_ref.IMPL_INFO, name="slow-oracle",
                    capabilities=_ref.IMPL_INFO.capabilities - {"kernels", "sizing", "offload"})
make_block_pool = _ref.make_block_pool
class M(ReferenceManager):
    def allocate_slots(self, request, *args):
        if not os.path.exists("oracle-slept"):  # once: more than the implementation's limit
            time.sleep(0.4)
            open("oracle-slept", "w").close()
        return super().allocate_slots(request, *args)
def make_kv_cache_manager(spec):
    return M(spec)
"""
CHECKS_THE_ORACLES_LIMIT = """
def test_oracle_limits(kv_oracle, kv_reference, kv_impl):
    assert kv_impl.call_timeout == 0.3
    assert kv_oracle.call_timeout == 60.0 and kv_reference.call_timeout == 60.0
"""


def test_the_oracle_is_never_the_one_a_limit_fails(pytester: pytest.Pytester) -> None:
    """--kv-timeout=0.3 and an oracle whose allocate_slots takes 0.4 s: the implementation
    (the reference) still passes; the oracle runs under at least the default limit."""
    pytester.makepyfile(slow_oracle=SLOW_ORACLE)
    pytester.makepyfile(test_user_oracle=CHECKS_THE_ORACLES_LIMIT)
    impl = make_ref(pytester)
    result = run(pytester, impl, "--kv-oracle=slow_oracle", "--kv-timeout=0.3",
                 "-k", "test_first_allocation or test_oracle_limits",
                 str(pytester.path / "test_user_oracle.py"), str(SUITE / "test_allocation.py"))
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes()["passed"] == 2
    assert (pytester.path / "oracle-slept").is_file()  # its call took longer than 0.3 s
    assert "did not return within" not in result.stdout.str()


MUTATES = """
from dataclasses import replace
import kvcheck.adapters.reference as _ref
from kvcheck.adapters.reference import ReferenceManager
IMPL_INFO = replace(_ref.IMPL_INFO, name={name!r}, capabilities=_ref.IMPL_INFO.capabilities
                    - {{"kernels", "sizing", "block_pool", "offload"}})
built = []
class SwapsGroups(ReferenceManager):
    def __init__(self, spec):
        super().__init__(spec)
        self.given = spec
    def allocate_slots(self, request, *args):
        # Swap the (tuple of) groups for a list, then grow it.
        object.__setattr__(self.given, "kv_cache_groups", [])
        self.given.kv_cache_groups.append("group")
        return super().allocate_slots(request, *args)
def make_kv_cache_manager(spec):
    built.append(spec)
    if len(built) == 1:  # the load-time probe
        return ReferenceManager(spec)
    {body}
"""
MUTATORS = {
    "writes": ('object.__setattr__(spec, "num_blocks", spec.num_blocks * 10)\n'
               "    return ReferenceManager(spec)"),
    "swaps": "return SwapsGroups(spec)",
}


def test_a_spec_mutation_is_reported_as_such(pytester: pytest.Pytester) -> None:
    """A factory that writes to its frozen spec (the old report: num_free_blocks() out of
    range), and a manager that swaps the spec's groups for a list and appends to it."""
    for name, body in MUTATORS.items():
        pytester.makepyfile(**{f"{name}_impl": MUTATES.format(name=name, body=body)})
    pytester.syspathinsert()
    result = run(pytester, "--kv-impl=writes_impl,swaps_impl", "-k", "test_first_allocation")
    assert result.ret == 1
    assert result.parseoutcomes()["failed"] == 2
    result.stdout.fnmatch_lines([
        ("E * writes.make_kv_cache_manager(KVCacheSpec(*): the adapter mutated the "
         "KVCacheSpec it was given: field num_blocks before 10, after 100. Specs are "
         "immutable inputs*"),
    ])
    out = result.stdout.str()
    assert ("after op #2 {'op': 'schedule', 'rid': 'r0', 'num_tokens': None}: protocol "
            "violation: swaps.allocate_slots(RequestView('r0', 14 tokens, num_computed_tokens=0)"
            ", 14, 0, []): the adapter mutated the KVCacheSpec it was given: field "
            "kv_cache_groups before (), after ['group'] (a list, was a tuple)") in out
    assert "num_free_blocks() returned" not in out and "outside [0" not in out
    assert "verdict: writes does NOT conform" in out and "verdict: swaps does NOT conform" in out
