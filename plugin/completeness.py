"""Did the whole applicable suite run? The facts behind a complete-run verdict.

A verdict of "conforms" is only honest when every suite test that applies to the
implementation (its declared capabilities and the active profile) ran and reported. Runs fall
short in many ways: ``-k`` / ``-m`` / ``--deselect`` / ``--lf`` deselection, a path or node-id
subset, ``-x`` / ``--maxfail``, Ctrl-C, a collection error, a crashed xdist worker, tests
skipped by ``--kv-skips-file``, tests that pytest-timeout stopped, an INTERNALERROR, a process
that never reached the end of its session. This module keeps the inventory and says what is
missing.

* ``SuiteInventory`` is built where tests are collected (the xdist workers, or the one
  process): the applicable suite tests per implementation, which of them were deselected or
  skipped by the skips file, which suite files were collected and which failed to collect.
  It is a plain dict on the wire (``config.workeroutput``), so the xdist controller gets it.
* When the collected files do not cover the suite (a path subset, ``--lf`` skipping files),
  ``inventory_subprocess`` collects the whole suite in a child pytest (``--collect-only
  --kv-inventory=FILE``) to count what *should* have run; only partial runs pay for it.
* ``Completeness`` is the answer for one implementation: ``applicable`` (M), ``ran`` (N) and
  the reasons, in the record's ``completeness`` shape.

Tests that are not part of the shipped suite (a user's own tests using the ``kv_impl``
fixture) are never counted: running them beside the suite keeps a full run complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import kvcheck.conformance
from kvcheck.results.schema import RecordCompleteness

__all__ = ["INTERNAL_ERROR", "RUN_DID_NOT_FINISH", "Completeness", "InventoryWire",
           "SuiteInventory", "assess", "inventory_subprocess", "is_suite_path", "suite_dir",
           "suite_files", "suite_key"]

#: The one reason of the record written before the first test, which the session's end
#: replaces: seen only when the process died first.
RUN_DID_NOT_FINISH = ("the run did not finish: pytest ended before the end of its session "
                      "(killed, crashed, or stopped by pytest-timeout's thread method)")
#: The reason given when pytest aborted the session (an INTERNALERROR).
INTERNAL_ERROR = "pytest aborted with an internal error"


def suite_dir() -> Path:
    """The installed conformance suite's folder."""
    return Path(kvcheck.conformance.__file__).resolve().parent


def suite_files() -> frozenset[str]:
    """File names of the suite's test modules (``test_allocation.py``...)."""
    return frozenset(p.name for p in suite_dir().glob("test_*.py"))


def suite_key(nodeid: str) -> str:
    """A suite test's id without the folder part (``test_eviction.py::test_x[impl]``): node
    ids are relative to the rootdir, which differs between a run and its child collection."""
    path, sep, rest = nodeid.partition("::")
    return Path(path).name + sep + rest


def is_suite_path(path: Path | str) -> bool:
    """Whether ``path`` is one of the shipped suite's test modules."""
    p = Path(path).resolve()
    return p.parent == suite_dir() and p.name.startswith("test_")


class InventoryWire(TypedDict, total=False):
    """A ``SuiteInventory`` as JSON (``to_wire``; ``from_wire`` reads it back)."""

    applicable: dict[str, list[str]]
    deselected: list[str]
    skipped_by_file: list[str]
    files: list[str]
    collect_errors: list[str]
    node_selection: bool
    known: bool


@dataclass
class SuiteInventory:
    """What collection saw, per implementation name (test ids are ``suite_key`` ids)."""

    applicable: dict[str, list[str]] = field(default_factory=dict)
    deselected: set[str] = field(default_factory=set)
    skipped_by_file: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)          # suite files collected from
    collect_errors: list[str] = field(default_factory=list)
    node_selection: bool = False                          # a ``file.py::test`` argument
    known: bool = False                                   # collection completed

    def to_wire(self) -> InventoryWire:
        return {"applicable": self.applicable, "deselected": sorted(self.deselected),
                "skipped_by_file": sorted(self.skipped_by_file), "files": sorted(self.files),
                "collect_errors": self.collect_errors, "node_selection": self.node_selection,
                "known": self.known}

    @classmethod
    def from_wire(cls, data: InventoryWire) -> SuiteInventory:
        return cls({k: list(v) for k, v in data.get("applicable", {}).items()},
                   set(data.get("deselected", ())), set(data.get("skipped_by_file", ())),
                   set(data.get("files", ())), list(data.get("collect_errors", ())),
                   bool(data.get("node_selection")), bool(data.get("known")))

    @property
    def partial_files(self) -> bool:
        """Collection did not reach every suite test (a path subset, ``--lf``, or a suite
        file that failed to collect)."""
        return (self.node_selection or bool(self.collect_errors)
                or not suite_files() <= self.files)


@dataclass(frozen=True)
class Completeness:
    """How much of the applicable suite one implementation ran.

    Attributes:
        applicable: M, suite tests applicable to the implementation (None: unknown).
        ran: N, of those, how many ran and reported an outcome.
        reasons: why the run is incomplete (empty when complete).
        interrupted: the run was stopped by Ctrl-C, aborted by pytest (an INTERNALERROR), or
            never finished; such a run gets no verdict, unless a test failed before it stopped
            (a failure is proof enough for "does NOT conform").
        timed_out: ``suite_key`` ids of the applicable tests pytest-timeout stopped: reported
            as failed, yet they did not finish, so their failures prove nothing (not in the
            record's ``completeness``, whose reasons count them).
    """

    applicable: int | None
    ran: int
    reasons: tuple[str, ...]
    interrupted: bool = False
    timed_out: frozenset[str] = frozenset()

    @property
    def complete(self) -> bool:
        return not self.reasons and self.applicable is not None and self.ran == self.applicable

    def as_record(self) -> RecordCompleteness:
        return {"applicable": self.applicable, "ran": self.ran, "reasons": list(self.reasons),
                "interrupted": self.interrupted}


