"""The `kvcheck` command's own surface: `--version`, and help text on every option of every
subcommand (what `kvcheck COMMAND --help` shows a newcomer)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

import kvcheck
from kvcheck.plugin.cli import build_parser, main


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"kvcheck \d+\.\d+\.\d+\S*\n", out), out
    assert out == f"kvcheck {kvcheck.__version__}\n"


def test_version_from_the_console_script() -> None:
    proc = subprocess.run([sys.executable, "-m", "kvcheck.plugin.cli", "--version"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (0, f"kvcheck {kvcheck.__version__}\n")


def test_every_option_of_every_subcommand_has_help() -> None:
    parser = build_parser()
    subs = subparsers(parser)
    assert {"run", "replay", "compare", "gate", "leaderboard", "new-adapter"} <= set(subs)
    missing = []
    for name, sub in [("kvcheck", parser), *subs.items()]:
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_every_subcommand_has_a_one_line_help() -> None:
    (action,) = [a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help for c in action._choices_actions}
    assert set(helps) == set(action.choices)
    assert all(h and h.strip() for h in helps.values()), helps
