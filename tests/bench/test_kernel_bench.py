"""The kernel measurement pipeline on the CPU: warm-up and rounds through a pedantic-shaped
stand-in, the re-check that fails wrong kernels, kvcheck's Triton kernels in the interpreter,
and the vLLM / FlashInfer adapters driven through fake modules built on kvcheck's references
(so their index conversions are checked; the real libraries need CUDA)."""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import

from kvcheck.bench.kernels.inputs import KernelBenchCase, KernelInputPool  # noqa: E402
from kvcheck.bench.kernels.measure import measure_kernel  # noqa: E402
from kvcheck.bench.kernels.providers import ProviderUnavailable, _csr, make_provider  # noqa: E402
from kvcheck.bench.measure.machine import KernelDevice  # noqa: E402
from kvcheck.gpu_kernels.reference import (  # noqa: E402
    attention_ref,
    paged_attention_varlen_ref,
    store_kv_cache_ref,
)

COMMON = dict(num_kv_heads=2, queries_per_kv=2, head_size=32, block_size=16, dtype="float32",
              num_input_sets=2)
CASES = {
    "store_kv_cache": KernelBenchCase("s", "store_kv_cache", (20, 5, 33), (1, 1, 1), num_pad=2,
                                      **COMMON),
    "paged_attention_decode": KernelBenchCase("d", "paged_attention_decode", (20, 5, 33),
                                              (1, 1, 1), **COMMON),
    "paged_attention_varlen": KernelBenchCase("v", "paged_attention_varlen", (20, 5, 33),
                                              (20, 1, 4), **COMMON),
}


class FakeBenchmark:
    """``benchmark.pedantic``'s contract: warm-up then timed rounds, setup before each."""

    def __init__(self) -> None:
        self.extra_info: dict = {}
        self.calls = 0

    def pedantic(self, target, setup, rounds, warmup_rounds):
        for _ in range(warmup_rounds + rounds):
            args, kwargs = setup()
            target(*args, **kwargs)
            self.calls += 1


@pytest.fixture(scope="module")
def device():
    dev = KernelDevice.create("cpu")
    yield dev
    dev.restore()


def _measure(op: str, provider, device, rounds: int = 2, warmup: int = 1):
    bench = FakeBenchmark()
    metrics, info = measure_kernel(bench, KernelInputPool(CASES[op], "cpu"), provider, device,
                                   rounds, warmup)
    assert bench.calls == rounds + warmup
    return {m.name: m for m in metrics}, info


@pytest.mark.parametrize("op", list(CASES))
def test_torch_reference_pipeline(op: str, device) -> None:
    """Time, GB/s and % of the copy peak from the timed rounds; the warm-up round is dropped;
    the bytes model and the re-check are recorded."""
    metrics, info = _measure(op, make_provider("torch_ref"), device)
    assert len(metrics["time_us"].samples) == 2
    assert metrics["gbps"].value > 0 and "pct_copy_peak" in metrics
    assert "pct_theoretical_peak" not in metrics  # unknown on the CPU: never invented
    assert info["bytes_per_call"] > 0 and info["l2"] == "uncontrolled"
    assert ("read back" in info["recheck"]) == (op == "store_kv_cache")


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


@pytest.mark.skipif(not _interpreted(), reason="needs the Triton interpreter (CPU run)")
@pytest.mark.parametrize("op", list(CASES))
def test_kvcheck_triton_passes_the_recheck(op: str, device) -> None:
    """kvcheck's kernels, interpreted: the output re-check against the reference passes."""
    pytest.importorskip("triton")
    _, info = _measure(op, make_provider("kvcheck_triton"), device, rounds=1, warmup=0)
    assert "read back" in info["recheck"] or "fp32 torch reference" in info["recheck"]


def _impl_with(kernel_set) -> SimpleNamespace:
    return SimpleNamespace(name="broken", info=SimpleNamespace(version="9"),
                           has=lambda cap: cap == "kernels",
                           module=SimpleNamespace(kernels=lambda: kernel_set))