def assess(impl: str, inventory: SuiteInventory | None, full: SuiteInventory | None,
           reported: set[str], *, interrupted: bool, stop_reason: str | None,
           worker_crashed: bool, internal_error: bool,
           timed_out: set[str] | None = None,
           resource_stops: Sequence[str] = ()) -> Completeness:
    """The completeness of ``impl``'s run.

    Args:
        inventory: what this session collected (None: nothing arrived, e.g. every xdist
            worker crashed).
        full: the whole suite's inventory from ``inventory_subprocess`` when the session
            collected a subset (None otherwise, or when it could not be taken).
        reported: suite test node ids of ``impl`` that reported an outcome.
        stop_reason: pytest's ``session.shouldstop`` / ``shouldfail`` text, if any.
        internal_error: pytest aborted the session (INTERNALERROR): marked interrupted.
        timed_out: suite test node ids that pytest-timeout failed: reported, but they did
            not finish, so they do not count as run.
        resource_stops: why a resource limit stopped the session (the memory limit): each
            is a reason, whether or not tests were left.
    """
    reasons: list[str] = []
    stopped = interrupted or internal_error
    if inventory is None or not inventory.known:
        # E.g. every xdist worker crashed before handing its inventory over: say why too.
        reasons.append("the test collection never completed")
        reasons.extend(reason for reason, fact in (("interrupted", interrupted),
                                                   (INTERNAL_ERROR, internal_error),
                                                   ("an xdist worker crashed", worker_crashed))
                       if fact)
        return Completeness(None, len(reported), tuple(reasons), stopped)
    applicable = set(inventory.applicable.get(impl, ()))
    outside = 0
    if inventory.partial_files:
        if full is not None and full.known:
            whole = set(full.applicable.get(impl, ()))
            outside = len(whole - applicable)
            applicable |= whole
            if outside and not inventory.collect_errors:
                reasons.append(f"{outside} not collected: a subset of the suite's paths "
                               "was given")
        else:
            reasons.append("a subset of the suite's paths was given (the full suite could "
                           "not be counted)")
    reported = {suite_key(t) for t in reported}
    timed = {suite_key(t) for t in timed_out or ()} & applicable
    ran = {t for t in applicable
           if t in reported and t not in inventory.skipped_by_file and t not in timed}
    deselected = len(applicable & inventory.deselected)
    if deselected:
        reasons.append(f"{deselected} deselected (-k, -m, --deselect or --lf)")
    by_file = len(applicable & inventory.skipped_by_file)
    if by_file:
        reasons.append(f"{by_file} skipped by --kv-skips-file")
    if inventory.collect_errors:
        reasons.append("collection errors in " + ", ".join(sorted(inventory.collect_errors)))
    if timed:
        reasons.append(f"{len(timed)} timed out (pytest-timeout)")
    if interrupted:
        reasons.append("interrupted")
    if internal_error:
        reasons.append(INTERNAL_ERROR)
    if worker_crashed:
        reasons.append("an xdist worker crashed")
    reasons.extend(resource_stops)
    accounted = outside + deselected + by_file + len(timed)
    silent = len(applicable) - len(ran) - accounted
    explained = (interrupted or internal_error or worker_crashed or inventory.collect_errors
                 or resource_stops)
    if silent > 0 and stop_reason and not resource_stops:
        reasons.append(f"stopped early: {stop_reason}")
    elif silent > 0 and not explained:
        reasons.append(f"{silent} applicable tests did not report")
    if not applicable and not reasons:
        reasons.append("no applicable test was collected")
    return Completeness(len(applicable), len(ran), tuple(reasons), stopped, frozenset(timed))


def inventory_subprocess(impl_value: str, profile: str | None,
                         extra_env: dict[str, str] | None = None,
                         timeout: float = 300.0, *,
                         indexer_value: str | None = None) -> SuiteInventory | None:
    """Collect the whole suite in a child pytest and return its inventory (None on failure).

    The child runs ``python -m pytest --collect-only`` on the suite folder with the same
    ``--kv-impl`` / ``--kv-indexer`` / ``--kv-profile``, in the current directory, with
    ``PYTHONPATH`` extended by ``extra_env`` (the folders the implementations were imported
    from).
    """
    fd, name = tempfile.mkstemp(prefix="kvcheck-inventory-", suffix=".json")
    os.close(fd)
    out = Path(name)
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "-p", "no:randomly", str(suite_dir()), f"--kv-inventory={out}"]
    if impl_value or indexer_value is None:
        cmd.append(f"--kv-impl={impl_value}")
    if indexer_value is not None:
        cmd.append(f"--kv-indexer={indexer_value}")
    if profile:
        cmd.append(f"--kv-profile={profile}")
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)  # the user's -k / -x must not shape the inventory
    if extra_env:
        env.update(extra_env)
    try:
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout, check=False)
        text = out.read_text(encoding="utf-8")
        return SuiteInventory.from_wire(json.loads(text)) if text else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    finally:
        out.unlink(missing_ok=True)
