"""Output files are claimed before the work starts: every output (``--kv-report``,
``--kv-bench-report``, ``kvcheck record -o``, ``leaderboard -o``, ``gate --markdown``,
``trace_workload dump -o``) passes ``check_output_path``; two outputs (or an output and an
input) of one run naming the same file are refused; a report another live run is writing is
refused (a lock held for the whole session, released by the kernel when its holder dies,
removed after a normal run); ``record -o`` never replaces a file that is not a corpus
without ``--force``; and an xdist worker that crashed makes the run exit non-zero."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcheck.adapters.reference
import kvcheck.bench.bench_allocator  # noqa: F401  (imported once: see tests/plugin/conftest)
from kvcheck import lock as kvlock
from kvcheck.bench.trace_workload import main as trace_workload_main
from kvcheck.conformance import recorder
from kvcheck.lock import OutputBusyError, acquire_output_lock, lock_file_for
from kvcheck.plugin.cli import main
from kvcheck.plugin.outputs import is_corpus_file
from kvcheck.results.schema import load_records

ONE_TEST = ("-p", "no:cacheprovider", "-p", "no:randomly", "--kv-max-examples=3",
            "--kv-impl=reference", "-k", "test_first_allocation")
BENCH = ("-p", "no:cacheprovider", "-p", "no:randomly", "--kv-impl=reference", "--kv-bench",
         "--kv-bench-scale=0.05", "--kv-bench-rounds=1", "--kv-bench-warmup=0")


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runs are plain sessions even under -n (pytest-benchmark disables
    itself when it sees PYTEST_XDIST_WORKER)."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


def assert_refused(result: pytest.RunResult, *lines: str, started: float | None = None) -> None:
    """A usage error (exit 4) with these stderr lines and a Fix, nothing run, no traceback,
    within seconds of ``started``."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    assert "Traceback" not in err and "INTERNALERROR" not in result.stdout.str()
    result.stderr.fnmatch_lines(list(lines))
    assert "\n  Fix: " in err
    out = result.stdout.str()
    assert "passed" not in out and "kvcheck benchmarks" not in out, "nothing may run"
    if started is not None:
        assert time.monotonic() - started < 45  # a few seconds idle; the margin is for load


def no_lock_files(folder: Path) -> bool:
    return not list(folder.rglob(".*.lock"))


HOLD_THE_LOCK = """
import sys, time
from kvcheck.lock import acquire_output_lock
acquire_output_lock(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A live process holding the lock of ``tmp_path/held/r.jsonl`` (a concurrent run)."""
    target = tmp_path / "held" / "r.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ --kv-bench-report
def test_bench_report_that_is_a_folder_stops_before_any_benchmark(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "out").mkdir()
    started = time.monotonic()
    result = pytester.runpytest(*BENCH, "--kv-bench-report=out")
    assert_refused(result, "ERROR: kvcheck: --kv-bench-report out: is a directory",
                   "  Fix: name a file inside it, e.g. --kv-bench-report out/bench.jsonl",
                   started=started)
    assert list((pytester.path / "out").iterdir()) == []


def test_bench_report_under_a_file_and_empty(pytester: pytest.Pytester) -> None:
    (pytester.path / "notes.txt").write_text("mine\n")
    result = pytester.runpytest(*BENCH, "--kv-bench-report=notes.txt/b.jsonl")
    assert_refused(result, "*--kv-bench-report notes.txt/b.jsonl: cannot write there*")
    assert (pytester.path / "notes.txt").read_text() == "mine\n"
    assert_refused(pytester.runpytest(*BENCH, "--kv-bench-report="),
                   "*--kv-bench-report : empty path*")


def test_bench_report_replacing_its_own_trace_is_refused(pytester: pytest.Pytester) -> None:
    assert trace_workload_main(["dump", "burst_short", "-o", str(pytester.path / "t.jsonl"),
                                "--scale", "0.05"]) == 0
    before = (pytester.path / "t.jsonl").read_bytes()
    result = pytester.runpytest(*BENCH, "--kv-bench-workload=trace:t.jsonl",
                                "--kv-bench-report=./t.jsonl")
    assert_refused(result, "*--kv-bench-report ./t.jsonl: is also the "
                           "--kv-bench-workload=trace:t.jsonl input (t.jsonl), which writing "
                           "there would destroy")
    assert (pytester.path / "t.jsonl").read_bytes() == before


