"""Bounds of the conformance plugin's numeric options (issue 23 item 3), checked before the
run: a value past them is a usage error (exit 4) naming the bound and the fix.

* ``--kv-max-examples`` in ``[1, MAX_EXAMPLES]`` (10^6): one example is a whole workload
  (milliseconds with the reference, more with a real engine), so 10^6 examples of each of the
  suite's property tests already take days on one core; the largest soak run kvcheck's own
  CI makes is 10^3. A bigger number (``10**23``) only ever meant "forever".
* ``--kv-seed`` in ``[0, MAX_SEED]`` (2^63 - 1): what a signed 64-bit field holds (the
  record's ``seed`` is read by other tools); the benchmark plugin's ``--kv-bench-seed`` has
  the same range (its workloads hash the seed as 8 bytes).
* ``--kv-timeout`` at most ``MAX_CALL_TIMEOUT_S`` (86400 s, a day): no adapter call is meant
  to take longer, ``0`` already means no limit, and past about 10^8 s the timer kvcheck arms
  (``faulthandler``'s last resort) overflows, which reads as the factory's fault.
* ``--kv-max-memory`` (``kvcheck.plugin.resources.memory_limit_option``): above what the
  process holds when the session starts, at most the machine's memory.
"""

from __future__ import annotations

import pytest

from kvcheck.conformance.bounds import MAX_SEED, num_digits

__all__ = ["MAX_CALL_TIMEOUT_S", "MAX_EXAMPLES", "MAX_SEED", "check_max_examples",
           "check_seed", "check_timeout_bound"]

MAX_EXAMPLES = 10**6
MAX_CALL_TIMEOUT_S = 86_400.0


def _digits(value: int) -> str:
    """``value`` for a message; a number of more than 30 digits by its size only."""
    digits = num_digits(value)
    return str(value) if digits <= 30 else f"<a {digits}-digit number>"


def check_max_examples(value: int) -> int:
    """``--kv-max-examples``, checked against ``[1, MAX_EXAMPLES]``."""
    if not 1 <= value <= MAX_EXAMPLES:
        raise pytest.UsageError(
            f"kvcheck: --kv-max-examples={_digits(value)}: must be >= 1 and <= {MAX_EXAMPLES} "
            "(10^6)\n"
            "  Fix: pass a number of examples in that range, e.g. --kv-max-examples=40 (the "
            "default) or 1000 for a soak run")
    return value


def check_seed(value: int | None) -> int | None:
    """``--kv-seed`` (None: derandomized), checked against ``[0, MAX_SEED]``."""
    if value is not None and not 0 <= value <= MAX_SEED:
        raise pytest.UsageError(
            f"kvcheck: --kv-seed={_digits(value)}: must be >= 0 and <= {MAX_SEED} "
            "(2^63 - 1)\n  Fix: pass a seed in that range, e.g. --kv-seed=7, or leave the "
            "option out for derandomized workloads")
    return value


def check_timeout_bound(value: float) -> None:
    """``--kv-timeout`` (already known finite and >= 0) is at most ``MAX_CALL_TIMEOUT_S``."""
    if value > MAX_CALL_TIMEOUT_S:
        raise pytest.UsageError(
            f"kvcheck: --kv-timeout={value:g}: must be at most {MAX_CALL_TIMEOUT_S:g} seconds "
            "(a day)\n  Fix: pass a limit up to a day, or --kv-timeout=0 for no limit at all")
