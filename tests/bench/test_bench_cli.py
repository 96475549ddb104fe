"""``kvcheck bench TOOL``: one command for the benchmark tools, their options declared once
(``kvcheck.bench.options``) and validated the same way by the tools and the pytest plugin."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvcheck.bench import cli
from kvcheck.bench import plugin as bench_plugin
from kvcheck.plugin import cli as kvcheck_cli

BENCH_DIR = Path(cli.__file__).resolve().parent


def _main_modules() -> set[str]:
    """The bench modules runnable as ``python -m`` (an ``if __name__ == "__main__"``)."""
    found = set()
    for path in BENCH_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body):
            found.add(f"kvcheck.bench.{path.stem}")
    return found - {"kvcheck.bench.cli"}


def test_every_runnable_bench_module_is_a_kvcheck_bench_tool() -> None:
    assert _main_modules() == {module for module, _ in cli.TOOLS.values()}
    for name, (module, _) in cli.TOOLS.items():
        tool = cli.tool(name)
        assert (tool.name, tool.module) == (name, module)
        assert cli.tool_parser(name).prog == f"kvcheck bench {name}"


def test_help_lists_every_tool_and_no_tool_is_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in cli.TOOLS), out
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: kvcheck bench TOOL")


def test_an_unknown_tool_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stabilty", "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert err == ("kvcheck bench: error: unknown tool 'stabilty'; Fix: use one of "
                   f"{', '.join(cli.TOOLS)}\n")


def test_the_alias_and_the_subcommand_say_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    from kvcheck.bench import sweep

    with pytest.raises(SystemExit):
        sweep.main(["--rounds", "0"])
    alias = capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--rounds", "0"])
    command = capsys.readouterr().err
    assert alias.startswith("python -m kvcheck.bench.sweep: error: argument --rounds: 0 ")
    assert command == alias.replace("python -m kvcheck.bench.sweep", "kvcheck bench sweep")


def test_kvcheck_hands_bench_to_its_entry_point() -> None:
    """Through the installed console script: ``kvcheck bench`` is reached by the
    ``kvcheck.commands`` entry point (the plugin layer does not import bench)."""
    script = Path(sys.executable).parent / "kvcheck"
    done = subprocess.run([str(script), "bench", "stability", "--rounds", "0"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == ("kvcheck bench stability: error: argument --rounds: 0 is not an int "
                           "in [1, 10000] (timed pairs per case); Fix: e.g. --rounds 7\n")
    listed = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                            timeout=120, check=True).stdout
    assert "    bench " in listed


def test_a_missing_entry_point_is_named_with_the_fix(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kwargs: [])
    assert kvcheck_cli.main(["bench", "--help"]) == 2
    err = capsys.readouterr().err
    assert "command 'bench' is not installed" in err and "Fix: install kvcheck again" in err


class _Group:
    """What pytest's ``parser.getgroup`` returns, recording each option."""

    def __init__(self) -> None:
        self.options: dict[str, dict[str, Any]] = {}

    def addoption(self, *flags: str, **kwargs: Any) -> None:
        self.options[flags[0]] = kwargs

    def getgroup(self, *args: object) -> _Group:
        return self


def _refusal(parse: Any, value: str) -> str:
    """The message up to what the value counts (``per case``, ``per benchmark`` differ)."""
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse(value)
    return str(info.value).split(" (")[0]


@pytest.mark.parametrize(("option", "tool", "bad"), [
    ("rounds", "stability", ["0", "10001", "x"]),
    ("warmup", "stability", ["-1", "1001"]),
    ("scale", "stability", ["0", "nan", "65"]),
    ("seed", "sweep", ["-1", str(2**63)]),
])
def test_plugin_and_tools_refuse_the_same_values(option: str, tool: str,
                                                 bad: list[str]) -> None:
    """``--kv-bench-X`` and a tool's ``--X`` take one type from ``kvcheck.bench.options``: the
    same bound, the same words (only what one round is, and the example's spelling, differ)."""
    group = _Group()
    bench_plugin.pytest_addoption(group)  # type: ignore[arg-type]
    plugin_type = group.options[f"--kv-bench-{option}"]["type"]
    tool_action = next(a for a in cli.tool_parser(tool)._actions
                       if f"--{option}" in a.option_strings)
    for value in bad:
        assert _refusal(plugin_type, value) == _refusal(tool_action.type, value)
    assert plugin_type("1") == tool_action.type("1")


def test_the_package_map_names_every_module() -> None:
    """``kvcheck.bench``'s docstring places every module and subpackage in its role (it named
    18 of 29 modules)."""
    import kvcheck.bench

    text = kvcheck.bench.__doc__ or ""
    missing = [str(path.relative_to(BENCH_DIR)) for path in BENCH_DIR.rglob("*.py")
               if path.stem != "__init__" and f"``{path.stem}``" not in text
               and f"``{path.name}``" not in text]
    assert not missing, f"bench/__init__.py does not place {missing}"
