"""``kvcheck bench TOOL [OPTIONS]``: the benchmark tools under one command.

``kvcheck`` (``kvcheck.plugin.cli``) hands ``bench ...`` to ``main`` here through the
``kvcheck.commands`` entry point (the plugin layer does not import bench). Each tool is a
``BenchTool`` in its own module, which is imported only when that tool runs; its
``python -m kvcheck.bench.MODULE`` form stays as an alias and behaves the same.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvcheck.bench.cli_args import BenchArgumentParser, BenchTool, run_tool

__all__ = ["PROG", "TOOLS", "main", "tool", "tool_parser"]

PROG = "kvcheck bench"
#: Subcommand -> (module defining ``TOOL``, one line of help).
TOOLS: dict[str, tuple[str, str]] = {
    "stability": ("kvcheck.bench.stability",
                  "A/A or A/B stability of the paired ratios, run after run"),
    "sweep": ("kvcheck.bench.sweep",
              "cost as pool size, prompt length and sharing grow, against the reference"),
    "counted": ("kvcheck.bench.counted",
                "instruction counts (callgrind) per case, as a record for kvcheck gate"),
    "spread": ("kvcheck.bench.count_spread",
               "the counts' spread over two runs, and the gate catching a slowed reference"),
    "request-speed": ("kvcheck.bench.request_speed",
                      "how fast a request is built: the reference's against vLLM's"),
    "kernels": ("kvcheck.bench.kernel_crosscheck",
                "kvcheck's Triton kernels against vLLM's on identical inputs"),
    "trace": ("kvcheck.bench.trace_workload",
              "dump a built-in scenario as a request trace, or inspect a trace or corpus"),
    "offload": ("kvcheck.bench.offload_bench",
                "the offload tier's policies (LRU, ARC) against the reference's"),
    "event-codec": ("kvcheck.bench.event_codec",
                    "kvcheck's KV-event codec against vLLM's, on the same batches"),
    "event-serve": ("kvcheck.bench.event_serve",
                    "publish an implementation's KV events on ZMQ as vLLM does"),
}


def _usage() -> str:
    width = max(map(len, TOOLS))
    lines = [f"usage: {PROG} TOOL [OPTIONS]  ({PROG} TOOL --help: the tool's options)", "",
             "tools:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in TOOLS.items()]
    return "\n".join(lines)


def tool(name: str) -> BenchTool:
    """The ``BenchTool`` of subcommand ``name`` (its module imported now)."""
    found: BenchTool = importlib.import_module(TOOLS[name][0]).TOOL
    return found


def tool_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``kvcheck bench NAME``, without running anything (the docs' check reads
    the options it accepts)."""
    parser = BenchArgumentParser(prog=f"{PROG} {name}", description=TOOLS[name][1])
    tool(name).add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kvcheck bench`` with ``argv`` (the words after ``bench``); returns the exit
    status (2: no tool or an unknown one, one line on stderr)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_usage(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name = args[0]
    if name not in TOOLS:
        print(f"{PROG}: error: unknown tool {name[:60]!r}; Fix: use one of "
              f"{', '.join(TOOLS)}", file=sys.stderr)
        return 2
    return run_tool(tool(name), args[1:], prog=f"{PROG} {name}")


if __name__ == "__main__":
    raise SystemExit(main())
