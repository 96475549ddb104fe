"""adapters/vllm_sizing.py: the ``sizing`` area run on the installed vLLM's own sizing code
(0.33.0 and 0.10.2 environments built by scripts/vllm-cpu-env.sh); skipped without vLLM."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvcheck.conformance

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (build it: scripts/vllm-cpu-env.sh)")

#: The vLLM adapter plus the sizing functions, declaring ``sizing``.
_MODULE = '''
from dataclasses import replace

from kvcheck.adapters.vllm import *  # noqa: F403
from kvcheck.adapters.vllm import IMPL_INFO as _BASE
from kvcheck.adapters.vllm_sizing import (  # noqa: F401
    SIZING_PROFILE, kv_block_sizes, kv_cache_view_shape, kv_page_size_bytes, kv_sizing_plan)

IMPL_INFO = replace(_BASE, name="vllm-sizing", capabilities=_BASE.capabilities | {"sizing"})
'''

_FACTS = """
import json
import kvcheck.adapters.vllm as a
import kvcheck.adapters.vllm_feature_defaults as f
import kvcheck.adapters.vllm_sizing as s
print(json.dumps({"profile": a.IMPL_INFO.profile, "sizing_profile": s.SIZING_PROFILE,
                  "feature_profile": f.FEATURE_PROFILE}))
"""


@needs_vllm
def test_sizing_profile_is_the_adapters_profile() -> None:
    """Asked in a child process: vLLM and torch stay out of this one."""
    proc = subprocess.run([sys.executable, "-c", _FACTS], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["sizing_profile"] == facts["profile"] == facts["feature_profile"], facts


@needs_vllm
def test_sizing_area_passes_on_vllm(pytester: pytest.Pytester) -> None:
    """conformance/test_sizing.py (golden values, errors, random specs and models against
    kvcheck's reference) answered by vLLM's own code."""
    pytester.makepyfile(vllm_sizing_impl=_MODULE)
    suite = Path(kvcheck.conformance.__file__).parent / "test_sizing.py"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kv-impl=vllm_sizing_impl", "--kv-max-examples=50",
        str(suite), timeout=900)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, (
        outcomes, result.stdout.str()[-4000:])
    assert outcomes.get("passed", 0) >= 20, outcomes


def test_adapter_without_vllm_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without vLLM the module fails to import (the loader turns that into its usage error)."""
    if HAS_VLLM:
        pytest.skip("vLLM is installed here")
    monkeypatch.delitem(sys.modules, "kvcheck.adapters.vllm_sizing", raising=False)
    with pytest.raises(ImportError, match=r"vLLM is not installed.*scripts/vllm-cpu-env\.sh"):
        importlib.import_module("kvcheck.adapters.vllm_sizing")
