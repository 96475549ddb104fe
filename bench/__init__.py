"""kvcheck.bench: allocator and kernel benchmarks, run with ``pytest --kv-impl=X --kv-bench``,
and the benchmark tools, run with ``kvcheck bench TOOL``. Every module, by role:

* **pytest layer**: ``plugin`` (the pytest11 plugin: ``--kv-bench-*`` options, hooks, tables,
  result records), ``session`` (shared state and the records), ``table`` (terminal tables),
  ``bench_allocator.py`` and ``bench_kernels.py`` (the benchmarks themselves), ``run_gpu.sh``
  (the GPU set);
* **command layer**: ``cli`` (``kvcheck bench TOOL``), ``cli_args`` (argument types, bounds,
  ``BenchTool`` and its runner), ``options`` (the options the tools and the plugin share,
  declared once), ``errors`` (every error of this package);
* **workloads**: ``workload_source`` (the one resolver of a workload's name: a scenario, a
  request trace or a recorded corpus, and the scheduler benchmark it becomes), ``workloads``
  (seeded scenarios by name), ``request_trace`` (a request trace file as a workload, and
  back), ``trace_file`` (a request trace file read and bounded), ``hybrid`` (a grouped spec's
  workloads);
* **replay**: ``scheduler`` (the continuous-batching loop through the protocol), ``native``
  (the same loop on an engine's own objects), ``recorded_bench`` (a recorded corpus
  replayed), ``harness`` (the null adapter's floor and an adapter's protocol layer);
* **measurement**: ``rounds`` (``RoundBench``, the one round type), ``allocator`` (the
  scheduler, hashing and slot_mapping rounds), ``paired`` (implementation and reference rounds
  interleaved A B B A, paired ratios), ``timing`` (measured clocks, CUDA events, L2),
  ``metrics`` (statistics, ratios, bytes-moved models), ``counted`` (instruction counts under
  callgrind), ``machine`` (device, peaks and commit);
* **other benchmarks**: ``event_wire_bench`` (``take_event_batch`` and decoding),
  ``indexer_bench`` (a router's index), ``offload_bench`` (an offload tier), ``wire_bench``
  (an ``exec:`` engine's round trip);
* **kernels**: ``kernel_inputs`` (cases and inputs), ``providers`` (the kernels compared:
  torch references, kvcheck's Triton, the implementation's, vLLM's, FlashInfer's),
  ``kernel_bench`` (one measurement), ``kernel_crosscheck`` (kvcheck's kernels against
  vLLM's);
* **tools** (``kvcheck bench NAME``, each also ``python -m kvcheck.bench.MODULE``):
  ``stability``, ``sweep``, ``counted``, ``count_spread`` (``spread``), ``request_speed``,
  ``kernel_crosscheck`` (``kernels``), ``trace_workload`` (``trace``), ``offload_bench``
  (``offload``), ``event_codec``, ``event_serve``.
"""