def test_bench_report_another_run_is_writing(pytester: pytest.Pytester, tmp_path: Path,
                                             holder: subprocess.Popen[str]) -> None:
    target = tmp_path / "held" / "r.jsonl"
    started = time.monotonic()
    result = pytester.runpytest(*BENCH, f"--kv-bench-report={target}")
    assert_refused(result, f"*--kv-bench-report {target}: another kvcheck run is writing this "
                           f"file (process {holder.pid} on *), and one record would be lost",
                   "  Fix: wait for it to finish, or write to another file, e.g. "
                   "--kv-bench-report bench.jsonl", started=started)
    assert not target.exists()


# ------------------------------------------------------------------ two outputs, one file
@pytest.mark.parametrize("spelling", ["same", "dot", "symlink", "hardlink"])
@pytest.mark.parametrize("bench", [False, True], ids=["conformance", "bench"])
def test_kv_report_and_bench_report_naming_one_file(pytester: pytest.Pytester, spelling: str,
                                                    bench: bool) -> None:
    (pytester.path / "r.jsonl").write_text("an earlier record\n")
    other = {"same": "r.jsonl", "dot": "./sub/../r.jsonl", "symlink": "link.jsonl",
             "hardlink": "hard.jsonl"}[spelling]
    (pytester.path / "sub").mkdir()
    if spelling == "symlink":
        (pytester.path / "link.jsonl").symlink_to(pytester.path / "r.jsonl")
    elif spelling == "hardlink":
        os.link(pytester.path / "r.jsonl", pytester.path / "hard.jsonl")
    args = BENCH if bench else ONE_TEST
    result = pytester.runpytest(*args, "--kv-report=r.jsonl", f"--kv-bench-report={other}")
    assert_refused(result, "ERROR: kvcheck: --kv-*report *: is also the --kv-*report output "
                           "(*), and one would replace the other",
                   "  Fix: write each to its own file, e.g. --kv-*report *.jsonl")
    assert (pytester.path / "r.jsonl").read_text() == "an earlier record\n"
    assert no_lock_files(pytester.path)


def test_kv_report_naming_the_junitxml_file(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*ONE_TEST, "--kv-report=out.xml", "--junitxml=out.xml")
    assert_refused(result, "*--kv-report out.xml: is also the --junitxml output (out.xml)*")
    assert not (pytester.path / "out.xml").exists()


@pytest.mark.parametrize("option", ["--kv-skips-file", "--kv-xfails-file"])
def test_kv_report_naming_an_id_file(pytester: pytest.Pytester, option: str) -> None:
    (pytester.path / "ids.txt").write_text("test_nothing_matches_this\n")
    result = pytester.runpytest(*ONE_TEST, f"{option}=ids.txt", "--kv-report=ids.txt")
    assert_refused(result, f"*--kv-report ids.txt: is also the {option} input (ids.txt), "
                           "which writing there would destroy")
    assert (pytester.path / "ids.txt").read_text() == "test_nothing_matches_this\n"


