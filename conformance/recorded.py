"""The recorded corpus: its file format, loading with validation, staleness checks and replay.

A corpus file (``conformance/corpus/vllm-0.33.cbor.xz``: one per profile, shipped in the
wheel) is CBOR compressed with xz (``lzma``). Its CBOR value is a map::

    {"format": "kvcheck-recorded-corpus", "format_version": 1 or 2,
     "header": {"profile", "impl", "impl_version", "target", "kvcheck_version", "seed",
                "traces", "steps", "steps_per_trace"},
     "traces": [{"name", "spec" (spec_to_dict), "fields" (state fields recorded),
                 "steps": [{"op", "answer", "state"}, ...]}, ...]}

``format_version`` is 2 when a trace has several KV-cache groups (``spec.kv_cache_groups``: its
answers and block tables hold one list of block ids per group, the adapter's form, and its
``add`` ops may carry ``encoder`` tokens), which kvcheck before 2 cannot read; 1 otherwise, so
a single-group corpus stays readable by older kvcheck. ``traces`` is the corpus's count, its
traces those of ``kvcheck.conformance.recorder.trace_indices`` (vLLM 0.10.2's corpus leaves out
the layouts only 0.33 accepts). ``impl`` / ``impl_version`` say what was recorded (``vllm``
0.33.0...), ``target`` the ``--kv-impl`` value; ``seed``, ``traces`` and ``steps_per_trace``
are what ``kvcheck record --check`` re-records with. A step's ``state`` holds only the fields
that changed since the previous step (the first step holds them all; ``events`` is absent when
the step emitted none; ``hashes`` holds only the requests whose hashes changed, the others
being those of the block tables): ``iter_steps`` rebuilds the full state. Fields: see
``kvcheck.conformance.recorder.observe_state``.

``load_corpus`` validates everything before a replay runs: a file that is not xz or is
truncated, larger than 64 MiB or decompressing past its bound (``MAX_CBOR_RATIO`` times its
size beyond 4 MiB, 512 MiB at most: a decompression bomb), bad CBOR, another format, a newer
``format_version``, a missing or mistyped header field (strings of at most 1000 printable
characters, a seed in the signed 64-bit range), a bad spec, op, answer or state field (specs
and ops with ``kvcheck replay``'s bounds, ``kvcheck.conformance.bounds``; block ids one list,
or one list per group of a multi-group spec; a multi-group trace in a version 1 file): each is a
``CorpusError`` (an input error) naming the file, the trace and the step.

``replay_recorded`` re-runs a trace's ops on an implementation and compares its answers, and
only the state fields it declares (``recordable_fields``), with the recording; the first
difference raises ``ConformanceMismatch`` naming the trace, the step and the field, with a
runnable repro and a JSON trace for ``kvcheck replay`` (which then compares with the reference
under the corpus's profile).
"""

from __future__ import annotations

import gc
import lzma
import stat
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NoReturn

import cbor2

from kvcheck import __version__
from kvcheck.atomic import write_atomic_bytes
from kvcheck.conformance.bounds import num_digits
from kvcheck.conformance.differential import REPRO_DIR, ConformanceMismatch, write_trace
from kvcheck.conformance.driver import Check, Driver
from kvcheck.conformance.errors import CorpusError
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.ops import Op
from kvcheck.conformance.protocol import KIND_CAPABILITIES, VLLM_PROFILES, KVCacheSpec
from kvcheck.conformance.recorder import (
    STEPS_PER_TRACE,
    RecordedAnswer,
    RecordedState,
    RecordedStep,
    RecordedTrace,
    normalize_answer,
    observe_state,
    record_corpus,
    recordable_fields,
)
from kvcheck.conformance.trace_check import check_encoder_ops, check_ops, check_spec
from kvcheck.errors import KVCheckInputError

__all__ = [
    "CORPUS_DIR",
    "FORMAT",
    "FORMAT_VERSION",
    "STATE_FIELDS",
    "Corpus",
    "CorpusError",
    "corpus_path",
    "decode_corpus",
    "encode_corpus",
    "first_difference",
    "iter_steps",
    "load_corpus",
    "make_corpus",
    "needed_capabilities",
    "replay_recorded",
    "rerecord",
    "shipped_corpus",
    "write_corpus",
]

