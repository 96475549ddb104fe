"""``kvcheck bench trace``: write a built-in scenario as a request trace file (``dump``), or
describe a request trace or a recorded corpus (``inspect``). The file format is
``kvcheck.bench.workload.request_trace``'s; a workload's name is resolved by
``kvcheck.bench.workload.source``.

::

    kvcheck bench trace dump multi_turn_chat -o chat.jsonl
    kvcheck bench trace inspect mooncake_trace.jsonl
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.workload.request_trace import dump_workload
from kvcheck.bench.workload.scenarios import (
    SCENARIOS,
    make_workload,
    trace_profile,
)
from kvcheck.bench.workload.source import (
    TRACE_PREFIX,
    RecordedWorkload,
    WorkloadSource,
    resolve_workload,
)

__all__ = ["MAX_DUMP_SCALE", "TOOL", "describe", "main"]

#: ``dump --scale`` at most this: the largest scenario (eviction_pressure, 2.8 * 10**5 tokens
#: at scale 1) then stays within a trace's 2**24 tokens, so every dump loads back.
MAX_DUMP_SCALE = 32.0


def describe(workload: WorkloadSource) -> list[str]:
    """Human-readable lines: size, limits and ``trace_profile`` of a workload (a recorded
    corpus: what was recorded, traces and steps)."""
    if isinstance(workload, RecordedWorkload):
        header = workload.corpus["header"]
        return [(f"{workload.scenario}: recorded corpus of {header['impl']} "
                f"{header['impl_version']} ({header['profile']}), {header['traces']} traces, "
                f"{header['steps']} steps; replayed call by call")]
    profile = trace_profile(workload.requests, workload.block_size)
    return [
        (f"{workload.scenario}: {len(workload.requests)} requests, "
         f"{workload.num_prompt_tokens} prompt + {workload.num_output_tokens} output tokens"),
        (f"pool {workload.num_blocks} blocks of {workload.block_size} tokens (working set "
         f"{workload.working_set_blocks}), max_num_seqs {workload.max_num_seqs}, "
         f"max_num_batched_tokens {workload.max_num_batched_tokens}"),
        "prompt tokens p10/p50/p90/max: " + "/".join(
            f"{profile[f'prompt_tokens_{q}']:.0f}" for q in ("p10", "p50", "p90", "max")),
        f"shared-prefix fraction of full prompt blocks: {profile['shared_prefix_fraction']:.3f}",
        f"digest {workload.digest()}",
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvcheck.bench.cli_args import float_in
    from kvcheck.bench.options import add_seed_option

    sub = parser.add_subparsers(dest="command", required=True)
    dump = sub.add_parser("dump", help="write a built-in scenario as a trace file")
    dump.add_argument("scenario", help=f"one of {', '.join(SCENARIOS)}")
    dump.add_argument("-o", "--output", required=True, metavar="PATH")
    add_seed_option(dump.add_argument)
    # A larger scenario would not load back within a trace's 2^24 tokens.
    dump.add_argument("--scale", type=float_in(0.0, MAX_DUMP_SCALE, "a trace file holds at "
                                               "most 2^24 tokens", "--scale 1", low_open=True),
                      default=1.0, metavar="F",
                      help=f"scenario scale, in (0, {MAX_DUMP_SCALE:g}] (default 1)")
    inspect = sub.add_parser("inspect", help="read a trace file and describe it")
    inspect.add_argument("path", help="a request trace (.jsonl) or a recorded corpus "
                         "(.cbor.xz)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``dump`` a built-in scenario as a trace file, or ``inspect`` a trace file."""
    if args.command == "dump":
        from kvcheck.results.io import check_output_path

        check_output_path(args.output, "-o", example="trace.jsonl")  # before the work
        written = dump_workload(make_workload(args.scenario, args.seed, args.scale),
                                args.output)
        print(f"wrote {os.fspath(written)}")
    else:
        print("\n".join(describe(resolve_workload(TRACE_PREFIX + args.path))))
    return 0


TOOL = BenchTool("trace", "kvcheck.bench.trace_workload", __doc__.split("\n\n")[0],
                 add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.trace_workload``: the same as ``kvcheck bench trace``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    raise SystemExit(main())
