"""kvcheck's side of the wire: an ``exec:COMMAND`` target as a module the loader checks like
any other (``exec_module``), whose factories return proxies that turn every protocol call into a
request to the engine process.

One ``EngineSession`` per target: it starts the process and sends ``init`` at load time, keeps
the process for the whole session, and after a process-level failure (which kills it) starts a
fresh one at the next factory call, so the next test starts clean. Objects of a killed process
are gone: a call on one fails, saying so. Objects the suite drops are released in one
``release`` request before the next factory call (a finalizer only queues them: nothing is sent
from inside the garbage collector, which may run in the middle of a call).
"""

from __future__ import annotations

import atexit
import contextlib
import shlex
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Final, NoReturn

from kvcheck import __version__
from kvcheck.conformance.indexer_protocol import IndexerConfig, config_to_dict
from kvcheck.conformance.protocol import KVCacheSpec, UnsupportedSpec, spec_to_dict
from kvcheck.errors import KVCheckInputError
from kvcheck.wire import PROTOCOL_VERSION
from kvcheck.wire.engine import EngineProcess, EngineProcessError
from kvcheck.wire.errors import EngineError
from kvcheck.wire.methods import FACTORIES, METHODS, WireMethod
from kvcheck.wire.values import WireValueError, batch_to_wire, result_from_wire

__all__ = ["EXEC_PREFIX", "EngineError", "EngineSession", "exec_module", "parse_command"]

EXEC_PREFIX: Final = "exec:"


def parse_command(target: str) -> list[str]:
    """The argv of ``exec:COMMAND`` (POSIX shell words, no shell).

    Raises:
        KVCheckInputError: empty command, unbalanced quotes, or a comma in it.
    """
    command = target.removeprefix(EXEC_PREFIX)
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise KVCheckInputError(f"exec:{command}: cannot split the command into words ({exc})"
                                "\n  Fix: balance the quotes in the command") from None
    if not argv:
        raise KVCheckInputError("exec: needs a command after it\n  Fix: pass "
                                "--kv-impl='exec:./my-engine --its-flags'")
    return argv


#: Error codes (docs/wire-protocol.md) -> the exception an in-process adapter would raise.
_ERRORS: Final[dict[str, type[Exception]]] = {
    "not_supported": UnsupportedSpec,
    "invalid_argument": ValueError,
    "violation": AssertionError,
    "internal": EngineError,
}