FORMAT = "kvcheck-recorded-corpus"
FORMAT_VERSION = 2
#: The first format version with multi-group traces.
GROUPS_FORMAT_VERSION = 2
#: Where the shipped corpora live (package data of kvcheck.conformance).
CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
#: Every state field a step may record.
STATE_FIELDS: tuple[Literal["free", "tables", "queue", "refs", "hashes", "events"], ...] = (
    "free", "tables", "queue", "refs", "hashes", "events")
#: Largest corpus file read, and largest CBOR it may decompress to.
MAX_FILE_BYTES = 64 << 20
MAX_CBOR_BYTES = 512 << 20
#: ... and, past ``CBOR_RATIO_FLOOR``, at most ``MAX_CBOR_RATIO`` times its own size:
#: kvcheck's corpora decompress 8-10x, a decompression bomb thousands of times (512 MiB of
#: CBOR empty lists take 37 GB and minutes to decode; 4 MiB of them 0.3 GB and 3 s), so
#: memory and time grow with the file's size, not with what it expands to.
MAX_CBOR_RATIO = 32
CBOR_RATIO_FLOOR = 4 << 20
#: Header strings (names, versions, the target) are printed and copied into records.
MAX_HEADER_TEXT = 1000
#: Characters refused in header strings: control, format, surrogate, private-use, unassigned
#: and line / paragraph separators (as the loader refuses them in ``IMPL_INFO.version``).
_BAD_TEXT_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
#: ``header.seed`` fits a signed 64-bit integer (records and JSON readers keep it exact).
_SEED_RANGE = (-(2**63), 2**63 - 1)
#: Bounds on what a header may ask ``kvcheck record --check`` to record again.
MAX_TRACES = 10_000
MAX_STEPS_PER_TRACE = 100_000
_HEADER_TYPES: dict[str, type | tuple[type, ...]] = {
    "profile": str, "impl": str, "impl_version": str, "target": str, "kvcheck_version": str,
    "seed": int, "traces": int, "steps": int, "steps_per_trace": int,
}
_ANSWER_KEYS = frozenset({"hits", "new", "reset"})

#: A loaded corpus: ``{"format", "format_version", "header", "traces"}`` (see the module doc).
# Any: decoded CBOR, validated by _check_corpus and read by key: the header's fields and the
# traces (``RecordedTrace``, their states only what changed), by the benchmarks too.
Corpus = dict[str, Any]


def corpus_path(profile: str) -> Path:
    """The shipped corpus of ``profile``."""
    if profile not in VLLM_PROFILES:
        raise CorpusError(f"no recorded corpus for profile {profile!r}: corpora exist for "
                          f"{list(VLLM_PROFILES)}")
    return CORPUS_DIR / f"{profile}.cbor.xz"


# ---------------------------------------------------------------------- making and writing
def _delta(steps: list[RecordedStep]) -> list[dict[str, object]]:
    """Steps with full states -> steps whose states hold only what changed."""
    out: list[dict[str, object]] = []
    previous: RecordedState = {}
    for step in steps:
        state = step["state"]
        delta: dict[str, object] = {}
        for key, value in state.items():
            if key == "events":
                if value:
                    delta[key] = value
            elif key == "hashes" and key in previous:
                # Per request: only the lists that changed (the requests are the tables').
                hashes, before = state.get("hashes", {}), previous.get("hashes", {})
                changed = {rid: hs for rid, hs in hashes.items() if before.get(rid) != hs}
                if changed:
                    delta[key] = changed
            elif key not in previous or previous.get(key) != value:
                delta[key] = value
        previous = state
        out.append({"op": step["op"], "answer": step["answer"], "state": delta})
    return out


def make_corpus(traces: list[RecordedTrace], *, profile: str, impl: ImplHandle, seed: int,
                steps_per_trace: int = STEPS_PER_TRACE) -> Corpus:
    """A corpus of ``traces`` (``kvcheck.conformance.recorder.record_corpus``, full states)."""
    header = {
        "profile": profile, "impl": impl.name, "impl_version": impl.info.version,
        "target": impl.target, "kvcheck_version": __version__, "seed": seed,
        "traces": len(traces), "steps": sum(len(t["steps"]) for t in traces),
        "steps_per_trace": steps_per_trace,
    }
    grouped = any(t["spec"].get("kv_cache_groups") for t in traces)
    return {"format": FORMAT, "format_version": GROUPS_FORMAT_VERSION if grouped else 1,
            "header": header, "traces": [{**t, "steps": _delta(t["steps"])} for t in traces]}


