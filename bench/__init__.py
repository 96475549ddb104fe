"""kvcheck.bench: allocator and kernel benchmarks, run with ``pytest --kv-impl=X --kv-bench``.

* ``plugin``: the pytest11 plugin (``--kv-bench-*`` options, tables, result records);
* ``workloads``: seeded, named request traces; ``scheduler``: the continuous-batching loop
  that replays them through the adapter protocol; ``allocator``: the allocator measurements;
  ``paired``: implementation and reference rounds interleaved A B B A, paired ratios;
  ``harness``: the null adapter's floor and an adapter's protocol layer; ``stability``: two
  back-to-back runs and how far each ratio moved; ``request_speed``: request construction;
* ``kernel_inputs``, ``providers``, ``kernel_bench``: kernel cases, the kernels compared
  (torch references, kvcheck's Triton, the implementation's, vLLM's, FlashInfer's) and one
  measurement; ``machine``: device, peaks and commit; ``timing``: clocks, CUDA events, L2;
* ``metrics``: statistics, ratios and bytes-moved models; ``session``: shared state and
  records; ``table``: the terminal tables;
* ``bench_allocator.py``, ``bench_kernels.py``: the benchmarks; ``run_gpu.sh``: the GPU set.
"""
