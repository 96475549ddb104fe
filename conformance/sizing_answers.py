"""The types of the ``sizing`` functions' answers (``kvcheck.conformance.sizing_protocol``),
checked before they are compared with vLLM's values.

vLLM's sizes are Python ints (bytes, blocks, tokens, dims). An answer of another type must not
pass by comparing equal (``65536.0 == 65536``, ``int("65536")``, ``True == 1``) nor end in a
raw ``ValueError`` inside the test (``int(nan)``): each is a ``SizingAnswerError``, a
protocol violation naming the function, its arguments, the answer and the rule. Integer
types that are not ``int`` but convert exactly (``numpy.int64``, via ``__index__``) are
accepted as the ints they are; ``bool`` is refused.
"""

from __future__ import annotations

import operator
from typing import Literal, NoReturn, overload

from kvcheck.conformance.call_limit import abbreviate, arg_text
from kvcheck.conformance.errors import SizingAnswerError
from kvcheck.conformance.sizing_protocol import FEATURE_OFF_REASONS

__all__ = ["SizingAnswerError", "check_sizing_answer", "feature_defaults_answer", "plan_int"]


def _as_int(value: object) -> int | None:
    """``value`` as an int, if it is one (``__index__``, not bool); else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]  # anything: refused below
    except TypeError:
        return None


def _fail(impl: str, name: str, args: tuple[object, ...], value: object,
          rule: str) -> NoReturn:
    shown = ", ".join(arg_text(a) for a in args)
    raise SizingAnswerError(f"protocol violation: {impl}.{name}({shown}) returned "
                            f"{abbreviate(value)}: {rule}")


def _ints(impl: str, name: str, args: tuple[object, ...], value: object, what: str,
          low: int, length: int | None = None) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or (length is not None and len(value) != length):
        count = f"{length} " if length is not None else ""
        _fail(impl, name, args, value, f"{what} must be a tuple of {count}ints, not a "
              f"{type(value).__name__}" + (f" of {len(value)}" if isinstance(
                  value, (tuple, list)) else ""))
    out: list[int] = []
    for item in value:
        number = _as_int(item)
        if number is None or number < low:
            _fail(impl, name, args, value, f"{what} must hold ints >= {low}; "
                  f"{abbreviate(item, 30)} is a {type(item).__name__}"
                  + ("" if number is None else f" below {low}"))
        out.append(number)
    return tuple(out)


@overload
def check_sizing_answer(impl: str, name: Literal["kv_page_size_bytes"],
                        args: tuple[object, ...], value: object) -> int: ...
@overload
def check_sizing_answer(impl: str, name: Literal["kv_cache_view_shape", "kv_block_sizes"],
                        args: tuple[object, ...], value: object) -> tuple[int, ...]: ...
@overload
def check_sizing_answer(impl: str, name: str, args: tuple[object, ...],
                        value: object) -> object: ...
def check_sizing_answer(impl: str, name: str, args: tuple[object, ...], value: object) -> object:
    """``value``, the answer of sizing function ``name``, with its type checked (and ints
    made ``int``); ``kv_sizing_plan``'s fields are checked by ``plan_int`` as they are read.

    Raises:
        SizingAnswerError: the answer has the wrong type or a negative size.
    """
    if name == "kv_page_size_bytes":
        number = _as_int(value)
        if number is None or number < 0:
            _fail(impl, name, args, value, "a page size is an int of bytes >= 0, not a "
                  f"{type(value).__name__}" + ("" if number is None else " below 0"))
        return number
    if name == "kv_cache_view_shape":
        return _ints(impl, name, args, value, "a view shape", 0)
    if name == "kv_block_sizes":
        return _ints(impl, name, args, value, "(scheduler_block_size, hash_block_size)", 1,
                     length=2)
    return value


def plan_int(impl: str, field: str, value: object) -> int:
    """A numeric field of ``kv_sizing_plan``'s answer (``page_size``, ``num_blocks``, a
    tensor's ``size``...) as an int >= 0."""
    number = _as_int(value)
    if number is None or number < 0:
        raise SizingAnswerError(
            f"protocol violation: {impl}.kv_sizing_plan(...) returned a plan whose {field} is "
            f"{abbreviate(value, 40)} ({type(value).__name__}): sizes are ints >= 0")
    return number


def feature_defaults_answer(impl: str, args: tuple[object, ...],
                            value: object) -> tuple[bool, bool, tuple[str, ...]]:
    """``kv_feature_defaults``'s answer (a ``KVFeatureDefaults`` or any object with its
    fields) as ``(enable_prefix_caching, enable_chunked_prefill, reasons)``: two bools (not
    ints: ``1 == True``) and the reasons as a sorted tuple of distinct
    ``FEATURE_OFF_REASONS`` codes.

    Raises:
        SizingAnswerError: a missing field, a non-bool flag, an unknown or unsorted reason.
    """
    name = "kv_feature_defaults"
    flags = []
    for field in ("enable_prefix_caching", "enable_chunked_prefill"):
        flag = getattr(value, field, None)
        if type(flag) is not bool:
            _fail(impl, name, args, value, f"{field} must be a bool, not "
                  f"{abbreviate(flag, 30)} ({type(flag).__name__})")
        flags.append(flag)
    reasons = getattr(value, "reasons", None)
    if not isinstance(reasons, (tuple, list)) or any(
            not isinstance(r, str) or r not in FEATURE_OFF_REASONS for r in reasons):
        _fail(impl, name, args, value, f"reasons must be a tuple of codes from "
              f"{list(FEATURE_OFF_REASONS)}")
    if list(reasons) != sorted(set(reasons)):
        _fail(impl, name, args, value, "reasons must be sorted, each code once")
    return flags[0], flags[1], tuple(reasons)
