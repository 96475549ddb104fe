"""kvcheck result records: one versioned JSON object per line (JSON Lines).

A record is either a conformance run (``kind="conformance"``: per-test outcomes, per-area
counts, a verdict, whether the run was complete) or a benchmark run (``kind="benchmark"``:
metrics with unit, direction and raw samples). Both carry the same envelope (``envelope``):
the implementation, the profile, the environment (with a ``hardware_key`` that decides which
records may be compared) and a UTC timestamp.

Loading validates every field and rejects a malformed or future-version file with a message
naming the file, line and field. No pickle: plain JSON only (NaN and Infinity are rejected).
Writing (``make_conformance_record``, ``make_benchmark_record``,
``kvcheck.results.io.write_records``) validates first, so an invalid record is never written.

Fields of schema version 2 (``?`` marks an optional field, which may also be ``null``)::

    schema_version  int        2; a file with a newer version is rejected, never guessed at
    kind            str        "conformance" | "benchmark"
    timestamp       str        ISO 8601, UTC (e.g. "2026-11-29T10:31:53+00:00")
    suite_version   str        version of the conformance suite / benchmark set
    kvcheck_version str        version of kvcheck that wrote the record
    profile         str        behaviour checked against: "vllm-0.33" | "vllm-0.10" | "generic"
    seed            int?       workload seed (null: derandomized)
    implementation  object     name str, version str, commit str?, capabilities [str]?,
                               target str?, module str?
    environment     object     hardware_key str (metrics compare only when equal), and
                               when known: cpu, cpu_count, gpu, gpu_model, driver, cuda,
                               torch, triton, python, platform, packages {name: version}
    metrics         [object]?  name str, unit str, direction "lower_is_better" |
                               "higher_is_better", value number (the headline statistic,
                               finite), samples [number]? (raw per-round values, same unit),
                               case str?, stat str? ("median", "mean", "min"...),
                               lower number?, upper number?, extra object?,
                               deterministic bool? (true: a count that does not depend
                               on the machine's load, e.g. callgrind's instructions;
                               the gate compares it without a significance test)
    extra           object?    free-form data (e.g. pytest-benchmark's JSON, verbatim)
  conformance only:
    outcomes        object     test id -> one of OUTCOMES
    areas           object     area -> {outcome: count >= 0}
    verdict         str        one human-readable line
    conforms        bool       true only when ``complete`` is true
    complete        bool       every suite test applicable to the implementation's
                               capabilities and profile ran and reported an outcome
    completeness    object     applicable int >= 0 (suite tests applicable to the
                               capabilities and profile; null only in an incomplete record
                               whose collection never completed, when it is unknown),
                               ran int, 0 <= ran <= applicable (of
                               those, how many reported an outcome), reasons [str] (why the
                               run is incomplete: empty when complete, at least one when
                               not), interrupted bool (the run was stopped, e.g. Ctrl-C);
                               complete is true exactly when ran == applicable, reasons is
                               empty and interrupted is false
    coverage        object?    how much the run checked (kvcheck.plugin.coverage): ran int
                               (suite tests that ran, any outcome but skipped), block_sizes
                               [int >= 1] (every size they ran at; empty: not recorded),
                               areas {area: {ran int, block_sizes [int]}}, families
                               {law family: {passed int, tests [str]}} (passed == the number
                               of distinct tests; empty without a request-level manager),
                               minimum int? (passed tests each family needs to conform; null:
                               none binds this profile), short [str] (the families below it:
                               passed < minimum; empty when minimum is null), fixes {family:
                               [str]} (what would add tests of a short family),
                               undeclared_capabilities {name: int} (tests skipped for lacking
                               it), not_applicable {kind: {area: int}} (skipped tests by why:
                               capability, vllm_only, profile, unsupported_spec, skips_file,
                               other); conforms is false while short is not empty
  benchmark only:
    metrics         at least one metric

Version 1 (before ``complete`` / ``completeness`` existed) still loads. ``load_records``
returns a version-1 conformance record with ``schema_version`` left at 1 and two fields
added: ``complete: true`` (version 1 had no notion of an incomplete run, and its
``conforms`` is kept as written) and ``completeness: null``, the marker of a legacy record
whose completeness is unknown (``is_legacy`` / ``completeness_known``). The gate treats such
a current record as complete and warns; the leaderboard notes it beside the verdict.
Version-1 benchmark records load unchanged. New records are always written as version 2.

``coverage`` is optional within version 2: records written before it existed load as they
are, and a kvcheck that predates it reads new records too (unknown fields are allowed).

A deterministic metric (``deterministic: true``) is a count measured by a method named in the
record's ``hardware_key`` (``"callgrind:x86_64"``: callgrind's instruction count on x86-64,
see ``kvcheck.bench.counted``); its ``unit`` says what is counted (``"instructions"``). The
field is optional, so such records remain schema version 2; absent or false means a timing
or other sampled figure.

A metric is identified inside a record by ``metric_key``: ``"<case>/<name>"`` when it has a
case, else its name; keys are unique within a record.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, NoReturn, Protocol, TypedDict, TypeVar, cast, overload

from kvcheck.errors import KVCheckInputError
from kvcheck.results.errors import RecordError

__all__ = [
    "COUNTING_METHODS",
    "DIRECTIONS",
    "KINDS",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "CoverageArea",
    "CoverageFamily",
    "LoadedImplementation",
    "Record",
    "RecordCompleteness",
    "RecordCoverage",
    "RecordEnvironment",
    "RecordError",
    "RecordImplementation",
    "RecordMetric",
    "completeness_known",
    "counting_method",
    "dump_lines",
    "envelope",
    "implementation_block",
    "is_deterministic",
    "is_legacy",
    "load_records",
    "make_benchmark_record",
    "make_conformance_record",
    "make_metric",
    "metric_key",
    "upgrade_record",
    "validate_record",
]

SCHEMA_VERSION = 2
OLDEST_VERSION = 1  # still loaded (see "Version 1" in the module docstring)
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")
KINDS = ("conformance", "benchmark")
DIRECTIONS = ("lower_is_better", "higher_is_better")
_KINDS = KINDS  # older private spelling
_DIRECTIONS = DIRECTIONS
_NUMBER = (int, float)


# ------------------------------------------------------------------ the validated shapes
# What ``validate_record`` guarantees, field by field (the module docstring's table): the
# required fields first, the optional ones (absent, or null where the table allows it) in a
# ``total=False`` subclass. Unknown extra fields are allowed, so these are lower bounds.
class _MetricFields(TypedDict):
    name: str
    unit: str
    direction: str
    value: float


class RecordMetric(_MetricFields, total=False):
    """One validated metric object of a record (see the module docstring)."""

    samples: list[float] | None
    case: str | None
    stat: str | None
    lower: float | None
    upper: float | None
    extra: dict[str, object] | None
    deterministic: bool | None


class _ImplementationFields(TypedDict):
    name: str
    version: str


class RecordImplementation(_ImplementationFields, total=False):
    """A validated record's ``implementation`` object (the fields not checked are
    ``object``)."""

    commit: str | None
    capabilities: list[str] | None
    target: object
    module: object


class _EnvironmentFields(TypedDict):
    hardware_key: str


class RecordEnvironment(_EnvironmentFields, total=False):
    """A validated record's ``environment`` object (the fields not checked are ``object``)."""

    cpu: str | None
    cpu_count: object
    gpu: object
    gpu_model: str | None
    driver: str | None
    cuda: str | None
    torch: str | None
    triton: str | None
    python: str | None
    platform: str | None
    packages: object