# ------------------------------------------------------------------ paths no file can be
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_kv_report_that_is_not_a_regular_file(pytester: pytest.Pytester, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(pytester.path / "pipe")
        path, what = "pipe", "named pipe"
    else:
        path, what = os.devnull, "character device"
    result = pytester.runpytest(*ONE_TEST, f"--kv-report={path}")
    assert_refused(result, f"*--kv-report {path}: is not a regular file (a {what}), which the "
                           "atomic write would replace")
    assert os.path.exists(path) and not os.path.isfile(path)


def test_kv_report_ending_in_a_separator(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*ONE_TEST, "--kv-report=out/")
    assert_refused(result, "*--kv-report out/: ends in a path separator, so it names a "
                           "folder, not a file",
                   "  Fix: name a file, e.g. --kv-report out/kvcheck.jsonl")
    assert not (pytester.path / "out").exists()


# ------------------------------------------------------------------ concurrent writers
def test_kv_report_another_run_is_writing(pytester: pytest.Pytester, tmp_path: Path,
                                          holder: subprocess.Popen[str]) -> None:
    target = tmp_path / "held" / "r.jsonl"
    target.write_text("the other run's record\n")
    result = pytester.runpytest(*ONE_TEST, f"--kv-report={target}")
    assert_refused(result, f"*--kv-report {target}: another kvcheck run is writing this file "
                           f"(process {holder.pid} on *), and one record would be lost")
    assert target.read_text() == "the other run's record\n"
    # Killed (SIGKILL: no cleanup at all): the kernel drops its lock, so the next run goes.
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock_file_for(target).exists(), "a killed holder leaves its lock file behind"
    result = pytester.runpytest(*ONE_TEST, f"--kv-report={target}")
    assert result.ret == 0, result.stdout.str()
    assert len(load_records(target)) == 1
    assert no_lock_files(tmp_path), "the run removes the lock file it held"


def test_the_report_is_locked_for_the_whole_session(pytester: pytest.Pytester) -> None:
    """While the session runs (its tests, the end of the session), a second writer is
    refused; after a normal run no lock file is left."""
    pytester.makepyfile(test_probe="""
        import pytest
        from kvcheck.lock import OutputBusyError, acquire_output_lock

        def test_report_is_held(kv_impl):
            with pytest.raises(OutputBusyError):
                acquire_output_lock("out/r.jsonl")
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                "test_probe.py", "--kv-report=out/r.jsonl")
    result.assert_outcomes(passed=1)
    assert len(load_records(pytester.path / "out" / "r.jsonl")) == 1
    assert sorted(p.name for p in (pytester.path / "out").iterdir()) == ["r.jsonl"]


def test_a_refused_run_leaves_no_folder_or_lock(pytester: pytest.Pytester) -> None:
    """The --kv-report claim created new/deeper/ for its lock; the later refusal of
    --kv-bench-report (a folder) removes both."""
    (pytester.path / "dir").mkdir()
    result = pytester.runpytest(*BENCH, "--kv-report=new/deeper/r.jsonl",
                                "--kv-bench-report=dir")
    assert_refused(result, "*--kv-bench-report dir: is a directory*")
    assert not (pytester.path / "new").exists()
    assert no_lock_files(pytester.path)


# ------------------------------------------------------------------ the lock itself
def test_lock_refuses_a_second_holder_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "r.jsonl"
    first = acquire_output_lock(target)
    assert first.held and lock_file_for(target).read_text().startswith(
        f"process {os.getpid()} on ")
    with pytest.raises(OutputBusyError, match=rf"being written by another process "
                                              rf"\(process {os.getpid()} on "):
        acquire_output_lock(tmp_path / "a" / "." / "b" / "r.jsonl")  # another spelling
    first.release()
    first.release()  # idempotent
    assert list(tmp_path.iterdir()) == [], "the folders made for the lock are removed"
    second = acquire_output_lock(target)
    assert second.held
    second.release()


def test_lock_degrades_where_flock_is_unavailable(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(fd: int, operation: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(kvlock.fcntl, "flock", unsupported)
    lock = acquire_output_lock(tmp_path / "r.jsonl")
    assert not lock.held
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(kvlock, "fcntl", None)
    assert not acquire_output_lock(tmp_path / "r.jsonl").held


# ------------------------------------------------------------------ kvcheck record -o
@pytest.fixture
def never_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal must come before any recording starts."""
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("record_corpus ran before the output was checked")

    monkeypatch.setattr(recorder, "record_corpus", fail)


def record(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    rc = main(["record", "--kv-impl=reference", "--traces", "1", *map(str, args)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out + err


@pytest.mark.usefixtures("never_records")
def test_record_refuses_bad_outputs_before_recording(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "notes.txt").write_text("mine\n")
    cases = {
        tmp_path / "dir": "is a directory; name a file inside it",
        "": "empty path; name a file, e.g. -o corpus.cbor.xz",
        tmp_path / "notes.txt" / "c.cbor.xz": "cannot write there (",
        os.devnull: "is not a regular file (a character device)",
    }
    for path, words in cases.items():
        rc, out = record(capsys, "-o", path)
        assert rc == 2 and out.startswith(f"kvcheck record: -o {path}: ") and words in out, out
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "notes.txt"]


@pytest.mark.usefixtures("never_records")
def test_record_never_replaces_a_file_that_is_not_a_corpus(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    fake_xz = tmp_path / "other.cbor.xz"
    fake_xz.write_bytes(b"\xfd7zXZ\x00 not really")
    for path in (notes, fake_xz):
        before = path.read_bytes()
        rc, out = record(capsys, "-o", path)
        assert rc == 2 and out == (
            f"kvcheck record: -o {path}: exists and is not a kvcheck corpus, so recording "
            "would replace it; name a new file (e.g. -o corpus.cbor.xz), or pass --force to "
            "replace it\n")
        assert path.read_bytes() == before


def test_record_replaces_a_corpus_and_with_force_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "c.cbor.xz"
    assert record(capsys, "-o", corpus)[0] == 0 and is_corpus_file(corpus)
    corpus.write_bytes(corpus.read_bytes())  # an existing corpus: replaced without --force
    rc, out = record(capsys, "--seed", "1", "-o", corpus)
    assert rc == 0 and "written to" in out
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    rc, out = record(capsys, "-o", notes, "--force")
    assert rc == 0 and is_corpus_file(notes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.cbor.xz", "notes.txt"]


@pytest.mark.usefixtures("never_records")
def test_record_into_a_file_another_run_is_writing(
        tmp_path: Path, holder: subprocess.Popen[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "held" / "r.jsonl"
    rc, out = record(capsys, "-o", target)
    assert rc == 2 and out.startswith(
        f"kvcheck record: -o {target}: another kvcheck run is writing this file (process "
        f"{holder.pid} on ")
    assert "; wait for it to finish, or write to another file, e.g. -o corpus.cbor.xz" in out
    assert not target.exists()


def test_record_o_and_check_together_are_refused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.cbor.xz"
    path.write_bytes(b"x")
    rc, out = record(capsys, "-o", path, "--check", path)
    assert rc == 2 and "pass -o PATH (record a corpus) or --check PATH" in out
    assert path.read_bytes() == b"x"


# ------------------------------------------------------------------ other writers
def test_leaderboard_and_gate_outputs_get_the_same_checks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "r.jsonl"
    records.write_text("{}\n")
    os.mkfifo(tmp_path / "pipe")
    for args, option in ((["leaderboard", str(records), "-o"], "-o"),
                         (["gate", "--baseline", str(records), "--current", str(records),
                           "--markdown"], "--markdown")):
        for path, words in ((str(tmp_path / "pipe"), "is not a regular file (a named pipe)"),
                            (f"{tmp_path}/new/", "ends in a path separator")):
            assert main([*args, path]) == 2
            out, err = capsys.readouterr()
            assert out == "" and f"{option} {path}: {words}" in err, err
    assert not (tmp_path / "new").exists()
    assert records.read_text() == "{}\n"


def test_trace_workload_dump_into_a_folder(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert trace_workload_main(["dump", "burst_short", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"python -m kvcheck.bench.trace_workload: error: -o {tmp_path}: is a "
                   f"directory; name a file inside it, e.g. -o {tmp_path / 'trace.jsonl'}\n")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ xdist
CRASH_ONCE = """
import os

def test_crashes_its_worker_once(kv_impl):
    mark = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crashed.mark")
    if not os.path.exists(mark):
        open(mark, "w").close()
        os._exit(3)

def test_other(kv_impl):
    pass
"""


def test_a_crashed_worker_fails_the_run(pytester: pytest.Pytester) -> None:
    """The crashed test passes on its rerun, so pytest alone would exit 0; the verdict is
    incomplete (a worker crashed), so the exit status is 1. The controller alone holds the
    report's lock (a worker claiming it would be refused) and writes the record."""
    pytester.makepyfile(test_crash=CRASH_ONCE)
    # pytest-rerunfailures reruns a crashed worker's test through a socket to the controller;
    # on a loaded machine that rerun is now and then not made (the test then fails as
    # crashed, and the premise, "pytest alone would pass", does not hold): up to three tries.
    for _ in range(3):
        for leftover in ("crashed.mark", "r.jsonl"):
            (pytester.path / leftover).unlink(missing_ok=True)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-p", "no:randomly", "--kv-impl=reference", "-n", "2",
            "--reruns=1", "test_crash.py", "--kv-report=r.jsonl", timeout=60)
        if "2 passed" in result.stdout.str():
            break
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*verdict: reference: incomplete: *an xdist worker crashed*",
        "kvcheck: exit status 1: an xdist worker crashed, so the run is incomplete*"])
    assert "2 passed" in result.stdout.str()
    (rec,) = load_records(pytester.path / "r.jsonl")
    assert rec["complete"] is False and rec["conforms"] is False
    assert no_lock_files(pytester.path)
