"""The gate's usage check: a baseline must hold records of the current records' kind.

A conformance record is compared with conformance records and a benchmark record with
benchmark records; nothing else can be compared. Two mix-ups are usage errors (exit 2), not
"no baseline": every record the gate would accept otherwise would be judged against nothing,
and a CI job gating ``--baseline bench.jsonl --current conformance.jsonl`` would believe it
is protected.

* the baseline files and the current files share no kind at all;
* for one implementation, the baseline holds records of it, but none of a kind its current
  records have (``--baseline base-bench.jsonl --current current.jsonl`` for ``mine``).

An implementation whose current records have one kind with a baseline and another without
(a conformance baseline, no benchmark baseline) is no usage error: the unmatched kind is
"no baseline", as for an implementation the baseline does not hold at all.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvcheck.results.errors import KindMismatchError
from kvcheck.results.schema import Record
from kvcheck.results.text import visible

__all__ = ["KindMismatchError", "check_kinds"]

Loaded = Iterable[tuple[str, Record]]  # (source file, record): compare.load_files

# How a run writes a record of each kind (the fix names it).
_WRITTEN_BY = {"conformance": "pytest --kv-impl=X --kv-report=FILE",
               "benchmark": "pytest --kv-impl=X --kv-bench --kv-bench-report=FILE"}


def _kinds(records: list[tuple[str, Record]], name: str | None = None) -> set[str]:
    return {r["kind"] for _, r in records if name is None or r["implementation"]["name"] == name}


def _files(records: list[tuple[str, Record]], name: str | None = None) -> str:
    """``"bench.jsonl: benchmark; base.jsonl: benchmark"``: each file and its record kinds."""
    by_file: dict[str, set[str]] = {}
    for source, r in records:
        if name is None or r["implementation"]["name"] == name:
            by_file.setdefault(source, set()).add(r["kind"])
    return "; ".join(f"{visible(f)}: {', '.join(sorted(k))}" for f, k in by_file.items())


def _fix(base_kinds: set[str], cur_kinds: set[str]) -> str:
    wanted = " and ".join(sorted(cur_kinds))
    have = " and ".join(sorted(base_kinds))
    how = "; ".join(f"{k}: {_WRITTEN_BY[k]}" for k in sorted(cur_kinds) if k in _WRITTEN_BY)
    return (f"Fix: pass the base run's {wanted} record with --baseline ({how}), or gate the "
            f"current run's {have} record (--current) against this baseline")


def check_kinds(baseline: Loaded, current: Loaded) -> None:
    """Raise ``KindMismatchError`` on either mix-up of the module docstring; the message
    names each file's record kinds and the fix. No baseline records: nothing to check."""
    base, cur = list(baseline), list(current)
    if not base:
        return
    base_kinds, cur_kinds = _kinds(base), _kinds(cur)
    if not base_kinds & cur_kinds:
        raise KindMismatchError(
            f"the baseline holds only {' and '.join(sorted(base_kinds))} records "
            f"({_files(base)}) and the current files only {' and '.join(sorted(cur_kinds))} "
            f"records ({_files(cur)}): a gate compares records of one kind, so nothing could "
            f"be compared. {_fix(base_kinds, cur_kinds)}")
    base_names = {r["implementation"]["name"] for _, r in base}
    for name in sorted({r["implementation"]["name"] for _, r in cur} & base_names):
        mine_base, mine_cur = _kinds(base, name), _kinds(cur, name)
        if not mine_base & mine_cur:
            raise KindMismatchError(
                f"the current records of '{visible(name)}' are {' and '.join(sorted(mine_cur))} "
                f"({_files(cur, name)}) but the baseline's records of it are only "
                f"{' and '.join(sorted(mine_base))} ({_files(base, name)}): a gate compares "
                f"records of one kind. {_fix(mine_base, mine_cur)}")
