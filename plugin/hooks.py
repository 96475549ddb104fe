"""The hooks through which kvcheck's two pytest plugins cooperate.

The conformance plugin (pytest11 entry point ``kvcheck``, ``kvcheck.plugin.plugin``) and the
benchmark plugin (``kvcheck-bench``, ``kvcheck.bench.plugin``) never read each other's options
or ``config.stash`` entries: each asks the other through these hooks, called as
``config.hook.<name>(config=config)``. A hook nobody implements answers None, so either plugin
works with the other disabled (``-p no:kvcheck-bench``, ``-p no:kvcheck``).

Both plugins declare the hooks from their ``pytest_addhooks`` with ``add_hookspecs`` below
(idempotent: whichever registers first declares them). Third-party plugins may implement them
too; every hook is ``firstresult``: the first answer that is not None wins.

* ``pytest_kvcheck_bench_active``: implemented by kvcheck-bench; asked by the conformance
  plugin, which in a benchmark run leaves ``config.args`` alone, prints no verdict and writes
  no ``--kv-report`` record.
* ``pytest_kvcheck_profiles``: implemented by the conformance plugin; asked by kvcheck-bench
  for the profile its result records name.
"""

from __future__ import annotations

import sys

import pytest

__all__ = ["add_hookspecs"]


def add_hookspecs(pluginmanager: pytest.PytestPluginManager) -> None:
    """Declare this module's hooks on ``pluginmanager`` unless they already are (both plugins
    call this from ``pytest_addhooks``; pluggy refuses a second declaration)."""
    caller = getattr(pluginmanager.hook, "pytest_kvcheck_bench_active", None)
    if caller is None or not caller.has_spec():
        pluginmanager.add_hookspecs(sys.modules[__name__])


@pytest.hookspec(firstresult=True)
def pytest_kvcheck_bench_active(config: pytest.Config) -> bool | None:
    """Whether this session runs kvcheck's benchmarks rather than a conformance check.

    Called from ``pytest_configure`` (before or after the benchmark plugin's own) and at the
    end of the session, so an implementation must answer from ``config``'s options alone.
    True: the conformance plugin does not point ``config.args`` at its suite, prints no
    verdict and writes no record (benchmark outcomes are no conformance verdict). None (no
    benchmark plugin) counts as False.
    """


@pytest.hookspec(firstresult=True)
def pytest_kvcheck_profiles(config: pytest.Config) -> dict[str, str] | None:
    """The implementations selected with ``--kv-impl``, in the order given, each mapped to
    the profile it is checked against (``--kv-profile``, else the profile its ``IMPL_INFO``
    claims), e.g. ``{"reference": "vllm-0.33"}``.

    Valid from the end of the conformance plugin's ``pytest_configure`` on. None: no
    conformance plugin, or no implementation selected.
    """
