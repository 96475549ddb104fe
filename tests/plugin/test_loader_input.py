"""Bad --kv-impl input: every kind is a usage error (exit 4) that names the problem and the fix,
decided before any test runs, with no traceback (issue 10 item 6)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from kv_helpers import MODULE_LEVEL_CAPABILITIES, reference_capabilities_source

import kvcheck.adapters.reference

# Imported here so pytester's per-test sys.modules restore keeps them: the reference's C
# extensions load only once per process.
import kvcheck.conformance.differential
from kvcheck.conformance.loader import ImplLoadError, load_impls
from kvcheck.errors import KVCheckInputError

SUITE_DIR = Path(kvcheck.conformance.differential.__file__).resolve().parent

_CAPS = reference_capabilities_source("_R.capabilities", drop={"block_pool"})
BASE = """
import time
from kvcheck.adapters.reference import IMPL_INFO as _R, make_kv_cache_manager
from kvcheck.conformance.protocol import ImplInfo, UnsupportedSpec
CAPS = {caps}
IMPL_INFO = {info}
"""


def make_impl(pytester: pytest.Pytester, info: str, extra: str = "") -> None:
    source = textwrap.dedent(BASE.format(caps=_CAPS, info=info)) + textwrap.dedent(extra)
    pytester.makepyfile(bad_impl=source)
    pytester.syspathinsert()


def usage_error(pytester: pytest.Pytester, *args: str, impl: str = "bad_impl") -> str:
    """Run with --kv-impl (or args); assert a clean usage error; return stderr + stdout."""
    argv = [f"--kv-impl={impl}"] if impl is not None else []
    result = pytester.runpytest("-p", "no:cacheprovider", *argv, *args)
    text = "\n".join(result.errlines + result.outlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "Traceback" not in text and "  Fix: " in text
    return text


@pytest.mark.parametrize("value", ["", ",", " , ", "reference,,reference"])
def test_empty_kv_impl_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    text = usage_error(pytester, impl=value)
    assert "the implementation list is empty" in text or "has an empty entry" in text


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_load_impls_refuses_empty_values(value: str) -> None:
    with pytest.raises(ImplLoadError, match="the implementation list is empty") as info:
        load_impls(value)
    assert isinstance(info.value, KVCheckInputError)


def test_empty_factory_name(pytester: pytest.Pytester) -> None:
    make_impl(pytester, 'ImplInfo("bad", "1", CAPS)')
    text = usage_error(pytester, impl="bad_impl:")
    assert "--kv-impl=bad_impl:: empty factory name after ':'" in text


def test_factory_name_not_an_identifier(pytester: pytest.Pytester) -> None:
    make_impl(pytester, 'ImplInfo("bad", "1", CAPS)')
    assert "factory name '1x' is not a Python identifier" in usage_error(
        pytester, impl="bad_impl:1x")


@pytest.mark.parametrize(("info", "message"), [
    ('ImplInfo("bad", "1", "manager")',
     "IMPL_INFO.capabilities is a str ('manager'), not a collection of names"),
    ('{"name": "bad", "version": "1", "capabilities": "manager"}',
     "IMPL_INFO.capabilities is a str ('manager'), not a collection of names"),
    ('ImplInfo("bad", "1", 5)', "IMPL_INFO.capabilities is a int, not a collection of names"),
    ('ImplInfo("bad", "1", CAPS, hash_algos=("sha256", "md5"))',
     "IMPL_INFO.hash_algos names unknown algorithms ['md5']"),
    ('ImplInfo("bad", "1", CAPS, hash_algos="sha256")',
     "IMPL_INFO.hash_algos is a str ('sha256'), not a collection of names"),
    ('ImplInfo("", "1", CAPS)', "IMPL_INFO.name is ''; it must be a non-empty str"),
    ('ImplInfo("my impl", "1", CAPS)', "U+0020 (Zs)"),
    ('ImplInfo("bad\\x07", "1", CAPS)', "U+0007 (Cc)"),
    ('ImplInfo("evil\\u202etxt", "1", CAPS)', "U+202E (Cf)"),
    ('ImplInfo("a\\u2028b", "1", CAPS)', "U+2028 (Zl)"),
    ('ImplInfo("x" * 101, "1", CAPS)', "is 101 characters long (at most 100)"),
    ('ImplInfo("bad", "1\\u202e", CAPS)', "IMPL_INFO.version '1\\u202e' contains control"),
    ('ImplInfo("bad", 1, CAPS)', "IMPL_INFO.version is a int, not a str"),
    ('ImplInfo("bad", "1", CAPS, reserved_block_ids=(-1,))',
     "IMPL_INFO.reserved_block_ids=(-1,): entries must be ints >= 0"),
    ('ImplInfo("bad", "1", CAPS, reserved_block_ids=(True,))',
     "IMPL_INFO.reserved_block_ids=(True,): entries must be ints >= 0"),
    ('ImplInfo("bad", "1", CAPS, reserved_block_ids=5)',
     "IMPL_INFO.reserved_block_ids is a int, not a tuple of int"),
    ('ImplInfo("bad", "1", CAPS, block_sizes=(0, 16))',
     "IMPL_INFO.block_sizes=(0, 16): entries must be ints >= 1"),
    ('ImplInfo("bad", "1", CAPS, block_sizes=("16",))',
     "IMPL_INFO.block_sizes=('16',): entries must be ints >= 1"),
    ('ImplInfo("bad", "1", CAPS, block_sizes=())', "IMPL_INFO.block_sizes=() is empty"),
    ('ImplInfo("bad", "1", CAPS, num_blocks_range=(100, 10))',
     "IMPL_INFO.num_blocks_range=(100, 10) is not a (min, max) pair with min <= max"),
    ('ImplInfo("bad", "1", CAPS, num_blocks_range=(1.5, 10))',
     "IMPL_INFO.num_blocks_range=(1.5, 10): entries must be ints >= 0"),
    ('ImplInfo("bad", "1", CAPS, profile="vllm-9")', "claims unknown profile 'vllm-9'"),
])
def test_bad_impl_info_fields(pytester: pytest.Pytester, info: str, message: str) -> None:
    make_impl(pytester, info)
    assert message in usage_error(pytester)


@pytest.mark.parametrize("capability", sorted(MODULE_LEVEL_CAPABILITIES))
def test_module_level_capability_is_looked_up_on_the_module(pytester: pytest.Pytester,
                                                            capability: str) -> None:
    """``kv_helpers.MODULE_LEVEL_CAPABILITIES`` (what every stand-in drops) names capabilities
    the loader checks on the module: declared by a module that defines none of their
    functions, each is refused. (That a stand-in declaring the rest loads, every test here
    that loads ``CAPS`` shows.)"""
    make_impl(pytester, f'ImplInfo("bad", "1", CAPS | {{{capability!r}}})')
    text = usage_error(pytester)
    assert re.search(rf"capability '{capability}' is declared but (the )?module ", text), text


def test_factory_declining_every_probe(pytester: pytest.Pytester) -> None:
    make_impl(pytester, 'ImplInfo("picky", "1", CAPS)', """
        def make_kv_cache_manager(spec):
            raise UnsupportedSpec("I only do block_size 7")
    """)
    text = usage_error(pytester)
    assert "make_kv_cache_manager declined every probe spec it claims to support" in text
    assert "I only do block_size 7" in text and "block_sizes, num_blocks_range" in text


def test_probe_uses_a_spec_the_impl_declares(pytester: pytest.Pytester) -> None:
    """A design supporting only block size 16 and pools of 32+ blocks loads: the probe asks
    for what it declares."""
    make_impl(pytester, 'ImplInfo("sixteen", "1", CAPS, block_sizes=(16,), '
                        'num_blocks_range=(32, 4096))', """
        from kvcheck.adapters.reference import make_kv_cache_manager as _make
        def make_kv_cache_manager(spec):
            if spec.block_size != 16 or spec.num_blocks < 32:
                raise UnsupportedSpec(f"block_size 16 and 32+ blocks only, not {spec}")
            return _make(spec)
    """)
    # Collect only, and not the kernel module: torch cannot be imported again after
    # pytester's sys.modules restore (a later in-process run would crash).
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=bad_impl", "--co", "-q",
                                f"--ignore={SUITE_DIR / 'test_kernels.py'}")
    assert result.ret == pytest.ExitCode.OK, "\n".join(result.errlines + result.outlines)


def test_hanging_factory_is_a_usage_error(pytester: pytest.Pytester) -> None:
    make_impl(pytester, 'ImplInfo("sleepy", "1", CAPS)', """
        def make_kv_cache_manager(spec):
            time.sleep(3600)
    """)
    text = usage_error(pytester, "--kv-timeout=0.5")
    assert "sleepy.make_kv_cache_manager(KVCacheSpec(" in text
    assert "did not return within 0.5 s" in text and "raise --kv-timeout" in text
