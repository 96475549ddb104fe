"""Validation of a replay trace (``kvcheck replay``) before anything runs.

A trace is untrusted input: a hand-edited or truncated file, a trace from a newer kvcheck, or
one asking for absurd sizes. Every problem is a ``TraceError`` (an input error: exit 2, never
blamed on the implementation) naming the file, the op (``ops[i]``, i.e. op #i+1 as failure
messages count) and the problem.

Bounds (what a trace may ask for; the suite's own traces are far below them; the shared
ones live in ``kvcheck.conformance.bounds``):

* ``num_blocks`` 1 .. ``MAX_NUM_BLOCKS`` (2**20), ``block_size`` 1 .. ``MAX_BLOCK_SIZE``
  (2**16), ``max_model_len`` None or 1 .. ``MAX_REQUEST_TOKENS``;
* a prompt of at most ``MAX_REQUEST_TOKENS`` (2**20) tokens, and at most as many asked for by
  the ``schedule`` / ``decode`` ops of one request (each count an int >= 0);
* at most ``MAX_OPS`` (10**6) ops; token ids are ints in [0, 2**63);
* ``hash_algo`` one of ``HASH_ALGOS``, ``profile`` one of ``PROFILES``;
* ``kv_cache_groups`` (optional) at most ``MAX_GROUPS`` objects with a ``kind`` of
  ``ATTENTION_KINDS`` and optional ``block_size``, ``sliding_window``,
  ``attention_chunk_size`` (null or ints in 1 .. ``MAX_BLOCK_SIZE``; a window only for
  ``sliding_window`` groups, a chunk only for ``chunked_local_attention`` ones, and required
  there; ``mamba_cache_mode`` null or a ``MAMBA_CACHE_MODES`` name and
  ``num_speculative_blocks`` 0 .. ``MAX_BLOCK_SIZE``, ``num_prefill_checkpoint_blocks`` 0 ..
  ``MAX_BLOCK_SIZE`` and ``prefill_checkpoint_alignment`` null or 1 .. ``MAX_BLOCK_SIZE``, on
  ``mamba`` groups only);
  ``prefix_cache_retention_interval`` null or an int in 0 .. ``MAX_REQUEST_TOKENS``;
  ``use_eagle`` (optional) true or false; ``num_prefill_lookahead`` (optional) an int in
  0 .. ``MAX_BLOCK_SIZE``; ``num_hash_lookahead_tokens`` (optional) an int in
  0 .. ``MAX_BLOCK_SIZE``; ``watermark`` (optional) a number in [0, 1);
  ``max_in_flight_tokens`` (optional) null or an int in 1 .. ``MAX_REQUEST_TOKENS``;
  ``mamba_shared_prefix_checkpoint`` (optional) true or false.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import TypeGuard, cast

from kvcheck.conformance.bounds import (
    MAX_BLOCK_SIZE,
    MAX_NUM_BLOCKS,
    MAX_OPS,
    MAX_REQUEST_TOKENS,
    TOKEN_ID_LIMIT,
)
from kvcheck.conformance.errors import TraceError
from kvcheck.conformance.ops import Op
from kvcheck.conformance.protocol import (
    ATTENTION_KINDS,
    HASH_ALGOS,
    MAMBA_CACHE_MODES,
    PROFILES,
    KVCacheGroupSpec,
    KVCacheSpec,
    spec_from_dict,
)

__all__ = ["MAX_BLOCK_SIZE", "MAX_GROUPS", "MAX_NUM_BLOCKS", "MAX_OPS", "MAX_REQUEST_TOKENS",
           "TraceError", "check_encoder_ops", "check_ops", "check_spec"]

# MAX_NUM_BLOCKS, MAX_BLOCK_SIZE, MAX_REQUEST_TOKENS, MAX_OPS: kvcheck.conformance.bounds,
# shared with the benchmark's request traces (re-exported here).
MAX_GROUPS = 64
_MAX_TOKEN_ID = TOKEN_ID_LIMIT

_OP_FIELDS: dict[str, frozenset[str]] = {
    "add": frozenset({"op", "rid", "prompt", "lora", "mm", "salt", "skip_read", "encoder"}),
    "schedule": frozenset({"op", "rid", "num_tokens", "lookahead", "external", "delay",
                           "gates"}),
    "decode": frozenset({"op", "rid", "num_tokens", "lookahead", "gates"}),
    "free": frozenset({"op", "rid", "in_flight", "preempt"}),
    "reset": frozenset({"op"}),
    "lookup": frozenset({"op", "rid"}),
    "cache": frozenset({"op", "rid", "num_tokens"}),
    "evict": frozenset({"op", "block_ids"}),
}


def _is_int(value: object) -> TypeGuard[int]:
    return type(value) is int


def check_spec(raw: object, where: str) -> KVCacheSpec:
    """The trace's ``spec`` object as a ``KVCacheSpec``, every field checked."""
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: field 'spec' missing or not an object")
    known = {f.name for f in fields(KVCacheSpec)}
    unknown = sorted(set(map(str, raw)) - known)
    if unknown:
        raise TraceError(f"{where}: field 'spec' is not a KVCacheSpec: unknown fields {unknown}"
                         f" (known: {sorted(known)})")
    for key in ("num_blocks", "block_size"):
        if key not in raw:
            raise TraceError(f"{where}: field 'spec' is not a KVCacheSpec: {key} is missing")
    bounds = {"num_blocks": MAX_NUM_BLOCKS, "block_size": MAX_BLOCK_SIZE}
    for key, high in bounds.items():
        value = raw[key]
        if not _is_int(value) or not 1 <= value <= high:
            raise TraceError(f"{where}: spec.{key}={value!r}: must be an int in [1, {high}]")
    for key in ("enable_caching", "enable_kv_cache_events", "use_eagle",
                "mamba_shared_prefix_checkpoint"):
        if key in raw and type(raw[key]) is not bool:
            raise TraceError(f"{where}: spec.{key}={raw[key]!r}: must be true or false")
    if "hash_algo" in raw and raw["hash_algo"] not in HASH_ALGOS:
        raise TraceError(f"{where}: spec.hash_algo={raw['hash_algo']!r}: unknown hash "
                         f"algorithm (known: {list(HASH_ALGOS)})")
    if "profile" in raw and raw["profile"] not in PROFILES:
        raise TraceError(f"{where}: spec.profile={raw['profile']!r}: unknown profile "
                         f"(known: {list(PROFILES)})")
    seed = raw.get("pythonhashseed")
    if seed is not None and not isinstance(seed, str):
        raise TraceError(f"{where}: spec.pythonhashseed={seed!r}: must be a string or null")
    mml = raw.get("max_model_len")
    if mml is not None and (not _is_int(mml) or not 1 <= mml <= MAX_REQUEST_TOKENS):
        raise TraceError(f"{where}: spec.max_model_len={mml!r}: must be null or an int in "
                         f"[1, {MAX_REQUEST_TOKENS}]")
    retention = raw.get("prefix_cache_retention_interval")
    if retention is not None and (not _is_int(retention)
                                  or not 0 <= retention <= MAX_REQUEST_TOKENS):
        raise TraceError(f"{where}: spec.prefix_cache_retention_interval={retention!r}: must "
                         f"be null or an int in [0, {MAX_REQUEST_TOKENS}]")
    lookahead = raw.get("num_prefill_lookahead", 0)
    if not _is_int(lookahead) or not 0 <= lookahead <= MAX_BLOCK_SIZE:
        raise TraceError(f"{where}: spec.num_prefill_lookahead={lookahead!r}: must be an int "
                         f"in [0, {MAX_BLOCK_SIZE}]")
    hash_lookahead = raw.get("num_hash_lookahead_tokens", 0)
    if not _is_int(hash_lookahead) or not 0 <= hash_lookahead <= MAX_BLOCK_SIZE:
        raise TraceError(f"{where}: spec.num_hash_lookahead_tokens={hash_lookahead!r}: must be "
                         f"an int in [0, {MAX_BLOCK_SIZE}]")
    watermark = raw.get("watermark", 0.0)
    if type(watermark) not in (int, float) or not 0 <= watermark < 1:
        raise TraceError(f"{where}: spec.watermark={watermark!r}: must be a number in [0, 1)")
    in_flight = raw.get("max_in_flight_tokens")
    if in_flight is not None and (not _is_int(in_flight)
                                  or not 1 <= in_flight <= MAX_REQUEST_TOKENS):
        raise TraceError(f"{where}: spec.max_in_flight_tokens={in_flight!r}: must be null or "
                         f"an int in [1, {MAX_REQUEST_TOKENS}]")
    if "kv_cache_groups" in raw:
        _check_groups(raw["kv_cache_groups"], where)
    return spec_from_dict(raw)


