"""How fast is a request built: kvcheck's reference ``Request`` against vLLM's.

::

    kvcheck bench request-speed                 # the reference alone
    envs/vllm-0.33/venv/bin/kvcheck bench request-speed   # beside vLLM's Request

Both sides build the same ``RequestView`` prompts through their adapter's own factory (the one
their request sync calls), block hasher included (both hash a prompt's full blocks on
construction), in interleaved rounds (A B B A, ``kvcheck.bench.measure.paired``). Printed:
microseconds per request for each side and the median of the paired time ratios reference / vLLM
(below 1: the reference builds faster).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.measure.paired import abba_first, paired_ratio
from kvcheck.bench.measure.timing import collector_off
from kvcheck.bench.workload.scenarios import Draws
from kvcheck.conformance.protocol import KVCacheSpec, RequestView

__all__ = ["main", "reference_factory", "time_construction", "vllm_factory"]

Factory = Callable[[RequestView], object]
#: Tokens held by one round's prompts (the views live for the whole run): 2^27 tokens are
#: about 4 GiB of Python ints in tuples.
_MAX_ROUND_TOKENS = 1 << 27


def reference_factory(spec: KVCacheSpec) -> Factory:
    """The reference adapter's request factory for ``spec`` (hasher included)."""
    from kvcheck.adapters.reference import ReferenceManager

    return ReferenceManager(spec)._requests._make


def vllm_factory(spec: KVCacheSpec) -> Factory:
    """The vLLM adapter's request factory for ``spec``, NONE_HASH installed first.

    Raises:
        ImportError: vLLM is not importable.
    """
    from kvcheck.adapters.vllm_requests import Hashing, make_request

    hashing = Hashing(spec)
    hashing.install()
    return lambda view: make_request(view, hashing.block_hasher)


def time_construction(make: Factory, views: Sequence[RequestView]) -> float:
    """Seconds to build one request per view (GC collected before, off during; CPU time of
    this thread, so another process's time slices do not count)."""
    with collector_off():
        start = time.thread_time_ns()
        for view in views:
            make(view)
        return (time.thread_time_ns() - start) / 1e9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvcheck.bench.cli_args import MAX_REQUESTS, int_in, name_in
    from kvcheck.bench.options import add_rounds_option
    from kvcheck.conformance.protocol import HASH_ALGOS

    add = parser.add_argument
    add("--requests", type=int_in(1, MAX_REQUESTS, "requests built per round", "--requests 200"),
        default=200)
    # A request of more tokens than kvcheck replay accepts is no request anyone schedules.
    add("--prompt-tokens", type=int_in(1, 1 << 20, "tokens per prompt", "--prompt-tokens 1024"),
        default=1024)
    add_rounds_option(add, default=9, per="side", unit="rounds")
    add("--hash-algo", type=name_in(HASH_ALGOS, "hash algorithm"), default="sha256")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.requests * args.prompt_tokens > _MAX_ROUND_TOKENS:
        parser.error(f"argument --requests: {args.requests} requests of {args.prompt_tokens} "
                     f"tokens hold more than {_MAX_ROUND_TOKENS} tokens per round; Fix: fewer "
                     "--requests or --prompt-tokens (default 200 x 1024)")
    spec = KVCacheSpec(num_blocks=16, block_size=16, hash_algo=args.hash_algo)
    draws = Draws(0, "request_speed")
    views = [RequestView(f"r{i}", draws.tokens(args.prompt_tokens)) for i in range(args.requests)]
    sides: dict[str, Factory] = {"reference": reference_factory(spec)}
    try:
        sides["vllm"] = vllm_factory(spec)
    except ImportError as exc:
        print(f"vLLM not importable ({exc}); timing the reference alone")
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(args.rounds + 1):  # round 0 warms up
        order = names if abba_first(i) == "impl" else names[::-1]
        for name in order:
            seconds = time_construction(sides[name], views)
            if i:
                samples[name].append(seconds)
    for name, values in samples.items():
        per = sorted(values)[len(values) // 2] / len(views) * 1e6
        print(f"{name:10s} {per:8.2f} us per {args.prompt_tokens}-token request "
              f"({args.hash_algo}, block 16)")
    if "vllm" in samples:
        r = paired_ratio(samples["reference"], samples["vllm"])
        if r is not None:
            print(f"reference / vllm time: {r.ratio:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] "
                  f"({r.confidence:.0%}); below 1: the reference builds faster")
    return 0


TOOL = BenchTool("request-speed", "kvcheck.bench.request_speed", __doc__.split("\n\n")[0],
                 add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.request_speed``: the same as ``kvcheck bench request-speed``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    raise SystemExit(main())
