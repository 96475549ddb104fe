"""Output paths of `kvcheck leaderboard -o` and `kvcheck gate --markdown` are checked before
anything is read or written: naming one of the command's own inputs (same path, a link to
it, the same file under another name) is refused with exit 2 and the input stays
byte-identical; a directory, a path under a regular file or an unwritable folder is exit 2
with a message, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck.plugin.cli import main


@pytest.fixture
def records(rec: SimpleNamespace) -> Path:
    return rec.write("records.jsonl", rec.conformance("mine"))


def _run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    rc = main([*map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
@pytest.mark.parametrize("option", ["-o", "--output"])
def test_leaderboard_output_naming_its_input_is_refused(
        records: Path, capsys: pytest.CaptureFixture[str], fmt: str, option: str) -> None:
    before = records.read_bytes()
    rc, out, err = _run(capsys, "leaderboard", records, "--format", fmt, option, records)
    assert rc == 2 and out == ""
    assert err.startswith(f"kvcheck leaderboard: -o {records}: is also an input file "
                          f"({records}); writing there would replace the records with the "
                          "report; write the output to another file, e.g. -o leaderboard.")
    assert "Traceback" not in err
    assert records.read_bytes() == before
    assert sorted(p.name for p in records.parent.iterdir()) == ["records.jsonl"]


def test_leaderboard_output_naming_an_input_another_way(
        rec: SimpleNamespace, records: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A relative spelling, a symlink and a hard link all reach the same file."""
    other = rec.write("other.jsonl", rec.conformance("other"))
    before = records.read_bytes()
    folder = records.parent
    (folder / "sub").mkdir()
    (folder / "link.jsonl").symlink_to(records)
    os.link(records, folder / "hard.jsonl")
    monkeypatch.chdir(folder / "sub")
    for output in ("../records.jsonl", str(folder / "link.jsonl"), str(folder / "hard.jsonl")):
        rc, _, err = _run(capsys, "leaderboard", other, "../records.jsonl", "--format",
                          "markdown", "-o", output)
        assert rc == 2, output
        assert "is also an input file (../records.jsonl)" in err, output
        assert records.read_bytes() == before


def test_gate_markdown_naming_an_input_is_refused(
        rec: SimpleNamespace, records: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    waivers = tmp_path / "waivers.txt"
    waivers.write_text("x  # reason\n")
    for target in (records, waivers):
        before = target.read_bytes()
        rc, out, err = _run(capsys, "gate", "--baseline", records, "--current", records,
                            "--waivers", waivers, "--markdown", target)
        assert rc == 2 and out == "", target
        assert err.startswith(f"kvcheck gate: --markdown {target}: is also an input file "
                              f"({target})"), err
        assert "e.g. --markdown gate.md" in err
        assert target.read_bytes() == before


def test_output_that_is_a_directory(records: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "site"
    folder.mkdir()
    rc, out, err = _run(capsys, "leaderboard", records, "--format", "html", "-o", folder)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err == (f"kvcheck leaderboard: -o {folder}: is a directory; name a file inside it, "
                   f"e.g. -o {folder / 'leaderboard.html'}\n")
    assert list(folder.iterdir()) == []
    rc, _, err = _run(capsys, "gate", "--baseline", records, "--current", records,
                      "--markdown", folder)
    assert rc == 2 and f"--markdown {folder}: is a directory" in err


def test_output_under_a_regular_file(records: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder\n")
    target = blocker / "board.md"
    rc, out, err = _run(capsys, "leaderboard", records, "--format", "markdown", "-o", target)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"kvcheck leaderboard: -o {target}: cannot write there (")
    assert err.rstrip().endswith("name a file in a folder you can write to")
    assert blocker.read_text() == "a file, not a folder\n"


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True,
                    reason="root writes into read-only folders; POSIX permissions only")
def test_output_in_a_read_only_folder(records: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        rc, _, err = _run(capsys, "leaderboard", records, "-o", locked / "board.txt")
    finally:
        locked.chmod(0o700)
    assert rc == 2 and "cannot write there (Permission denied)" in err


def test_empty_output_path(records: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, "leaderboard", records, "-o", "")
    assert rc == 2 and err == ("kvcheck leaderboard: -o : empty path; name a file, e.g. "
                               "-o leaderboard.txt\n")


def test_a_good_output_is_written(records: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The checks do not get in the way: a new folder is created, the page written."""
    page = tmp_path / "new" / "deeper" / "board.md"
    rc, out, _ = _run(capsys, "leaderboard", records, "--format", "markdown", "-o", page)
    assert rc == 0 and "1 table(s) written to" in out
    assert page.read_text().startswith("# kvcheck leaderboard")
    assert sorted(p.name for p in page.parent.iterdir()) == ["board.md"]  # no probe left


def test_nothing_is_created_when_the_input_is_bad(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The output check leaves no folder or probe file behind when the command then fails."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{\n")
    rc, _, err = _run(capsys, "leaderboard", bad, "-o", tmp_path / "new" / "board.txt")
    assert rc == 2 and "bad.jsonl:1: not valid JSON" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
