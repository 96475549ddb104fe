"""kvcheck result records: one versioned JSON object per line (JSON Lines).

A record is either a conformance run (``kind="conformance"``: per-test outcomes, per-area
counts, a verdict) or a benchmark run (``kind="benchmark"``: metrics with unit, direction and
raw samples). Both carry the implementation, the profile, the environment (with a
``hardware_key`` that decides which records may be compared) and a UTC timestamp.

Loading validates every field and rejects a malformed or future-version file with a message
naming the file, line and field. No pickle: plain JSON only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "OUTCOMES",
    "SCHEMA_VERSION",
    "RecordError",
    "load_records",
    "validate_record",
]

SCHEMA_VERSION = 1
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")
_KINDS = ("conformance", "benchmark")
_DIRECTIONS = ("lower_is_better", "higher_is_better")


class RecordError(ValueError):
    """A record file or object that does not follow the schema; the message names the field."""


def _req(obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str,
         optional: bool = False) -> Any:
    if key not in obj:
        if optional:
            return None
        raise RecordError(f"{where}: missing field {key!r}")
    value = obj[key]
    if value is None and optional:
        return None
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        raise RecordError(
            f"{where}: field {key!r} must be {_type_names(types)}, got {type(value).__name__}"
        )
    return value


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _tuple(types))


def validate_record(record: Any, where: str = "record") -> dict[str, Any]:
    """Check one record against schema version ``SCHEMA_VERSION``; return it unchanged.

    Raises:
        RecordError: naming ``where`` and the offending field.
    """
    if not isinstance(record, dict):
        raise RecordError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    version = _req(record, "schema_version", int, where)
    if version > SCHEMA_VERSION:
        raise RecordError(
            f"{where}: schema_version {version} is newer than this kvcheck understands "
            f"({SCHEMA_VERSION}); upgrade kvcheck to read it"
        )
    if version < 1:
        raise RecordError(f"{where}: field 'schema_version' must be >= 1, got {version}")
    kind = _req(record, "kind", str, where)
    if kind not in _KINDS:
        raise RecordError(f"{where}: field 'kind' must be one of {list(_KINDS)}, got {kind!r}")
    _req(record, "timestamp", str, where)
    _req(record, "suite_version", str, where)
    _req(record, "kvcheck_version", str, where)
    _req(record, "profile", str, where)
    _req(record, "seed", int, where, optional=True)
    impl = _req(record, "implementation", dict, where)
    _req(impl, "name", str, f"{where}: implementation")
    _req(impl, "version", str, f"{where}: implementation")
    _req(impl, "commit", str, f"{where}: implementation", optional=True)
    caps = _req(impl, "capabilities", list, f"{where}: implementation", optional=True)
    if caps is not None and not all(isinstance(c, str) for c in caps):
        raise RecordError(f"{where}: implementation.capabilities must be a list of str")
    env = _req(record, "environment", dict, where)
    _req(env, "hardware_key", str, f"{where}: environment")
    if kind == "conformance":
        outcomes = _req(record, "outcomes", dict, where)
        for test_id, outcome in outcomes.items():
            if outcome not in OUTCOMES:
                raise RecordError(
                    f"{where}: outcomes[{test_id!r}] must be one of {list(OUTCOMES)}, "
                    f"got {outcome!r}"
                )
        areas = _req(record, "areas", dict, where)
        for area, counts in areas.items():
            if not isinstance(counts, dict) or set(counts) - set(OUTCOMES) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for v in counts.values()
            ):
                raise RecordError(
                    f"{where}: areas[{area!r}] must map outcomes {list(OUTCOMES)} to counts >= 0"
                )
        _req(record, "verdict", str, where)
        _req(record, "conforms", bool, where)
    metrics = _req(record, "metrics", list, where, optional=True) or []
    for i, metric in enumerate(metrics):
        w = f"{where}: metrics[{i}]"
        if not isinstance(metric, dict):
            raise RecordError(f"{w}: must be an object")
        _req(metric, "name", str, w)
        _req(metric, "unit", str, w)
        direction = _req(metric, "direction", str, w)
        if direction not in _DIRECTIONS:
            raise RecordError(f"{w}: field 'direction' must be one of {list(_DIRECTIONS)}")
        value = _req(metric, "value", (int, float), w)
        if not math.isfinite(value):
            raise RecordError(f"{w}: field 'value' must be finite, got {value}")
        samples = _req(metric, "samples", list, w, optional=True) or []
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in samples):
            raise RecordError(f"{w}: field 'samples' must be a list of numbers")
    return record


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate every record of a JSON Lines file (blank lines are ignored).

    Raises:
        RecordError: unreadable file, invalid JSON, or a record that fails validation; the
            message names the file and line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecordError(f"{path}: cannot read ({exc.strerror or exc})") from None
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        records.append(validate_record(obj, where))
    if not records:
        raise RecordError(f"{path}: no records (an empty result file)")
    return records


def dump_lines(records: Iterable[Mapping[str, Any]]) -> str:
    """Records as JSON Lines text: sorted keys, one record per line, no NaN."""
    return "".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in records)
