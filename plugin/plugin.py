"""kvcheck's pytest plugin (pytest11 entry point).

The conformance options (--kv-impl and friends) are added by the conformance issue; for now the
plugin only registers itself so the entry point resolves.
"""
from __future__ import annotations