class EngineSession:
    """The engine process of one ``exec:`` target, its announced ``impl_info``, and the
    objects made on it (handles per process generation)."""

    def __init__(self, target: str, argv: list[str]) -> None:
        self.target = target
        self.argv = argv
        self.name = target  # until init names the implementation
        self.impl_info: dict[str, object] | None = None
        self.process: EngineProcess | None = None
        self.generation = 0
        self.pending_release: list[tuple[int, int]] = []  # (generation, handle)
        atexit.register(self.close)

    # ------------------------------------------------------------------ process
    def _started(self) -> EngineProcess:
        """The live process, started (and initialised) if there is none."""
        process = self.process
        if process is not None and not process.killed and process.alive:
            return process
        process = EngineProcess(self.argv, self.name)
        self.process = process
        self.generation += 1
        self.pending_release.clear()
        answer = process.call("init", {"protocol": PROTOCOL_VERSION,
                                       "kvcheck_version": __version__},
                              what="init" if self.impl_info is None else f"{self.name}.init")
        info = self._init_result(answer, process)
        process.head = list(process.transcript)  # every object's transcript starts with it
        if self.impl_info is None:
            self.impl_info = info
            self.name = str(info.get("name", self.target))
        elif info != self.impl_info:
            process.kill()
            raise EngineProcessError(
                f"{self.name}.init: the restarted engine announced another impl_info "
                f"({info!r:.200}) than at start ({self.impl_info!r:.200})")
        return process

    def _init_result(self, answer: dict[str, object], process: EngineProcess
                     ) -> dict[str, object]:
        def refuse(problem: str) -> NoReturn:
            process.kill()
            where = "init" if self.impl_info is None else f"{self.name}.init"
            raise EngineProcessError(f"{where}: {problem}\n{process.stderr_tail()}")

        if "error" in answer:
            refuse(f"the engine answered init with an error: {answer['error']!r:.300}")
        result = answer["result"]
        if not isinstance(result, dict) or not isinstance(result.get("impl_info"), dict):
            refuse(f"the init answer must be {{\"protocol\": {PROTOCOL_VERSION}, "
                   f"\"impl_info\": {{...}}}}, got {result!r:.200}")
        if result.get("protocol") != PROTOCOL_VERSION:
            refuse(f"the engine speaks protocol {result.get('protocol')!r}; this kvcheck "
                   f"speaks {PROTOCOL_VERSION} (docs/wire-protocol.md)")
        info: dict[str, object] = dict(result["impl_info"])
        caps = info.get("capabilities")
        if isinstance(caps, list) and "kernels" in caps:
            refuse("impl_info declares 'kernels', which cannot cross the wire (GPU tensors); "
                   "check kernels with an in-process Python adapter")
        if isinstance(caps, list) and "offload" in caps:
            refuse("impl_info declares 'offload', which protocol v1 does not carry yet; check "
                   "an offload tier with an in-process Python adapter (make_offloading_manager, "
                   "docs/writing-an-adapter.md)")
        return info

    def close(self) -> None:
        """End the process: ``shutdown``, end of input, then signals if needed."""
        process, self.process = self.process, None
        if process is None or not process.alive:
            return
        with contextlib.suppress(Exception):  # ending anyway: close() kills what is left
            process.call("shutdown", {}, what=f"{self.name}.shutdown")
        process.close()

    # ------------------------------------------------------------------ calls
    def call(self, method: str, params: dict[str, object], *, handle: int | None = None,
             generation: int | None = None) -> object:
        """One call's result, or the exception its error code stands for."""
        what = f"{self.name}.{method}"
        process = self._started() if generation is None else self._serving(generation, what)
        answer = process.call(method, params, handle=handle, what=what)
        if "error" in answer:
            raise self._error(what, answer["error"])
        return answer["result"]

    def call_many(self, method: str, params: list[dict[str, object]], *, handle: int,
                  generation: int) -> list[object]:
        """``call`` for many requests of one object's method, pipelined
        (``EngineProcess.call_many``); the first error answer raises, after every answer was
        read (the stream stays in step)."""
        what = f"{self.name}.{method}"
        answers = self._serving(generation, what).call_many(method, params, handle=handle,
                                                            what=what)
        for answer in answers:
            if "error" in answer:
                raise self._error(what, answer["error"])
        return [answer["result"] for answer in answers]

    def _serving(self, generation: int, what: str) -> EngineProcess:
        """The process an object of ``generation`` lives in; an object of a killed process is
        gone (no restart here: only a factory call starts a fresh process)."""
        current = self.process
        if current is None or generation != self.generation or current.killed:
            raise EngineProcessError(
                f"{what}: this object lived in an engine process that was killed after an "
                "earlier failure (the next factory call starts a fresh process)")
        return current

    def _error(self, what: str, error: object) -> Exception:
        if not isinstance(error, dict):
            return EngineError(f"{what}: the engine answered error {error!r:.300}")
        code = error.get("code")
        message = str(error.get("message", ""))
        kind = _ERRORS.get(code if isinstance(code, str) else "", EngineError)
        if kind is EngineError and code != "internal":
            message = f"(unknown error code {code!r}) {message}"
        return kind(message if kind is not EngineError else f"{what}: {message}")

    def make(self, kind: str, argument: KVCacheSpec | IndexerConfig) -> _Proxy:
        """A factory call: a proxy for the object the engine made."""
        factory, param = FACTORIES[kind]
        process = self._started()
        self._flush_releases(process)
        value: object = argument
        if param == "spec":
            # FACTORIES: a "spec" factory is make_kv_cache_manager / make_block_pool, which
            # the loader calls with a KVCacheSpec
            assert isinstance(argument, KVCacheSpec)
            value = spec_to_dict(argument)
        elif isinstance(argument, IndexerConfig):
            value = config_to_dict(argument)  # later fields left out at their default
        result = self.call(factory, {param: value})
        if not isinstance(result, dict) or type(result.get("handle")) is not int:
            raise EngineProcessError(f"{self.name}.{factory}: the answer must be "
                                     f"{{\"handle\": INT}}, got {result!r:.200}")
        handle: int = result["handle"]
        proxy = _PROXY_CLASSES[kind](self, handle, self.generation, argument)
        process.retag_last(2, handle)  # the factory call's lines belong to the new object
        weakref.finalize(proxy, self.pending_release.append, (self.generation, handle))
        return proxy

    def _flush_releases(self, process: EngineProcess) -> None:
        handles = [h for g, h in self.pending_release if g == self.generation]
        self.pending_release.clear()
        if handles:
            process.call("release", {"handles": handles}, what=f"{self.name}.release")

    def transcript(self, handle: int, generation: int) -> list[str]:
        """The lines exchanged about ``handle`` (its factory call included), oldest first."""
        process = self.process
        if process is None or generation != self.generation:
            return []
        return process.transcript_of(handle)


class _Proxy:
    """An object made on the engine; its methods are generated per kind (``_proxy_class``)."""

    __slots__ = ("__weakref__", "_argument", "_generation", "_handle", "_session")

    def __init__(self, session: EngineSession, handle: int, generation: int,
                 argument: KVCacheSpec | IndexerConfig) -> None:
        self._session = session
        self._handle = handle
        self._generation = generation
        self._argument = argument  # the spec or config it was made for

    def wire_transcript(self) -> list[str]:
        """The exact lines exchanged with the engine about this object (``"> "`` kvcheck's,
        ``"< "`` the engine's), at most the engine's transcript length."""
        return self._session.transcript(self._handle, self._generation)

    def __repr__(self) -> str:
        return f"<{self._session.name} object {self._handle} over the wire>"


#: The annotation of a decoded batch (``apply_events``'s ``batch``) as the protocol spells it:
#: such a parameter is sent with hex hashes (``batch_to_wire``).
_DECODED_BATCH: Final = METHODS["indexer"]["apply_events"].annotations["batch"]