class RecordCompleteness(TypedDict):
    """A validated version-2 conformance record's ``completeness`` object."""

    applicable: int | None
    ran: int
    reasons: list[str]
    interrupted: bool


class CoverageArea(TypedDict):
    """One area of a record's ``coverage.areas``."""

    ran: int
    block_sizes: list[int]


class CoverageFamily(TypedDict):
    """One law family of a record's ``coverage.families``."""

    passed: int
    tests: list[str]


class _CoverageFields(TypedDict):
    ran: int
    block_sizes: list[int]
    areas: dict[str, CoverageArea]
    families: dict[str, CoverageFamily]
    short: list[str]
    fixes: dict[str, list[str]]
    undeclared_capabilities: dict[str, int]
    not_applicable: dict[str, dict[str, int]]


class RecordCoverage(_CoverageFields, total=False):
    """A validated conformance record's ``coverage`` object."""

    minimum: int | None


class _RecordFields(TypedDict):
    schema_version: int
    kind: str
    timestamp: str
    suite_version: str
    kvcheck_version: str
    profile: str
    implementation: RecordImplementation
    environment: RecordEnvironment


class Record(_RecordFields, total=False):
    """A record as ``validate_record`` returns it: the envelope, then the optional and the
    conformance-only fields (present in every conformance record; ``completeness`` is null
    in an upgraded version-1 record, see ``upgrade_record``)."""

    seed: int | None
    extra: dict[str, object] | None
    metrics: list[RecordMetric] | None
    outcomes: dict[str, str]
    areas: dict[str, dict[str, int]]
    verdict: str
    conforms: bool
    complete: bool
    completeness: RecordCompleteness | None
    coverage: RecordCoverage | None


