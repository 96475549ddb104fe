"""The ``kvcheck`` command: one entry point for running, replaying, comparing and gating.

    kvcheck run --impl mypkg.kv_adapter [--profile vllm-0.10] [--report r.jsonl] [-- PYTEST_ARGS]
    kvcheck replay .kvcheck/repro/test_x.json --kv-impl=mypkg.kv_adapter
    kvcheck compare base.jsonl r.jsonl
    kvcheck gate --baseline base.jsonl --current r.jsonl [--threshold mean:5%] [--waivers W]
    kvcheck leaderboard results/records/*.jsonl r.jsonl --format html -o leaderboard.html

Exit codes: 0 success, 1 a check failed (a divergence, a gated regression), 2 unusable input
(bad module, trace, record file or arguments; the message names the file and field).
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


def _fail_input(command: str, exc: Exception) -> int:
    print(f"kvcheck {command}: {exc}", file=sys.stderr)
    return 2


def _cmd_compare(args: argparse.Namespace) -> int:
    from kvcheck.results.compare import (
        group_records,
        load_files,
        pair_groups,
        render_compare,
    )
    from kvcheck.results.schema import RecordError

    try:
        base, cur = load_files([args.a]), load_files([args.b])
    except RecordError as exc:
        return _fail_input("compare", exc)
    pairs = pair_groups(group_records(base), group_records(cur), pair_singletons=True)
    sys.stdout.write(render_compare(pairs))
    return 0


def _cmd_gate(args: argparse.Namespace) -> int:
    from kvcheck.results.compare import load_files
    from kvcheck.results.gate import (
        GateConfig,
        GateInputError,
        load_thresholds_file,
        load_waivers,
        parse_rule,
        render_gate,
        render_gate_markdown,
        run_gate,
    )
    from kvcheck.results.io import write_atomic
    from kvcheck.results.schema import RecordError

    try:
        if not 0 < args.alpha < 1:
            raise GateInputError(f"--alpha {args.alpha}: must be between 0 and 1")
        config = GateConfig(alpha=args.alpha)
        if args.thresholds_file:
            config.thresholds, config.floors = load_thresholds_file(args.thresholds_file)
        config.thresholds += [parse_rule(t, "--threshold") for t in args.threshold]
        config.floors += [parse_rule(f, "--floor", allow_percent=False) for f in args.floor]
        if args.waivers:
            config.waivers = load_waivers(args.waivers)
        baseline, current = load_files(args.baseline), load_files(args.current)
    except (RecordError, GateInputError) as exc:
        return _fail_input("gate", exc)
    result = run_gate(baseline, current, config)
    sys.stdout.write(render_gate(result, verbose=args.verbose))
    if args.markdown:
        try:
            write_atomic(args.markdown, render_gate_markdown(result, verbose=args.verbose))
        except OSError as exc:
            return _fail_input("gate", f"--markdown {args.markdown}: cannot write ({exc})")
    return result.exit_code


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    from kvcheck.results.compare import load_files
    from kvcheck.results.html import render_html
    from kvcheck.results.io import write_atomic
    from kvcheck.results.leaderboard import build_boards, render_markdown, render_table
    from kvcheck.results.schema import RecordError

    try:
        records = load_files(args.files)
    except RecordError as exc:
        return _fail_input("leaderboard", exc)
    boards = build_boards(records, reference=args.reference, metric_patterns=args.metric)
    render = {"table": render_table, "markdown": render_markdown, "html": render_html}
    text = render[args.format](boards)
    if args.output:
        try:
            path = write_atomic(args.output, text)
        except OSError as exc:
            return _fail_input("leaderboard", f"-o {args.output}: cannot write ({exc})")
        print(f"kvcheck leaderboard: {len(boards)} table(s) written to {path}")
    else:
        sys.stdout.write(text)
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

    compare = sub.add_parser(
        "compare", help="show what differs between two result files (informational, exit 0)",
        description="Pair the records of A and B by implementation, kind and profile (or, when "
                    "each holds one implementation, those two) and show differing test "
                    "outcomes and metrics with one-sided Mann-Whitney p-values.")
    compare.add_argument("a", metavar="A", help="result file (JSON Lines), the 'before'")
    compare.add_argument("b", metavar="B", help="result file (JSON Lines), the 'after'")
    compare.set_defaults(func=_cmd_compare)

    gate = sub.add_parser(
        "gate", help="fail (exit 1) on a regression of the current run against a baseline",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Exit 1 if a conformance test that passed in the baseline fails now, or\n"
                    "if a metric got worse by more than its threshold AND significantly\n"
                    "(one-sided Mann-Whitney U on the raw samples, p < alpha) AND by more\n"
                    "than its floor. Records from a different hardware key are 'no baseline'\n"
                    "(warning, exit 0). Exit 2 on unusable input.",
        epilog="SEL matches a metric's key (case/name), name, stat or unit; '*' is a\n"
               "wildcard; the most specific match wins.\n\nexamples:\n"
               "  kvcheck gate --baseline base.jsonl --current r.jsonl\n"
               "  kvcheck gate --baseline b.jsonl --current c.jsonl --threshold 10% \\\n"
               "      --threshold 'decode*:3%' --floor us:0.5 --waivers waivers.txt")
    gate.add_argument("--baseline", action="append", required=True, metavar="FILE",
                      help="baseline result file (repeatable)")
    gate.add_argument("--current", action="append", required=True, metavar="FILE",
                      help="current result file (repeatable)")
    gate.add_argument("--threshold", action="append", default=[], metavar="[SEL:]N[%]",
                      help="allowed worsening: percent of the baseline value (default 5%%) "
                           "or absolute in the metric's unit; repeatable")
    gate.add_argument("--floor", action="append", default=[], metavar="[SEL:]N",
                      help="ignore worsenings up to N (metric's unit); default 0; repeatable")
    gate.add_argument("--thresholds-file", metavar="FILE",
                      help="lines 'threshold SEL:N[%%]' / 'floor SEL:N' (# comments); the "
                           "command-line options are applied after it")
    gate.add_argument("--alpha", type=float, default=0.01,
                      help="significance level of the Mann-Whitney test (default 0.01)")
    gate.add_argument("--waivers", metavar="FILE",
                      help="accepted regressions: 'test-id-or-metric-key  # reason' per line")
    gate.add_argument("-v", "--verbose", action="store_true",
                      help="also list the metrics that stayed within their thresholds")
    gate.add_argument("--markdown", metavar="OUT",
                      help="also write the report as Markdown (e.g. for $GITHUB_STEP_SUMMARY)")
    gate.set_defaults(func=_cmd_gate)

    board = sub.add_parser(
        "leaderboard", help="tables comparing implementations, one per hardware key",
        description="One row per implementation and profile: conformance verdict per area, "
                    "metrics and their ratio to the reference. Records measured on different "
                    "hardware keys go to separate tables.")
    board.add_argument("files", nargs="+", metavar="FILE", help="result files (JSON Lines)")
    board.add_argument("--format", choices=("table", "markdown", "html"), default="table",
                       help="table (terminal, default), markdown, or html (one self-contained "
                            "page with bar charts and sortable columns)")
    board.add_argument("-o", "--output", metavar="OUT", help="write here (atomically) instead "
                       "of standard output")
    board.add_argument("--reference", default="reference", metavar="NAME",
                       help="implementation the ratios are relative to (default: reference)")
    board.add_argument("--metric", action="append", default=[], metavar="PATTERN",
                       help="show only metrics whose key or name matches ('*' wildcard); "
                            "repeatable")
    board.set_defaults(func=_cmd_leaderboard)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "pytest_args", None) and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