def encode_corpus(corpus: Corpus) -> bytes:
    """The file bytes: CBOR (canonical: sorted map keys), then xz at its strongest preset.
    The same corpus always gives the same bytes."""
    raw = cbor2.dumps(corpus, canonical=True)
    return lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                         preset=9 | lzma.PRESET_EXTREME)


def write_corpus(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (``kvcheck.atomic.write_atomic_bytes``)."""
    return write_atomic_bytes(path, data)


# ---------------------------------------------------------------------- loading
def load_corpus(path: str | Path) -> Corpus:
    """Read and fully validate a corpus file.

    Raises:
        CorpusError: unreadable, not a regular file, too large, not xz or truncated,
            decompressing past its bound, not CBOR, another format or a newer version, or a
            malformed header, trace or step (named).
    """
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # reading a named pipe would wait for a writer
            raise CorpusError(f"{path}: not a regular file (a directory, named pipe or "
                              "device); a corpus is a .cbor.xz file kvcheck record writes")
        size = info.st_size
        if size > MAX_FILE_BYTES:
            raise CorpusError(f"{path}: {size} bytes; a corpus is at most {MAX_FILE_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read the corpus ({exc.strerror or exc})") from None
    return decode_corpus(data, str(path))


def decode_corpus(data: bytes, where: str) -> Corpus:
    """``data`` (a corpus file's bytes) decoded and validated; see ``load_corpus``."""
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    limit = min(MAX_CBOR_BYTES, max(CBOR_RATIO_FLOOR, MAX_CBOR_RATIO * len(data)))
    try:
        raw = decompressor.decompress(data, max_length=limit)
    except lzma.LZMAError as exc:
        raise CorpusError(f"{where}: not an xz-compressed corpus ({exc})") from None
    if not decompressor.eof:
        if decompressor.needs_input:
            raise CorpusError(f"{where}: truncated: the xz stream ends early (an interrupted "
                              "download or copy?); record the corpus again")
        raise CorpusError(f"{where}: decompresses to more than {limit} bytes (a corpus "
                          f"decompresses to at most {MAX_CBOR_RATIO}x its file's "
                          f"{len(data)} bytes, or {CBOR_RATIO_FLOOR} bytes, and at most "
                          f"{MAX_CBOR_BYTES}; kvcheck's corpora decompress 8-10x): a "
                          "decompression bomb, or not what kvcheck record writes; record the "
                          "corpus again with kvcheck record")
    if decompressor.unused_data:
        raise CorpusError(f"{where}: {len(decompressor.unused_data)} bytes after the xz stream")
    # A corpus decodes to ~300k lists and maps and no garbage. With the collector on, making
    # them triggers collections that walk the growing corpus again and again: the decode and
    # the check took 0.7 s instead of 0.4 s, in every run (the recorded area loads the
    # shipped corpus at collection).
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            corpus = cbor2.loads(raw)
        except (cbor2.CBORDecodeError, ValueError, RecursionError) as exc:
            raise CorpusError(f"{where}: not a CBOR corpus ({type(exc).__name__}: "
                              f"{str(exc)[:120]})") from None
        _check_corpus(corpus, where)
        if gc.get_freeze_count() == 0:
            # Straight into the oldest generation: made with the collector paused, the corpus
            # sits in the youngest one, and the next young collections would walk all of it
            # twice on its way up (0.1 s). Freezing and unfreezing moves every object to the
            # oldest generation without walking any; skipped where someone has frozen objects
            # (unfreezing would give theirs back too).
            gc.freeze()
            gc.unfreeze()
    finally:
        if collecting:
            gc.enable()
    return corpus  # type: ignore[no-any-return]  # checked by _check_corpus


def _check_corpus(corpus: object, where: str) -> None:
    if not isinstance(corpus, dict) or corpus.get("format") != FORMAT:
        raise CorpusError(f"{where}: not a kvcheck recorded corpus (no format {FORMAT!r})")
    version = corpus.get("format_version")
    if type(version) is not int or version < 1:
        raise CorpusError(f"{where}: field 'format_version' must be an int >= 1, got "
                          f"{version!r}")
    if version > FORMAT_VERSION:
        raise CorpusError(f"{where}: format_version {version} is newer than this kvcheck "
                          f"({__version__}) reads ({FORMAT_VERSION}); upgrade kvcheck or record "
                          "the corpus again with this one")
    header = corpus.get("header")
    if not isinstance(header, dict):
        raise CorpusError(f"{where}: field 'header' missing or not a map")
    for key, kind in _HEADER_TYPES.items():
        value = header.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CorpusError(f"{where}: header.{key}={repr(value)[:80]}: expected "
                              f"{getattr(kind, '__name__', kind)}")
    for key, high in (("traces", MAX_TRACES), ("steps_per_trace", MAX_STEPS_PER_TRACE)):
        if not 1 <= header[key] <= high:
            raise CorpusError(f"{where}: header.{key}={_show_int(header[key])}: must be in "
                              f"[1, {high}]")
    low, high = _SEED_RANGE
    if not low <= header["seed"] <= high:
        raise CorpusError(f"{where}: header.seed={_show_int(header['seed'])}: must be in "
                          f"[-2^63, 2^63) (a signed 64-bit integer, as kvcheck record writes "
                          "it); record the corpus again")
    for key in ("profile", "impl", "impl_version", "target", "kvcheck_version"):
        _check_text(header[key], f"{where}: header.{key}")
    if header["profile"] not in VLLM_PROFILES:
        raise CorpusError(f"{where}: header.profile={header['profile']!r}: a corpus records "
                          f"one of {list(VLLM_PROFILES)}")
    traces = corpus.get("traces")
    if not isinstance(traces, list):
        raise CorpusError(f"{where}: field 'traces' missing or not a list")
    if len(traces) != header["traces"]:
        raise CorpusError(f"{where}: the header counts {header['traces']} traces, the file "
                          f"holds {len(traces)}")
    total = 0
    for index, trace in enumerate(traces):
        total += _check_trace(trace, f"{where}: traces[{index}]", header["profile"], version)
    if total != header["steps"]:
        raise CorpusError(f"{where}: the header counts {_show_int(header['steps'])} steps, "
                          f"the traces hold {total}")


def _short(value: object) -> str:
    """``repr(value)`` cut to 120 characters; an int too long to print is said to be one."""
    try:
        return repr(value)[:120]
    except ValueError:  # an int past Python's 4300-digit limit, somewhere inside
        return "(a value holding an integer too long to print)"


def _show_int(value: int) -> str:
    """An int for a message: in full unless huge (str() of a huge int is slow or refused)."""
    if value.bit_length() > 64:
        return f"an integer of {num_digits(value)} digits"
    return str(value)


def _check_text(value: str, at: str) -> None:
    """A header string: printed by ``inspect`` and copied into records, so one short line."""
    if len(value) > MAX_HEADER_TEXT:
        raise CorpusError(f"{at}: {len(value)} characters; a header string has at most "
                          f"{MAX_HEADER_TEXT}; record the corpus again")
    bad = sorted({f"U+{ord(c):04X} ({unicodedata.category(c)})" for c in value
                  if unicodedata.category(c) in _BAD_TEXT_CATEGORIES})
    if bad:
        raise CorpusError(f"{at}={value[:60]!r}: holds control or format characters "
                          f"({', '.join(bad[:5])}); record the corpus again")


def _check_trace(trace: object, at: str, profile: str, version: int) -> int:
    if not isinstance(trace, dict):
        raise CorpusError(f"{at}: a trace is a map")
    name = trace.get("name")
    if not isinstance(name, str) or not name:
        raise CorpusError(f"{at}: field 'name' must be a non-empty string")
    at = f"{at} ({name})"
    try:
        spec = check_spec(trace.get("spec"), at)
        fields = trace.get("fields")
        if not isinstance(fields, list) or not all(f in STATE_FIELDS for f in fields):
            raise CorpusError(f"{at}: field 'fields'={_short(fields)}: a list of {STATE_FIELDS}")
        steps = trace.get("steps")
        if not isinstance(steps, list) or not steps:
            raise CorpusError(f"{at}: field 'steps' missing, empty or not a list")
        if spec.profile != profile:
            raise CorpusError(f"{at}: spec.profile={spec.profile!r}, the corpus is {profile!r}")
        groups = len(spec.kv_cache_groups)
        if groups and version < GROUPS_FORMAT_VERSION:
            raise CorpusError(f"{at}: spec.kv_cache_groups in a format_version {version} file; "
                              f"multi-group traces are format_version {GROUPS_FORMAT_VERSION} "
                              "(kvcheck record writes it): record the corpus again")
        ops = []
        for i, step in enumerate(steps):
            if not isinstance(step, dict) or set(step) != {"op", "answer", "state"}:
                raise CorpusError(f"{at}: steps[{i}] (step #{i + 1}): a step is a map of op, "
                                  "answer and state")
            ops.append(step["op"])
            _check_step(step, f"{at}: steps[{i}] (step #{i + 1})", set(fields), groups,
                        first=i == 0)
        check_encoder_ops(spec, check_ops(ops, at), at)
    except CorpusError:
        raise
    except KVCheckInputError as exc:  # TraceError from check_spec / check_ops
        raise CorpusError(str(exc)) from None
    return len(steps)


def _check_step(step: dict[str, object], at: str, fields: set[str], groups: int,
                first: bool) -> None:
    """One step of a trace whose spec has ``groups`` KV-cache groups (0: the single-group
    protocol, flat lists of block ids)."""
    answer, state = step["answer"], step["state"]
    if not isinstance(answer, dict) or not set(answer) <= _ANSWER_KEYS:
        raise CorpusError(f"{at}: answer {_short(answer)}: a map of {sorted(_ANSWER_KEYS)}")
    ids = _IDS_OF[min(groups, 1)]
    hits = answer.get("hits", [[[] for _ in range(groups)], 0])
    if not (isinstance(hits, list) and len(hits) == 2 and _block_ids(hits[0], groups)
            and type(hits[1]) is int):
        raise CorpusError(f"{at}: answer hits={_short(hits)}: [block ids ({ids}), "
                          "num_computed_tokens]")
    new = answer.get("new")
    if new is not None and not _block_ids(new, groups):
        raise CorpusError(f"{at}: answer new={_short(new)}: {ids} or null")
    if not isinstance(state, dict) or not set(state) <= fields:
        shown = sorted(map(str, state)) if isinstance(state, dict) else state
        raise CorpusError(f"{at}: state {_short(shown)}: a map of the trace's fields "
                          f"{sorted(fields)}")
    missing = fields - set(state) - {"events"}
    if first and missing:
        raise CorpusError(f"{at}: the first step's state lacks {sorted(missing)}")
    for key, value in state.items():
        if key == "tables":
            if not (isinstance(value, dict) and all(
                    isinstance(k, str) and _block_ids(t, groups) for k, t in value.items())):
                raise CorpusError(f"{at}: state field 'tables' is malformed: {_short(value)}: "
                                  f"request id -> {ids}")
        elif not _STATE_CHECKS[key](value):
            raise CorpusError(f"{at}: state field {key!r} is malformed: {_short(value)}")


#: How block ids are written: flat (single-group) or per group.
_IDS_OF = ("a list of block ids", "one list of block ids per group")


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(type(v) is int for v in value)


def _block_ids(value: object, groups: int) -> bool:
    """Block ids in the adapter's form: one list (``groups`` 0), or one list per group."""
    if not groups:
        return _ints(value)
    return (isinstance(value, list) and len(value) == groups
            and all(_ints(ids) for ids in value))


#: State field -> whether a recorded value has its shape (``tables``: by the trace's groups,
#: in ``_check_step``).
_STATE_CHECKS: dict[str, Callable[[object], bool]] = {
    "free": lambda v: type(v) is int and v >= 0,
    "queue": _ints,
    "refs": lambda v: isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and _ints(p) for p in v),
    "hashes": lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(hs, list)
        and all(isinstance(h, bytes) for h in hs) for k, hs in v.items()),
    "events": lambda v: isinstance(v, list) and all(
        isinstance(e, dict) and isinstance(e.get("type"), str) for e in v),
}


