"""kvcheck.bench: allocator and kernel benchmarks, run with ``pytest --kv-impl=X --kv-bench``,
and the benchmark tools, run with ``kvcheck bench TOOL``. Every module, by role:

* **pytest layer** (here): ``plugin`` (the pytest11 plugin: ``--kv-bench-*`` options, hooks,
  tables, result records), ``session`` (shared state and the records), ``table`` (terminal
  tables), ``bench_allocator.py`` and ``bench_kernels.py`` (the benchmarks themselves),
  ``run_gpu.sh`` (the GPU set);
* **command layer** (here): ``cli`` (``kvcheck bench TOOL``), ``cli_args`` (argument types,
  bounds, ``BenchTool`` and its runner), ``options`` (the options the tools and the plugin
  share, declared once), ``errors`` (every error of this package);
* **tools** (here; ``kvcheck bench NAME``, each also ``python -m kvcheck.bench.MODULE``):
  ``stability``, ``sweep``, ``counted`` (instruction counts under callgrind),
  ``count_spread`` (``spread``), ``request_speed``, ``kernel_crosscheck`` (``kernels``),
  ``trace_workload`` (``trace``), ``offload_bench`` (``offload``: also the offload tier's
  benchmark), ``event_codec``, ``event_serve``;
* ``workload/``: what is replayed: ``source`` (the one resolver of a workload's name: a
  scenario, a request trace or a recorded corpus, and the scheduler benchmark it becomes),
  ``scenarios`` (seeded scenarios by name), ``request_trace`` (a request trace file as a
  workload, and back), ``trace_file`` (a request trace file read and bounded), ``hybrid`` (a
  grouped spec's workloads and benchmark);
* ``replay/``: how it is driven: ``scheduler`` (the continuous-batching loop through the
  protocol), ``native`` (the same loop on an engine's own objects), ``recorded`` (a recorded
  corpus replayed with the conformance Driver's step planning), ``harness`` (the null
  adapter's floor and an adapter's protocol layer);
* ``measure/``: how a round is measured: ``rounds`` (``RoundBench``, the one round type, its
  clock passed in), ``allocator`` (the scheduler, hashing and slot_mapping rounds), ``paired``
  (implementation and reference rounds interleaved A B B A, paired ratios), ``timing``
  (clocks, timed calls, the one garbage-collection policy, CUDA events, L2), ``metrics``
  (statistics, ratios, bytes-moved models), ``machine`` (device, peaks and commit);
* ``kernels/``: ``inputs`` (cases and inputs), ``providers`` (the kernels compared: torch
  references, kvcheck's Triton, the implementation's, vLLM's, FlashInfer's), ``measure`` (one
  kernel measurement);
* ``kinds/``: the other kinds and interfaces: ``event_wire`` (``take_event_batch`` and
  decoding), ``indexer`` (a router's index), ``wire`` (an ``exec:`` engine's round trip).
"""