class _ImplementationInfo(Protocol):
    @property
    def version(self) -> str: ...

    @property
    def commit(self) -> str | None: ...

    @property
    def capabilities(self) -> Iterable[str]: ...


class LoadedImplementation(Protocol):
    """What ``implementation_block`` reads of a loaded implementation
    (``kvcheck.conformance.loader.ImplHandle``, which results does not import)."""

    @property
    def name(self) -> str: ...

    @property
    def info(self) -> _ImplementationInfo: ...


_T = TypeVar("_T")
_U = TypeVar("_U")


@overload
def _req(obj: Mapping[str, object], key: str, types: type[_T], where: str,
         optional: Literal[False] = False) -> _T: ...
@overload
def _req(obj: Mapping[str, object], key: str, types: type[_T], where: str,
         optional: bool) -> _T | None: ...
@overload
def _req(obj: Mapping[str, object], key: str, types: tuple[type[_T], type[_U]], where: str,
         optional: bool = False) -> _T | _U | None: ...
def _req(obj: Mapping[str, object], key: str, types: type | tuple[type, ...], where: str,
         optional: bool = False) -> object:
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


def _finite(obj: Mapping[str, object], key: str, where: str,
            optional: bool = False) -> float | None:
    value = _req(obj, key, _NUMBER, where, optional)
    if value is not None and not math.isfinite(value):
        raise RecordError(f"{where}: field {key!r} must be finite, got {value}")
    return value


#: Hardware-key prefixes that name a counting method (``"callgrind:x86_64"``): the records
#: under such a key hold deterministic counts beside (ungated) wall time.
COUNTING_METHODS = ("callgrind", "perf")


def counting_method(hardware_key: str) -> str | None:
    """The counting method a hardware key names (``"callgrind:x86_64"`` -> ``"callgrind"``),
    or None for a machine's own key (``"cpu:AMD EPYC x2"``)."""
    method, sep, _ = hardware_key.partition(":")
    return method if sep and method in COUNTING_METHODS else None


def is_deterministic(metric: Mapping[str, object]) -> bool:
    """Whether a metric is a deterministic count (``deterministic: true``), not a timing."""
    return metric.get("deterministic") is True


def metric_key(metric: Mapping[str, object]) -> str:
    """The identity of a metric inside a record: ``"<case>/<name>"``, or the name alone."""
    case = metric.get("case")
    return f"{case}/{metric['name']}" if case else str(metric["name"])


def _validate_metric(metric: object, w: str) -> str:
    if not isinstance(metric, dict):
        raise RecordError(f"{w}: must be an object")
    _req(metric, "name", str, w)
    _req(metric, "unit", str, w)
    direction = _req(metric, "direction", str, w)
    if direction not in DIRECTIONS:
        raise RecordError(f"{w}: field 'direction' must be one of {list(DIRECTIONS)}, "
                          f"got {direction!r}")
    _finite(metric, "value", w)
    samples = _req(metric, "samples", list, w, optional=True) or []
    for j, x in enumerate(samples):
        if not isinstance(x, _NUMBER) or isinstance(x, bool) or not math.isfinite(x):
            raise RecordError(f"{w}: field 'samples' must be a list of finite numbers "
                              f"(samples[{j}] is {x!r})")
    _req(metric, "case", str, w, optional=True)
    _req(metric, "stat", str, w, optional=True)
    _finite(metric, "lower", w, optional=True)
    _finite(metric, "upper", w, optional=True)
    _req(metric, "extra", dict, w, optional=True)
    _req(metric, "deterministic", bool, w, optional=True)
    return metric_key(metric)


def _count(obj: Mapping[str, object], key: str, where: str) -> int:
    value = _req(obj, key, int, where)
    if value < 0:
        raise RecordError(f"{where}: field {key!r} must be >= 0, got {value}")
    return int(value)


