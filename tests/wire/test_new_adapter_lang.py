"""``kvcheck new-adapter --lang rust|cpp|js NAME`` as a newcomer runs it: the files and the
``pytest.ini`` it writes, the next step it prints, and that step's first run failing on the
first method to write (``num_free_blocks``), as the Python scaffold's does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.plugin.cli import main


@pytest.mark.parametrize(("lang", "files"), [
    ("rust", ["eng/Cargo.toml", "eng/src/main.rs", "eng/pytest.ini"]),
    ("cpp", ["eng.cpp", "pytest.ini"]),
    ("js", ["eng.mjs", "pytest.ini"]),
])
def test_it_writes_the_shim_and_a_pytest_ini(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             lang: str, files: list[str]) -> None:
    assert main(["new-adapter", "--lang", lang, "eng", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in files:
        assert (tmp_path / name).is_file(), name
        assert f"wrote {tmp_path / name}" in out
    sources = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert '"generic"' in sources and "{{PROFILE}}" not in sources
    ini = next(tmp_path.glob("**/pytest.ini")).read_text()
    assert "--kv-impl='exec:" in ini
    assert "{{NAME}}" not in "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "pytest -x" in out and "next:" in out


def test_profile_goes_into_impl_info(tmp_path: Path) -> None:
    assert main(["new-adapter", "--lang", "js", "eng", "--profile", "vllm-0.33",
                 "--dir", str(tmp_path)]) == 0
    assert 'profile: "vllm-0.33",' in (tmp_path / "eng.mjs").read_text()


def test_it_never_overwrites_and_refuses_bad_names(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new-adapter", "--lang", "js", "eng", "--dir", str(tmp_path)]) == 0
    (tmp_path / "eng.mjs").write_text("// mine\n")
    assert main(["new-adapter", "--lang", "js", "eng", "--dir", str(tmp_path)]) == 2
    assert "exist(s) already; nothing was written" in capsys.readouterr().err
    assert (tmp_path / "eng.mjs").read_text() == "// mine\n"
    assert main(["new-adapter", "--lang", "rust", "9lives", "--dir", str(tmp_path)]) == 2
    assert "cannot name an engine" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["new-adapter", "--lang", "go", "eng"])


def test_the_js_skeleton_fails_first_on_num_free_blocks(tmp_path: Path) -> None:
    if shutil.which("node") is None:
        pytest.skip("node is not on PATH")
    assert main(["new-adapter", "--lang", "js", "skel", "--dir", str(tmp_path)]) == 0
    run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-p", "no:cacheprovider"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "skel.num_free_blocks" in run.stdout and "is not written yet" in run.stdout
    assert "skel does NOT conform to generic" in run.stdout