def test_a_wrong_kernel_fails_its_benchmark(device) -> None:
    """Fast but wrong is a failure: a store that skips a token and an attention that returns
    zeros are caught by the re-check after timing."""
    from kvcheck.gpu_kernels.conformance import KernelSet

    def lazy_store(key, value, key_cache, value_cache, slot_mapping):
        store_kv_cache_ref(key[1:], value[1:], key_cache, value_cache, slot_mapping[1:])

    def zeros(query, *args):
        return torch.zeros_like(query)

    provider = make_provider("impl", _impl_with(KernelSet(
        name="broken", store_kv_cache=lazy_store, paged_attention_decode=zeros)))
    with pytest.raises(AssertionError, match="does not hold the token's row"):
        _measure("store_kv_cache", provider, device)
    with pytest.raises(AssertionError, match="outside tolerance"):
        _measure("paged_attention_decode", provider, device)
    with pytest.raises(ProviderUnavailable, match="provides no paged_attention_varlen"):
        _measure("paged_attention_varlen", provider, device)


def test_impl_provider_skips_kvchecks_own_kernels() -> None:
    """The reference's kernels() are kvcheck's Triton kernels: no duplicate 'impl' rows."""
    from kvcheck.conformance.loader import load_impl

    pytest.importorskip("triton")
    with pytest.raises(ProviderUnavailable, match="see the kvcheck_triton rows"):
        make_provider("impl", load_impl("reference"))
    no_kernels = SimpleNamespace(name="x", has=lambda cap: False)
    with pytest.raises(ProviderUnavailable, match="does not declare the 'kernels' capability"):
        make_provider("impl", no_kernels)


def test_flashinfer_page_lists_hand_computed() -> None:
    """rows [[7, 3, 9], [5]], seq_lens (33, 4), block 16: indptr [0, 3, 4], indices
    [7, 3, 9, 5], last_page_len [33 - 32, 4] = [1, 4]."""
    case = KernelBenchCase("t", "paged_attention_decode", (33, 4), (1, 1), 1, 1, 16, 16,
                           dtype="float32")
    x = SimpleNamespace(case=case, rows=[[7, 3, 9], [5]], key_cache=torch.zeros(1))
    indptr, indices, last = _csr(x)
    assert (indptr.tolist(), indices.tolist(), last.tolist()) == ([0, 3, 4], [7, 3, 9, 5],
                                                                   [1, 4])


# ------------------------------------------------------------------ fake third-party modules
def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


