"""Decode-only twins of a release's structs that validate inside msgspec, one hash form each.

vLLM's own decoder reads ``block_hashes`` as ``bytes | int`` and checks nothing more. kvcheck
must also refuse what a router would choke on: both forms in one batch, an int outside u64,
a bytes hash that is not a digest width, a negative ``group_idx``. Checked in Python, hash by
hash, that made ``decode_batch`` about 9x slower than vLLM's decoder. Here the same checks are
msgspec constraints, so a valid payload is decoded *and* validated in one pass of msgspec's C
code: one decoder per hash form (the u64 int; bytes of each digest width), tried in turn. A
payload no strict decoder accepts goes to ``codec``'s general path, which names the fault.

The twins are built from the release module's own classes (``msgspec.defstruct`` over their
fields, with the hash type substituted), so they can never drift from the wire structs: same
names (tags), field order, defaults and struct options. Two string fields every event
repeats (``medium``, 0.33's ``kv_cache_spec_kind``) are read as ``Literal`` s of vLLM's
values, which msgspec hands out without decoding a new string: with that, the validating
decoder is as fast as vLLM's unvalidating one. A value outside those sets is valid all the
same: such a payload is read by the general path.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Annotated, Final, Literal, Union, get_args, get_origin

import msgspec

from kvcheck.events.decoded import DecodedBatch, batch_class
from kvcheck.events.hashes import DIGEST_WIDTHS

__all__ = ["HASH_FORMS", "StrictDecoder", "strict_decoders"]

#: The hash forms a strict decoder accepts, in the order they are tried (vLLM's default
#: first): ``"int"``, then bytes of each digest width.
HASH_FORMS: Final = ("int", *(f"bytes{w}" for w in DIGEST_WIDTHS))

_HASH_TYPES: Final[dict[str, object]] = {  # type forms, for msgspec
    # msgpack's ints stop at u64 (< 2**64), so ge=0 is the whole u64 check (msgspec takes no
    # bound beyond int64 anyway).
    "int": Annotated[int, msgspec.Meta(ge=0)],
    **{f"bytes{w}": Annotated[bytes, msgspec.Meta(min_length=w, max_length=w)]
       for w in DIGEST_WIDTHS},
}
_GROUP_IDX: Final = Annotated[int, msgspec.Meta(ge=0)]
#: Strings a stream repeats in every event, read as ``Literal`` s: msgspec then hands out
#: one interned object instead of decoding a new ``str`` each time, which pays for the
#: constraints above. Values outside these sets are just as valid: a payload with one fails
#: the strict decoders and is read by the general path (vLLM's own decoder, then checked).
_KNOWN_STRINGS: Final[dict[str, object]] = {
    # vllm/distributed/kv_events.py: MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE (0.10.2: GPU).
    "medium": Literal["GPU", "CPU", "STORAGE"],
    # 0.33's vllm/v1/kv_cache_interface.py: KVCacheSpecKind's values.
    "kv_cache_spec_kind": Literal[
        "full_attention", "mla_attention", "sliding_window", "sliding_window_mla", "mamba",
        "chunked_local_attention", "sink_full_attention", "encoder_only_attention",
        "cross_attention", "unknown"],
}


class StrictDecoder:
    """One release's payload decoder for one hash form (``form`` in ``HASH_FORMS``): its
    ``decode(payload)`` returns a ``DecodedBatch`` or raises msgspec's error."""

    __slots__ = ("decode", "decoder", "form", "int_hashes")

    def __init__(self, form: str, decoder: msgspec.msgpack.Decoder[DecodedBatch]) -> None:
        self.form = form
        self.int_hashes = form == "int"
        self.decoder = decoder
        self.decode = decoder.decode  # bound once: the fast path's call


def _substitute(tp: object, hash_type: object, field: str) -> object:
    """``tp`` with the wire hash type (a union holding both ``bytes`` and ``int``) replaced by
    ``hash_type``, ``group_idx``'s int constrained to >= 0, and the repeated strings read
    as their known values (``_KNOWN_STRINGS``)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return list[_substitute(args[0], hash_type, field)]  # type: ignore[misc]
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a not in (bytes, int)]
        if bytes in args and int in args:
            members = (hash_type, *rest)
            return Union[members]  # noqa: UP007 (built at run time)
        if field == "group_idx" and int in args:
            members = (_GROUP_IDX, *rest)
            return Union[members]  # noqa: UP007
        if field in _KNOWN_STRINGS and str in args:
            members = (_KNOWN_STRINGS[field], *(a for a in args if a is not str))
            return Union[members]  # noqa: UP007
    return tp


def _twin(cls: type[msgspec.Struct], hash_type: object) -> type[msgspec.Struct]:
    config = cls.__struct_config__
    fields: list[tuple[str, object] | tuple[str, object, object]] = []
    for info in msgspec.structs.fields(cls):
        tp = _substitute(info.type, hash_type, info.name)
        fields.append((info.name, tp) if info.default is msgspec.NODEFAULT
                      else (info.name, tp, info.default))
    return msgspec.defstruct(
        cls.__name__, fields, tag=config.tag, tag_field=config.tag_field,
        array_like=config.array_like, omit_defaults=config.omit_defaults,
        forbid_unknown_fields=config.forbid_unknown_fields, gc=False)


def strict_decoders(structs: types.ModuleType) -> Sequence[StrictDecoder]:
    """One ``StrictDecoder`` per hash form for the release module ``structs`` (its
    ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared`` and ``KVEventBatch``)."""
    out = []
    for form in HASH_FORMS:
        hash_type = _HASH_TYPES[form]
        events = tuple(_twin(getattr(structs, name), hash_type)
                       for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared"))
        # The batch's events field names the twins, not the release's classes, and the
        # decoder builds the DecodedBatch the codec hands out (no Python on the fast path).
        event_list: object = list[Union[events]]  # type: ignore[valid-type]  # noqa: UP007
        batch = batch_class(structs.KVEventBatch, event_list)
        out.append(StrictDecoder(form, msgspec.msgpack.Decoder(batch)))
    return tuple(out)