@lru_cache(maxsize=4)
def shipped_corpus(profile: str) -> Corpus:
    """The shipped corpus of ``profile``, loaded and validated once per process."""
    return load_corpus(corpus_path(profile))


# ---------------------------------------------------------------------- reading steps
def iter_steps(trace: RecordedTrace) -> Iterator[tuple[Op, RecordedAnswer, RecordedState]]:
    """``(op, answer, full state)`` of every step of a loaded trace."""
    state: RecordedState = {}
    for step in trace["steps"]:
        delta = step["state"]
        hashes = state.get("hashes", {})
        state = state.copy()  # a new state without the previous step's events
        state.pop("events", None)
        state.update(delta)
        if "hashes" in trace["fields"]:
            changed = delta.get("hashes", {})
            state["hashes"] = {rid: changed[rid] if rid in changed else hashes.get(rid, [])
                               for rid in state.get("tables", {})}
        full = state.copy()
        if "events" in trace["fields"]:
            full.setdefault("events", [])
        yield step["op"], step["answer"], full


def first_difference(shipped: Corpus, fresh: Corpus) -> str | None:
    """Where two corpora first differ (None: the same recording), naming the trace, the step
    and the field; the headers' kvcheck and implementation versions are not compared."""
    for key in ("profile", "seed", "traces", "steps_per_trace"):
        if shipped["header"][key] != fresh["header"][key]:
            return (f"header.{key}: shipped {shipped['header'][key]!r}, re-recorded "
                    f"{fresh['header'][key]!r}")
    for old, new in zip(shipped["traces"], fresh["traces"], strict=False):
        where = f"trace {old['name']}"
        for key in ("name", "spec", "fields"):
            if old[key] != new[key]:
                return f"{where}: {key}: shipped {old[key]!r}, re-recorded {new[key]!r}"
        for i, (a, b) in enumerate(zip(iter_steps(old), iter_steps(new), strict=False)):
            for part, x, y in (("op", a[0], b[0]), ("answer", a[1], b[1])):
                if x != y:
                    return (f"{where}, step #{i + 1}: {part} differs: shipped {x!r}, "
                            f"re-recorded {y!r}")
            for field in sorted(set(a[2]) | set(b[2])):
                if a[2].get(field) != b[2].get(field):
                    return (f"{where}, step #{i + 1} ({a[0]}): state.{field} differs: shipped "
                            f"{a[2].get(field)!r}, re-recorded {b[2].get(field)!r}")
        if len(old["steps"]) != len(new["steps"]):
            return (f"{where}: {len(old['steps'])} steps shipped, {len(new['steps'])} "
                    "re-recorded")
    return None


