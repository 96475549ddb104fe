"""--kv-oracle: kv_pair compares with the chosen oracle, kv_reference stays the reference, the
header names the oracle, and a bad oracle is a usage error naming the option."""

from __future__ import annotations

import os
import textwrap

import numpy as np  # noqa: F401
import pytest
from kv_helpers import reference_capabilities_source

import kvcheck.adapters.reference
import kvcheck.conformance.workload_machine

# As in tests/plugin/test_plugin.py: pytester's in-process runs drop the modules they imported,
# and numpy / torch cannot be imported twice in one process, so the suite's imports happen here.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import
    import triton  # noqa: F401

    import kvcheck.gpu_kernels.conformance  # noqa: F401
except ImportError:
    pass

_CAPS = reference_capabilities_source("_ref.IMPL_INFO.capabilities")
# The reference under another name, with a free queue reversed after every free: an oracle
# that disagrees with the reference on free order only.
SKEWED = f"""
from kvcheck.conformance.protocol import ImplInfo
from kvcheck.adapters import reference as _ref

IMPL_INFO = ImplInfo(name="skewed", version="9.9", capabilities={_CAPS},
                     profile="vllm-0.33", hash_algos=_ref.IMPL_INFO.hash_algos)
PROFILE_NOTE = "skewed: a test oracle"


class _Skewed(_ref.ReferenceManager):
    def free_block_ids(self):
        return list(reversed(super().free_block_ids()))


def make_kv_cache_manager(spec):
    return _Skewed(spec)


make_block_pool = _ref.make_block_pool
"""

TEST = """
def test_pair_uses_oracle(kv_pair, kv_reference, kv_oracle):
    pair = kv_pair(num_blocks=8, block_size=4)
    assert pair.oracle.impl is kv_oracle
    assert kv_oracle.name == {oracle!r}
    assert kv_reference.name == "reference"
"""


def _setup(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(skewed_oracle=textwrap.dedent(SKEWED))
    pytester.syspathinsert()


def test_default_oracle_is_the_reference(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_it=TEST.format(oracle="reference"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference", "test_it.py")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "kvcheck: oracle reference * (kvcheck.adapters.reference) claims profile=vllm-0.33"])


def test_kv_oracle_replaces_the_reference_in_kv_pair(pytester: pytest.Pytester) -> None:
    _setup(pytester)
    pytester.makepyfile(test_it=TEST.format(oracle="skewed"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                "--kv-oracle=skewed_oracle", "test_it.py")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "kvcheck: oracle skewed 9.9 (skewed_oracle) claims profile=vllm-0.33",
        "  note: skewed: a test oracle"])


def test_differential_disagreement_names_the_oracle(pytester: pytest.Pytester) -> None:
    _setup(pytester)
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                "--kv-oracle=skewed_oracle", "-k",
                                "test_free_order_golden_test_evict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*free queue (head first) differs: implementation *, skewed *"])


def test_profile_mismatch_with_oracle_is_warned(pytester: pytest.Pytester) -> None:
    _setup(pytester)
    pytester.makepyfile(test_it=TEST.format(oracle="skewed"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                "--kv-oracle=skewed_oracle", "--kv-profile=vllm-0.10",
                                "test_it.py")
    result.stdout.fnmatch_lines([
        ("kvcheck warning: differential tests of reference run under profile vllm-0.10, but "
         "the oracle behaves as vllm-0.33: pass --kv-profile=vllm-0.33")])


def test_bad_oracle_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                "--kv-oracle=no_such_module_xyz")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kv-oracle=no_such_module_xyz: cannot import*"])
    assert "Traceback" not in result.stderr.str()
