"""Argument types and the runner shared by the benchmark tools (``kvcheck bench TOOL``, also
``python -m kvcheck.bench.MODULE``) and the benchmark plugin's options
(``kvcheck.bench.options`` declares each option once with these types).

Every numeric argument is bounded, and every name is checked, while the command line is
parsed, so a bad value never reaches the work: no traceback, no hang (``--rounds 1e9``), no
silent pass (``--tolerance nan`` makes every ``moved > tolerance`` false). A bad argument ends
the command with exit status 2 and one line on stderr naming the argument, the value, the
bound and the fix::

    kvcheck bench stability: error: argument --rounds: 0 is not an int in [1, 10000]
    (timed pairs per case); Fix: e.g. --rounds 7

The bounds (``MAX_*``) keep the longest legitimate run finite on one machine: an A/A
stability run of every case at ``MAX_ROUNDS`` pairs and ``MAX_SCALE`` already takes hours.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from kvcheck.conformance import bounds
from kvcheck.errors import KVCheckInputError

__all__ = [
    "MAX_JOBS",
    "MAX_MIN_TIME_S",
    "MAX_REQUESTS",
    "MAX_ROUNDS",
    "MAX_RUNS",
    "MAX_SCALE",
    "MAX_SEED",
    "MAX_WARMUP",
    "BenchArgumentParser",
    "BenchTool",
    "float_in",
    "impl_error",
    "int_in",
    "name_in",
    "names_in",
    "run_tool",
    "scale_arg",
    "seed_arg",
]

#: Timed pairs (or rounds) per case, for the tools and the plugin alike: every round's raw
#: sample goes into the record, and 10^4 rounds of one case already take hours.
MAX_ROUNDS = 10_000
#: Untimed warm-up pairs (or rounds) per case.
MAX_WARMUP = 1_000
#: Back-to-back runs of every case (``stability --runs``).
MAX_RUNS = 100
#: Workload scale: request counts grow linearly with it (default 1; counting: 0.05).
MAX_SCALE = 64.0
#: Seeds fit a signed 64-bit integer: records and JSON readers keep them exact.
MAX_SEED = bounds.MAX_SEED
#: Seconds of pairs per case (``stability --min-time``).
MAX_MIN_TIME_S = 3600.0
#: Children or threads side by side.
MAX_JOBS = 64
#: Requests built per round (``request_speed --requests``).
MAX_REQUESTS = 100_000


class BenchArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``PROG: error: MESSAGE``, exit 2),
    without argparse's usage block: the message already names the argument and the fix."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def impl_error(exc: Exception) -> str:
    """A loader error (``--kv-impl=X: ...``) as these commands spell the option
    (``--impl X: ...``)."""
    return str(exc).removeprefix("kvcheck: ").replace("--kv-impl=", "--impl ", 1)


def _show(n: int) -> str:
    """A bound for a message: ``2^63-1`` rather than 19 digits."""
    if n >= 1 << 32 and (n + 1) & n == 0:
        return f"2^{n.bit_length()}-1"
    return str(n)


def _fix(example: str) -> str:
    return f"; Fix: e.g. {example}" if example else ""


def int_in(low: int, high: int, what: str, example: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an int in ``[low, high]`` (``what``: what it counts, shown in
    the message; ``example``: a good value, e.g. ``--rounds 7``)."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{_shown(text)} is not an int in [{_show(low)}, {_show(high)}] ({what})"
                f"{_fix(example)}")
        return value

    return parse


def _shown(text: str) -> str:
    """An argument as a message quotes it: at most 40 characters."""
    return text if len(text) <= 40 else f"{text[:40]}..."


def float_in(low: float, high: float, what: str, example: str = "", *,
             low_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[low, high]`` (``(low, high]`` with
    ``low_open``); NaN and infinities are refused (they compare false with everything)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above = value > low if low_open else value >= low
        if not (math.isfinite(value) and above and value <= high):
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(
                f"{_shown(text)} is not a finite number in {bracket}{low:g}, {high:g}] ({what})"
                f"{_fix(example)}")
        return value

    return parse


def name_in(choices: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse ``type``: one of ``choices`` (the message lists them)."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text[:60]!r}; Fix: use one of {', '.join(choices)}")
        return text

    return parse


def names_in(choices: Sequence[str], what: str) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated, non-empty list of ``choices`` without
    repeats (``scheduler,hashing``)."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if not names or unknown or len(set(names)) != len(names):
            problem = (f"unknown {what} {unknown}" if unknown else
                       f"no {what} named" if not names else f"a {what} named twice")
            raise argparse.ArgumentTypeError(
                f"{text[:60]!r}: {problem}; Fix: a comma-separated list of "
                f"{', '.join(choices)}")
        return names

    return parse


def seed_arg(example: str = "--seed 0") -> Callable[[str], int]:
    """An argparse ``type`` for a workload seed: an int in ``[0, MAX_SEED]``."""
    return int_in(0, MAX_SEED, "a workload seed", example)


def scale_arg(example: str = "--scale 1") -> Callable[[str], float]:
    """An argparse ``type`` for a workload scale: a finite number in ``(0, MAX_SCALE]``."""
    return float_in(0.0, MAX_SCALE, "request counts scale with it", example, low_open=True)


@dataclass(frozen=True)
class BenchTool:
    """One benchmark tool: ``kvcheck bench NAME`` (``kvcheck.bench.cli``) and its
    ``python -m MODULE`` alias run it the same way (``run_tool``).

    ``add_arguments(parser)`` declares its options (the shared ones through
    ``kvcheck.bench.options``); ``run(args, parser)`` does the work and returns the exit
    status (0 done, 1 a check failed, 2 unusable input); it may call ``parser.error`` or raise
    ``KVCheckInputError`` for input found bad after parsing (one line on stderr, exit 2)."""

    name: str
    module: str
    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int]


def run_tool(tool: BenchTool, argv: Sequence[str] | None = None,
             prog: str | None = None) -> int:
    """Parse ``argv`` (None: ``sys.argv[1:]``) with ``tool``'s options and run it; ``prog``:
    how the command was spelled (default ``python -m MODULE``). Returns the exit status; a
    ``KVCheckInputError`` from the work is one line on stderr and status 2, no traceback."""
    parser = BenchArgumentParser(prog=prog or f"python -m {tool.module}",
                                 description=tool.summary)
    tool.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return tool.run(args, parser)
    except KVCheckInputError as exc:
        print(f"{parser.prog}: error: {' '.join(impl_error(exc).split())}", file=sys.stderr)
        return 2
