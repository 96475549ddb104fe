"""The ``kvcheck`` command: one entry point for running, replaying and (later) comparing.

    kvcheck run --impl mypkg.kv_adapter [--profile vllm-0.10] [--report r.jsonl] [-- PYTEST_ARGS]
    kvcheck replay .kvcheck/repro/test_x.json --kv-impl=mypkg.kv_adapter

Exit codes: 0 success, 1 a check failed, 2 unusable input (bad module, trace or arguments).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _cmd_run(args: argparse.Namespace) -> int:
    import pytest

    argv = [f"--kv-impl={args.impl}"]
    if args.profile:
        argv.append(f"--kv-profile={args.profile}")
    if args.report:
        argv.append(f"--kv-report={args.report}")
    argv += args.pytest_args
    return int(pytest.main(argv))


def _cmd_replay(args: argparse.Namespace) -> int:
    import pytest

    from kvcheck.conformance.differential import ConformanceMismatch, load_trace, replay_trace
    from kvcheck.plugin.loader import load_impl

    try:
        trace = load_trace(args.trace)
    except ValueError as exc:
        print(f"kvcheck replay: {exc}", file=sys.stderr)
        return 2
    target = args.kv_impl or trace.get("impl")
    if not target:
        print("kvcheck replay: the trace names no implementation; pass --kv-impl=MODULE",
              file=sys.stderr)
        return 2
    try:
        impl = load_impl(target)
        oracle = None if args.no_oracle or trace["spec"].profile == "generic" else (
            load_impl("reference"))
    except pytest.UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        replay_trace(trace, impl, oracle)
    except ConformanceMismatch as exc:
        print(f"kvcheck replay: {impl.name} diverges\n{exc}")
        return 1
    against = "laws only" if oracle is None else f"compared with {oracle.name}"
    print(f"kvcheck replay: {len(trace['ops'])} ops on {impl.name} ({against}): no divergence")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcheck",
        description="Check paged KV-cache managers against vLLM V1 semantics.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the conformance suite (a thin wrapper over pytest)")
    run.add_argument("--impl", required=True, help="implementation module (as --kv-impl)")
    run.add_argument("--profile", choices=("vllm-0.33", "vllm-0.10", "generic"))
    run.add_argument("--report", help="write a JSON Lines result record here")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER,
                     help="further pytest arguments, after --")
    run.set_defaults(func=_cmd_run)

    replay = sub.add_parser("replay", help="re-run a JSON trace written by a failing test")
    replay.add_argument("trace", help="path of the trace (.kvcheck/repro/*.json)")
    replay.add_argument("--kv-impl", help="implementation to replay on (default: the one "
                        "recorded in the trace)")
    replay.add_argument("--no-oracle", action="store_true",
                        help="check the laws only, without comparing with the reference")
    replay.set_defaults(func=_cmd_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "pytest_args", None) and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