def _validate_completeness(record: Mapping[str, object], where: str) -> None:
    """The version-2 conformance fields: ``complete``, ``completeness`` and the rule that
    ``conforms`` needs a complete run."""
    complete = _req(record, "complete", bool, where)
    info = _req(record, "completeness", dict, where)
    w = f"{where}: completeness"
    # null: unknown, when the collection never completed (only in an incomplete record)
    if "applicable" not in info:
        raise RecordError(f"{w}: missing field 'applicable'")
    applicable = None if info["applicable"] is None else _count(info, "applicable", w)
    ran = _count(info, "ran", w)
    if applicable is not None and ran > applicable:
        raise RecordError(f"{w}: field 'ran' ({ran}) cannot exceed 'applicable' ({applicable})")
    reasons = _req(info, "reasons", list, w)
    if not all(isinstance(r, str) for r in reasons):
        raise RecordError(f"{w}: field 'reasons' must be a list of str")
    interrupted = _req(info, "interrupted", bool, w)
    if complete and (ran != applicable or reasons or interrupted):
        raise RecordError(
            f"{where}: field 'complete' is true but completeness says otherwise (ran {ran} of "
            f"{applicable}, reasons {reasons!r}, interrupted {interrupted}); a complete run "
            "ran every applicable test, has no reasons and was not interrupted")
    if not complete and not reasons:
        raise RecordError(f"{w}: field 'reasons' must say why the run is incomplete "
                          "(at least one reason when 'complete' is false)")
    if record.get("conforms") is True and not complete:
        raise RecordError(f"{where}: field 'conforms' is true but 'complete' is false; an "
                          "incomplete run cannot conform (write conforms: false)")


def _str_counts(obj: object, w: str) -> None:
    """``obj`` maps str to counts >= 0."""
    if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in obj.items()):
        raise RecordError(f"{w} must map names to counts >= 0")


def _sizes(obj: Mapping[str, object], w: str) -> None:
    sizes = _req(obj, "block_sizes", list, w)
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes):
        raise RecordError(f"{w}: field 'block_sizes' must be a list of ints >= 1")


def _validate_coverage(record: Mapping[str, object], where: str) -> None:
    """The optional ``coverage`` object of a conformance record (see the module docstring),
    and the rule that a record whose law families fall short does not conform."""
    info = _req(record, "coverage", dict, where, optional=True)
    if info is None:
        return
    w = f"{where}: coverage"
    _count(info, "ran", w)
    _sizes(info, w)
    areas = _req(info, "areas", dict, w)
    for area, row in areas.items():
        aw = f"{w}: areas[{area!r}]"
        if not isinstance(row, dict):
            raise RecordError(f"{aw} must be an object")
        _count(row, "ran", aw)
        _sizes(row, aw)
    families = _req(info, "families", dict, w)
    for family, row in families.items():
        fw = f"{w}: families[{family!r}]"
        if not isinstance(row, dict):
            raise RecordError(f"{fw} must be an object")
        passed = _count(row, "passed", fw)
        tests = _req(row, "tests", list, fw)
        if not all(isinstance(t, str) for t in tests) or len(set(tests)) != passed:
            raise RecordError(f"{fw}: field 'tests' must list {passed} distinct test ids "
                              "('passed' counts them)")
    minimum = None if info.get("minimum") is None else _count(info, "minimum", w)
    short = _req(info, "short", list, w)
    for family in short:
        row = families.get(family) if isinstance(family, str) else None
        if row is None or minimum is None or row["passed"] >= minimum:
            raise RecordError(
                f"{w}: field 'short' names {family!r}, which is not a family with fewer "
                f"passed tests than the minimum ({minimum}); list only families below it")
    fixes = _req(info, "fixes", dict, w)
    if not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
               for v in fixes.values()):
        raise RecordError(f"{w}: field 'fixes' must map families to lists of str")
    _str_counts(_req(info, "undeclared_capabilities", dict, w),
                f"{w}: field 'undeclared_capabilities'")
    for kind, by_area in _req(info, "not_applicable", dict, w).items():
        _str_counts(by_area, f"{w}: not_applicable[{kind!r}]")
    if short and record.get("conforms") is True:
        raise RecordError(f"{where}: field 'conforms' is true but coverage.short names "
                          f"{short!r}; a run whose law families fall short of the minimum "
                          "does not conform (write conforms: false)")


