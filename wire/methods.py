"""Every call of the wire protocol: its name, the kind of object it is made on, its parameter
names (in order, defaults included) and the annotations that say which values are bytes, specs
or requests.

All of it is read from the Protocol classes of ``kvcheck.conformance`` (the one place the calls
are written down), so a method added there is on the wire at once, and the tables of
docs/wire-protocol.md are checked against this module (``tests/wire/test_docs_tables.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kvcheck.conformance.indexer_protocol import (
    IndexerAdapter,
    SupportsDecodedEvents,
    SupportsWireBatches,
)
from kvcheck.conformance.protocol import (
    BlockPoolAdapter,
    ManagerWithCapabilities,
    protocol_methods,
)
from kvcheck.conformance.sizing_protocol import SupportsSizing

__all__ = ["FACTORIES", "KINDS", "METHODS", "WireMethod", "methods_of"]


@dataclass(frozen=True)
class WireMethod:
    """One call: ``params`` in signature order, ``annotations`` their annotation texts (and
    ``"return"``), ``defaults`` the parameters that have one."""

    name: str
    kind: str  # "manager", "block_pool", "indexer" (on a handle) or "sizing" (none)
    params: tuple[str, ...]
    annotations: Mapping[str, str]
    defaults: Mapping[str, object]
    #: Keyword-only parameters of a capability (``allocate_slots``'s external-KV ones): sent
    #: only when not at their default, so an engine without the capability never sees them.
    optional: frozenset[str] = frozenset()

    @property
    def returns(self) -> str:
        return self.annotations.get("return", "")

    def bind(self, args: tuple[object, ...], kwargs: Mapping[str, object]) -> dict[str, object]:
        """Every parameter by name, defaults filled in, as the wire sends them (an optional
        one only when it is not at its default).

        Raises:
            TypeError: the arguments do not fit the signature (as a Python call would).
        """
        if len(args) > len(self.params) - len(self.optional):
            raise TypeError(f"{self.name}() takes {len(self.params)} arguments, "
                            f"{len(args)} given")
        bound = dict(zip(self.params, args, strict=False))
        for key, value in kwargs.items():
            if key not in self.params or key in bound:
                raise TypeError(f"{self.name}() got an unexpected or repeated argument {key!r}")
            bound[key] = value
        for key in self.params:
            if key not in bound:
                if key not in self.defaults:
                    raise TypeError(f"{self.name}() missing argument {key!r}")
                bound[key] = self.defaults[key]
        return {key: bound[key] for key in self.params
                if key not in self.optional or bound[key] != self.defaults[key]}


def _read(protocol: type, kind: str) -> dict[str, WireMethod]:
    out = {}
    for name in protocol_methods(protocol):
        signature = inspect.signature(getattr(protocol, name))
        params = [p for p in signature.parameters.values() if p.name != "self"]
        annotations = {p.name: str(p.annotation) for p in params}
        annotations["return"] = str(signature.return_annotation)
        out[name] = WireMethod(
            name, kind, tuple(p.name for p in params), annotations,
            {p.name: p.default for p in params if p.default is not inspect.Parameter.empty},
            frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY))
    return out


def _indexer_methods() -> dict[str, WireMethod]:
    out: dict[str, WireMethod] = {}
    for protocol in (IndexerAdapter, SupportsWireBatches, SupportsDecodedEvents):
        out.update(_read(protocol, "indexer"))
    return out


#: kind -> method name -> its description.
METHODS: Final[dict[str, dict[str, WireMethod]]] = {
    "manager": _read(ManagerWithCapabilities, "manager"),
    "block_pool": _read(BlockPoolAdapter, "block_pool"),
    "indexer": _indexer_methods(),
    "sizing": _read(SupportsSizing, "sizing"),
}
#: The kinds of objects, and the factory that makes each (its one parameter).
FACTORIES: Final[dict[str, tuple[str, str]]] = {
    "manager": ("make_kv_cache_manager", "spec"),
    "block_pool": ("make_block_pool", "spec"),
    "indexer": ("make_indexer", "config"),
}
KINDS: Final = tuple(METHODS)


def methods_of(kind: str) -> dict[str, WireMethod]:
    """The methods of ``kind`` (``KeyError`` for an unknown kind)."""
    return METHODS[kind]
