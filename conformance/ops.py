"""Tiny constructors for workload ops (see ``kvcheck.conformance.driver``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["add", "decode", "free", "one_token_decodes", "reset", "schedule"]


def add(rid: str, prompt: Sequence[int], **extras: Any) -> dict[str, Any]:
    """A new request; extras: lora=(name, id, path), mm=[(id, offset, length)], salt=str,
    skip_read=bool."""
    op: dict[str, Any] = {"op": "add", "rid": rid, "prompt": list(prompt)}
    for key, value in extras.items():
        if key not in ("lora", "mm", "salt", "skip_read"):
            raise TypeError(f"unknown request extra {key!r}")
        op[key] = [list(v) for v in value] if key == "mm" else (
            list(value) if key == "lora" else value)
    return op


def schedule(rid: str, num_tokens: int | None = None) -> dict[str, Any]:
    """One prefill step of up to ``num_tokens`` prompt tokens (default: the rest)."""
    return {"op": "schedule", "rid": rid, "num_tokens": num_tokens}


def decode(rid: str, num_tokens: int = 1) -> dict[str, Any]:
    """Sample ``num_tokens`` tokens and allocate their slots."""
    return {"op": "decode", "rid": rid, "num_tokens": num_tokens}


def free(rid: str) -> dict[str, Any]:
    return {"op": "free", "rid": rid}


def reset() -> dict[str, Any]:
    return {"op": "reset"}


def one_token_decodes(ops: Iterable[dict[str, Any]], multi_token: bool) -> list[dict[str, Any]]:
    """``ops`` with every ``decode`` of n > 1 tokens split into n one-token decodes unless
    ``multi_token`` (the ``multi_token_decode`` capability). The sampled tokens are the same
    (they depend on the request and the output position only); only the step size changes."""
    out: list[dict[str, Any]] = []
    for op in ops:
        n = int(op.get("num_tokens") or 1)
        if op["op"] == "decode" and n > 1 and not multi_token:
            out += [decode(op["rid"], 1) for _ in range(n)]
        else:
            out.append(op)
    return out
