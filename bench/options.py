"""The benchmark options, declared once: the pytest plugin (``--kv-bench-*``) and every
``kvcheck bench`` tool add them through these functions (pytest-benchmark's
``add_*_options(addoption)`` pattern), so a name, its bound, its message and its help are
written in one place and checked the same way everywhere.

Each ``add_*`` takes ``addoption``: ``argparse.ArgumentParser.add_argument`` or pytest's
``OptionGroup.addoption`` (the same keywords), and ``prefix``: ``""`` for the tools
(``--rounds 7``), ``"kv-bench-"`` for the plugin (``--kv-bench-rounds=7``). The bounds are
``kvcheck.bench.cli_args``'s; a bad value is refused while the command line is parsed, with a
message naming the option, the value, the bound and a good value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from kvcheck.bench.cli_args import (
    MAX_JOBS,
    MAX_ROUNDS,
    MAX_SCALE,
    MAX_WARMUP,
    int_in,
    names_in,
    scale_arg,
    seed_arg,
)

__all__ = [
    "PLUGIN_PREFIX",
    "AddOption",
    "add_benches_option",
    "add_impl_option",
    "add_jobs_option",
    "add_report_option",
    "add_rounds_option",
    "add_scale_option",
    "add_seed_option",
    "add_wall_rounds_option",
    "add_warmup_option",
]

#: ``parser.add_argument`` or pytest's ``group.addoption``.
AddOption = Callable[..., object]
#: The pytest plugin's option prefix.
PLUGIN_PREFIX = "kv-bench-"


def _flag(prefix: str, name: str) -> str:
    return f"--{prefix}{name}"


def _example(prefix: str, name: str, value: object) -> str:
    """A good value as the caller spells options: ``--rounds 7`` or ``--kv-bench-rounds=7``."""
    return f"--{prefix}{name}={value}" if prefix else f"--{name} {value}"


def add_impl_option(addoption: AddOption, *, note: str = "") -> None:
    """``--impl MODULE``: the implementation, as ``--kv-impl`` takes it (tools only: the
    plugin has ``--kv-impl``)."""
    addoption("--impl", default="reference", metavar="MODULE",
              help="the implementation, as --kv-impl takes it (default: reference"
                   + (f"; {note}" if note else "") + ")")


def add_rounds_option(addoption: AddOption, *, default: int | None, per: str,
                      unit: str = "pairs", default_text: str | None = None,
                      prefix: str = "", name: str = "rounds", low: int = 1) -> None:
    """``--rounds N``: timed rounds (or A B B A pairs) per ``per``, ``low`` to ``MAX_ROUNDS``;
    ``name``: another option of the same kind (``max-rounds``, ``wall-rounds``)."""
    what = f"timed {unit} per {per}"
    shown = default_text if default_text is not None else str(default)
    addoption(_flag(prefix, name),
              type=int_in(low, MAX_ROUNDS, what, _example(prefix, name, default or 5)),
              default=default, metavar="N",
              help=f"{what}, {low} to {MAX_ROUNDS} (default {shown})")


def add_warmup_option(addoption: AddOption, *, default: int | None, per: str,
                      unit: str = "pairs", default_text: str | None = None,
                      prefix: str = "") -> None:
    """``--warmup N``: untimed rounds before the timed ones, 0 to ``MAX_WARMUP``."""
    what = f"untimed warm-up {unit} per {per}"
    shown = default_text if default_text is not None else str(default)
    addoption(_flag(prefix, "warmup"),
              type=int_in(0, MAX_WARMUP, what, _example(prefix, "warmup", default or 1)),
              default=default, metavar="N",
              help=f"{what}, 0 to {MAX_WARMUP} (default {shown})")


def add_scale_option(addoption: AddOption, *, default: float = 1.0, note: str = "",
                     prefix: str = "") -> None:
    """``--scale F``: multiply the workloads' request counts by F, ``0 < F <= MAX_SCALE``."""
    addoption(_flag(prefix, "scale"), type=scale_arg(_example(prefix, "scale", default)),
              default=default, metavar="F",
              help=f"multiply the workloads' request counts by F, 0 < F <= {MAX_SCALE:g} "
                   f"(default {default:g}" + (f": {note}" if note else "") + ")")


def add_seed_option(addoption: AddOption, *, prefix: str = "") -> None:
    """``--seed N``: the workload seed; the same seed gives the same workload everywhere."""
    addoption(_flag(prefix, "seed"), type=seed_arg(_example(prefix, "seed", 0)), default=0,
              metavar="N", help="workload seed, 0 to 2^63 - 1 (default 0); the same seed "
                                "gives the same workload everywhere")


def add_report_option(addoption: AddOption, *, what: str, prefix: str = "",
                      as_path: bool = False) -> None:
    """``--report PATH``: write ``what`` as kvcheck result records (JSON Lines, atomically;
    the path is checked before any work). ``as_path``: the value as a ``Path``."""
    kwargs: dict[str, object] = {"type": Path} if as_path else {}
    addoption(_flag(prefix, "report"), default=None, metavar="PATH",
              help=f"write {what} as kvcheck result records (JSON Lines, atomically)",
              **kwargs)


def add_jobs_option(addoption: AddOption, *, default: int, what: str) -> None:
    """``--jobs N``: children or threads side by side, 1 to ``MAX_JOBS``."""
    addoption("--jobs", type=int_in(1, MAX_JOBS, what, f"--jobs {default}"), default=default,
              metavar="N", help=f"{what}, 1 to {MAX_JOBS} (default {default})")


def add_wall_rounds_option(addoption: AddOption) -> None:
    """``--wall-rounds N``: native wall-time rounds recorded beside instruction counts."""
    add_rounds_option(addoption, default=5, per="case", unit="native wall-time rounds",
                      default_text="5; 0: counts only", name="wall-rounds", low=0)


def add_benches_option(addoption: AddOption, choices: Sequence[str]) -> None:
    """``--bench A,B``: the counted benchmarks to run (default: all of ``choices``)."""
    addoption("--bench", type=names_in(choices, "counted benchmark"), default=list(choices),
              metavar="NAMES",
              help=f"comma-separated benchmarks: {', '.join(choices)} (default: all)")
