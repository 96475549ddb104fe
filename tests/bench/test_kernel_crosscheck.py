"""The cross-check of kvcheck's kernels against vLLM's Triton kernels (bench/kernel_crosscheck).

Without vLLM: the comparison itself, with torch-reference stand-ins for both sides (an honest
pair agrees; a store that drops a token and an attention with the wrong scale disagree, and the
command exits 1). With vLLM installed (the CI vLLM stage runs this file in each vLLM
environment): the real cross-check in a fresh interpreter process, vLLM's own Triton kernels
against kvcheck's, every case agreeing (0.10.2 ships no Triton store: those cases are skipped
by name, the attention cases still run).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kvcheck.bench import kernel_crosscheck  # noqa: E402
from kvcheck.bench.kernel_crosscheck import CROSSCHECK_CASES, crosscheck  # noqa: E402
from kvcheck.bench.kernels.inputs import KERNEL_OPS  # noqa: E402
from kvcheck.gpu_kernels.reference import (  # noqa: E402
    paged_attention_decode_ref,
    paged_attention_varlen_ref,
    store_kv_cache_ref,
)


def test_cases_cover_every_op_in_two_dtypes() -> None:
    seen = {(c.op, c.dtype) for c in CROSSCHECK_CASES}
    assert seen == {(op, dt) for op in KERNEL_OPS for dt in ("float32", "float16")}
    for case in CROSSCHECK_CASES:
        # Ragged contexts: at least one sequence ends inside a block, one spans several blocks.
        assert any(n % case.block_size for n in case.seq_lens), case.name
        assert max(case.seq_lens) > case.block_size, case.name


def _provider(label: str, scale_factor: float = 1.0, drop_first_token: bool = False):
    def store(x):
        skip = 1 if drop_first_token else 0
        return lambda: store_kv_cache_ref(x.key[skip:], x.value[skip:], x.key_cache,
                                          x.value_cache, x.slot_mapping[skip:])

    def decode(x):
        return lambda: paged_attention_decode_ref(x.query, x.key_cache, x.value_cache,
                                                  x.block_table, x.seq_lens,
                                                  x.scale * scale_factor)

    def varlen(x):
        return lambda: paged_attention_varlen_ref(x.query, x.key_cache, x.value_cache,
                                                  x.block_table, x.query_start_loc,
                                                  x.seq_lens, x.scale * scale_factor)

    fns = {"store_kv_cache": store, "paged_attention_decode": decode,
           "paged_attention_varlen": varlen}
    return SimpleNamespace(label=label, prepare=lambda x: fns[x.case.op](x))


@pytest.fixture
def stand_ins(monkeypatch):
    """Both providers replaced by torch references; vLLM 'ships' a Triton store."""
    providers = {"kvcheck_triton": _provider("kvcheck"), "vllm": _provider("vllm fake")}
    monkeypatch.setattr("kvcheck.bench.kernels.providers.make_provider",
                        lambda name, impl=None: providers[name])
    monkeypatch.setattr(kernel_crosscheck, "_has_triton_store", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return providers


def test_an_honest_pair_agrees(stand_ins) -> None:
    outcomes = crosscheck(device="cpu")
    assert [o.error for o in outcomes] == [None] * len(CROSSCHECK_CASES)
    assert all(o.max_abs_diff == 0 for o in outcomes)


def test_a_dropped_token_and_a_wrong_scale_disagree(stand_ins, capsys) -> None:
    stand_ins["vllm"] = _provider("vllm fake", scale_factor=1.5, drop_first_token=True)
    outcomes = crosscheck(device="cpu")
    assert all(not o.ok for o in outcomes)
    store = [o for o in outcomes if o.case.op == "store_kv_cache"]
    assert all("caches differ" in o.error for o in store)
    attention = [o for o in outcomes if o.case.op != "store_kv_cache"]
    assert all("outside tolerance" in o.error for o in attention), attention[0].error
    assert kernel_crosscheck.main([]) == 1
    assert "0 of 8 cases agree, 0 skipped, 8 disagree" in capsys.readouterr().out


def test_a_release_without_a_triton_store_skips_by_name_only_when_allowed(
        stand_ins, monkeypatch, capsys) -> None:
    monkeypatch.setattr(kernel_crosscheck, "_has_triton_store", lambda: False)
    assert kernel_crosscheck.main(["--op", "store_kv_cache"]) == 1
    assert "ships no Triton K/V store" in capsys.readouterr().out
    # Allowed but nothing else compared: not a pass either.
    assert kernel_crosscheck.main(["--op", "store_kv_cache",
                                   "--allow-missing", "store_kv_cache"]) == 2
    assert kernel_crosscheck.main(["--allow-missing", "store_kv_cache"]) == 0
    assert "4 of 8 cases agree, 4 skipped, 0 disagree" in capsys.readouterr().out


def test_a_raising_third_party_kernel_is_a_disagreement(stand_ins) -> None:
    def boom(x):
        raise RuntimeError("unsupported head size\nsecond line")

    stand_ins["vllm"] = SimpleNamespace(label="vllm fake", prepare=boom)
    outcomes = crosscheck(device="cpu")
    assert {o.error for o in outcomes} == {"vllm fake raised RuntimeError: unsupported head size"}


def test_cpu_without_the_interpreter_is_refused(stand_ins, monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(kernel_crosscheck.KVCheckError, match="TRITON_INTERPRET=1"):
        crosscheck(device="cpu")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed here (the CI vLLM stage runs this test)")
def test_vllm_triton_kernels_agree_with_kvchecks() -> None:
    """The real thing, in a fresh process (vLLM decides at import whether Triton is usable)."""
    import vllm

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                             "CUDA_VISIBLE_DEVICES")}
    args = [sys.executable, "-m", "kvcheck.bench.kernel_crosscheck"]
    if vllm.__version__.startswith("0.10."):
        args += ["--allow-missing", "store_kv_cache"]
    proc = subprocess.run(args, check=False, capture_output=True, text=True, env=env,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert " 0 disagree" in proc.stdout
