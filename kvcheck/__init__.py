"""kvcheck: conformance suite, reference and benchmarks for paged KV-cache managers."""

__version__ = "0.1.0"