#: A ``schedule`` op's ``gates`` (vLLM 0.33's admission gates): each name's JSON type.
_GATES: dict[str, type] = {"full_sequence_must_fit": bool, "reserved_blocks": int,
                           "has_scheduled_reqs": bool, "num_in_flight_tokens": int}


def _check_gates(gates: object, at: str) -> None:
    if not isinstance(gates, dict) or not gates:
        raise TraceError(f"{at}: field 'gates'={gates!r}: must be a non-empty object of "
                         f"{sorted(_GATES)}")
    for name, value in gates.items():
        if name not in _GATES:
            raise TraceError(f"{at}: gates has unknown field {name!r} (known: "
                             f"{sorted(_GATES)})")
        if type(value) is not _GATES[name] or (
                _is_int(value) and not 0 <= value <= MAX_REQUEST_TOKENS):
            raise TraceError(f"{at}: gates.{name}={value!r}: must be "
                             + ("true or false" if _GATES[name] is bool else
                                f"an int in [0, {MAX_REQUEST_TOKENS}]"))


_GROUP_FIELDS = frozenset(f.name for f in fields(KVCacheGroupSpec))
# The size field each kind needs (and only it may set).
_KIND_FIELD = {"sliding_window": "sliding_window",
               "chunked_local_attention": "attention_chunk_size"}