def validate_record(record: object, where: str = "record") -> Record:
    """Check one record against its ``schema_version`` (1 or ``SCHEMA_VERSION``); return it
    unchanged. Loading also upgrades version-1 records (``upgrade_record``).

    Unknown extra fields are allowed (forward-compatible additions within a version).

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
    if version < OLDEST_VERSION:
        raise RecordError(f"{where}: field 'schema_version' must be >= {OLDEST_VERSION}, "
                          f"got {version}")
    kind = _req(record, "kind", str, where)
    if kind not in KINDS:
        raise RecordError(f"{where}: field 'kind' must be one of {list(KINDS)}, got {kind!r}")
    stamp = _req(record, "timestamp", str, where)
    if parse_timestamp(stamp) is None:
        raise RecordError(f"{where}: field 'timestamp' must be an ISO 8601 date and time, "
                          f"got {stamp!r}")
    _req(record, "suite_version", str, where)
    _req(record, "kvcheck_version", str, where)
    _req(record, "profile", str, where)
    _req(record, "seed", int, where, optional=True)
    _req(record, "extra", dict, where, optional=True)
    impl = _req(record, "implementation", dict, where)
    _req(impl, "name", str, f"{where}: implementation")
    _req(impl, "version", str, f"{where}: implementation")
    _req(impl, "commit", str, f"{where}: implementation", optional=True)
    caps = _req(impl, "capabilities", list, f"{where}: implementation", optional=True)
    if caps is not None and not all(isinstance(c, str) for c in caps):
        raise RecordError(f"{where}: implementation.capabilities must be a list of str")
    env = _req(record, "environment", dict, where)
    _req(env, "hardware_key", str, f"{where}: environment")
    for key in ("cpu", "gpu_model", "driver", "cuda", "torch", "triton", "python", "platform"):
        _req(env, key, str, f"{where}: environment", optional=True)
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
        if version >= 2:
            _validate_completeness(record, where)
        _validate_coverage(record, where)
    metrics = _req(record, "metrics", list, where, optional=True) or []
    if kind == "benchmark" and not metrics:
        raise RecordError(f"{where}: field 'metrics' must hold at least one metric in a "
                          "benchmark record")
    seen: dict[str, int] = {}
    for i, metric in enumerate(metrics):
        key = _validate_metric(metric, f"{where}: metrics[{i}]")
        if key in seen:
            raise RecordError(f"{where}: metrics[{i}] repeats metric {key!r} "
                              f"(already metrics[{seen[key]}]); give each a distinct case/name")
        seen[key] = i
    return cast(Record, record)  # every field of Record checked above


def parse_timestamp(text: str) -> datetime | None:
    """An ISO 8601 timestamp as an aware UTC datetime (naive means UTC); None if unparsable."""
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.astimezone(timezone.utc)


def _reject_constant(name: str) -> NoReturn:
    raise KVCheckInputError(f"{name} is not allowed (JSON has no NaN or Infinity)")


def load_records(path: str | Path) -> list[Record]:
    """Read and validate every record of a JSON Lines file (blank lines are ignored).

    Raises:
        RecordError: unreadable file, invalid JSON, or a record that fails validation; the
            message names the file and line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecordError(f"{path}: not a UTF-8 text file (is it a result record?)") from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot read ({exc.strerror or exc})") from None
    records: list[Record] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise RecordError(
                f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except (ValueError, RecursionError) as exc:
            raise RecordError(f"{where}: not valid JSON ({exc})") from None
        records.append(upgrade_record(validate_record(obj, where)))
    if not records:
        raise RecordError(f"{path}: no records (an empty result file)")
    return records


def upgrade_record(record: Record) -> Record:
    """A validated record in today's reading: a version-1 conformance record gets
    ``complete: true`` and ``completeness: null`` (the legacy marker; ``schema_version``
    stays 1, so it is never mistaken for a version-2 record). Other records are returned
    unchanged. The argument is not modified."""
    if record.get("schema_version", SCHEMA_VERSION) >= 2 or record.get("kind") != "conformance":
        return record
    upgraded = record.copy()
    upgraded["complete"] = True
    upgraded["completeness"] = None
    return upgraded


def is_legacy(record: Record) -> bool:
    """Whether a record was written under an older schema version (loaded by upgrading)."""
    return int(record.get("schema_version", SCHEMA_VERSION)) < SCHEMA_VERSION


def completeness_known(record: Mapping[str, object]) -> bool:
    """Whether a conformance record says how complete its run was (false for version 1)."""
    return record.get("kind") == "conformance" and isinstance(record.get("completeness"), dict)


def dump_lines(records: Iterable[Mapping[str, object]]) -> str:
    """Records as JSON Lines text: sorted keys, one record per line, no NaN."""
    return "".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in records)