@pytest.fixture
def fake_vllm(monkeypatch):
    """vllm._custom_ops.reshape_and_cache_flash and unified_attention, on kvcheck's refs;
    they assert the calling convention the adapter promises."""
    def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
                                kv_cache_dtype, k_scale, v_scale):
        assert kv_cache_dtype == "auto" and float(k_scale) == float(v_scale) == 1.0
        store_kv_cache_ref(key, value, key_cache, value_cache, slot_mapping)

    def unified_attention(*, q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k,
                          max_seqlen_k, softmax_scale, causal, window_size, block_table,
                          softcap, q_descale, k_descale, v_descale):
        assert causal and window_size == (-1, -1) and softcap == 0 and q_descale is None
        assert tuple(k_descale.shape) == (len(seqused_k), k.shape[2])
        assert max_seqlen_k == int(seqused_k.max())
        assert max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        out.copy_(paged_attention_varlen_ref(q, k, v, block_table, cu_seqlens_q, seqused_k,
                                             softmax_scale))

    mods = {
        "vllm": _module("vllm", __version__="0.0.fake"),
        "vllm._custom_ops": _module("vllm._custom_ops",
                                    reshape_and_cache_flash=reshape_and_cache_flash),
        "vllm.v1": _module("vllm.v1"), "vllm.v1.attention": _module("vllm.v1.attention"),
        "vllm.v1.attention.ops": _module("vllm.v1.attention.ops"),
        "vllm.v1.attention.ops.triton_unified_attention": _module(
            "vllm.v1.attention.ops.triton_unified_attention",
            unified_attention=unified_attention),
    }
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    """append_paged_kv_cache and the decode / prefill wrappers, reading FlashInfer's page
    lists (indptr, indices, last_page_len) exactly as FlashInfer defines them."""
    def pages(kv, indptr, indices, last, b):
        k_cache, v_cache = kv
        bs = k_cache.shape[1]
        ids = indices[int(indptr[b]):int(indptr[b + 1])]
        length = (len(ids) - 1) * bs + int(last[b])
        assert 1 <= int(last[b]) <= bs
        return (k_cache[ids].reshape(-1, *k_cache.shape[2:])[:length],
                v_cache[ids].reshape(-1, *v_cache.shape[2:])[:length])

    def append_paged_kv_cache(append_key, append_value, batch_indices, positions,
                              paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len,
                              kv_layout="NHD"):
        assert kv_layout == "NHD"
        k_cache, v_cache = paged_kv_cache
        bs = k_cache.shape[1]
        for i, (b, pos) in enumerate(zip(batch_indices.tolist(), positions.tolist(),
                                         strict=True)):
            num_pages = int(kv_indptr[b + 1] - kv_indptr[b])
            assert pos < (num_pages - 1) * bs + int(kv_last_page_len[b])  # lengths after append
            page = int(kv_indices[int(kv_indptr[b]) + pos // bs])
            k_cache[page, pos % bs] = append_key[i]
            v_cache[page, pos % bs] = append_value[i]

    class Wrapper:
        def __init__(self, workspace, layout):
            assert layout == "NHD"

        def plan(self, *args, q_data_type=None, kv_data_type=None, causal=None):
            assert q_data_type == kv_data_type
            self.args = args

    class BatchDecodeWithPagedKVCacheWrapper(Wrapper):
        def run(self, q, kv):
            indptr, indices, last, _, _, head_dim, _ = self.args
            out = torch.empty_like(q)
            for b in range(q.shape[0]):
                k, v = pages(kv, indptr, indices, last, b)
                out[b] = attention_ref(q[b:b + 1], k, v, head_dim ** -0.5)[0]
            return out

    class BatchPrefillWithPagedKVCacheWrapper(Wrapper):
        def run(self, q, kv):
            qo, indptr, indices, last, _, _, head_dim, _ = self.args
            out = torch.empty_like(q)
            for b in range(len(qo) - 1):
                lo, hi = int(qo[b]), int(qo[b + 1])
                k, v = pages(kv, indptr, indices, last, b)
                out[lo:hi] = attention_ref(q[lo:hi], k, v, head_dim ** -0.5)
            return out

    monkeypatch.setitem(sys.modules, "flashinfer", _module(
        "flashinfer", __version__="0.0.fake", append_paged_kv_cache=append_paged_kv_cache,
        BatchDecodeWithPagedKVCacheWrapper=BatchDecodeWithPagedKVCacheWrapper,
        BatchPrefillWithPagedKVCacheWrapper=BatchPrefillWithPagedKVCacheWrapper))


@pytest.mark.parametrize("op", list(CASES))
def test_vllm_adapter_calling_convention(op: str, device, fake_vllm) -> None:
    """kvcheck's inputs reach vLLM's entry points in their conventions and re-check clean."""
    provider = make_provider("vllm")
    assert provider.label == "vllm 0.0.fake"
    _measure(op, provider, device, rounds=1, warmup=0)


@pytest.mark.parametrize("op", list(CASES))
def test_flashinfer_adapter_page_lists(op: str, device, fake_flashinfer) -> None:
    """The page lists and append positions built for FlashInfer describe the same sequences:
    stores land in the right slots and attention matches the reference."""
    _measure(op, make_provider("flashinfer"), device, rounds=1, warmup=0)


def test_missing_third_party_libraries_are_skip_reasons(monkeypatch) -> None:
    """Not installed -> ProviderUnavailable naming the library (a skip, never a figure)."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(ProviderUnavailable, match="vLLM is not installed"):
        make_provider("vllm")
    with pytest.raises(ProviderUnavailable, match="FlashInfer is not installed"):
        make_provider("flashinfer")
