"""The ``kvcheck`` command: one entry point for running, replaying, comparing and gating.

    kvcheck run --impl mypkg.kv_adapter [--profile vllm-0.10] [--report r.jsonl] [-- PYTEST_ARGS]
    kvcheck replay .kvcheck/repro/test_x.json --kv-impl=mypkg.kv_adapter
    kvcheck compare base.jsonl r.jsonl
    kvcheck gate --baseline base.jsonl --current r.jsonl [--threshold mean:5%] [--waivers W]
    kvcheck leaderboard results/records/*.jsonl r.jsonl --format html -o leaderboard.html
    kvcheck new-adapter myengine_adapter       (writes myengine_adapter.py and pytest.ini)
    kvcheck record --kv-impl=vllm --kv-profile=vllm-0.33 -o vllm-0.33.cbor.xz
    kvcheck record --check conformance/corpus/vllm-0.33.cbor.xz
    kvcheck events capture tcp://127.0.0.1:5557 -o stream.kvcap   (kvcheck[events])
    kvcheck events check stream.kvcap --format vllm-0.33
    kvcheck --version

Exit codes: 0 success, 1 a check failed (a divergence, a gated regression, a stale corpus), 2
unusable input (bad module, trace, record or corpus file, or arguments; the message names the
file and field).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]

# kvcheck.conformance.recorder.DEFAULT_TRACES (every planned trace: vLLM 0.33's default; 0.10
# records those its release runs, recorder.default_traces), spelled here so `kvcheck --help`
# imports nothing heavy (tests/plugin/test_cli_record.py checks they agree).
_DEFAULT_TRACES = 80


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
    """Exit 0: no divergence; 1: the implementation diverges, breaks the protocol or hangs;
    2: unusable input (the trace, the module, the options), never blamed on the
    implementation."""
    from kvcheck.conformance.call_floor import apply_floor, oracle_timeout
    from kvcheck.conformance.call_limit import DEFAULT_CALL_TIMEOUT, AdapterRaised, AdapterTimeout
    from kvcheck.conformance.differential import ConformanceMismatch, load_trace, replay_trace
    from kvcheck.conformance.guard import ProtocolViolation
    from kvcheck.conformance.interrupts import watch_user_interrupts
    from kvcheck.conformance.loader import ImplLoadError, load_impl
    from kvcheck.conformance.protocol import UnsupportedSpec
    from kvcheck.plugin.replay_spec import replay_spec_problem

    timeout = DEFAULT_CALL_TIMEOUT if args.kv_timeout is None else args.kv_timeout
    if not timeout >= 0 or timeout == float("inf"):
        print(f"kvcheck replay: --kv-timeout={timeout}: must be a finite number of seconds >= 0"
              " (0 = no limit)", file=sys.stderr)
        return 2
    watch_user_interrupts()  # an adapter's own KeyboardInterrupt is not a Ctrl-C
    try:
        trace = load_trace(args.trace)  # fully validated before anything runs
    except ValueError as exc:
        print(f"kvcheck replay: {exc}", file=sys.stderr)
        return 2
    target = args.kv_impl or trace.get("impl")
    if not target or not target.strip():
        print("kvcheck replay: the trace names no implementation; pass --kv-impl=MODULE",
              file=sys.stderr)
        return 2
    timeout, note = apply_floor(timeout)  # never below what the reference's calls take
    if note:
        print(f"kvcheck replay: {note}", file=sys.stderr)
    try:
        impl = load_impl(target, call_timeout=timeout)
        oracle = None if args.no_oracle or trace["spec"].profile == "generic" else (
            load_impl("reference", call_timeout=oracle_timeout(timeout)))
    except ImplLoadError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    spec = trace["spec"]
    problem = replay_spec_problem(args.trace, spec, impl.name, impl.info)
    if problem is not None:  # a spec it never claimed: no verdict on it, never "diverges"
        print(f"kvcheck replay: {problem}", file=sys.stderr)
        return 2
    try:
        replay_trace(trace, impl, oracle)
    except ConformanceMismatch as exc:
        print(f"kvcheck replay: {impl.name} diverges\n{exc}")
        return 1
    except UnsupportedSpec as exc:
        print(f"kvcheck replay: {args.trace}: {impl.name} declines the trace's spec "
              f"(UnsupportedSpec: {exc})", file=sys.stderr)
        return 2
    except AdapterTimeout as exc:  # the factory itself hung
        print(f"kvcheck replay: {impl.name} hangs: {exc}")
        return 1
    except (AdapterRaised, ProtocolViolation) as exc:  # before the first op: the factory...
        print(f"kvcheck replay: {impl.name} fails before the first op: {exc}")
        return 1
    against = "laws only" if oracle is None else f"compared with {oracle.name}"
    print(f"kvcheck replay: {len(trace['ops'])} ops on {impl.name} ({against}): no divergence")
    return 0


def _cmd_record(args: argparse.Namespace) -> int:
    """``kvcheck record``: record a corpus of an implementation's behaviour (``-o``), or
    re-record one with its header's parameters and compare (``--check``). Exit 0: written, or
    up to date; 1: the corpus is stale (the first difference is named); 2: unusable input.

    ``-o`` is checked and locked before anything is recorded: a path no file can be
    written at, a file another run is recording into, or an existing file that is not a
    corpus (unless ``--force``) is refused at once."""
    from pathlib import Path

    from kvcheck.plugin.outputs import is_corpus_file
    from kvcheck.plugin.record_args import record_argument_problem
    from kvcheck.results.io import OutputPathError, check_output_path, lock_output

    if (args.check is None) == (args.output is None):
        return _fail_input("record", "pass -o PATH (record a corpus) or --check PATH (compare "
                           "a corpus with a fresh recording), one of the two")
    problem = record_argument_problem(args, _DEFAULT_TRACES)
    if problem is not None:  # before -o is claimed and anything is loaded or recorded
        return _fail_input("record", problem)
    if args.output is None:
        return _record_or_check(args)
    example = "corpus.cbor.xz"
    try:
        check_output_path(args.output, "-o", example=example)
        if Path(args.output).is_file() and not args.force and not is_corpus_file(args.output):
            raise OutputPathError(
                f"-o {args.output}: exists and is not a kvcheck corpus, so recording would "
                f"replace it; name a new file (e.g. -o {example}), or pass --force to "
                "replace it")
        lock = lock_output(args.output, "-o", example=example)
    except OutputPathError as exc:
        return _fail_input("record", exc)
    try:
        return _record_or_check(args)
    finally:
        lock.release()


def _record_or_check(args: argparse.Namespace) -> int:
    """``kvcheck record`` once its output is claimed (``_cmd_record``)."""
    from kvcheck.conformance.loader import ImplLoadError, load_impl
    from kvcheck.conformance.recorded import (
        CorpusError,
        encode_corpus,
        first_difference,
        load_corpus,
        make_corpus,
        rerecord,
        write_corpus,
    )
    from kvcheck.conformance.recorder import default_traces, record_corpus
    from kvcheck.plugin.record_args import check_profile

    try:
        shipped = None if args.check is None else load_corpus(args.check)
    except CorpusError as exc:
        return _fail_input("record", exc)
    mismatch = None if shipped is None else check_profile(
        args, shipped["header"]["profile"], args.check)
    if mismatch is not None:
        return _fail_input("record", mismatch)
    seed = 0 if args.seed is None else args.seed
    target = args.kv_impl or (shipped["header"]["target"] if shipped else "vllm")
    try:
        impl = load_impl(target)
    except ImplLoadError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if shipped is not None:
        header = shipped["header"]
        fresh = rerecord(shipped, impl)
        difference = first_difference(shipped, fresh)
        recorded = f"{header['impl']} {header['impl_version']}"
        now = f"{impl.name} {impl.info.version}"
        if difference is not None:
            print(f"kvcheck record: {args.check} is stale: recorded from {recorded}, "
                  f"{now} now behaves differently at {difference}\n"
                  f"  Fix: record it again: kvcheck record --kv-impl={target} "
                  f"--kv-profile={header['profile']} --traces {header['traces']} "
                  f"--seed {header['seed']} -o {args.check}")
            return 1
        note = "" if recorded == now else f" (recorded from {recorded})"
        print(f"kvcheck record: {args.check} is up to date: {header['traces']} traces, "
              f"{header['steps']} steps replay identically on {now}{note}")
        return 0
    profile = args.kv_profile or impl.info.profile
    if profile == "generic":
        return _fail_input("record", "--kv-profile=generic: a corpus records one vLLM "
                           "profile's exact behaviour; pass vllm-0.33 or vllm-0.10")
    if profile != impl.info.profile and impl.module.__name__ != "kvcheck.adapters.reference":
        print(f"kvcheck record: warning: {impl.name} {impl.info.version} claims profile "
              f"{impl.info.profile}; recording it under {profile}", file=sys.stderr)
    traces = default_traces(profile) if args.traces is None else args.traces
    corpus = make_corpus(record_corpus(impl, profile, traces, seed),
                         profile=profile, impl=impl, seed=seed)
    data = encode_corpus(corpus)
    try:
        path = write_corpus(args.output, data)
    except OSError as exc:
        return _fail_input("record", f"-o {args.output}: cannot write ({exc})")
    header = corpus["header"]
    print(f"kvcheck record: {header['traces']} traces, {header['steps']} steps of {impl.name} "
          f"{impl.info.version} under {profile} written to {path} ({len(data)} bytes)")
    return 0


def _cmd_new_adapter(args: argparse.Namespace) -> int:
    from kvcheck.plugin.scaffold import ScaffoldError, write_skeleton

    if args.lang is not None:
        from kvcheck.plugin.wire_scaffold import write_wire_skeleton

        try:
            written, next_step = write_wire_skeleton(args.name, args.dir, args.lang,
                                                     args.profile)
        except ScaffoldError as exc:
            return _fail_input("new-adapter", exc)
        for path in written:
            print(f"kvcheck new-adapter: wrote {path}")
        print(f"kvcheck new-adapter: next: `{next_step}` runs the suite on {args.name} over "
              "the wire (every method answers an error naming what to write; see "
              "docs/wire-protocol.md)")
        return 0
    try:
        written = write_skeleton(args.name, args.dir, profile=args.profile)
    except ScaffoldError as exc:
        return _fail_input("new-adapter", exc)
    for path in written:
        print(f"kvcheck new-adapter: wrote {path}")
    where = "" if args.dir == "." else f"cd {args.dir} && "
    print(f"kvcheck new-adapter: next: `{where}pytest -x` runs the suite on {args.name} "
          "(every method raises NotImplementedError until you implement it; see "
          "docs/writing-an-adapter.md)")
    return 0


def _fail_input(command: str, exc: Exception | str) -> int:
    """Print ``kvcheck COMMAND: message`` to stderr and return exit code 2 (unusable input)."""
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
        KindMismatchError,
        load_thresholds_file,
        load_waivers,
        parse_rule,
        render_gate,
        render_gate_markdown,
        run_gate,
    )
    from kvcheck.results.io import OutputPathError, check_output_path, write_atomic
    from kvcheck.results.schema import RecordError

    try:
        if args.markdown is not None:  # before anything is read or written
            inputs = [*args.baseline, *args.current, *filter(None, (args.waivers,
                                                                      args.thresholds_file))]
            check_output_path(args.markdown, "--markdown", inputs, example="gate.md")
        if not 0 < args.alpha < 1:
            raise GateInputError(f"--alpha {args.alpha}: must be between 0 and 1")
        config = GateConfig(alpha=args.alpha, allow_missing=args.allow_missing,
                            allow_incomplete=args.allow_incomplete,
                            allow_empty=args.allow_empty)
        if args.thresholds_file:
            config.thresholds, config.floors = load_thresholds_file(args.thresholds_file)
        config.thresholds += [parse_rule(t, "--threshold") for t in args.threshold]
        config.floors += [parse_rule(f, "--floor", allow_percent=False) for f in args.floor]
        if args.waivers:
            config.waivers = load_waivers(args.waivers)
        baseline, current = load_files(args.baseline), load_files(args.current)
        result = run_gate(baseline, current, config)  # KindMismatchError: a usage error
    except (RecordError, GateInputError, OutputPathError, KindMismatchError) as exc:
        return _fail_input("gate", exc)
    sys.stdout.write(render_gate(result, verbose=args.verbose))
    if args.markdown is not None:
        try:
            write_atomic(args.markdown, render_gate_markdown(result, verbose=args.verbose))
        except OSError as exc:
            return _fail_input("gate", f"--markdown {args.markdown}: cannot write ({exc})")
    return result.exit_code


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    from kvcheck.results.compare import load_files
    from kvcheck.results.html import render_html
    from kvcheck.results.io import OutputPathError, check_output_path, write_atomic
    from kvcheck.results.leaderboard import build_boards, render_markdown, render_table
    from kvcheck.results.schema import RecordError

    try:
        if args.output is not None:  # before anything is read or written
            example = {"html": "leaderboard.html", "markdown": "leaderboard.md"}.get(
                args.format, "leaderboard.txt")
            check_output_path(args.output, "-o", args.files, example=example)
        records = load_files(args.files)
    except (RecordError, OutputPathError) as exc:
        return _fail_input("leaderboard", exc)
    boards = build_boards(records, reference=args.reference, metric_patterns=args.metric)
    render = {"table": render_table, "markdown": render_markdown, "html": render_html}
    text = render[args.format](boards)
    if args.output is not None:
        try:
            path = write_atomic(args.output, text)
        except OSError as exc:
            return _fail_input("leaderboard", f"-o {args.output}: cannot write ({exc})")
        print(f"kvcheck leaderboard: {len(boards)} table(s) written to {path}")
    else:
        sys.stdout.write(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from kvcheck import __version__
    from kvcheck.conformance.protocol import PROFILES

    parser = argparse.ArgumentParser(
        prog="kvcheck",
        description="Check paged KV-cache managers against vLLM V1 semantics.")
    parser.add_argument("--version", action="version", version=f"kvcheck {__version__}",
                        help="print kvcheck's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the conformance suite (a thin wrapper over pytest)")
    run.add_argument("--impl", required=True, metavar="MODULE[:FACTORY][,...]",
                     help="implementation(s) under test, as pytest's --kv-impl (e.g. "
                          "mypkg.kv_adapter, or 'reference')")
    run.add_argument("--profile", choices=PROFILES,
                     help="behaviour to check against, as --kv-profile (default: the profile "
                          "IMPL_INFO claims)")
    run.add_argument("--report", metavar="PATH",
                     help="write the JSON Lines result record here, as --kv-report "
                          "(replaced atomically)")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER,
                     help="further pytest arguments, after -- (e.g. -- -q -n 2)")
    run.set_defaults(func=_cmd_run)

    new_adapter = sub.add_parser(
        "new-adapter", help="write a documented adapter skeleton NAME.py and a pytest.ini",
        description="Write NAME.py (an adapter skeleton: IMPL_INFO, the factory and every "
                    "protocol method, each raising NotImplementedError until you implement "
                    "it, with the capability it belongs to) and pytest.ini (so that `pytest` "
                    "in this folder runs the suite on it) into a folder. Existing files are "
                    "never overwritten. See docs/writing-an-adapter.md.")
    new_adapter.add_argument("name", metavar="NAME",
                             help="module name of the adapter: a Python identifier, e.g. "
                                  "myengine_adapter")
    new_adapter.add_argument("--dir", default=".", metavar="DIR",
                             help="folder to write into (default: the current folder)")
    new_adapter.add_argument("--profile", choices=PROFILES, default="generic",
                             help="profile IMPL_INFO claims (default generic: the laws every "
                                  "design must keep; switch to vllm-0.33 once it conforms)")
    new_adapter.add_argument("--lang", choices=("rust", "cpp", "js"), default=None,
                             help="write a shim skeleton in this language instead, speaking "
                                  "the wire protocol (docs/wire-protocol.md), and a pytest.ini "
                                  "running the suite on it with --kv-impl=exec:...")
    new_adapter.set_defaults(func=_cmd_new_adapter)

    replay = sub.add_parser("replay", help="re-run a JSON trace written by a failing test")
    replay.add_argument("trace", help="path of the trace (.kvcheck/repro/*.json)")
    replay.add_argument("--kv-impl", help="implementation to replay on (default: the one "
                        "recorded in the trace)")
    replay.add_argument("--no-oracle", action="store_true",
                        help="check the laws only, without comparing with the reference")
    replay.add_argument("--kv-timeout", type=float, default=None, metavar="SECONDS",
                        help="per-call limit on every adapter call, as the pytest option "
                             "(default 60; 0 = no limit; raised to this machine's floor, at "
                             "least 0.25 s)")
    replay.set_defaults(func=_cmd_replay)

    record = sub.add_parser(
        "record", help="record an implementation's behaviour as a replayable corpus, or "
                       "check that a corpus is up to date",
        description="Drive the implementation (vLLM by default) through seeded "
                    "scheduler-like traces and record every call, its answer and the "
                    "observable state after every step, as the corpus the `recorded` area "
                    "replays (CBOR, xz-compressed; written atomically). With --check PATH, "
                    "record again with PATH's own parameters and exit 1, naming the first "
                    "differing trace and step, if the behaviour changed. See "
                    "docs/recorded.md.")
    record.add_argument("--kv-impl", metavar="MODULE[:FACTORY]",
                        help="implementation to record (default: vllm; with --check, the one "
                             "the corpus was recorded with)")
    record.add_argument("--kv-profile", choices=PROFILES,
                        help="profile to record under (default: the one IMPL_INFO claims)")
    record.add_argument("-o", "--output", metavar="PATH",
                        help="write the corpus here (e.g. conformance/corpus/vllm-0.33.cbor.xz); "
                             "an existing file that is not a corpus is refused unless --force")
    record.add_argument("--force", action="store_true",
                        help="with -o: replace an existing file even if it is not a corpus")
    record.add_argument("--check", metavar="PATH",
                        help="re-record the corpus at PATH with its header's parameters and "
                             "fail (exit 1) if anything differs")
    # Defaults None: given beside --check (whose corpus header decides) they are refused.
    record.add_argument("--traces", type=int, default=None, metavar="N",
                        help=f"traces to record, 1 to 10000 (default: every planned trace the "
                             f"profile's vLLM runs, {_DEFAULT_TRACES} under vllm-0.33)")
    record.add_argument("--seed", type=int, default=None, metavar="S",
                        help="seed of the traces' moves, 0 to 2^63-1 (default 0)")
    record.set_defaults(func=_cmd_record)

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
        description="Exit 1 if a current conformance record does not conform (a failed or\n"
                    "errored test not matched by a waiver, baseline or not) or is incomplete\n"
                    "(not every applicable test ran), if a conformance test that passed in\n"
                    "the baseline fails now or is missing from the current record, if a\n"
                    "metric got worse by more than its threshold AND significantly (one-sided\n"
                    "Mann-Whitney U on the raw samples, p < alpha) AND by more than its\n"
                    "floor, or if nothing was compared (--allow-empty accepts that).\n"
                    "Conformance records pair whatever their hardware keys (outcomes do not\n"
                    "depend on the machine); benchmark records only on one key. Exit 2 on\n"
                    "unusable input, e.g. a baseline of another record kind.",
        epilog="SEL matches a metric's key (case/name), name, stat or unit; '*' is a\n"
               "wildcard; the most specific match wins.\n\nexamples:\n"
               "  kvcheck gate --baseline base.jsonl --current r.jsonl\n"
               "  kvcheck gate --baseline b.jsonl --current c.jsonl --threshold 10% \\\n"
               "      --threshold 'decode*:3%' --floor us:0.5 --waivers waivers.txt")
    gate.add_argument("--baseline", action="append", default=[], metavar="FILE",
                      help="baseline result file (repeatable); without one the current "
                           "records are judged alone and only --allow-empty lets it pass")
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
    gate.add_argument("--allow-missing", action="store_true",
                      help="accept tests that passed in the baseline but are absent from the "
                           "current record (a waiver can accept single tests instead)")
    gate.add_argument("--allow-incomplete", action="store_true",
                      help="accept a current conformance record of an incomplete run "
                           "(complete: false: -k, -x, Ctrl-C...)")
    gate.add_argument("--allow-empty", action="store_true",
                      help="exit 0 (with a warning) when nothing was compared: no current "
                           "record had a comparable baseline (a first run, a new "
                           "implementation); each conformance record's own verdict still "
                           "counts")
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
                       "of standard output; never one of the input FILEs")
    board.add_argument("--reference", default="reference", metavar="NAME",
                       help="implementation the ratios are relative to (default: reference)")
    board.add_argument("--metric", action="append", default=[], metavar="PATTERN",
                       help="show only metrics whose key or name matches ('*' wildcard); "
                            "repeatable")
    board.set_defaults(func=_cmd_leaderboard)

    from kvcheck.plugin.events_cli import add_events_parser  # imports nothing heavy
    add_events_parser(sub)

    # Listed here for `kvcheck --help` only: main hands every word after `bench` to the
    # command itself (kvcheck.bench.cli, which lists its tools), before this parser runs.
    bench = sub.add_parser("bench", add_help=False,
                           help="the benchmark tools (kvcheck bench --help lists them)")
    bench.add_argument("words", nargs=argparse.REMAINDER, metavar="TOOL ...",
                       help="a tool and its options (kvcheck bench TOOL --help)")
    return parser


#: Commands another kvcheck layer provides through this entry-point group (``bench``:
#: ``kvcheck.bench.cli:main``), so that this layer needs no import of it.
COMMANDS_GROUP = "kvcheck.commands"


def _installed_command(name: str, words: Sequence[str]) -> int:
    """Run command ``name`` of the ``kvcheck.commands`` entry points with ``words``."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=COMMANDS_GROUP, name=name))
    if not found:
        print(f"kvcheck: error: command {name!r} is not installed (no {COMMANDS_GROUP!r} entry "
              "point); Fix: install kvcheck again (pip install -e . in a checkout), which "
              "declares it", file=sys.stderr)
        return 2
    return int(found[0].load()(list(words)))


def main(argv: Sequence[str] | None = None) -> int:
    from kvcheck.errors import KVCheckError, KVCheckFailure

    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["bench"]:  # its own parser reads every word after it, --help included
        return _installed_command("bench", words[1:])
    args = build_parser().parse_args(words)
    if getattr(args, "pytest_args", None) and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    try:
        return int(args.func(args))
    except KVCheckFailure:
        raise  # a failed check the command did not report itself: keep its traceback
    except KVCheckError as exc:
        # Every kvcheck error not handled by its command is unusable input: exit 2, no
        # traceback (the message names the problem and the fix).
        return _fail_input(args.command, exc)


if __name__ == "__main__":
    sys.exit(main())