def _check_groups(groups: object, where: str) -> None:
    """A trace's ``spec.kv_cache_groups``: a list of group objects (see the module doc)."""
    if not isinstance(groups, list) or len(groups) > MAX_GROUPS:
        raise TraceError(f"{where}: spec.kv_cache_groups must be a list of at most "
                         f"{MAX_GROUPS} group objects")
    for i, group in enumerate(groups):
        at = f"{where}: spec.kv_cache_groups[{i}]"
        if not isinstance(group, dict):
            raise TraceError(f"{at}: must be an object with a 'kind'")
        unknown = sorted(set(map(str, group)) - _GROUP_FIELDS)
        if unknown:
            raise TraceError(f"{at}: unknown fields {unknown} (known: {sorted(_GROUP_FIELDS)})")
        kind = group.get("kind", "full_attention")
        if kind not in ATTENTION_KINDS:
            raise TraceError(f"{at}: kind={kind!r}: unknown (known: {list(ATTENTION_KINDS)})")
        for key in ("block_size", "sliding_window", "attention_chunk_size"):
            value = group.get(key)
            if value is not None and (not _is_int(value) or not 1 <= value <= MAX_BLOCK_SIZE):
                raise TraceError(f"{at}: {key}={value!r}: must be null or an int in "
                                 f"[1, {MAX_BLOCK_SIZE}]")
        for key in ("sliding_window", "attention_chunk_size"):
            needed = _KIND_FIELD.get(str(kind)) == key
            if needed and group.get(key) is None:
                raise TraceError(f"{at}: a {kind} group needs {key}")
            if not needed and group.get(key) is not None:
                raise TraceError(f"{at}: {key} is set on a {kind} group")
        _check_mamba_fields(group, str(kind), at)
        if type(group.get("is_eagle_group", False)) is not bool:
            raise TraceError(f"{at}: is_eagle_group={group['is_eagle_group']!r}: must be a "
                             "bool (true or false)")


