"""Drive an offload tier: every call goes to the implementation's (guarded) tier, its answer is
checked by the laws (``offload_model.TierModel``) and compared with the oracle's tier given the
same call; the first difference fails with a repro snippet of every call so far.

Compared with the oracle: ``lookup``'s answer, ``prepare_store``'s refusal, ``keys_to_store``
and ``evicted_keys`` (the policy's choice, in order), and ``take_events``'s events with every
field. Slots (``chunk_ids``, ``prepare_load``'s answer) are checked by the laws only: where a
tier puts a key is its own business, as long as no two keys share a slot.
"""

from __future__ import annotations

from typing import Any

from kvcheck.atomic import write_atomic
from kvcheck.conformance.differential import REPRO_DIR, safe_name
from kvcheck.conformance.errors import OffloadMismatch
from kvcheck.conformance.guard import ProtocolViolation
from kvcheck.conformance.offload_guard import GuardedOffloadingManager
from kvcheck.conformance.offload_model import OffloadLawBroken, TierModel
from kvcheck.conformance.offload_protocol import OffloadSpec
from kvcheck.conformance.short_repr import short_repr

__all__ = ["OffloadMismatch", "OffloadRun"]

_Call = tuple[str, tuple[object, ...]]


def _compared(name: str, answer: object) -> object:
    """The part of an answer the oracle comparison looks at."""
    if name == "prepare_store" and answer is not None:
        assert isinstance(answer, dict)  # the guard's prepare_store: a StoreAnswer or None
        return {"keys_to_store": answer["keys_to_store"], "evicted_keys": answer["evicted_keys"]}
    if name == "prepare_load":
        return None
    return answer


class OffloadRun:
    """One workload on ``tier`` (and ``oracle``, if any), call by call.

    ``target`` is the implementation as ``--kv-impl`` names it (for the repro snippet). With
    ``trace_name`` set, a failure also writes the snippet to ``.kvcheck/repro/<name>.py``
    (the last failure of a shrinking run is the smallest).
    """

    def __init__(self, tier: GuardedOffloadingManager, oracle: GuardedOffloadingManager | None,
                 spec: OffloadSpec, target: str) -> None:
        self.tier, self.oracle, self.spec, self.target = tier, oracle, spec, target
        self.model = TierModel(spec)
        self.log: list[_Call] = []
        self.trace_name: str | None = None

    # Any: the arguments and the answer of the tier method named ``name`` (each method has its
    # own types: lookup answers a str, prepare_store a StoreAnswer or None...).
    def call(self, name: str, *args: Any) -> Any:
        """``tier.name(*args)``, checked; returns the implementation's answer."""
        self.log.append((name, args))
        try:
            answer = getattr(self.tier, name)(*args)
            self._laws(name, args, answer)
        except (OffloadLawBroken, ProtocolViolation) as exc:
            raise self._failure(str(exc)) from None
        if self.oracle is not None:
            theirs = getattr(self.oracle, name)(*args)
            mine, want = _compared(name, answer), _compared(name, theirs)
            if mine != want:
                raise self._failure(
                    f"{name}({', '.join(short_repr(a, 60) for a in args)}) answered "
                    f"{short_repr(mine, 400)}; the oracle ({self.oracle.impl}) answered "
                    f"{short_repr(want, 400)}")
        return answer

    def _laws(self, name: str, args: tuple[Any, ...], answer: Any) -> None:  # Any: as call
        model = self.model
        if name == "lookup":
            model.lookup(args[0], answer)
        elif name == "prepare_load":
            model.prepare_load(args[0], answer)
        elif name == "complete_load":
            model.complete_load(args[0])
        elif name == "prepare_store":
            model.prepare_store(args[0], answer)
        elif name == "complete_store":
            model.complete_store(args[0], args[2])
        elif name == "take_events":
            model.take_events(answer if self.spec.enable_events else [])
        elif name == "reset_cache":
            model.reset()

    def _failure(self, problem: str) -> OffloadMismatch:
        snippet = self.repro()
        where = ""
        if self.trace_name:
            try:
                path = write_atomic(REPRO_DIR / f"{safe_name(self.trace_name)}.py",
                                    snippet + "\n")
                where = f" (also written to {path}: python {path})"
            except OSError as exc:  # an unwritable directory must not hide the failure
                where = f" (not written to {REPRO_DIR}: {exc.strerror or exc})"
        return OffloadMismatch(f"{self.tier.impl}: {problem}\n\nAfter {len(self.log)} call(s); "
                               f"to reproduce{where}:\n{snippet}")

    def repro(self) -> str:
        """A Python snippet making every call so far on a fresh tier of the implementation."""
        keys: dict[bytes, int] = {}
        for _, args in self.log:
            for arg in args:
                for key in (arg if isinstance(arg, list) else
                            list(arg) if isinstance(arg, dict) else [arg]):
                    if isinstance(key, bytes):
                        keys.setdefault(key, len(keys))

        def show(arg: object) -> str:
            if isinstance(arg, bytes):
                return f"K[{keys[arg]}]"
            if isinstance(arg, list):
                return "[" + ", ".join(show(a) for a in arg) + "]"
            if isinstance(arg, dict):
                return "{" + ", ".join(f"{show(k)}: {v!r}" for k, v in arg.items()) + "}"
            return repr(arg)

        lines = ["from kvcheck.conformance.loader import load_impl",
                 "from kvcheck.conformance.offload_protocol import OffloadSpec",
                 f"tier = load_impl({self.target!r}).make_offloading_manager({self.spec!r}).raw",
                 "K = [" + ", ".join(f"bytes.fromhex({k.hex()!r})" for k in keys) + "]"]
        calls = [f"tier.{name}({', '.join(show(a) for a in args)})" for name, args in self.log]
        if calls:
            calls[-1] = f"print({calls[-1]})  # the call that failed"
        return "\n".join(lines + calls)
