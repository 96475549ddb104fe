"""kvcheck's pytest plugin (pytest11 entry point ``kvcheck``).

Every option lives here, not in a conftest, so it also works with ``--pyargs``::

    pytest --kv-impl=mypkg.kv_adapter            # the whole shipped suite
    pytest --kv-impl=reference,mypkg.kv_adapter  # each as its own parametrization
    pytest --pyargs kvcheck.conformance --kv-impl=... -n 2 --kv-report=r.jsonl

Flow: ``pytest_configure`` loads and checks the implementations (``UsageError`` on any contract
problem; ``kvcheck.plugin.suite``), ``pytest_generate_tests`` parametrizes ``kv_impl``,
``pytest_collection_modifyitems`` applies capability / profile gating and the skip / xfail
files, ``pytest_runtest_logreport`` collects outcomes (on the xdist controller too;
``kvcheck.plugin.state``), and the terminal summary and ``--kv-report`` record are produced at
the end.

This module is what pytest imports when it loads its plugins, before any plugin runs (so
before pytest-cov starts measuring). It therefore imports nothing of kvcheck at module level:
the options are declared from constants spelled here (``tests/plugin/test_ecosystem_coverage``
checks them against ``kvcheck.conformance``), and the rest of the plugin is imported and
registered from ``pytest_configure``, where ``--cov=kvcheck`` measures it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvcheck.plugin.state import KV_STATE, KVSessionState

__all__ = ["KV_STATE", "KVSessionState"]

_DEFAULT_MAX_EXAMPLES = 40
#: ``kvcheck.conformance.protocol.PROFILES`` and ``kvcheck.conformance.loader.
#: DEFAULT_CALL_TIMEOUT``, spelled here so that declaring the options imports nothing.
_PROFILES = ("vllm-0.33", "vllm-0.10", "generic")
_DEFAULT_CALL_TIMEOUT = 60.0


def __getattr__(name: str) -> object:
    """``KV_STATE`` and ``KVSessionState``, for code written against kvcheck 0.1 (they live
    in ``kvcheck.plugin.state``)."""
    if name in __all__:
        from kvcheck.plugin import state

        return getattr(state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Declare the hooks shared with the benchmark plugin (``kvcheck.plugin.hooks``)."""
    from kvcheck.plugin.hooks import add_hookspecs

    add_hookspecs(pluginmanager)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcheck", "kvcheck paged KV-cache conformance")
    group.addoption(
        "--kv-impl", default=None, metavar="MODULE[:FACTORY][,...]",
        help="implementation(s) under test: a module defining IMPL_INFO and "
             "make_kv_cache_manager(spec), 'module:factory', or the alias 'reference'; a "
             "comma list runs each as its own parametrization (env KV_IMPL as fallback)",
    )
    group.addoption(
        "--kv-indexer", default=None, metavar="MODULE[,...]",
        help="KV-aware router index(es) under test: a module defining IMPL_INFO (capability "
             "'indexer') and make_indexer(config), or the alias 'reference'; runs the indexer "
             "area (docs/indexers.md), beside --kv-impl's implementations if any",
    )
    group.addoption(
        "--kv-oracle", default="reference", metavar="MODULE[:FACTORY]",
        help="what differential tests (the kv_pair fixture) compare each implementation with: "
             "'reference' (default), 'vllm' (the installed vLLM, kvcheck.adapters.vllm) or "
             "any adapter module; kv_reference stays kvcheck's reference",
    )
    group.addoption(
        "--kv-profile", default=None, choices=_PROFILES,
        help="behaviour to check against: vllm-0.33, vllm-0.10, or generic (invariants only, "
             "for radix-tree engines); default: the profile IMPL_INFO claims",
    )
    group.addoption(
        "--kv-max-examples", type=int, default=_DEFAULT_MAX_EXAMPLES, metavar="N",
        help=f"Hypothesis examples per property/differential test (default "
             f"{_DEFAULT_MAX_EXAMPLES}; 1 to 10^6)",
    )
    group.addoption(
        "--kv-seed", type=int, default=None, metavar="N",
        help="random seed for generated workloads, 0 to 2^63 - 1; default: derandomized (the "
             "same examples on every run, as CI wants)",
    )
    group.addoption(
        "--kv-report", default=None, metavar="PATH",
        help="write a versioned JSON Lines result record (one line per implementation), "
             "atomically; a run that ends before its session does leaves a record saying so",
    )
    group.addoption(
        "--kv-xfails-file", default=None, metavar="PATH",
        help="file of test-id substrings expected to fail (known deviations)",
    )
    group.addoption(
        "--kv-skips-file", default=None, metavar="PATH",
        help="file of test-id substrings to skip (a run that skips suite tests is reported "
             "incomplete)",
    )
    group.addoption(
        "--kv-timeout", type=float, default=None, metavar="SECONDS",
        help=f"limit on every call into the implementation (factory and load-time probe "
             f"included): a call that does not return in time fails its test (default "
             f"{_DEFAULT_CALL_TIMEOUT:g}; 0 = no limit; a value below this machine's floor, "
             f"at least 0.25 s, is raised to it; at most 86400, a day)",
    )
    group.addoption(
        "--kv-max-memory", default=None, metavar="SIZE",
        help="memory limit on the test process (resident set, sampled between adapter calls): "
             "past it the test fails naming the growth and the session stops, incomplete; "
             "MiB (4096) or with a unit (512M, 8G); default: half the machine's memory; "
             "0 = no limit",
    )
    group.addoption(
        "--kv-inventory", default=None, metavar="PATH",
        help="internal: with --collect-only, write the applicable suite tests as JSON to PATH "
             "(how a partial run counts the whole suite)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from kvcheck.plugin.suite import configure

    configure(config)