def _check_mamba_fields(group: dict[str, object], kind: str, at: str) -> None:
    """A group's ``mamba_cache_mode`` (null or one of ``MAMBA_CACHE_MODES``) and
    ``num_speculative_blocks`` (an int in 0 .. ``MAX_BLOCK_SIZE``): set on ``mamba`` groups
    only."""
    mode = group.get("mamba_cache_mode")
    spec_blocks = group.get("num_speculative_blocks", 0)
    if mode is not None and mode not in MAMBA_CACHE_MODES:
        raise TraceError(f"{at}: mamba_cache_mode={mode!r}: must be null or one of "
                         f"{list(MAMBA_CACHE_MODES)}")
    if not _is_int(spec_blocks) or not 0 <= spec_blocks <= MAX_BLOCK_SIZE:
        raise TraceError(f"{at}: num_speculative_blocks={spec_blocks!r}: must be an int in "
                         f"[0, {MAX_BLOCK_SIZE}]")
    if kind != "mamba" and (mode is not None or spec_blocks):
        raise TraceError(f"{at}: mamba_cache_mode / num_speculative_blocks are set on a {kind} "
                         "group (mamba groups only)")
    checkpoints = group.get("num_prefill_checkpoint_blocks", 0)
    alignment = group.get("prefill_checkpoint_alignment")
    if not _is_int(checkpoints) or not 0 <= checkpoints <= MAX_BLOCK_SIZE:
        raise TraceError(f"{at}: num_prefill_checkpoint_blocks={checkpoints!r}: must be an int "
                         f"in [0, {MAX_BLOCK_SIZE}]")
    if alignment is not None and (not _is_int(alignment)
                                  or not 1 <= alignment <= MAX_BLOCK_SIZE):
        raise TraceError(f"{at}: prefill_checkpoint_alignment={alignment!r}: must be null or an "
                         f"int in [1, {MAX_BLOCK_SIZE}]")
    if kind != "mamba" and (checkpoints or alignment is not None):
        raise TraceError(f"{at}: num_prefill_checkpoint_blocks / prefill_checkpoint_alignment "
                         f"are set on a {kind} group (mamba groups only)")


def check_ops(ops: object, where: str) -> list[Op]:
    """Check every op: a known kind, its fields and their types, request ids that were
    added, counts within bounds; returns ``ops``, now known to be ops."""
    if not isinstance(ops, list):
        raise TraceError(f"{where}: field 'ops' missing or not a list")
    if len(ops) > MAX_OPS:
        raise TraceError(f"{where}: {len(ops)} ops; a trace holds at most {MAX_OPS}")
    tokens: dict[str, int] = {}  # request id -> tokens its schedule / decode ops asked for
    for index, op in enumerate(ops):
        at = f"{where}: ops[{index}] (op #{index + 1})"
        if not isinstance(op, dict):
            raise TraceError(f"{at}: an op is an object, got {type(op).__name__}")
        kind = op.get("op")
        if kind not in _OP_FIELDS:
            raise TraceError(f"{at}: unknown op {kind!r} (known: {sorted(_OP_FIELDS)})")
        extra = sorted(set(map(str, op)) - _OP_FIELDS[kind])
        if extra:
            raise TraceError(f"{at}: {kind!r} op has unknown fields {extra}")
        if kind == "reset":
            continue
        if kind == "evict":
            ids = op.get("block_ids")
            if not isinstance(ids, list) or not all(
                    type(b) is int and 0 <= b < MAX_NUM_BLOCKS for b in ids):
                raise TraceError(f"{at}: field 'block_ids'={ids!r}: must be a list of block "
                                 f"ids (ints in [0, {MAX_NUM_BLOCKS}))")
            continue
        rid = op.get("rid")
        if not isinstance(rid, str) or not rid:
            raise TraceError(f"{at}: field 'rid' must be a non-empty string, got {rid!r}")
        if kind == "add":
            _check_add(op, at)
            tokens[rid] = 0
            continue
        if rid not in tokens:
            raise TraceError(f"{at}: {kind!r} names request {rid!r}, which no earlier 'add' op "
                             "added")
        if kind == "free":
            in_flight = op.get("in_flight", 0)
            if type(in_flight) is not int or not 0 <= in_flight <= MAX_REQUEST_TOKENS:
                raise TraceError(f"{at}: in_flight={in_flight!r}: must be an int in "
                                 f"[0, {MAX_REQUEST_TOKENS}]")
            if type(op.get("preempt", False)) is not bool:
                raise TraceError(f"{at}: field 'preempt'={op['preempt']!r}: must be true or false")
            continue
        if kind == "cache":
            n = op.get("num_tokens")
            if type(n) is not int or not 0 <= n <= MAX_REQUEST_TOKENS:
                raise TraceError(f"{at}: num_tokens={n!r}: must be an int in "
                                 f"[0, {MAX_REQUEST_TOKENS}]")
            continue
        if kind in ("schedule", "decode"):
            external = op.get("external", 0)
            if type(external) is not int or not 0 <= external <= MAX_REQUEST_TOKENS:
                raise TraceError(f"{at}: external={external!r}: must be an int in "
                                 f"[0, {MAX_REQUEST_TOKENS}]")
            if "delay" in op and type(op["delay"]) is not bool:
                raise TraceError(f"{at}: field 'delay'={op['delay']!r}: must be true or false")
            if "gates" in op:
                _check_gates(op["gates"], at)
            lookahead = op.get("lookahead", 0)
            if type(lookahead) is not int or not 0 <= lookahead <= MAX_REQUEST_TOKENS:
                raise TraceError(f"{at}: lookahead={lookahead!r}: must be an int in "
                                 f"[0, {MAX_REQUEST_TOKENS}]")
            n = op.get("num_tokens")
            if n is None and kind == "schedule":
                continue
            if type(n) is not int or not 0 <= n <= MAX_REQUEST_TOKENS:
                raise TraceError(f"{at}: num_tokens={n!r}: must be an int in "
                                 f"[0, {MAX_REQUEST_TOKENS}]"
                                 + (" or null" if kind == "schedule" else ""))
            tokens[rid] += n
            if tokens[rid] > MAX_REQUEST_TOKENS:
                raise TraceError(f"{at}: the schedule and decode ops of request {rid!r} ask "
                                 f"for {tokens[rid]} tokens; at most {MAX_REQUEST_TOKENS}")
    return cast("list[Op]", ops)  # every op checked above


