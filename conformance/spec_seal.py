"""Specs handed to adapters cannot change what kvcheck checks against: each factory gets a
private copy, and a write to it is reported as what it is.

Python cannot make a frozen ``slots`` dataclass immune to ``object.__setattr__``, so:

* the nested parts are immutable: ``KVCacheSpec.kv_cache_groups`` is always a tuple (a list
  given to the constructor becomes one) of frozen ``KVCacheGroupSpec``; ``LayerKVSpec``'s
  shapes and dtypes are tuples;
* ``ImplHandle.make_manager`` / ``make_block_pool`` hand the factory a private copy
  (``private_copy``), never the spec the test, the guard and the oracle use, so a write can
  only affect that adapter;
* the copy is compared with the original after the factory returns and after every call on
  the manager or pool built from it (``SpecWatch``, about 0.3 us a call): a difference raises
  ``SpecMutated`` (a ``ProtocolViolation``) ``IMPL.METHOD(...): the adapter mutated the
  KVCacheSpec it was given: field num_blocks before 16, after 1000``, instead of whatever the
  write would have broken later (a count "out of range");
* sizing functions get private deep copies of their spec arguments the same way
  (``call_with_private_args``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, TypeVar

from kvcheck.conformance.call_limit import CallLimit, abbreviate, arg_text
from kvcheck.conformance.errors import SpecMutated
from kvcheck.conformance.protocol import KVCacheSpec

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    _Args = TypeVarTuple("_Args")

__all__ = ["SpecMutated", "SpecWatch", "call_with_private_args", "changes", "check_unchanged",
           "private_copy"]

_T = TypeVar("_T")


def private_copy(spec: KVCacheSpec) -> KVCacheSpec:
    """A copy of ``spec`` sharing no mutable-by-``object.__setattr__`` object with it (its
    groups are copied too)."""
    return dataclasses.replace(
        spec, kv_cache_groups=tuple(dataclasses.replace(g) for g in spec.kv_cache_groups))


def changes(before: object, after: object, path: str = "") -> list[str]:
    """What differs between ``before`` and a copy of it that an adapter held: ``field X
    before ..., after ...`` per differing leaf (dataclass fields, dict keys, list items)."""
    where = path or "the value"
    if type(before) is not type(after):
        return [(f"{where} before {abbreviate(before, 60)}, after {abbreviate(after, 60)} "
                 f"(a {type(after).__name__}, was a {type(before).__name__})")]
    if dataclasses.is_dataclass(before) and not isinstance(before, type):
        out: list[str] = []
        for f in dataclasses.fields(before):
            out += changes(getattr(before, f.name), getattr(after, f.name),
                           f"{path}.{f.name}" if path else f"field {f.name}")
        return out
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in list(before) + [k for k in after if k not in before]:
            if key not in before or key not in after:
                out.append(f"{where}[{key!r}] {'added' if key in after else 'removed'}")
            else:
                out += changes(before[key], after[key], f"{where}[{key!r}]")
        return out
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)) and (
            len(before) == len(after)):
        return [c for i, (b, a) in enumerate(zip(before, after, strict=True))
                for c in changes(b, a, f"{where}[{i}]")]
    if before != after:
        return [f"{where} before {abbreviate(before, 60)}, after {abbreviate(after, 60)}"]
    return []


def _spec_name(value: object) -> str:
    """The class name of the first dataclass in ``value`` (itself, or in a dict or list)."""
    if dataclasses.is_dataclass(value):
        return type(value).__name__
    items = value.values() if isinstance(value, dict) else value if isinstance(
        value, (list, tuple)) else ()
    for item in items:
        if dataclasses.is_dataclass(item):
            return type(item).__name__
    return type(value).__name__


def _mutated(impl: str, method: str, args: tuple[object, ...], original: object,
             given: object, path: str = "") -> SpecMutated:
    shown = ", ".join(arg_text(a) for a in args)
    diff = "; ".join(changes(original, given, path)) or "its identity or type"
    return SpecMutated(
        f"{impl}.{method}({shown}): the adapter mutated the {_spec_name(original)} it was "
        f"given: {diff}. Specs are immutable inputs (object.__setattr__ on a frozen spec "
        "included): keep your own copy of what you need to change")


def check_unchanged(impl: str, method: str, args: tuple[object, ...], original: object,
                    given: object, path: str = "") -> None:
    """Raise ``SpecMutated`` when ``given`` (the private copy an adapter held) no longer
    equals ``original`` (``path``: how the message names it; the fields of a spec by
    default)."""
    if given != original:
        raise _mutated(impl, method, args, original, given, path)


# Every field of a spec in one C call: the tuples compare in C too (the groups, distinct
# objects in the copy, by value).
_SPEC_FIELDS = attrgetter(*(f.name for f in dataclasses.fields(KVCacheSpec)))


class SpecWatch(CallLimit):
    """The handle's per-call limit, plus: after every call (returned or raised) the private
    copy handed to the factory is compared with the original spec."""

    __slots__ = ("_given", "_inner", "_original", "_state")

    def __init__(self, inner: CallLimit, original: KVCacheSpec, given: KVCacheSpec) -> None:
        super().__init__(inner.seconds, inner.impl, inner.grace)
        self._inner = inner
        self._original = original
        self._given = given
        self._state = _SPEC_FIELDS(original)

    def call(self, method: str, fn: Callable[[Unpack[_Args]], _T], *args: Unpack[_Args]) -> _T:
        try:
            result = self._inner.call(method, fn, *args)
        except BaseException as exc:
            if _SPEC_FIELDS(self._given) != self._state:  # the write is the root cause
                raise _mutated(self.impl, method, args, self._original, self._given) from exc
            raise
        if _SPEC_FIELDS(self._given) != self._state:
            raise _mutated(self.impl, method, args, self._original, self._given)
        return result


def call_with_private_args(limit: CallLimit, method: str, fn: Callable[..., _T],
                           *args: object) -> _T:
    """``limit.call(method, fn, *copies)`` with deep copies of ``args`` (sizing specs, dicts
    of them), each compared with its original after the call (``SpecMutated``)."""
    copies = tuple(copy.deepcopy(a) for a in args)
    result = limit.call(method, fn, *copies)
    for i, (original, given) in enumerate(zip(args, copies, strict=True)):
        check_unchanged(limit.impl, method, args, original, given, f"argument {i + 1}")
    return result
