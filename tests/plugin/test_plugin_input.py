"""Bad pytest options are refused before anything runs: a usage error (exit 4) whose message
names the option, the problem and the fix; no traceback, no lost run, no half-written file."""

from __future__ import annotations

import pytest

import kvcheck.adapters.reference  # noqa: F401


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", *args)


def assert_usage_error(result: pytest.RunResult, *lines: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    assert "Traceback" not in err and "INTERNALERROR" not in result.stdout.str()
    result.stderr.fnmatch_lines([*lines, "*Fix: *"])
    assert "passed" not in result.stdout.str(), "nothing may run before the error"


def test_report_path_is_a_folder(pytester: pytest.Pytester) -> None:
    (pytester.path / "out").mkdir()
    result = run(pytester, "--kv-impl=reference", "--kv-report=out")
    assert_usage_error(result, "ERROR: kvcheck: --kv-report out: is a directory")


def test_report_path_under_a_file(pytester: pytest.Pytester) -> None:
    (pytester.path / "plain.txt").write_text("not a folder\n")
    result = run(pytester, "--kv-impl=reference", "--kv-report=plain.txt/r.jsonl")
    assert_usage_error(result, "*--kv-report plain.txt/r.jsonl: cannot write there*")
    assert (pytester.path / "plain.txt").read_text() == "not a folder\n"


def test_report_path_empty(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--kv-impl=reference", "--kv-report=")
    assert_usage_error(result, "*--kv-report : empty path*")


def test_existing_report_is_replaced_atomically(pytester: pytest.Pytester) -> None:
    """Documented like --junitxml: the file is replaced, never appended to or half-written."""
    (pytester.path / "r.jsonl").write_text("old content\n")
    result = run(pytester, "--kv-impl=reference", "-k", "test_first_allocation",
                 "--kv-report=r.jsonl")
    assert result.ret == 0
    text = (pytester.path / "r.jsonl").read_text()
    assert "old content" not in text and text.count("\n") == 1
    assert not list(pytester.path.glob(".r.jsonl.*")), "no temporary file left behind"


@pytest.mark.parametrize("option", ["--kv-skips-file", "--kv-xfails-file"])
def test_binary_id_file(pytester: pytest.Pytester, option: str) -> None:
    (pytester.path / "ids.bin").write_bytes(b"test_x\n\x00\x01\x02\xff")
    result = run(pytester, "--kv-impl=reference", f"{option}=ids.bin")
    assert_usage_error(result, f"*{option}=ids.bin: a binary file (NUL byte at offset 7)*")


@pytest.mark.parametrize("option", ["--kv-skips-file", "--kv-xfails-file"])
def test_non_utf8_id_file(pytester: pytest.Pytester, option: str) -> None:
    (pytester.path / "ids.txt").write_bytes(b"test_first_allocation\ntest_caf\xe9\n")
    result = run(pytester, "--kv-impl=reference", f"{option}=ids.txt")
    assert_usage_error(result, f"*{option}=ids.txt: not UTF-8 text (byte 0xe9 at offset 30, "
                               "line 2)*")


def test_id_file_with_a_bom_is_fine(pytester: pytest.Pytester) -> None:
    (pytester.path / "ids.txt").write_bytes("\ufefftest_first_allocation\n".encode())
    result = run(pytester, "--kv-impl=reference", "--kv-xfails-file=ids.txt", "-k",
                 "test_first_allocation or test_initial_free_count")
    assert result.ret == 0
    result.assert_outcomes(passed=1, xpassed=1)


@pytest.mark.parametrize("line", ["test_", "reference", "::"])
def test_id_line_matching_every_test(pytester: pytest.Pytester, line: str) -> None:
    (pytester.path / "ids.txt").write_text(f"# every test\n{line}\n")
    result = run(pytester, "--kv-impl=reference", "--kv-xfails-file=ids.txt")
    assert_usage_error(result, f"*--kv-xfails-file: the line {line!r} matches every collected "
                               "test*")


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_bad_timeout(pytester: pytest.Pytester, value: str) -> None:
    result = run(pytester, "--kv-impl=reference", f"--kv-timeout={value}")
    assert_usage_error(result, "*--kv-timeout=*: must be a finite number of seconds >= 0*")


def test_timeout_not_a_number(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--kv-impl=reference", "--kv-timeout=soon")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kv-timeout*invalid float value*soon*"])


def test_max_examples_zero(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--kv-impl=reference", "--kv-max-examples=0")
    assert_usage_error(result, "*--kv-max-examples=0: must be >= 1*")
