"""``kvcheck record``'s numbers, checked before anything is loaded, locked or recorded.

* ``--traces N``: 1 .. ``MAX_TRACES`` (10 000), the most traces ``load_corpus`` reads back:
  a bigger corpus would take hours to record and then be refused by every reader.
* ``--seed S``: 0 .. 2^63-1. Negative seeds are refused because the recorder seeds
  ``random.Random`` with ``S * 1000003 + i`` and ``random`` uses the absolute value, so trace 0
  of ``--seed -1`` is trace 0 of ``--seed 1``; above 2^63-1 the header's seed is no signed
  64-bit integer, which corpus readers refuse.
* With ``--check`` the corpus's header decides the traces, the seed and the profile: a
  ``--traces`` or ``--seed`` given beside it would be ignored, so it is refused; a
  ``--kv-profile`` is refused when it is not the corpus's own (``check_profile``).
"""

from __future__ import annotations

import argparse

from kvcheck.conformance.bounds import MAX_SEED
from kvcheck.conformance.recorded import MAX_TRACES

__all__ = ["MAX_RECORD_SEED", "MAX_TRACES", "check_profile", "record_argument_problem"]

MAX_RECORD_SEED = MAX_SEED


def record_argument_problem(args: argparse.Namespace, default_traces: int) -> str | None:
    """What is wrong with ``--traces`` / ``--seed`` (None: nothing); the message names the
    option, the bound and the fix."""
    if args.check is not None:
        given = [f"--{name} {getattr(args, name)}" for name in ("traces", "seed")
                 if getattr(args, name) is not None]
        if given:
            return (f"{' and '.join(given)} with --check: --check records again with the "
                    f"corpus's own traces and seed (its header), so {given[0].split()[0]} "
                    "would be ignored; drop it, or record a new corpus with -o")
        return None
    traces = args.traces if args.traces is not None else default_traces
    if not 1 <= traces <= MAX_TRACES:
        return (f"--traces {traces}: record 1 to {MAX_TRACES} traces (a corpus holds at most "
                f"{MAX_TRACES}: kvcheck refuses to load more); e.g. --traces {default_traces}")
    seed = args.seed if args.seed is not None else 0
    if not 0 <= seed <= MAX_RECORD_SEED:
        why = ("a negative seed repeats a positive one: random.Random uses the absolute value"
               if seed < 0 else "a corpus header's seed is a signed 64-bit integer")
        shown = str(seed) if seed.bit_length() <= 64 else f"a {seed.bit_length()}-bit number"
        return f"--seed {shown}: must be in [0, 2^63-1] ({why}); e.g. --seed 0"
    return None


def check_profile(args: argparse.Namespace, header_profile: str, path: str) -> str | None:
    """With ``--check``: why ``--kv-profile`` cannot be used (None: absent, or the corpus's
    own profile)."""
    if args.kv_profile is None or args.kv_profile == header_profile:
        return None
    return (f"--kv-profile={args.kv_profile} with --check {path}: that corpus records "
            f"{header_profile}, and --check records again under the corpus's own profile; "
            f"drop --kv-profile, or check the {args.kv_profile} corpus instead")
