"""Benchmarks of the other implementation kinds and interfaces, each a ``RoundBench`` paired
with the reference: KV events encoded and decoded (``event_wire``), a router's index
(``indexer``), and an ``exec:`` engine's round trip per call (``wire``)."""
