"""Branch coverage of ``reference_impl/`` reached by the random and differential tests alone.

    python scripts/coverage_report.py            # from the repository root, dev venv active
    python scripts/coverage_report.py --min 90   # another threshold

Runs, under coverage.py with branch coverage, on ``--kv-impl=reference`` under ``vllm-0.33``
and ``vllm-0.10`` (one pytest process per profile, their data combined):

* ``conformance/test_differential.py``: random workloads against the reference oracle;
* the random workloads of ``conformance/test_invariants.py`` (laws only, no oracle);
* the ``*_matches_reference`` property tests of ``conformance/test_batch_metadata.py``, where
  that area exists: random batches compared with the reference's batch builder;
* the random multi-group workloads of ``conformance/test_hybrid.py`` (laws, and the
  differential against the reference), where that area exists;
* the random offload-tier workloads of ``conformance/test_offload.py`` (laws and the
  differential; ``vllm-0.33`` only), and the random external-KV workloads of
  ``conformance/test_external_kv.py``, where those areas exist.

No scripted test runs, so the figures say what the generated workloads reach on their own.
Prints, for every module of ``reference_impl/``, its coverage (statements and branches
together, as ``coverage report --branch`` computes it) over all its code, then over the code the
workloads can reach (``UNREACHABLE`` lists what is left out, and why), with the branches alone;
then the workload features the random workloads reached
(``kvcheck.conformance.workload_machine.FEATURES``; each must be reached under some profile).
Exits 1 when a gated module (``GATED``) is under the threshold over reachable code or a
feature was never reached, 2 when the tests themselves fail. docs/coverage.md has the figures.

Needs ``coverage`` (the ``test`` extra).

Also a pytest plugin (``-p coverage_report``, with this folder on ``sys.path``): at the end of
a session it writes the features reached to the file named by ``$KVCHECK_FEATURES_OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROFILES = ("vllm-0.33", "vllm-0.10")
#: The modules held to the threshold: the manager, the pool, the free queue, hashing and the
#: block table.
GATED = ("kv_cache_manager.py", "block_pool.py", "free_block_queue.py", "hashing.py",
         "block_hasher.py", "block_table.py")
DEFAULT_MIN = 95.0
#: Code the random workloads cannot reach through kvcheck's protocol: regex of a source line
#: -> why. A matched ``def``, ``class`` or ``if`` line leaves out its whole block (coverage.py
#: exclusion rules). The names below are called by no method of the reference adapter
#: (kvcheck.adapters.reference), which is all the workloads drive.
UNREACHABLE: dict[str, str] = {
    # An ``if`` (or ``elif``) whose own block ends in a misuse raise (the raise at the
    # block's indentation, the lines before it at least as deep), or a bare raise.
    (r"^[ \t]*(?:el)?if .*:\n(?P<body>[ \t]+)\S.*\n(?:(?P=body).*\n)*?(?P=body)"
     r"raise (?:KVCacheMisuseError|FreeQueueMisuseError|OffloadMisuseError)\b"
     r"|raise (?:KVCacheMisuseError|FreeQueueMisuseError|OffloadMisuseError)\b"):
        "misuse checks: the workloads are valid by construction; scripted tests raise each",
    # Since the one-path merge the manager's argument checks end in ``_raise*`` helpers.
    r"self\._raise_\w+\(|def (_raise_\w+|_check_unlinked)\b":
        "misuse checks (an ``if`` ending in a ``_raise*`` helper, the helpers themselves, the "
        "free queue's link checks): the workloads are valid by construction",
    (r"def (make_request|usage|get_blocks|get_num_common_prefix_blocks|get_usage"
     r"|__len__|append|get_all_free_blocks|__repr__|hash_request_tokens|_version_tuple"
     r"|to_event_int|compute_slot_mapping_v0_10|num_kv_cache_groups|num_blocks_needed"
     r"|check_invariants)\b"):
        "API no adapter method calls: conveniences, usage metrics, "
        "0.10.2 cascade attention, hash-lookahead version check, helpers for tests",
    r"class BlockTable\b": "vLLM's persistent worker block table (row operations): no "
                          "protocol method reaches it",
    r"if self\.profile\.touch_null_ref_cnt:": (
        "0.10.2's null-block ref count in touch / free_blocks: its false side (a 0.33 null "
        "reaching them) cannot happen, 0.33 drops skipped hits and trims leading nulls first"),
    r"if request\.prompt_embeds is not None:": "prompt embeddings are not in RequestView",
    r"return \(extra_keys, \*token_ids": "hash lookahead (EAGLE/MTP) is not in the protocol",
}
_FEATURES_ENV = "KVCHECK_FEATURES_OUT"


def pytest_sessionfinish() -> None:
    """Plugin hook: dump the features this process's random workloads reached."""
    out = os.environ.get(_FEATURES_ENV)
    if out:
        from kvcheck.conformance.workload_machine import REACHED

        Path(out).write_text(json.dumps(dict(REACHED), sort_keys=True), encoding="utf-8")


