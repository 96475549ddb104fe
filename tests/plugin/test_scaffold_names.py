"""`kvcheck new-adapter NAME` refuses names `import NAME` would not resolve to the scaffold
(a standard-library module, an installed one, a module already imported, a package already in
the folder, a dunder name, an absurdly long one): exit 2, nothing written, and the message
names a free alternative that works."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvcheck.plugin.cli import main
from kvcheck.plugin.scaffold import MAX_NAME_LENGTH, shadowed_module


def new_adapter(capsys: pytest.CaptureFixture[str], name: str, folder: Path) -> tuple[int, str]:
    rc = main(["new-adapter", name, "--dir", str(folder)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out + err


@pytest.mark.parametrize("name", ["os", "json", "sys", "typing", "sqlite3", "this"])
def test_standard_library_names_are_refused(tmp_path: Path, name: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = new_adapter(capsys, name, tmp_path)
    assert rc == 2
    assert out == (f"kvcheck new-adapter: {name!r} would shadow the standard-library module "
                   f"{name}: `import {name}` would load that module, never this adapter, so "
                   f"the scaffold could not load\n  Fix: pass a free name, e.g. {name}_kv\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["numpy", "hypothesis", "rich", "cbor2", "_pytest"])
def test_installed_module_names_are_refused(tmp_path: Path, name: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = new_adapter(capsys, name, tmp_path)
    assert rc == 2
    assert out.startswith(f"kvcheck new-adapter: {name!r} would shadow the installed module "
                          f"{name} (")
    assert f"  Fix: pass a free name, e.g. {name}_kv\n" in out
    assert list(tmp_path.iterdir()) == []


def test_the_suggested_name_is_free_and_works(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = new_adapter(capsys, "json", tmp_path)
    assert rc == 2 and "e.g. json_kv\n" in out
    assert shadowed_module("json_kv") is None
    rc, out = new_adapter(capsys, "json_kv", tmp_path)
    assert rc == 0 and (tmp_path / "json_kv.py").is_file()


def test_a_taken_suggestion_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """json_kv importable (a module on sys.path): the next free name is offered."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "json_kv.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc, out = new_adapter(capsys, "json", out_dir)
    assert rc == 2 and "  Fix: pass a free name, e.g. json_kv2\n" in out
    rc, out = new_adapter(capsys, "json_kv", out_dir)
    assert rc == 2 and f"the installed module json_kv ({site / 'json_kv.py'})" in out
    assert list(out_dir.iterdir()) == []


def test_an_imported_module_without_a_spec_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    module = ModuleType("made_at_runtime")
    module.__spec__ = None
    monkeypatch.setitem(sys.modules, "made_at_runtime", module)
    rc, out = new_adapter(capsys, "made_at_runtime", tmp_path)
    assert rc == 2 and "would shadow the already imported module made_at_runtime" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["__main__", "__init__", "__engine__"])
def test_dunder_names_are_refused(tmp_path: Path, name: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = new_adapter(capsys, name, tmp_path)
    assert rc == 2 and "is a name Python reserves for special modules" in out
    assert f"e.g. {name.strip('_')}_kv\n" in out
    assert list(tmp_path.iterdir()) == []


def test_a_package_of_that_name_in_the_folder_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """pytest.ini puts the folder first on sys.path, where a package NAME/ wins over
    NAME.py."""
    (tmp_path / "myengine").mkdir()
    (tmp_path / "myengine" / "__init__.py").write_text("")
    rc, out = new_adapter(capsys, "myengine", tmp_path)
    assert rc == 2
    assert (f"{tmp_path} already holds a module 'myengine' "
            f"({tmp_path / 'myengine' / '__init__.py'})") in out
    assert "e.g. myengine_kv, or another folder (--dir)" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["myengine"]


def test_a_plain_folder_of_that_name_does_not_get_in_the_way(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder without __init__.py is only a namespace package: NAME.py wins over it."""
    (tmp_path / "myengine").mkdir()
    rc, _ = new_adapter(capsys, "myengine", tmp_path)
    assert rc == 0 and (tmp_path / "myengine.py").is_file()


def test_a_name_too_long_is_refused(tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    name = "e" * (MAX_NAME_LENGTH + 1)
    rc, out = new_adapter(capsys, name, tmp_path)
    assert rc == 2 and (f"the name is {MAX_NAME_LENGTH + 1} characters long; a module name "
                        f"here is at most {MAX_NAME_LENGTH}") in out
    assert list(tmp_path.iterdir()) == []
    assert new_adapter(capsys, "e" * MAX_NAME_LENGTH, tmp_path)[0] == 0
