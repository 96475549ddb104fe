"""`kvcheck new-adapter NAME`: the skeleton has every protocol method and capability, loads,
and a plain `pytest` in its folder runs the suite on it and reports NotImplementedError
failures (not a usage error); bad names and existing files are refused with nothing written."""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from types import ModuleType

import pytest

from kvcheck.conformance import protocol
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import (
    MANAGER_CAPABILITIES,
    ImplInfo,
    KVCacheSpec,
    RequestView,
)
from kvcheck.plugin.cli import main

MANAGER_PROTOCOLS = (protocol.KVCacheManagerAdapter, protocol.SupportsResetPrefixCache,
                     protocol.SupportsFreeQueueOrder,
                     protocol.SupportsRefCounts, protocol.SupportsBlockHashes,
                     protocol.SupportsEvents, protocol.SupportsSlotMapping,
                     protocol.SupportsInvariants, protocol.SupportsBatchMetadata)


def protocol_methods(proto: type) -> set[str]:
    return {n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")}


def import_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"scaffold_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def skeleton(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["new-adapter", "myengine", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'myengine.py'}" in out and "pytest -x" in out
    return tmp_path


def test_writes_module_and_pytest_ini(skeleton: Path) -> None:
    assert sorted(p.name for p in skeleton.iterdir()) == ["myengine.py", "pytest.ini"]
    ini = (skeleton / "pytest.ini").read_text()
    assert re.search(r"^\[pytest\]$", ini, re.MULTILINE)
    assert re.search(r"^addopts = --kv-impl=myengine$", ini, re.MULTILINE)
    assert re.search(r"^pythonpath = \.$", ini, re.MULTILINE)


def test_every_protocol_method_is_there_and_raises_not_implemented(skeleton: Path) -> None:
    module = import_file(skeleton / "myengine.py")
    spec = KVCacheSpec(num_blocks=16, block_size=4)
    manager = module.make_kv_cache_manager(spec)
    pool = module.make_block_pool(spec)
    wanted = set().union(*map(protocol_methods, MANAGER_PROTOCOLS))
    assert "reset_prefix_cache" in wanted and "check_invariants" in wanted  # the set is real
    for obj, names in ((manager, wanted), (pool, protocol_methods(protocol.BlockPoolAdapter))):
        for name in sorted(names):
            method = getattr(obj, name)
            params = list(inspect.signature(method).parameters)
            args = {"request": RequestView("r", (1, 2, 3)), "num_new_tokens": 3,
                    "num_blocks": 1, "block_hash": b"x", "ordered_block_ids": [1],
                    "block_ids": [1], "num_cached_blocks": 0, "num_full_blocks": 0,
                    "block_id": 1, "request_id": "r", "start": 0, "end": 1,
                    "block_tables": [[1]], "num_computed_tokens": [0],
                    "num_scheduled_tokens": [1], "num_padded_tokens": 1, "seq_lens": [1]}
            with pytest.raises(NotImplementedError, match=rf"myengine\.\w+\.{name}: \w+"):
                method(*(args[p] for p in params if p in args))
    with pytest.raises(NotImplementedError, match="KernelSet"):
        module.kernels()


def test_impl_info_lists_every_field_and_capability(skeleton: Path) -> None:
    text = (skeleton / "myengine.py").read_text()
    for f in fields(ImplInfo):
        assert re.search(rf"^    {f.name}=", text, re.MULTILINE), f"IMPL_INFO lacks {f.name}"
    for cap in MANAGER_CAPABILITIES:
        assert re.search(rf'^        (# )?"{cap}",\s+# \S', text, re.MULTILINE), cap
    info = import_file(skeleton / "myengine.py").IMPL_INFO
    assert info.capabilities == {"manager", "prefix_caching"}
    assert (info.profile, info.hash_algos) == ("generic", ())


def test_declaring_every_capability_still_loads(skeleton: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each capability's methods are where the loader looks for them (uncommenting every
    capability line gives a module the loader accepts)."""
    path = skeleton / "myengine.py"
    text = re.sub(r'^        # (")', r"        \1", path.read_text(), flags=re.MULTILINE)
    path.write_text(text)
    monkeypatch.syspath_prepend(str(skeleton))
    handle = load_impl("myengine")
    assert handle.info.capabilities == set(MANAGER_CAPABILITIES)
    sys.modules.pop("myengine", None)


def test_vllm_profile_skeleton_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a vLLM profile the design capabilities are implied: their methods must exist."""
    assert main(["new-adapter", "myvllmish", "--dir", str(tmp_path),
                 "--profile", "vllm-0.33"]) == 0
    monkeypatch.syspath_prepend(str(tmp_path))
    handle = load_impl("myvllmish")
    assert (handle.info.profile, handle.info.hash_algos) == ("vllm-0.33", ("sha256",))
    sys.modules.pop("myvllmish", None)


def test_pytest_in_the_folder_runs_the_suite_and_reports_failures(skeleton: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x", "--kv-max-examples=3"],
        cwd=skeleton, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]           # tests failed; 4 would be a usage error
    assert "kvcheck conformance: myengine 0.0.1 (generic)" in out
    assert re.search(r"NotImplementedError: myengine\.Manager\.\w+: ", out), out[-3000:]
    assert "1 failed" in out


@pytest.mark.parametrize("name", ["1engine", "my-engine", "class", "", "my engine", "ñame",
                                  "test_engine", "vllm"])
def test_bad_names_are_refused(tmp_path: Path, name: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new-adapter", name, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcheck new-adapter: ") and "\n  Fix: " in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", ["myengine.py", "pytest.ini"])
def test_existing_files_are_never_overwritten(tmp_path: Path, existing: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / existing).write_text("mine\n")
    assert main(["new-adapter", "myengine", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / existing} already exists; nothing was written" in err
    assert [p.name for p in tmp_path.iterdir()] == [existing]
    assert (tmp_path / existing).read_text() == "mine\n"


def test_missing_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new-adapter", "myengine", "--dir", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()
