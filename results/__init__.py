"""kvcheck.results: versioned result records, comparisons, regression gates, leaderboards.

Modules (one idea each):

- ``schema``: the JSON Lines record format (version 2; version 1 still loads), validation,
  the shared ``envelope``, ``make_conformance_record``, ``make_metric`` and
  ``make_benchmark_record``;
- ``io``: atomic writes and output-path checks; ``environment``: the environment block and
  its ``hardware_key``; ``text``: untrusted record text made visible (control/bidi chars);
- ``stats``: the Mann-Whitney U test; ``compare``: pairing records and what changed;
- ``gate``: thresholds, floors, waivers and the regression decision;
- ``leaderboard`` and ``html``: tables per hardware key (terminal, Markdown, HTML page).

Only the record API is imported here, so that loading the pytest plugin stays cheap.
"""

from kvcheck.results.io import write_atomic, write_records
from kvcheck.results.schema import (
    SCHEMA_VERSION,
    RecordError,
    load_records,
    make_benchmark_record,
    make_conformance_record,
    make_metric,
    validate_record,
)

__all__ = [
    "SCHEMA_VERSION",
    "RecordError",
    "load_records",
    "make_benchmark_record",
    "make_conformance_record",
    "make_metric",
    "validate_record",
    "write_atomic",
    "write_records",
]
