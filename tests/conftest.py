"""Fixtures shared by the test folders (plain helpers live in ``kv_helpers``)."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Bytecode caching on for the Python processes these tests start (hundreds of pytest runs,
# CLIs and servers over the same sources): with PYTHONDONTWRITEBYTECODE set, as CI machines
# often have it, each one compiled kvcheck and rewrote the suite's asserts again, about 2 s a
# start. The variable is dropped here, before xdist starts its workers, so they and every child
# inherit the default; __pycache__ is in .gitignore.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False


@pytest.fixture
def impl_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) \
        -> Iterator[Callable[[str, str], str]]:
    """``make(name, body)`` writes module ``name`` (``body`` dedented) where it imports, and
    returns ``name`` (for ``--kv-impl``/``load_impl``); the modules are forgotten at the end."""
    made: list[str] = []

    def make(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        made.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in made:
        sys.modules.pop(name, None)


def pytest_configure(config: pytest.Config) -> None:
    # Our own suite lists its slowest tests unless asked otherwise (`--durations=N`): CI's log
    # then shows where its minutes go (docs/ci.md), with no extra run.
    if getattr(config.option, "durations", None) is None:
        config.option.durations = 30
