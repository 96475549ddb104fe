"""The kernel benchmarks' parts: cases and inputs (``inputs``), the kernels compared side by
side (``providers``: torch references, kvcheck's Triton kernels, the implementation's, vLLM's,
FlashInfer's) and one kernel measurement (``measure``)."""