def rerecord(corpus: Corpus, impl: ImplHandle) -> Corpus:
    """Record ``corpus`` again on ``impl`` with its header's parameters."""
    header = corpus["header"]
    traces = record_corpus(impl, header["profile"], header["traces"], header["seed"],
                           header["steps_per_trace"])
    return make_corpus(traces, profile=header["profile"], impl=impl, seed=header["seed"],
                       steps_per_trace=header["steps_per_trace"])


# ---------------------------------------------------------------------- replay
# Any: a loaded corpus's trace, as the benchmarks pass it (Corpus).
def needed_capabilities(trace: dict[str, Any]) -> frozenset[str]:
    """Capabilities a trace needs beyond ``manager`` (and the design capabilities a vLLM
    profile implies): ``kv_cache_groups`` and each group's kind (``KIND_CAPABILITIES``:
    ``sliding_window``, ``mamba``, ``cross_attention``...) for a multi-group spec,
    ``extra_keys`` for LoRA, salt or multimodal requests, ``external_kv`` for external tokens
    and load endings, ``evict_blocks`` for evictions."""
    ops = [s["op"] for s in trace["steps"]]
    needed = set()
    for group in trace["spec"].get("kv_cache_groups") or ():
        needed |= {"kv_cache_groups", KIND_CAPABILITIES[group["kind"]]}
    if any(op["op"] == "add" and (op.get("lora") or op.get("mm") or op.get("salt") is not None)
           for op in ops):
        needed.add("extra_keys")
    if any(op.get("external") or op["op"] == "cache" for op in ops):
        needed.add("external_kv")
    if any(op["op"] == "evict" for op in ops):
        needed.add("evict_blocks")
    return frozenset(needed)


