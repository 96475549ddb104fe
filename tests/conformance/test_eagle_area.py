"""EAGLE / MTP (capability ``eagle``) has teeth: the reference passes the EAGLE area
(``conformance/test_eagle.py``) under both vLLM profiles, and each hand-written single-bug
EAGLE mutant (``tests/mutants/eagle_*.py``: the reference with one bug in its EAGLE drop)
fails the tests that own its bug: the golden scenarios recorded from vLLM, and where the
first random examples reach it, the laws (the EAGLE hit cap, the window law) and the
differential against the reference, whose random workloads draw ``use_eagle``.

Each run is in-process (``inner_runs.run_area``) with the mutant-run settings of
``tests/mutants/test_mutants.py``: ``--kv-max-examples=15`` and no shrinking.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inner_runs import run_area

import kvcheck.conformance

SUITE = Path(kvcheck.conformance.__file__).resolve().parent
MUTANTS_DIR = Path(__file__).resolve().parents[1] / "mutants"
MAX_EXAMPLES = 15

#: (suite file, test function) the mutants must fail.
GOLDEN = ("test_eagle.py", "test_eagle_golden")
LAWS = ("test_invariants.py", "test_laws_hold_under_random_workloads")
DIFFERENTIAL = ("test_differential.py", "test_random_workloads_match_reference")
HYBRID_DIFFERENTIAL = ("test_hybrid.py", "test_hybrid_differential")

#: (mutant, profile) -> the suite tests that must each fail (others may too).
MUTANTS: dict[tuple[str, str], set[tuple[str, str]]] = {
    # The recorded hits (8 tokens, not 12), the EAGLE hit cap, and the oracle.
    ("eagle_no_drop", "vllm-0.33"): {GOLDEN, LAWS, DIFFERENTIAL},
    ("eagle_no_drop", "vllm-0.10"): {GOLDEN, LAWS, DIFFERENTIAL},
    # The recorded window hits ([null, 2], not [null, null]); the window law holds them too.
    # 0.10's multi-group differential reaches it within 15 examples, 0.33's does not.
    ("eagle_window_no_extra_block", "vllm-0.33"): {GOLDEN},
    ("eagle_window_no_extra_block", "vllm-0.10"): {GOLDEN, HYBRID_DIFFERENTIAL},
    # 0.33's widened search (eagle_proof_margin): the recorded full-and-window hit (12, not 16)
    # and the windows under sparse retention. 0.10.2 has no margin: nothing to catch there.
    ("eagle_no_search_margin", "vllm-0.33"): {GOLDEN},
    # vLLM 0.33's per-group flags (is_eagle_group): every group dropping, the recorded hits
    # with only full attention, only the window, only Mamba flagged (8 or 0, not 16 or 24).
    ("eagle_groups_ignored", "vllm-0.33"): {GOLDEN},
    # An unflagged group caching the block past the boundary: the recorded free queue with
    # only the window flagged. 0.10.2 has no flag: nothing to catch there.
    ("eagle_groups_unflagged_cache_past_boundary", "vllm-0.33"): {GOLDEN},
    # An unflagged window keeping the tails of the boundaries without EAGLE under sparse
    # retention: the recorded resend's hit (nothing, not 8 tokens).
    ("eagle_groups_replay_per_group", "vllm-0.33"): {GOLDEN},
    # An unflagged chunked local group beside flagged full attention dropping anyway: the
    # recorded hits (12 tokens, not 16).
    ("eagle_groups_unflagged_chunked_local_drops", "vllm-0.33"): {GOLDEN},
    # A group that never drops searched with EAGLE's margin: the recorded hits beside a
    # flagged group (20 tokens, not 16, with an unflagged chunked local group).
    ("eagle_groups_unflagged_search_margin", "vllm-0.33"): {GOLDEN},
}


def _failed(pytester: pytest.Pytester, impl: str, profile: str, file: str,
            only: set[str] | None = None) -> tuple[set[str], set[str]]:
    """Run one suite file on ``impl`` under ``profile`` (``only``: just these functions);
    the failed and passed test functions."""
    select = ("-k", " or ".join(sorted(only))) if only else ()
    failed, passed, _ = run_area(pytester, SUITE / file, impl, f"--kv-profile={profile}",
                                 f"--kv-max-examples={MAX_EXAMPLES}", *select,
                                 path=MUTANTS_DIR)
    return failed, passed


def test_every_eagle_mutant_is_listed() -> None:
    """Each tests/mutants/eagle_*.py has an entry in MUTANTS (and vice versa)."""
    files = {p.stem for p in MUTANTS_DIR.glob("eagle_*.py")}
    assert files == {name for name, _ in MUTANTS}, (sorted(files), sorted(MUTANTS))


@pytest.mark.parametrize(("mutant", "profile"), sorted(MUTANTS))
def test_eagle_tests_fail_each_bug(pytester: pytest.Pytester, mutant: str, profile: str) -> None:
    must_fail = MUTANTS[mutant, profile]
    for file in sorted({f for f, _ in must_fail}):
        wanted = {t for f, t in must_fail if f == file}
        failed, _ = _failed(pytester, mutant, profile, file, only=wanted)
        assert wanted <= failed, (
            f"{mutant} under {profile}: {file}: {sorted(wanted - failed)} passed, but must "
            f"fail (failed: {sorted(failed)})")


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_reference_passes_eagle_area(pytester: pytest.Pytester, profile: str) -> None:
    failed, passed = _failed(pytester, "reference", profile, "test_eagle.py")
    assert not failed, f"reference fails the EAGLE area under {profile}: {sorted(failed)}"
    assert "test_eagle_golden" in passed