def _test_selection() -> list[str]:
    """The test files and the ``-k`` expression picking their random tests."""
    files = ["conformance/test_differential.py", "conformance/test_invariants.py"]
    files.extend(f"conformance/{optional}"
                 for optional in ("test_batch_metadata.py", "test_hybrid.py", "test_offload.py",
                                  "test_external_kv.py")
                 if (REPO / "conformance" / optional).exists())
    selection = ("random_workloads or matches_reference or hybrid_differential or "
                 "random_offload or random_external_kv")
    return [*files, "-k", selection]


def _run_profile(profile: str, work: Path, extra: list[str]) -> tuple[int, Counter[str]]:
    """One pytest process under coverage for ``profile``: its exit status and features."""
    features = work / f"features-{profile}.json"
    env = dict(os.environ)
    env[_FEATURES_ENV] = str(features)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parent), env.get("PYTHONPATH")) if p)
    command = [
        sys.executable, "-m", "coverage", "run", "--branch", "--parallel-mode",
        f"--data-file={work / '.coverage'}", "--source=kvcheck.reference_impl",
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "coverage_report",
        "--kv-impl=reference", f"--kv-profile={profile}", *extra, *_test_selection(),
    ]
    print(f"== {profile}: {' '.join(command[3:])}", flush=True)
    status = subprocess.run(command, cwd=REPO, env=env, check=False).returncode
    reached: Counter[str] = Counter()
    if features.exists():
        reached.update(json.loads(features.read_text(encoding="utf-8")))
    return status, reached


def _combine(work: Path) -> None:
    import coverage

    cov = coverage.Coverage(data_file=str(work / ".coverage"), branch=True)
    cov.combine(data_paths=[str(work)])
    cov.save()


def _module_figures(work: Path, exclude: list[str],
                    ) -> dict[str, tuple[float, int, int, list[str]]]:
    """Per ``reference_impl`` module, ``exclude`` left out: (coverage %, covered branches,
    branches, what was missed: ``"L12"`` a line, ``"B12->14"`` a branch)."""
    import coverage

    cov = coverage.Coverage(data_file=str(work / ".coverage"), branch=True)
    cov.load()
    for pattern in exclude:
        cov.exclude(pattern)
    out = work / "coverage.json"
    cov.json_report(outfile=str(out))
    report = json.loads(out.read_text(encoding="utf-8"))
    figures = {}
    for path, data in report["files"].items():
        summary = data["summary"]
        missed = [f"L{n}" for n in data["missing_lines"]]
        missed += [f"B{a}->{b}" for a, b in data["missing_branches"]]
        figures[Path(path).name] = (summary["percent_covered"], summary["covered_branches"],
                                    summary["num_branches"], missed)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--min", type=float, default=DEFAULT_MIN, metavar="PERCENT",
                        help=f"threshold for the gated modules (default {DEFAULT_MIN:g})")
    parser.add_argument("--max-examples", type=int, default=None, metavar="N",
                        help="--kv-max-examples for the runs (default: the suite's)")
    parser.add_argument("--show-missing", action="store_true",
                        help="list the reachable lines and branches missed in every gated "
                             "module")
    args = parser.parse_args(argv)
    extra = [] if args.max_examples is None else [f"--kv-max-examples={args.max_examples}"]
    with tempfile.TemporaryDirectory(prefix="kvcheck-coverage-") as tmp:
        work = Path(tmp)
        statuses, reached = [], {}
        for profile in PROFILES:
            status, reached[profile] = _run_profile(profile, work, extra)
            statuses.append(status)
        _combine(work)
        everything = _module_figures(work, [])
        figures = _module_figures(work, list(UNREACHABLE))

    print("\nreference_impl/ coverage by the random and differential tests (statements and "
          "branches: all code, reachable code; reachable branches alone):")
    failures = []
    for name, (percent, covered, branches, missing) in sorted(figures.items()):
        gate = name in GATED
        line = (f"  {name:24} {everything[name][0]:6.1f}%  {percent:6.1f}%   "
                f"branches {covered:>3}/{branches:<3}{'  gated' if gate else ''}")
        if gate and percent < args.min:
            failures.append(f"{name} {percent:.1f}% < {args.min:g}%")
            line += f"  BELOW {args.min:g}%"
        if gate and missing and (args.show_missing or percent < args.min):
            line += f"; missed {' '.join(missing)}"
        print(line)
    missing_gated = [name for name in GATED if name not in figures]
    failures += [f"{name}: not measured" for name in missing_gated]

    from kvcheck.conformance.workload_machine import FEATURES

    print("\nworkload features reached (" + ", ".join(PROFILES) + "):")
    for feature in FEATURES:
        counts = [reached[p][feature] for p in PROFILES]
        print(f"  {feature:34} " + "  ".join(f"{c:>6}" for c in counts))
        if not any(counts):
            failures.append(f"workload feature {feature!r} never reached")
    others = sorted({f for p in PROFILES for f in reached[p]} - set(FEATURES))
    for feature in others:  # informative counts (admissions, prefix hits...)
        counts = [reached[p][feature] for p in PROFILES]
        print(f"  ({feature})".ljust(37) + "  ".join(f"{c:>6}" for c in counts))

    if any(statuses):
        print(f"\ncoverage_report: the tests failed (exit statuses {statuses})")
        return 2
    if failures:
        print("\ncoverage_report: FAILED: " + "; ".join(failures))
        return 1
    print(f"\ncoverage_report: every gated module >= {args.min:g}%, every feature reached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