def _param_out(annotation: str, value: object) -> object:
    """A parameter as sent: bytes as hex, specs as ``spec_to_dict``, decoded batches with
    hex hashes; everything else msgspec encodes as it is (dataclasses as objects)."""
    if annotation == "bytes" and isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if annotation == _DECODED_BATCH and isinstance(value, Mapping):
        return batch_to_wire(value)
    return value


def _method(wm: WireMethod) -> Callable[..., object]:
    plain = all(wm.annotations[p] not in ("bytes", _DECODED_BATCH) for p in wm.params)
    returns = wm.returns
    name = wm.name
    convert = returns in ("bytes", "list[bytes]", "list[KVEvent]", "KVSizingPlan") \
        or returns.startswith("tuple[")

    def call(self: _Proxy, *args: object, **kwargs: object) -> object:
        params = wm.bind(args, kwargs)
        if not plain:
            params = {k: _param_out(wm.annotations[k], v) for k, v in params.items()}
        session = self._session
        value = session.call(name, params, handle=self._handle, generation=self._generation)
        if not convert:
            return value
        try:
            return result_from_wire(name, returns, value)
        except WireValueError as exc:
            raise EngineError(f"{session.name}.{name}: {exc}") from None

    call.__name__ = call.__qualname__ = name
    return call


def _many(wm: WireMethod) -> Callable[..., list[object]]:
    """``wm`` (a read-only manager method of one parameter) asked for many values of it,
    pipelined: the guard's bulk reads (``GuardedManager.ref_cnts`` over the pool's blocks,
    ``get_block_ids_many`` / ``block_hashes_many`` over the running requests)."""
    (param,) = wm.params
    name, returns = wm.name, wm.returns

    def call(self: _Proxy, keys: Iterable[object]) -> list[object]:
        session = self._session
        values = session.call_many(name, [{param: k} for k in keys],
                                   handle=self._handle, generation=self._generation)
        try:
            return [result_from_wire(name, returns, v) for v in values]
        except WireValueError as exc:
            raise EngineError(f"{session.name}.{name}: {exc}") from None

    return call


#: The bulk reads an ``exec:`` manager proxy has: name -> the method it asks many times.
_BULK_READS: Final = {"ref_cnts": "ref_cnt", "get_block_ids_many": "get_block_ids",
                      "block_hashes_many": "block_hashes"}


def _proxy_class(kind: str) -> type[_Proxy]:
    namespace: dict[str, object] = {"__slots__": ()}
    for name, wm in METHODS[kind].items():
        namespace[name] = _method(wm)
    if kind == "manager":
        for bulk, one in _BULK_READS.items():
            namespace[bulk] = _many(METHODS[kind][one])
    return type(f"Wire{kind.title().replace('_', '')}", (_Proxy,), namespace)


_PROXY_CLASSES: Final[dict[str, type[_Proxy]]] = {kind: _proxy_class(kind) for kind in FACTORIES}


def _sizing_function(session: EngineSession, wm: WireMethod) -> Callable[..., object]:
    def call(*args: object, **kwargs: object) -> object:
        value = session.call(wm.name, wm.bind(args, kwargs))
        try:
            return result_from_wire(wm.name, wm.returns, value)
        except WireValueError as exc:
            raise EngineError(f"{session.name}.{wm.name}: {exc}") from None

    call.__name__ = call.__qualname__ = wm.name
    return call


def exec_module(target: str) -> ModuleType:
    """Start the engine of ``exec:COMMAND``, send ``init``, and return a module with what a
    Python adapter module has: ``IMPL_INFO`` (the engine's ``impl_info``), the factories of
    its declared kinds and the sizing functions. The loader then checks it as any module.

    Raises:
        KVCheckInputError: a malformed command.
        EngineProcessError: the engine could not be started or failed ``init``.
        AdapterTimeout: ``init`` took longer than the caller's call limit.
    """
    argv = parse_command(target)
    session = EngineSession(target, argv)
    session._started()
    info = session.impl_info or {}
    module = ModuleType(target, f"the engine {argv!r} over the kvcheck wire protocol")
    module.IMPL_INFO = info  # type: ignore[attr-defined]
    module.__wire_session__ = session  # type: ignore[attr-defined]
    module.kvcheck_close = session.close  # type: ignore[attr-defined]
    declared = info.get("capabilities")
    caps: list[object] = declared if isinstance(declared, list) else []
    for kind, (factory, _param) in FACTORIES.items():
        if kind in caps:
            setattr(module, factory, _factory(session, kind, factory))
    if "sizing" in caps:
        for wm in METHODS["sizing"].values():
            setattr(module, wm.name, _sizing_function(session, wm))
    return module


def _factory(session: EngineSession, kind: str, name: str
             ) -> Callable[[KVCacheSpec | IndexerConfig], _Proxy]:
    def make(argument: KVCacheSpec | IndexerConfig) -> _Proxy:
        return session.make(kind, argument)

    make.__name__ = make.__qualname__ = name
    return make
