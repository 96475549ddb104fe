"""Compile every kernel launch configuration the wrappers produce for NVIDIA GPUs, without a GPU.

Run as a script (``python _compile_for_cuda.py [sm ...]``) in a process where TRITON_INTERPRET is
unset: the wrappers are called with CPU tensors while each kernel is replaced by a recorder that
captures its launch arguments; every captured launch is then compiled with ``triton.compile``
down to a cubin (ptxas ships with triton) for each requested target. This catches what the
interpreter cannot: tl.dot shape minimums, constexpr and type rules, loop-carried types, fp8
support per architecture. Exit status 0 when everything compiles; prints one line per launch.
"""

from __future__ import annotations

import os
import sys

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without TRITON_INTERPRET"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

from kvcheck.gpu_kernels import _host, block_copy, paged_decode, paged_varlen, store_kv  # noqa: E402
from kvcheck.gpu_kernels.cases import AttentionCase, build_attention_inputs  # noqa: E402

LAUNCHES: list[tuple[str, object, dict, dict, bool]] = []
_SEEN: set[tuple] = set()


class _Recorder:
    def __init__(self, name: str, kernel) -> None:
        self.name, self.kernel = name, kernel

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            names = [n for n in self.kernel.arg_names if n not in constexprs]
            signature = {}
            for name, value in zip(names, args, strict=False):
                signature[name] = "fp32" if isinstance(value, float) else mangle_type(value)
            uses_fp8 = any("fp8" in t for t in signature.values())
            signature.update(dict.fromkeys(constexprs, "constexpr"))
            key = (self.name, tuple(signature.items()), tuple(constexprs.items()))
            if key not in _SEEN:  # identical launches compile to the same binary
                _SEEN.add(key)
                LAUNCHES.append((self.name, self.kernel, signature, constexprs, uses_fp8))

        return launch


def _patch(module, attr: str) -> None:
    setattr(module, attr, _Recorder(attr, getattr(module, attr)))


def _record_launches() -> None:
    _host.check_device_runnable = lambda kernel, tensor: None  # CPU tensors, recorded only
    _patch(store_kv, "_store_kv_cache_kernel")
    _patch(paged_decode, "_paged_attention_decode_kernel")
    _patch(paged_decode, "_paged_attention_decode_reduce_kernel")
    _patch(paged_varlen, "_paged_attention_varlen_kernel")
    _patch(block_copy, "_copy_blocks_kernel")
    _patch(block_copy, "_gather_kv_kernel")

    for dtype, kv in ((torch.float16, "auto"), (torch.bfloat16, "auto"), (torch.float32, "auto"),
                      (torch.float16, "fp8")):
        cache_dtype = torch.float8_e4m3fn if kv == "fp8" else dtype
        cache = torch.zeros(4, 16, 2, 128, dtype=cache_dtype)
        key = torch.zeros(3, 2, 128, dtype=dtype)
        store_kv.store_kv_cache(key, key, cache, cache, torch.tensor([1, -1, 5]), kv, 0.5, 0.5)
    store_kv.store_kv_cache(key, key, cache.transpose(1, 2), cache.transpose(1, 2),
                            torch.tensor([1, 2, 3], dtype=torch.int32), "fp8", layout="HND")

    variants = [
        dict(dtype="float16", queries_per_kv=4, head_size=128),
        dict(dtype="bfloat16", queries_per_kv=8, head_size=64, softcap=30.0, sliding_window=9),
        dict(dtype="float32", queries_per_kv=1, head_size=128, block_size=1),
        dict(dtype="float16", queries_per_kv=4, head_size=64, kv_cache_dtype="fp8"),
        dict(dtype="bfloat16", queries_per_kv=2, head_size=128, kv_cache_dtype="fp8"),
        dict(dtype="float16", queries_per_kv=16, head_size=80, block_size=32),
        # A sliding-window group's null-padded table (kv_start masking, window-only splits).
        dict(dtype="float16", queries_per_kv=4, head_size=64, block_size=4, sliding_window=7,
             null_padded_window=True),
    ]
    for variant in variants:
        v = {"block_size": 16, **variant}
        for query_lens in (None, (5, 1, 0, 20)):
            case = AttentionCase("compile", "cpu", num_kv_heads=2, seq_lens=(7, 30, 9, 40),
                                 query_lens=query_lens, **v)
            inputs = build_attention_inputs(case)
            c = inputs["cache"]
            if query_lens is None:
                for num_splits in (1, 4):
                    paged_decode.paged_attention_decode(
                        inputs["query"], c.key_cache, c.value_cache, inputs["block_table"],
                        inputs["seq_lens"], inputs["scale"], num_splits=num_splits,
                        max_seq_len=40, **inputs["kwargs"])
            else:
                paged_varlen.paged_attention_varlen(
                    inputs["query"], c.key_cache, c.value_cache, inputs["block_table"],
                    inputs["query_start_loc"], inputs["seq_lens"], inputs["scale"],
                    max_query_len=20, **inputs["kwargs"])
    for dtype in (torch.float16, torch.float8_e4m3fn):
        cache = torch.zeros(4, 16, 2, 64, dtype=dtype)
        block_copy.copy_blocks([cache], torch.tensor([[0, 1]]))
        block_copy.gather_kv(cache, cache, torch.tensor([[2, 3]], dtype=torch.int32),
                             torch.tensor([20], dtype=torch.int32), max_seq_len=20)


def main(archs: list[int]) -> int:
    _record_launches()
    failures = 0
    for arch in archs:
        target = GPUTarget("cuda", arch, 32)
        for name, kernel, signature, constexprs, uses_fp8 in LAUNCHES:
            if uses_fp8 and arch < 89:
                continue  # fp8 e4m3 needs sm_89+ (vLLM refuses fp8 KV caches there too)
            try:
                triton.compile(ASTSource(kernel, signature, constexprs), target=target)
                status = "ok"
            except Exception as exc:  # noqa: BLE001 - report every failing launch, not the first
                failures += 1
                status = f"FAILED {type(exc).__name__}: {str(exc)[-400:]}"
            print(f"sm_{arch} {name} {constexprs}: {status}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [90]))