def _expression(field: str, driver: Driver) -> str | None:
    """Python over the repro's manager ``m`` computing ``field`` (None: events, drained)."""
    rids = sorted(driver.running)
    ids = list(driver.ordinary_block_ids)
    return {
        "free": "m.num_free_blocks()",
        "tables": f"{{rid: list(m.get_block_ids(rid)) for rid in {rids!r}}}",
        "queue": "list(m.free_block_ids())",
        "refs": f"[[b, m.ref_cnt(b)] for b in {ids!r} if m.ref_cnt(b)]",
        "hashes": f"{{rid: [bytes(h) for h in m.block_hashes(rid)] for rid in {rids!r}}}",
    }.get(field)


def replay_recorded(impl: ImplHandle, trace: RecordedTrace, header: Mapping[str, object]) -> int:
    """Replay one loaded trace on ``impl``; returns the number of steps replayed.

    Answers are always compared; of the state, only the recorded fields ``impl`` declares.

    Raises:
        ConformanceMismatch: at the first difference (trace, step, field, recorded and actual
            value, a runnable repro and a ``kvcheck replay`` trace).
        UnsupportedSpec: the factory declines the trace's spec.
    """
    __tracebackhide__ = True
    spec = check_spec(trace["spec"], trace["name"])
    driver = Driver(impl, spec)
    fields = frozenset(trace["fields"]) & recordable_fields(impl, spec)
    source = f"{header['impl']} {header['impl_version']}"
    ops: list[Op] = []
    def at(i: int, op: Op) -> str:  # written only on a failure (a step's op is long)
        return (f"recorded trace {trace['name']} ({header['profile']}, {source}), "
                f"step #{i + 1} {op}")

    for i, (op, answer, expected) in enumerate(iter_steps(trace)):
        ops.append(op)
        try:
            got = normalize_answer(spec, driver.apply(op))
            observed = observe_state(driver, fields)
        except Exception as exc:  # noqa: BLE001 - whatever it raises fails the trace, named
            _fail(driver, spec, trace, ops, f"{at(i, op)}: {type(exc).__name__}: {exc}")
        if got != answer:
            check = _answer_check(got, answer)
            _fail(driver, spec, trace, ops, f"{at(i, op)}: answer differs: recorded "
                  f"{answer!r}, {impl.name} {got!r}", check)
        for field in STATE_FIELDS:
            if field in fields and observed[field] != expected.get(field):
                expression = _expression(field, driver)
                check = None if expression is None else Check(
                    f"{field} after step #{i + 1}", expected.get(field), expression)
                _fail(driver, spec, trace, ops, f"{at(i, op)}: state field {field!r} differs: "
                      f"recorded {expected.get(field)!r}, {impl.name} {observed[field]!r}",
                      check)
    return len(ops)


def _answer_check(got: RecordedAnswer, want: RecordedAnswer) -> Check | None:
    if got.get("hits") != want.get("hits"):
        return Check("get_computed_blocks answer", want.get("hits"), call="get_computed_blocks",
                     normalize="[list({0}[0]), {0}[1]]")
    if got.get("new") != want.get("new"):
        return Check("allocate_slots answer", want.get("new"), call="allocate_slots",
                     normalize="None if {0} is None else list({0})")
    return None


def _fail(driver: Driver, spec: KVCacheSpec, trace: RecordedTrace, ops: list[Op],
          problem: str, check: Check | None = None) -> NoReturn:
    __tracebackhide__ = True
    message = [problem]
    name = f"recorded-{spec.profile}-{trace['name']}"
    try:
        path = write_trace(name, driver.impl.target, spec, ops)
        message.append(f"trace of the steps so far written to {path} (kvcheck replay {path} "
                       f"--kv-impl={driver.impl.target} compares with the reference)")
    except OSError as exc:  # an unwritable directory must not hide the failure
        message.append(f"trace not written ({REPRO_DIR}: {exc.strerror or exc})")
    message.append("runnable repro of the calls made:\n" + driver.snippet(problem, check))
    raise ConformanceMismatch("\n".join(message))

