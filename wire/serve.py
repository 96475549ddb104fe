"""``python -m kvcheck.wire.serve [--kv-impl TARGET]``: a Python implementation (kvcheck's
reference by default) served as a wire engine on standard input and output.

It is the wire's own reference: the suite on ``--kv-impl='exec:python -m kvcheck.wire.serve'``
must give the record the in-process reference gives (``tests/wire/``). It is also a complete
engine loop to read before writing one in another language (docs/wire-protocol.md).

Errors map to the protocol's codes: ``UnsupportedSpec`` -> ``not_supported``, ``ValueError``
-> ``invalid_argument``, ``AssertionError`` -> ``violation``, any other exception ->
``internal`` (the implementation's own message and type). The served module is loaded and
checked by kvcheck's loader, without call limits (the kvcheck that drives this process applies
``--kv-timeout``) and without guards (that kvcheck guards the answers).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import msgspec

from kvcheck.conformance.indexer_protocol import IndexerConfig
from kvcheck.conformance.loader import INDEXER_ALIASES, ImplHandle, ImplLoadError, load_impl
from kvcheck.conformance.protocol import KVCacheSpec, UnsupportedSpec, spec_from_dict
from kvcheck.wire import PROTOCOL_VERSION
from kvcheck.wire.methods import METHODS, WireMethod
from kvcheck.wire.values import events_from_wire, param_from_wire, to_wire

__all__ = ["Server", "main"]

#: Results that need ``to_wire`` (bytes, events, dataclasses); the rest msgspec encodes as is.
_CONVERTED_RESULTS = frozenset({"bytes", "list[bytes]", "list[KVEvent]", "KVSizingPlan",
                                "KVFeatureDefaults"})


#: Methods an implementation may lack, and the answer given for them then: ``new_step_starts``
#: as a no-op (``SupportsNewStep``: a design with no per-step state),
#: ``take_kv_cache_block_copies`` as "no copies" (``SupportsBlockCopies``: a design that never
#: copies a block), ``take_boundary_state_offloads`` as "no hand-offs" and
#: ``finalize_partial_tail_offloads`` as "no partial tail" (``SupportsBoundaryStateOffloads``: a
#: design that keeps no Mamba "align" states).
_OPTIONAL_METHODS: dict[str, object] = {"new_step_starts": None,
                                        "take_kv_cache_block_copies": [],
                                        "take_boundary_state_offloads": {},
                                        "finalize_partial_tail_offloads": []}


#: Capabilities protocol v1 does not carry (an engine declaring one is refused at ``init``).
_NOT_ON_THE_WIRE = frozenset({"kernels", "offload"})


class _Shutdown(Exception):
    """``shutdown`` was answered: leave the loop."""


class Server:
    """The objects made so far (handle -> kind, object, the config of an index) and the
    dispatch of one request."""

    def __init__(self, handle: ImplHandle) -> None:
        self.impl = handle
        self.objects: dict[int, tuple[str, object, IndexerConfig | None]] = {}
        self.next_handle = 1

    def impl_info(self) -> dict[str, object]:
        """The served ``IMPL_INFO``, less what protocol v1 does not carry: ``kernels`` (GPU
        tensors do not cross the wire) and ``offload`` (an offload tier is checked in process;
        docs/wire-protocol.md)."""
        info = to_wire(self.impl.info)
        assert isinstance(info, dict)  # to_wire turns a dataclass (ImplInfo) into a dict
        info["capabilities"] = [c for c in info["capabilities"]
                                if c not in _NOT_ON_THE_WIRE]
        return info

    def answer(self, request: object) -> dict[str, object]:
        """The answer object for one decoded request line."""
        if not isinstance(request, dict):
            return {"id": None, "error": {"code": "internal",
                                          "message": "a request is a JSON object"}}
        rid = request.get("id")
        try:
            return {"id": rid, "result": self.dispatch(request)}
        except _Shutdown:
            raise
        except UnsupportedSpec as exc:
            return _error(rid, "not_supported", exc)
        except ValueError as exc:
            return _error(rid, "invalid_argument", exc)
        except AssertionError as exc:
            return _error(rid, "violation", exc)
        except Exception as exc:  # noqa: BLE001 - the implementation's failure: code internal
            return _error(rid, "internal", exc)

    def dispatch(self, request: dict[str, object]) -> object:
        method = request.get("method")
        # Any: the params as decoded, unchecked: a malformed value fails where it is read,
        # and answer() turns the exception into the error answer
        params: Any = request.get("params") or {}
        if "handle" in request:
            return self._object_call(request["handle"], method, params)
        if method == "init":
            return {"protocol": PROTOCOL_VERSION, "impl_info": self.impl_info()}
        if method == "shutdown":
            raise _Shutdown
        if method == "release":
            for handle in params.get("handles", ()):
                self.objects.pop(handle, None)
            return None
        made = self._make(method, params)
        if made is not None:
            return made
        sizing = METHODS["sizing"].get(str(method))
        if sizing is not None and self.impl.has("sizing"):
            function = getattr(self.impl.module, sizing.name, None)
            if function is None:  # an optional sizing function the module does not define
                raise UnsupportedSpec(f"{self.impl.name} does not define {sizing.name}")
            return _result(sizing, function(*_args(sizing, params)))
        raise LookupError(f"unknown method {method!r}")

    # Any: the params as decoded (see dispatch): a config must be a mapping for ** below
    def _make(self, method: object, params: Mapping[str, Any]) -> dict[str, int] | None:
        impl = self.impl
        if method == "make_indexer":
            indexer_factory = impl.indexer_factory
            if indexer_factory is None:
                raise LookupError(f"{impl.name} declares no indexer capability")
            config = IndexerConfig(**params["config"])
            return self._keep("indexer", indexer_factory(config), config)
        factories: dict[str, tuple[str, Callable[[KVCacheSpec], object] | None]] = {
            "make_kv_cache_manager": ("manager", impl.factory),
            "make_block_pool": ("block_pool", impl.pool_factory),
        }
        if method not in factories:
            return None
        kind, factory = factories[str(method)]
        if factory is None:
            raise LookupError(f"{impl.name} declares no {kind} capability")
        return self._keep(kind, factory(spec_from_dict(params["spec"])), None)

    def _keep(self, kind: str, obj: object, config: IndexerConfig | None) -> dict[str, int]:
        """A new handle for ``obj``, the answer to its factory call."""
        handle = self.next_handle
        self.next_handle += 1
        self.objects[handle] = (kind, obj, config)
        return {"handle": handle}

    def _object_call(self, handle: object, method: object, params: Mapping[str, object]
                     ) -> object:
        if type(handle) is not int or handle not in self.objects:
            raise LookupError(f"unknown handle {handle!r}")
        kind, obj, config = self.objects[handle]
        wm = METHODS[kind].get(str(method))
        if wm is None:
            raise LookupError(f"unknown {kind} method {method!r}")
        args = _args(wm, params)
        if wm.name == "apply_events" and config is not None:
            sent: Any = args[2]  # Any: the batch as decoded; dict() refuses a malformed one
            batch = dict(sent)
            batch["events"] = events_from_wire(batch.get("events"), "apply_events batch",
                                               int_hashes=config.hash_form == "int")
            args[2] = batch
        # Optional (keyword-only) parameters go on only when sent: an implementation
        # without that capability's arguments is called as before.
        kwargs = {p: param_from_wire(wm.annotations[p], params[p])
                  for p in wm.optional if p in params}
        function = getattr(obj, wm.name, None)
        if function is None and wm.name in _OPTIONAL_METHODS:
            # A method the design may lack: a no-op there (a fresh list: never shared).
            answer = _OPTIONAL_METHODS[wm.name]
            if isinstance(answer, list | dict):
                return type(answer)(answer)
            return answer
        if function is None:
            raise AttributeError(f"{type(obj).__name__} has no method {wm.name!r}")
        return _result(wm, function(*args, **kwargs))


def _args(wm: WireMethod, params: Mapping[str, object]) -> list[object]:
    return [param_from_wire(wm.annotations[p], params[p]) for p in wm.params
            if p not in wm.optional]


def _result(wm: WireMethod, value: object) -> object:
    return to_wire(value) if wm.returns in _CONVERTED_RESULTS else value


def _error(rid: object, code: str, exc: BaseException) -> dict[str, object]:
    return {"id": rid, "error": {"code": code, "message": f"{type(exc).__name__}: {exc}"}}


def _lines(stdin: BinaryIO, flush: Callable[[], None]) -> Iterator[bytes]:
    """The request lines of ``stdin``, as they come; ``flush`` is called whenever no whole
    line is left to answer (before waiting for more input), so the answers to requests that
    arrived together (a pipelined ``ref_cnt`` sweep) leave in one write."""
    read = getattr(stdin, "read1", stdin.read)
    buffer = b""
    start = 0
    while True:
        end = buffer.find(b"\n", start)
        if end >= 0:
            yield buffer[start:end]
            start = end + 1
            continue
        flush()
        chunk = read(1 << 16)
        if not chunk:
            return
        buffer = buffer[start:] + chunk
        start = 0


def serve(server: Server, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer requests until end of input or ``shutdown``."""
    decoder = msgspec.json.Decoder()
    encoder = msgspec.json.Encoder()
    pending: list[bytes] = []

    def flush() -> None:
        if pending:
            stdout.write(b"".join(pending))
            stdout.flush()
            pending.clear()

    for line in _lines(stdin, flush):
        try:
            request = decoder.decode(line)
        except msgspec.DecodeError as exc:
            answer: dict[str, object] = {"id": None, "error": {
                "code": "internal", "message": f"not a JSON request line: {exc}"}}
        else:
            try:
                answer = server.answer(request)
            except _Shutdown:
                pending.append(encoder.encode({"id": request.get("id"), "result": None}) + b"\n")
                flush()
                return
        try:
            data = encoder.encode(answer)
        except (TypeError, msgspec.EncodeError) as exc:
            data = encoder.encode({"id": answer.get("id"), "error": {
                "code": "internal", "message": f"the answer cannot be encoded: {exc}"}})
        pending.append(data + b"\n")
    flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvcheck.wire.serve",
        description="Serve a Python KV-cache implementation over the kvcheck wire protocol "
                    "(JSON Lines on stdin/stdout; docs/wire-protocol.md).")
    parser.add_argument("--kv-impl", default="reference", metavar="MODULE[:FACTORY]",
                        help="the implementation to serve (default: kvcheck's reference; an "
                             "index module works too)")
    parser.add_argument("--kv-indexer", default=None, metavar="MODULE",
                        help="serve this router index instead (reference: kvcheck's own)")
    args = parser.parse_args(argv)
    target = args.kv_impl if args.kv_indexer is None else \
        INDEXER_ALIASES.get(args.kv_indexer, args.kv_indexer)
    try:
        handle = load_impl(target, call_timeout=0)
    except ImplLoadError as exc:
        print(exc, file=sys.stderr)
        return 2
    serve(Server(handle), sys.stdin.buffer, sys.stdout.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