# ------------------------------------------------------------------ building benchmark records
def implementation_block(impl: Mapping[str, object] | LoadedImplementation
                         ) -> dict[str, object]:
    """The ``implementation`` object of a record, from a mapping (``name``, ``version``,
    optional ``commit``...) or from a loaded ``kvcheck.conformance.loader.ImplHandle``."""
    if isinstance(impl, Mapping):
        return dict(impl)
    info = getattr(impl, "info", None)
    if info is None:
        raise RecordError("implementation: expected a mapping with 'name' and 'version' or an "
                          f"ImplHandle, got {type(impl).__name__}")
    return {
        "name": impl.name,
        "version": info.version,
        "target": getattr(impl, "target", None),
        "module": getattr(getattr(impl, "module", None), "__name__", None),
        "commit": info.commit,
        "capabilities": sorted(info.capabilities),
    }


def make_metric(name: str, unit: str, direction: str, samples: Sequence[float] = (),
                value: float | None = None, *, case: str | None = None,
                stat: str | None = None, extra: Mapping[str, object] | None = None,
                deterministic: bool | None = None) -> dict[str, object]:
    """One metric object.

    Args:
        name: what is measured, e.g. ``"us_per_call"`` or ``"gbps"``.
        unit: unit of ``value`` and of every sample, e.g. ``"us"``, ``"GB/s"``, ``"ops/s"``.
        direction: ``"lower_is_better"`` or ``"higher_is_better"`` (``"lower"`` / ``"higher"``
            are accepted as shorthands).
        samples: raw per-round values, kept so a later gate can test significance.
        value: the headline statistic; default: the median of ``samples`` (``stat`` is then
            ``"median"``, with ``lower``/``upper`` the 25th/75th percentiles).
        case: the benchmark case (shape, workload) the metric belongs to.
        deterministic: true for a count that does not depend on the machine's load
            (instructions counted by callgrind); the gate then uses no significance test.

    Raises:
        RecordError: no value and no samples, or an invalid field.
    """
    direction = {"lower": "lower_is_better", "higher": "higher_is_better"}.get(direction,
                                                                               direction)
    samples = [float(x) for x in samples]
    metric: dict[str, object] = {"name": name, "unit": unit, "direction": direction,
                                 "samples": samples}
    if value is None:
        if not samples:
            raise RecordError(f"metric {name!r}: give a value or at least one sample")
        value = statistics.median(samples)
        stat = stat or "median"
        if len(samples) >= 2:
            q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
            metric["lower"], metric["upper"] = q1, q3
    metric["value"] = float(value)
    if case is not None:
        metric["case"] = case
    if stat is not None:
        metric["stat"] = stat
    if extra is not None:
        metric["extra"] = dict(extra)
    if deterministic is not None:
        metric["deterministic"] = deterministic
    _validate_metric(metric, f"metric {name!r}")
    return metric


def envelope(kind: str, implementation: Mapping[str, object] | LoadedImplementation, *,
             profile: str, seed: int | None, suite_version: str,
             environment: Mapping[str, object] | None = None,
             timestamp: str | None = None) -> dict[str, object]:
    """The fields every record kind shares, as the start of a record (not yet validated).

    Args:
        kind: ``"conformance"`` or ``"benchmark"``.
        implementation: a mapping with ``name`` and ``version`` (``commit`` recommended), or
            an ``ImplHandle`` (see ``implementation_block``).
        profile: the profile the implementation ran under.
        seed: the workload seed (None: derandomized).
        suite_version: the version of the test or benchmark set that produced the record
            (``kvcheck.conformance.SUITE_VERSION``; passed in: results never imports the
            suite).
        environment: default ``collect_environment()`` of this process.
        timestamp: default now, UTC, to the second.
    """
    from kvcheck import __version__

    if environment is None:
        from kvcheck.results.environment import collect_environment

        environment = collect_environment()
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "timestamp": timestamp or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suite_version": suite_version,
        "kvcheck_version": __version__,
        "implementation": implementation_block(implementation),
        "profile": profile,
        "seed": seed,
        "environment": dict(environment),
    }