def check_encoder_ops(spec: KVCacheSpec, ops: Sequence[Op], where: str) -> None:
    """``add`` ops with encoder tokens need a ``cross_attention`` group in the spec (an
    encoder-decoder model) to hold them."""
    if any(g.kind == "cross_attention" for g in spec.kv_cache_groups):
        return
    for index, op in enumerate(ops):
        if op["op"] == "add" and "encoder" in op:
            raise TraceError(f"{where}: ops[{index}] (op #{index + 1}): encoder tokens "
                             f"({op['encoder']}) but spec.kv_cache_groups has no "
                             "cross_attention group to hold them (an encoder-decoder "
                             "model's); drop 'encoder' or add the group")


def _check_add(op: dict[str, object], at: str) -> None:
    prompt = op.get("prompt")
    if not isinstance(prompt, list):
        raise TraceError(f"{at}: field 'prompt' must be a list of token ids")
    if len(prompt) > MAX_REQUEST_TOKENS:
        raise TraceError(f"{at}: a {len(prompt)}-token prompt; at most {MAX_REQUEST_TOKENS}")
    bad = next((t for t in prompt if not _is_int(t) or not 0 <= t < _MAX_TOKEN_ID), None)
    if bad is not None:
        raise TraceError(f"{at}: token id {bad!r} in 'prompt': token ids are ints in "
                         "[0, 2**63)")
    lora = op.get("lora")
    if lora is not None and not (
            isinstance(lora, list) and len(lora) == 3 and isinstance(lora[0], str)
            and _is_int(lora[1]) and lora[1] >= 0 and isinstance(lora[2], str)):
        raise TraceError(f"{at}: field 'lora'={lora!r}: must be [name, int id >= 0, path]")
    mm = op.get("mm", [])
    if not isinstance(mm, list):
        raise TraceError(f"{at}: field 'mm' must be a list of [identifier, offset, length]")
    for item in mm:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                and _is_int(item[1]) and _is_int(item[2]) and item[1] >= 0 and item[2] >= 1
                and item[1] + item[2] <= len(prompt)):
            raise TraceError(f"{at}: multimodal item {item!r}: must be [identifier, offset >= 0,"
                             f" length >= 1] inside the {len(prompt)}-token prompt")
    salt = op.get("salt")
    if salt is not None and not isinstance(salt, str):
        raise TraceError(f"{at}: field 'salt'={salt!r}: must be a string or null")
    if "skip_read" in op and type(op["skip_read"]) is not bool:
        raise TraceError(f"{at}: field 'skip_read'={op['skip_read']!r}: must be true or false")
    encoder = op.get("encoder", 1)
    if type(encoder) is not int or not 1 <= encoder <= MAX_REQUEST_TOKENS:
        raise TraceError(f"{at}: field 'encoder'={encoder!r}: the request's encoder tokens, "
                         f"an int in [1, {MAX_REQUEST_TOKENS}] (absent for a decoder-only "
                         "request)")