def _where(kind: str, record: Mapping[str, object]) -> str:
    impl = record.get("implementation")
    name = impl.get("name") if isinstance(impl, Mapping) else None
    return f"{kind} record of {name!r}"


def _plain_completeness(completeness: object) -> object:
    """A copy as plain JSON types (a tuple of reasons becomes a list); anything else is left
    for validation to reject with a message."""
    if not isinstance(completeness, Mapping):
        return completeness
    out = dict(completeness)
    if isinstance(out.get("reasons"), tuple):
        out["reasons"] = list(out["reasons"])
    return out


def make_conformance_record(*, implementation: Mapping[str, object] | LoadedImplementation,
                            profile: str, seed: int | None,
                            outcomes: Mapping[str, str], areas: Mapping[str, Mapping[str, int]],
                            verdict: str, conforms: bool, complete: bool,
                            completeness: Mapping[str, object],
                            suite_version: str,
                            environment: Mapping[str, object] | None = None,
                            timestamp: str | None = None,
                            coverage: Mapping[str, object] | None = None) -> Record:
    """A validated ``kind="conformance"`` record (schema version 2).

    Args:
        implementation: mapping with ``name``, ``version`` and optionally ``commit``,
            ``capabilities``, ``target``, ``module`` (or an ``ImplHandle``).
        profile: the profile checked against.
        seed: workload seed, None when derandomized.
        outcomes: test id -> one of ``OUTCOMES``.
        areas: area -> {outcome: count}.
        verdict: the one-line verdict.
        conforms: true only when ``complete`` is true.
        complete: every applicable suite test ran and reported.
        completeness: ``{"applicable": int, "ran": int, "reasons": [str],
            "interrupted": bool}`` (see the module docstring for the rules).
        suite_version: the suite's ``SUITE_VERSION``.
        environment: default ``collect_environment()``; timestamp: default now (UTC).
        coverage: how much the run checked (optional; see the module docstring).

    Raises:
        RecordError: any field breaking the schema, e.g. ``conforms`` with an incomplete run.
    """
    record = envelope("conformance", implementation, profile=profile, seed=seed,
                      suite_version=suite_version, environment=environment,
                      timestamp=timestamp)
    record.update({
        "outcomes": dict(outcomes),
        "areas": {area: dict(counts) for area, counts in areas.items()},
        "verdict": verdict,
        "conforms": conforms,
        "complete": complete,
        "completeness": _plain_completeness(completeness),
        "metrics": [],
    })
    if coverage is not None:
        record["coverage"] = dict(coverage)
    return validate_record(record, _where("conformance", record))


def make_benchmark_record(implementation: Mapping[str, object] | LoadedImplementation,
                          metrics: Sequence[Mapping[str, object]], *,
                          profile: str, suite_version: str,
                          environment: Mapping[str, object] | None = None,
                          seed: int | None = None, timestamp: str | None = None,
                          extra: Mapping[str, object] | None = None) -> dict[str, object]:
    """A validated ``kind="benchmark"`` record, ready for ``kvcheck.results.io.write_records``.

    Args:
        implementation: a mapping with ``name`` and ``version`` (``commit`` recommended), or
            an ``ImplHandle``.
        metrics: objects from ``make_metric`` (keys unique per record).
        profile: the profile the implementation ran under (rows of a leaderboard join a
            benchmark record to the conformance record with the same implementation and
            profile).
        suite_version: version of the benchmark set (the suite's ``SUITE_VERSION``).
        environment: default ``collect_environment()`` of this process.
        timestamp: default now, UTC.
        extra: free-form data kept verbatim (e.g. pytest-benchmark's JSON).
    """
    record = envelope("benchmark", implementation, profile=profile, seed=seed,
                      suite_version=suite_version, environment=environment,
                      timestamp=timestamp)
    record["metrics"] = [dict(m) for m in metrics]
    if extra is not None:
        record["extra"] = dict(extra)
    # validate_record returns the same object; the plain dict type is kept for the callers
    # that collect benchmark records with their own fields (a Record is no dict[str, ...])
    validate_record(record, _where("benchmark", record))
    return record
