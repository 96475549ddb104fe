"""Resolve ``--kv-impl`` values into checked ``ImplHandle`` objects.

Every way a module can fail the contract (not importable, no ``IMPL_INFO``, no factory, a
factory with the wrong signature, an unknown capability, hash algorithm or profile, a malformed
``IMPL_INFO`` field, a name unfit for test ids, a declared capability whose method (or, for
``kernels`` and ``sizing``, module-level function) is missing, a
factory that declines every spec it claims to support or does not return) becomes one
``ImplLoadError`` paragraph that names the problem and the fix; no traceback. The pytest plugin
and the ``kvcheck`` command turn it into their usage error.

Implementation names become test ids, report rows and file names, so a name must be 1-100
printable characters with no whitespace: Unicode categories Cc, Cf (bidi overrides such as
U+202E included), Cs, Co, Cn, Zs, Zl and Zp are refused. ``version`` may hold spaces but none
of the other categories.

A handle's factories and every adapter call run under its per-call limit
(``call_timeout`` seconds, ``kvcheck.conformance.call_limit``); managers and pools come back
wrapped in the answer-validating guards of ``kvcheck.conformance.guard``. Each factory gets a
private copy of its spec, compared with the original after the factory and after every call
(``kvcheck.conformance.spec_seal``).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, cast

from kvcheck.conformance.call_limit import (
    DEFAULT_CALL_TIMEOUT,
    AdapterRaised,
    AdapterTimeout,
    CallLimit,
)
from kvcheck.conformance.errors import ImplLoadError
from kvcheck.conformance.guard import GuardedBlockPool, GuardedManager
from kvcheck.conformance.indexer_guard import GuardedIndexer
from kvcheck.conformance.indexer_protocol import (
    IndexerAdapter,
    IndexerConfig,
    SupportsDecodedEvents,
    SupportsWireBatches,
)
from kvcheck.conformance.interrupts import is_adapters_doing
from kvcheck.conformance.offload_guard import GuardedOffloadingManager
from kvcheck.conformance.offload_protocol import (
    OFFLOAD_FACTORY,
    OffloadingManagerAdapter,
    OffloadSpec,
)
from kvcheck.conformance.protocol import (
    CAPABILITIES,
    CAPABILITY_METHODS,
    HASH_ALGOS,
    PROFILES,
    BlockPoolAdapter,
    ImplInfo,
    KVCacheSpec,
    ManagerWithCapabilities,
    UnsupportedSpec,
    effective_capabilities,
    protocol_methods,
    reserved_block_ids,
)
from kvcheck.conformance.sizes import note_spec
from kvcheck.conformance.sizing_protocol import SIZING_FUNCTIONS
from kvcheck.conformance.spec_seal import SpecMutated, SpecWatch, check_unchanged, private_copy
from kvcheck.errors import KVCheckInputError

__all__ = ["ALIASES", "DEFAULT_CALL_TIMEOUT", "INDEXER_ALIASES", "ImplHandle", "ImplLoadError",
           "load_impl", "load_impls", "load_indexers"]

#: Short names accepted by --kv-impl.
ALIASES: dict[str, str] = {
    "reference": "kvcheck.adapters.reference",
    "vllm": "kvcheck.adapters.vllm",
}
#: ``exec:COMMAND`` targets: an engine in its own process, any language (docs/wire-protocol.md);
#: the module that starts it and turns it into a module (``exec_module``), named by string as
#: the aliases are (the wire layer sits above this one).
EXEC_PREFIX = "exec:"
_WIRE_CLIENT = "kvcheck.wire.client"
#: Short names accepted by --kv-indexer.
INDEXER_ALIASES: dict[str, str] = {"reference": "kvcheck.adapters.reference_indexer"}
#: The factory an indexer module defines (capability ``indexer``).
INDEXER_FACTORY = "make_indexer"

# Capabilities whose methods live on the manager object (the others: on the block pool or
# the module); the method names come from the Protocol classes (CAPABILITY_METHODS).
_POOL_CAPABILITY = "block_pool"
_MODULE_CAPABILITY = "kernels"
# Module-level functions too (kvcheck.conformance.sizing_protocol.SIZING_FUNCTIONS).
_SIZING_CAPABILITY = "sizing"
_PROBE_SPEC = KVCacheSpec(num_blocks=16, block_size=4)
# Pool sizes tried by the load-time probe, in order, within ImplInfo.num_blocks_range.
_PROBE_NUM_BLOCKS = (16, 64, 256, 8, 4)
_NAME_MAX = 100
# Unicode categories refused in names: controls, format characters (bidi overrides),
# surrogates, private use, unassigned, and every separator (names become test ids).
_BAD_NAME_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})
_BAD_TEXT_CATEGORIES = _BAD_NAME_CATEGORIES - {"Zs"}


@dataclass(frozen=True)
class ImplHandle:
    """A loaded implementation: its module, claims and factories.

    ``call_timeout`` is the per-call limit in seconds (0 or None: none) applied to the
    factories and to every call on the managers and pools they build.
    """

    name: str
    target: str  # what the user wrote, e.g. "reference" or "pkg.mod:factory"
    module: ModuleType
    info: ImplInfo
    factory: Callable[[KVCacheSpec], object] | None
    pool_factory: Callable[[KVCacheSpec], object] | None
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT
    factory_name: str = "make_kv_cache_manager"
    indexer_factory: Callable[[IndexerConfig], object] | None = None
    offload_factory: Callable[[OffloadSpec], object] | None = None
    limit: CallLimit = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", CallLimit(self.call_timeout, self.name))

    def has(self, capability: str) -> bool:
        return capability in self.info.capabilities

    def close(self) -> None:
        """End what the implementation keeps running between tests: the module's optional
        ``kvcheck_close()`` (an ``exec:`` engine's process; an adapter's own helper processes
        or threads), called by the plugin once at the end of the session, before it looks for
        leftover processes. Errors in it are not the session's: they are ignored."""
        close = getattr(self.module, "kvcheck_close", None)
        if callable(close):
            with contextlib.suppress(Exception):  # the session is over either way
                close()

    def make_manager(self, spec: KVCacheSpec, *,
                     guard: bool = True) -> ManagerWithCapabilities:
        """A fresh manager for ``spec``, built under the call limit and (``guard``) wrapped in
        a ``GuardedManager``. ``guard=False`` returns the adapter's own object (benchmarks),
        still built under the limit. The factory gets a private copy of ``spec``, compared
        with it after the factory and (guarded) after every call
        (``kvcheck.conformance.spec_seal``).

        Raises:
            UnsupportedSpec: the factory declines ``spec``.
            AdapterTimeout: the factory did not return within the limit.
            AdapterRaised: the factory raised a BaseException of its own.
            SpecMutated: the factory wrote to the spec it was given.
        """
        if self.factory is None:
            raise KVCheckInputError(f"{self.name} declares no manager capability")
        given = private_copy(spec)
        note_spec(spec)  # the block sizes the running test used (its record)
        raw = self.limit.call(self.factory_name, self.factory, given)
        check_unchanged(self.name, self.factory_name, (spec,), spec, given)
        if not guard:
            # load_impl checked that it has the methods of the declared capabilities.
            return cast(ManagerWithCapabilities, raw)
        manager = GuardedManager(raw, impl=self.name, spec=spec,
                                 reserved=reserved_block_ids(self.info, spec.profile),
                                 limit=SpecWatch(self.limit, spec, given))
        if "pinning_lookup" in self.info.capabilities:
            manager.follow_pins()  # its lookups pin their hits (kvcheck.conformance.pinning)
        return manager

    def make_indexer(self, config: IndexerConfig) -> GuardedIndexer:
        """A fresh indexer for ``config`` (capability ``indexer``), built under the call
        limit and wrapped in a ``GuardedIndexer`` (``kvcheck.conformance.indexer_guard``).

        Raises:
            KVCheckInputError: the implementation declares no ``indexer``.
            AdapterTimeout, AdapterRaised: as for ``make_manager``.
        """
        if self.indexer_factory is None:
            raise KVCheckInputError(f"{self.name} declares no indexer capability")
        raw = self.limit.call(INDEXER_FACTORY, self.indexer_factory, config)
        return GuardedIndexer(raw, impl=self.name, config=config, limit=self.limit,
                              decoded="decoded_events" in self.info.capabilities)

    def make_offloading_manager(self, spec: OffloadSpec, *,
                                guard: bool = True) -> GuardedOffloadingManager:
        """A fresh offload tier for ``spec`` (capability ``offload``), built under the call
        limit and wrapped in a ``GuardedOffloadingManager``
        (``kvcheck.conformance.offload_guard``); ``guard=False`` wraps it without answer
        checks being needed by the caller (benchmarks call ``.raw``).

        Raises:
            KVCheckInputError: the implementation declares no ``offload``.
            UnsupportedSpec: the factory declines ``spec``.
            AdapterTimeout, AdapterRaised: as for ``make_manager``.
        """
        if self.offload_factory is None:
            raise KVCheckInputError(f"{self.name} declares no offload capability")
        raw = self.limit.call(OFFLOAD_FACTORY, self.offload_factory, spec)
        return GuardedOffloadingManager(raw, impl=self.name, spec=spec, limit=self.limit)

    def make_block_pool(self, spec: KVCacheSpec, *, guard: bool = True) -> BlockPoolAdapter:
        """A fresh block pool for ``spec`` (see ``make_manager``)."""
        if self.pool_factory is None:
            raise KVCheckInputError(f"{self.name} declares no block_pool capability")
        given = private_copy(spec)
        note_spec(spec)
        raw = self.limit.call("make_block_pool", self.pool_factory, given)
        check_unchanged(self.name, "make_block_pool", (spec,), spec, given)
        if not guard:
            return cast(BlockPoolAdapter, raw)  # its methods were checked by load_impl
        return GuardedBlockPool(raw, impl=self.name, spec=spec,
                                reserved=reserved_block_ids(self.info, spec.profile),
                                limit=SpecWatch(self.limit, spec, given))


def _usage(target: str, problem: str, fix: str) -> ImplLoadError:
    return ImplLoadError(f"kvcheck: --kv-impl={target}: {problem}\n  Fix: {fix}")


def _bad_chars(text: str, categories: frozenset[str]) -> list[str]:
    return sorted({f"U+{ord(c):04X} ({unicodedata.category(c)})" for c in text
                   if unicodedata.category(c) in categories})


def _check_text_fields(target: str, info: ImplInfo) -> None:
    name = info.name
    if not isinstance(name, str) or not name:
        raise _usage(target, f"IMPL_INFO.name is {name!r}; it must be a non-empty str",
                     "give the implementation a short printable name, e.g. name='mykv'")
    bad = _bad_chars(name, _BAD_NAME_CATEGORIES)
    if bad or len(name) > _NAME_MAX:
        problem = (f"contains characters unfit for test ids and reports: {', '.join(bad)}"
                   if bad else f"is {len(name)} characters long (at most {_NAME_MAX})")
        raise _usage(target, f"IMPL_INFO.name {name!r} {problem}",
                     "use printable characters without spaces, e.g. name='mykv-1.2' (control "
                     "and bidi-override characters would garble test ids, the terminal and "
                     "the HTML leaderboard)")
    version = info.version
    if not isinstance(version, str):
        raise _usage(target, f"IMPL_INFO.version is a {type(version).__name__}, not a str",
                     "give the version as a string, e.g. version='1.4.0'")
    bad = _bad_chars(version, _BAD_TEXT_CATEGORIES)
    if bad:
        raise _usage(target, f"IMPL_INFO.version {version!r} contains control or format "
                     f"characters: {', '.join(bad)}", "use printable characters only")
    if info.commit is not None and (not isinstance(info.commit, str)
                                    or _bad_chars(info.commit, _BAD_NAME_CATEGORIES)):
        raise _usage(target, f"IMPL_INFO.commit {info.commit!r} is not a printable str",
                     "give the source revision as a string (e.g. a git sha) or None")


# Any: an IMPL_INFO field as the module wrote it; list() / tuple() tell whether it is a
# collection (TypeError: it is not), as the messages say.
def _str_collection(target: str, field_name: str, value: Any, example: str) -> list[str]:
    """A field that must be a collection of names: refuse a str (its letters would be taken
    as names) and anything not iterable."""
    if isinstance(value, (str, bytes)):
        raise _usage(target, f"IMPL_INFO.{field_name} is a {type(value).__name__} "
                     f"({value!r}), not a collection of names", f"write {field_name}={example}")
    try:
        items = list(value)
    except TypeError:
        raise _usage(target, f"IMPL_INFO.{field_name} is a {type(value).__name__}, not a "
                     "collection of names", f"write {field_name}={example}") from None
    odd = [v for v in items if not isinstance(v, str)]
    if odd:
        raise _usage(target, f"IMPL_INFO.{field_name} holds non-string entries {odd!r}",
                     f"write {field_name}={example}")
    return cast("list[str]", items)  # every entry checked just above


def _int_tuple(target: str, field_name: str, value: Any, *, low: int, fix: str,  # Any: as above
               pair: bool = False) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        items = tuple(value)
    except TypeError:
        raise _usage(target, f"IMPL_INFO.{field_name} is a {type(value).__name__}, not a "
                     "tuple of int", fix) from None
    bad = [v for v in items if type(v) is not int or v < low]
    if bad or isinstance(value, (str, bytes, dict)):
        raise _usage(target, f"IMPL_INFO.{field_name}={value!r}: entries must be ints >= {low} "
                     "(not bool, str or float)", fix)
    if pair and (len(items) != 2 or items[0] > items[1]):
        raise _usage(target, f"IMPL_INFO.{field_name}={value!r} is not a (min, max) pair with "
                     "min <= max", fix)
    if not pair and ((not items and field_name == "block_sizes") or len(set(items)) != len(items)):
        raise _usage(target, f"IMPL_INFO.{field_name}={value!r} is empty or lists a value "
                     "twice", fix)
    return items


def _impl_info(target: str, module: ModuleType) -> ImplInfo:
    raw = getattr(module, "IMPL_INFO", None)
    if raw is None:
        return_fix = (
            f"define IMPL_INFO = ImplInfo(name=..., version=..., capabilities=frozenset({{...}}))"
            f" in {module.__name__} (from kvcheck.conformance.protocol import ImplInfo)"
        )
        raise _usage(target, f"module {module.__name__!r} has no IMPL_INFO", return_fix)
    if isinstance(raw, dict):
        known = {f.name for f in fields(ImplInfo)}
        unknown = sorted(set(map(str, raw)) - known)
        if unknown:
            raise _usage(target, f"IMPL_INFO has unknown fields {unknown}",
                         f"use only {sorted(known)}")
        try:
            raw = ImplInfo(**raw)
        except TypeError as exc:
            raise _usage(target, f"IMPL_INFO is incomplete ({exc})",
                         "give at least name and version") from None
    if not isinstance(raw, ImplInfo):
        raise _usage(target, f"IMPL_INFO is a {type(raw).__name__}, not an ImplInfo or dict",
                     "build it with kvcheck.conformance.protocol.ImplInfo(...)")
    _check_text_fields(target, raw)
    caps = _str_collection(target, "capabilities", raw.capabilities,
                           "frozenset({'manager', 'prefix_caching', ...})")
    unknown_caps = sorted(set(caps) - set(CAPABILITIES))
    if unknown_caps:
        raise _usage(target, f"IMPL_INFO declares unknown capabilities {unknown_caps}",
                     f"use names from {sorted(CAPABILITIES)}")
    _check_capability_needs(target, set(caps))
    algos = _str_collection(target, "hash_algos", raw.hash_algos, "('sha256',)")
    unknown_algos = sorted(set(algos) - set(HASH_ALGOS))
    if unknown_algos:
        raise _usage(target, f"IMPL_INFO.hash_algos names unknown algorithms {unknown_algos}",
                     f"use names from {list(HASH_ALGOS)}, or () for a design with its own "
                     "hashing")
    if not isinstance(raw.profile, str) or raw.profile not in PROFILES:
        raise _usage(target, f"IMPL_INFO claims unknown profile {raw.profile!r}",
                     f"use one of {list(PROFILES)}")
    reserved = _int_tuple(target, "reserved_block_ids", raw.reserved_block_ids, low=0,
                          fix="give the reserved block ids as a tuple of ints >= 0, e.g. "
                              "(0,), or () for none, or None for the profile's default")
    sizes = _int_tuple(target, "block_sizes", raw.block_sizes, low=1,
                       fix="give the supported block sizes as a tuple of ints >= 1, e.g. "
                           "(16, 32), or None for any")
    blocks_range = _int_tuple(target, "num_blocks_range", raw.num_blocks_range, low=0,
                              pair=True, fix="give (min, max) pool sizes in blocks, "
                                             "0 <= min <= max, e.g. (2, 100000), or None")
    _check_ref_cnt_convention(target, raw.ref_cnt_counts_cache, set(caps))
    return replace(raw, capabilities=frozenset(caps), hash_algos=tuple(algos),
                   reserved_block_ids=reserved, block_sizes=sizes,
                   num_blocks_range=None if blocks_range is None else (
                       blocks_range[0], blocks_range[1]))  # a checked (min, max) pair


def _check_ref_cnt_convention(target: str, value: object, caps: set[str]) -> None:
    """``ImplInfo.ref_cnt_counts_cache``: a bool, and True only with ``ref_counts`` (the
    only thing it changes is how ``ref_cnt`` is judged)."""
    if type(value) is not bool:
        raise _usage(target, f"IMPL_INFO.ref_cnt_counts_cache={value!r} is a "
                     f"{type(value).__name__}, not a bool",
                     "write ref_cnt_counts_cache=True if ref_cnt(block_id) counts the prefix "
                     "cache's own reference (a cached block nobody holds has ref_cnt 1), else "
                     "False (vLLM's convention, the default)")
    if value and "ref_counts" not in caps:
        raise _usage(target, "IMPL_INFO.ref_cnt_counts_cache=True without the 'ref_counts' "
                     "capability: it only says how ref_cnt counts, and nothing calls ref_cnt",
                     "declare 'ref_counts' (manager.ref_cnt) as well, or drop "
                     "ref_cnt_counts_cache")


#: Capability -> the capability without which its tests can never run (they are marked with
#: both, or drive a manager): declaring it alone would look tested and never be.
_CAPABILITY_NEEDS: dict[str, tuple[str, ...]] = {
    "sliding_window": ("kv_cache_groups",),
    "chunked_local_attention": ("kv_cache_groups",),
    "cross_attention": ("kv_cache_groups",),
    "mamba": ("kv_cache_groups",),
    "fine_grained_hits": ("mamba",),
    "mamba_checkpoints": ("mamba",),
    "boundary_state_offloads": ("mamba",),
    "mamba_shared_prefix_checkpoint": ("mamba",),
    "dcp": ("kv_cache_groups",),
    "mamba_dcp": ("mamba", "dcp"),
    "prefix_match_unit": ("kv_cache_groups",),
    "eagle": ("manager",),
    "eagle_groups": ("eagle",),
    "hash_lookahead": ("manager",),
    "block_zeroing": ("manager",),
    "prefill_lookahead": ("manager",),
    "kv_cache_groups": ("manager", "indexer"),
    "pinning_lookup": ("manager",),
    "replay": ("indexer",),
    "decoded_events": ("indexer",),
    "int_hashes": ("indexer",),
    "bytes_hashes": ("indexer",)}


def _check_capability_needs(target: str, caps: set[str]) -> None:
    for cap, needed in _CAPABILITY_NEEDS.items():
        if cap in caps and caps.isdisjoint(needed):
            need = " or ".join(repr(n) for n in needed)
            raise _usage(target, f"IMPL_INFO declares {cap!r} without {need}, so no test "
                         f"of {cap!r} would ever run (each needs {need} too)",
                         f"declare {need} as well, or drop {cap!r}")
    if "indexer" in caps and caps.isdisjoint({"int_hashes", "bytes_hashes"}):
        raise _usage(target, "IMPL_INFO declares 'indexer' but neither 'int_hashes' nor "
                     "'bytes_hashes': no hash form to feed it",
                     "declare the forms the index reads: 'int_hashes' (vLLM's default 64-bit "
                     "integers) and/or 'bytes_hashes' (digests)")


#: What each factory takes and builds (for the fix of a malformed factory).
_FACTORY_SIGNATURES: dict[str, tuple[str, str]] = {
    INDEXER_FACTORY: ("config: IndexerConfig", "index"),
    OFFLOAD_FACTORY: ("spec: OffloadSpec", "tier"),
}


def _check_factory(target: str, name: str, factory: object) -> None:
    arg, built = _FACTORY_SIGNATURES.get(name, ("spec: KVCacheSpec", "manager"))
    if not callable(factory):
        raise _usage(target, f"{name} is not callable", f"define def {name}({arg}) -> {built}")
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # builtins / C extensions: trust them
    try:
        sig.bind(_PROBE_SPEC)
    except TypeError:
        raise _usage(target, f"{name}{sig} cannot be called as {name}({arg.partition(':')[0]})",
                     f"make it take exactly one argument: def {name}({arg})") from None


def _check_methods(target: str, obj: object, what: str, names: tuple[str, ...],
                   cap: str) -> None:
    """A capability's methods: every one of ``names`` must be callable on ``obj`` (the
    probe manager or block pool, named by ``what``)."""
    _require_callables(target, obj, names, lambda missing: (
        f"capability {cap!r} is declared but the {what} ({type(obj).__name__}) lacks {missing}",
        f"implement {missing} or remove {cap!r} from IMPL_INFO.capabilities"))


def _check_module_functions(target: str, module: ModuleType, names: tuple[str, ...],
                            cap: str, protocol: str) -> None:
    """A module-level capability: every function of ``names`` must be a module attribute
    (a callable), not a manager method."""
    _require_callables(target, module, names, lambda missing: (
        (f"capability {cap!r} is declared but module {module.__name__!r} lacks the "
         f"module-level function(s) {missing}"),
        (f"define {missing} at module level in {module.__name__} (see {protocol}), or "
         f"remove {cap!r} from IMPL_INFO.capabilities")))


def _require_callables(target: str, obj: object, names: tuple[str, ...],
                       usage: Callable[[str], tuple[str, str]]) -> None:
    """Raises the usage error ``usage(missing)`` (its problem and its fix, given the missing
    names joined by commas) unless every one of ``names`` is a callable attribute of ``obj``."""
    missing = ", ".join(n for n in names if not callable(getattr(obj, n, None)))
    if missing:
        raise _usage(target, *usage(missing))


def _parse_target(target: str) -> tuple[str, str]:
    """``(module, factory)`` of one --kv-impl entry (aliases resolved)."""
    module_name, colon, factory_name = target.partition(":")
    module_name = ALIASES.get(module_name.strip(), module_name.strip())
    factory_name = factory_name.strip()
    if not module_name:
        raise _usage(target, "empty module name", "pass --kv-impl=package.module")
    if colon and not factory_name:
        raise _usage(target, "empty factory name after ':'",
                     f"name the factory (--kv-impl={module_name}:make_my_manager) or drop the "
                     f"':' to use make_kv_cache_manager")
    if colon and not factory_name.isidentifier():
        raise _usage(target, f"factory name {factory_name!r} is not a Python identifier",
                     f"pass --kv-impl={module_name}:FACTORY with FACTORY a function name")
    return module_name, factory_name or "make_kv_cache_manager"


def _import(target: str, module_name: str, search: Sequence[Path]) -> ModuleType:
    """Import ``module_name``; a top-level module or package that is not on ``sys.path`` but
    sits in one of the ``search`` folders (the current folder, pytest's rootdir) is found
    there, as pytest's ``pythonpath`` setting would find it: that folder joins ``sys.path``.
    """
    top = module_name.partition(".")[0]
    searched = [Path(d).resolve() for d in search]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != top and not module_name.startswith(f"{exc.name}."):
            # The module exists but something it imports does not.
            raise _usage(target, f"importing {module_name!r} failed: {exc}",
                         f"install {exc.name!r} in this environment (a dependency of "
                         f"{module_name!r})") from None
        for folder in searched:
            if (folder / f"{top}.py").is_file() or (folder / top).is_dir():
                if str(folder) not in sys.path:
                    sys.path.insert(0, str(folder))
                importlib.invalidate_caches()
                return _import(target, module_name, ())
        where = ", ".join(str(f) for f in searched) or "nowhere else"
        raise _usage(
            target,
            f"cannot import {module_name!r} ({type(exc).__name__}: {exc}); searched "
            f"sys.path and {where}",
            "check the dotted module path; a module in another folder needs that folder on "
            "PYTHONPATH (or `pythonpath = FOLDER` in pytest.ini), a package must be installed "
            "in this environment",
        ) from None
    except ImportError as exc:
        raise _usage(target, f"cannot import {module_name!r} ({type(exc).__name__}: {exc})",
                     "fix the import in that module, or install what it needs") from None
    except BaseException as exc:  # the module itself crashed at import time
        if not isinstance(exc, Exception) and not is_adapters_doing(exc):
            raise  # the user's Ctrl-C
        kind = "" if isinstance(exc, Exception) else " (a BaseException, not an Exception)"
        raise _usage(target, f"importing {module_name!r} raised {type(exc).__name__}{kind}: "
                     f"{exc}", "fix the error in that module's import-time code") from None


def load_impl(target: str, *, call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
              search: Sequence[Path | str] = (".",)) -> ImplHandle:
    """Import and check one ``--kv-impl`` value (``module``, ``module:factory`` or an alias).

    Args:
        call_timeout: per-call limit in seconds for the factories (the load-time probe
            included) and every adapter call (0 or None: none); stored on the handle.
        search: folders where a module that is not on ``sys.path`` is also looked for (the
            current folder by default; the plugin adds pytest's rootdir).

    Raises:
        ImplLoadError: with the problem and the fix, for every contract violation.
    """
    target = target.strip()
    if target.startswith(EXEC_PREFIX):
        module_name, factory_name = target, "make_kv_cache_manager"
        module = _exec_module(target, call_timeout)
    else:
        module_name, factory_name = _parse_target(target)
        module = _import(target, module_name, [Path(s) for s in search])
    info = _impl_info(target, module)
    if not info.capabilities & {"manager", "block_pool", "indexer", "offload"}:
        raise _usage(target, "IMPL_INFO declares none of 'manager', 'block_pool', 'indexer' "
                     "and 'offload'",
                     "declare 'manager' (make_kv_cache_manager) and/or 'block_pool' "
                     "(make_block_pool), 'indexer' (make_indexer) for a router's prefix "
                     "index, or 'offload' (make_offloading_manager) for a KV offload tier: "
                     "the suite needs something to drive")
    limit = CallLimit(call_timeout, info.name)
    factory = getattr(module, factory_name, None)
    if "manager" in info.capabilities:
        if factory is None:
            raise _usage(target, f"module {module_name!r} has no factory {factory_name!r}",
                         f"define def {factory_name}(spec: KVCacheSpec) in {module_name}, or "
                         "name yours with --kv-impl=module:factory")
        _check_factory(target, factory_name, factory)
        probe = _probe(target, factory_name, factory, info, limit)
        # Under a vLLM profile the design capabilities are implied, so their methods too.
        caps = effective_capabilities(info, info.profile)
        for cap, methods in CAPABILITY_METHODS.items():
            if cap in caps and cap not in (_POOL_CAPABILITY, _MODULE_CAPABILITY,
                                           _SIZING_CAPABILITY):
                _check_methods(target, probe, "manager", methods, cap)
        if "mamba" in caps and info.profile == "vllm-0.33":
            # vLLM 0.33's Mamba "align" groups refuse a hit on a block cached in the same
            # scheduler step: the suite marks the steps with this call.
            _require_callables(target, probe, ("new_step_starts",), lambda missing: (
                (f"capability 'mamba' is declared under profile vllm-0.33 but the manager "
                 f"({type(probe).__name__}) lacks {missing}() (SupportsNewStep: vLLM 0.33's "
                 "scheduler calls it at the start of every step)"),
                (f"implement {missing}(self) -> None (a no-op if your design keeps no "
                 "per-step state) or remove 'mamba' from IMPL_INFO.capabilities")))
        if "fine_grained_hits" in caps and info.profile == "vllm-0.33":
            # The copy-on-write copies and their retained blocks: the suite drains them where
            # vLLM 0.33's schedule() does (kvcheck.conformance.fine_grained).
            _require_callables(target, probe, ("take_kv_cache_block_copies",), lambda missing: (
                (f"capability 'fine_grained_hits' is declared under profile vllm-0.33 but the "
                 f"manager ({type(probe).__name__}) lacks {missing}() (SupportsBlockCopies: "
                 "vLLM 0.33's scheduler drains the copy-on-write copies at the end of every "
                 "schedule() and frees the blocks they retained)"),
                (f"implement {missing}(self) -> list[tuple[int, int]] (the (src, dst) copies "
                 "made since the last call, their retained blocks released) or remove "
                 "'fine_grained_hits' from IMPL_INFO.capabilities")))
        if "boundary_state_offloads" in caps and info.profile == "vllm-0.33":
            # The driver drains the hand-offs where vLLM 0.33's schedule() does and asks a
            # finishing request's partial tail (kvcheck.conformance.boundary_offloads).
            _require_callables(target, probe, ("take_boundary_state_offloads",
                                               "finalize_partial_tail_offloads"),
                               lambda missing: (
                (f"capability 'boundary_state_offloads' is declared under profile vllm-0.33 "
                 f"but the manager ({type(probe).__name__}) lacks {missing}() "
                 "(SupportsBoundaryStateOffloads: vLLM 0.33's scheduler drains the Mamba "
                 "'align' boundary-state hand-offs for a KV connector in every schedule())"),
                (f"implement {missing} (take_boundary_state_offloads(self) -> dict[str, "
                 "list[tuple[int, int, int]]], finalize_partial_tail_offloads(self, request) "
                 "-> list[tuple[int, int, int]]) or remove 'boundary_state_offloads' from "
                 "IMPL_INFO.capabilities")))
    pool_factory = getattr(module, "make_block_pool", None)
    if "block_pool" in info.capabilities:
        if pool_factory is None:
            raise _usage(target, "capability 'block_pool' is declared but the module has no "
                         "make_block_pool", "define make_block_pool(spec) or drop 'block_pool'")
        _check_factory(target, "make_block_pool", pool_factory)
        pool_probe = _probe(target, "make_block_pool", pool_factory, info, limit)
        _check_methods(target, pool_probe, "block pool", CAPABILITY_METHODS[_POOL_CAPABILITY],
                       _POOL_CAPABILITY)
    if "kernels" in info.capabilities and not callable(getattr(module, "kernels", None)):
        raise _usage(target, "capability 'kernels' is declared but the module has no kernels()",
                     "define kernels() returning a KernelSet, or drop 'kernels'")
    if _SIZING_CAPABILITY in info.capabilities:
        _check_module_functions(target, module, SIZING_FUNCTIONS, _SIZING_CAPABILITY,
                                "kvcheck.conformance.sizing_protocol.SupportsSizing")
    indexer_factory = _indexer_factory(target, module, info, limit)
    offload_factory = _offload_factory(target, module, info, limit)
    return ImplHandle(
        info.name, target, module, info,
        factory if "manager" in info.capabilities else None,
        pool_factory if "block_pool" in info.capabilities else None,
        call_timeout=call_timeout, factory_name=factory_name,
        indexer_factory=indexer_factory, offload_factory=offload_factory,
    )


def _exec_module(target: str, call_timeout: float | None) -> ModuleType:
    """The module of an ``exec:COMMAND`` target: the engine started, ``init`` answered within
    the call limit (``kvcheck.wire.client.exec_module``); any failure is a usage error."""
    client = importlib.import_module(_WIRE_CLIENT)
    try:
        return cast(ModuleType, CallLimit(call_timeout, target).call(
            "init", client.exec_module, target))
    except AdapterTimeout as exc:
        raise _usage(target, f"the engine did not answer init: {exc}",
                     "answer the init request promptly (docs/wire-protocol.md, Lifecycle), or "
                     "raise --kv-timeout") from None
    except (KVCheckInputError, AssertionError, AdapterRaised) as exc:
        raise _usage(target, str(exc), "make the engine answer init as docs/wire-protocol.md "
                     "says (run the command by hand and type an init line to see what it "
                     "does)") from None


def _indexer_factory(target: str, module: ModuleType, info: ImplInfo,
                     limit: CallLimit) -> Callable[[IndexerConfig], object] | None:
    """Capability ``indexer``: ``make_indexer`` checked, and the methods of a probe index."""
    if "indexer" not in info.capabilities:
        return None
    factory = getattr(module, INDEXER_FACTORY, None)
    if factory is None:
        raise _usage(target, f"capability 'indexer' is declared but the module has no "
                     f"{INDEXER_FACTORY}",
                     f"define def {INDEXER_FACTORY}(config: IndexerConfig) returning the index "
                     "(kvcheck.conformance.indexer_protocol), or drop 'indexer'")
    _check_factory(target, INDEXER_FACTORY, factory)
    size = (info.block_sizes or (4,))[0]
    config = IndexerConfig(block_size=size, release="vllm-0.10" if info.profile == "vllm-0.10"
                           else "vllm-0.33",
                           hash_form="int" if "int_hashes" in info.capabilities else "bytes",
                           hash_algo=(info.hash_algos or ("sha256",))[0])
    try:
        probe = limit.call(INDEXER_FACTORY, factory, config)
    except (AdapterTimeout, AdapterRaised) as exc:
        raise _usage(target, f"{exc}", f"{INDEXER_FACTORY} must return an index promptly for "
                     "a small config") from None
    except Exception as exc:  # noqa: BLE001 - any crash of the factory: a usage error
        raise _usage(target, f"{INDEXER_FACTORY}({config}) raised {type(exc).__name__}: {exc}",
                     f"{INDEXER_FACTORY} must build an index for any config it supports"
                     ) from None
    protocols: list[type] = [IndexerAdapter, SupportsDecodedEvents if "decoded_events" in
                             info.capabilities else SupportsWireBatches]
    for proto in protocols:
        _check_methods(target, probe, "indexer", protocol_methods(proto),
                       "decoded_events" if proto is SupportsDecodedEvents else "indexer")
    return cast("Callable[[IndexerConfig], object]", factory)


def _offload_factory(target: str, module: ModuleType, info: ImplInfo,
                     limit: CallLimit) -> Callable[[OffloadSpec], object] | None:
    """Capability ``offload``: ``make_offloading_manager`` checked, and the methods of a probe
    tier (LRU, 8 chunks; or ARC if LRU is declined)."""
    if "offload" not in info.capabilities:
        return None
    factory = getattr(module, OFFLOAD_FACTORY, None)
    if factory is None:
        raise _usage(target, f"capability 'offload' is declared but the module has no "
                     f"{OFFLOAD_FACTORY}",
                     f"define def {OFFLOAD_FACTORY}(spec: OffloadSpec) returning the tier "
                     "(kvcheck.conformance.offload_protocol), or drop 'offload'")
    _check_factory(target, OFFLOAD_FACTORY, factory)
    probe: object = None
    declined = []
    policies: tuple[Literal["lru", "arc"], ...] = ("lru", "arc")
    for policy in policies:
        spec = OffloadSpec(num_chunks=8, cache_policy=policy)
        try:
            probe = limit.call(OFFLOAD_FACTORY, factory, spec)
        except UnsupportedSpec as exc:
            declined.append(f"{policy}: {exc}")
            continue
        except (AdapterTimeout, AdapterRaised) as exc:
            raise _usage(target, f"{exc}", f"{OFFLOAD_FACTORY} must return a tier promptly for "
                         "a small spec") from None
        except Exception as exc:  # noqa: BLE001 - any crash of the factory: a usage error
            raise _usage(target, f"{OFFLOAD_FACTORY}({spec}) raised {type(exc).__name__}: "
                         f"{exc}", f"{OFFLOAD_FACTORY} must build a tier for any spec it "
                         "supports (raise UnsupportedSpec for the others)") from None
        if probe is None:
            raise _usage(target, f"{OFFLOAD_FACTORY}({spec}) returned None",
                         "return the tier (an object with the methods of kvcheck.conformance."
                         "offload_protocol.OffloadingManagerAdapter), or raise UnsupportedSpec "
                         "for a spec it does not support")
        break
    if probe is None:
        raise _usage(target, f"{OFFLOAD_FACTORY} declined both policies: {'; '.join(declined)}",
                     "support at least one of cache_policy 'lru' and 'arc', or drop 'offload'")
    _check_methods(target, probe, "offload tier", protocol_methods(OffloadingManagerAdapter),
                   "offload")
    return cast("Callable[[OffloadSpec], object]", factory)


def _probe_specs(info: ImplInfo) -> list[KVCacheSpec]:
    """Small specs the ImplInfo says it supports (the default probe spec first)."""
    sizes = [4] if info.block_sizes is None or 4 in info.block_sizes else []
    sizes += sorted(s for s in (info.block_sizes or ()) if s != 4)
    low, high = info.num_blocks_range or (0, 1 << 62)
    counts = [n for n in _PROBE_NUM_BLOCKS if low <= n <= high] or [max(low, 1)]
    profile = info.profile
    return [KVCacheSpec(num_blocks=n, block_size=s, profile=profile)
            for s in sizes[:3] for n in counts[:3]]


def _probe(target: str, name: str, factory: Callable[[KVCacheSpec], object], info: ImplInfo,
           limit: CallLimit) -> object:
    """Build one small instance (under the call limit), to check that declared capabilities'
    methods exist. A spec the factory declines (``UnsupportedSpec``) is followed by the next
    supported one; declining them all is a usage error."""
    declined: list[str] = []
    for spec in _probe_specs(info):
        try:
            given = private_copy(spec)
            probe = limit.call(name, factory, given)
            check_unchanged(info.name, name, (spec,), spec, given)
            return probe
        except UnsupportedSpec as exc:
            declined.append(f"num_blocks={spec.num_blocks}, block_size={spec.block_size}"
                            f" ({exc})")
        except AdapterTimeout as exc:
            raise _usage(target, f"{exc}",
                         "the factory must return promptly for a small spec; fix the hang or "
                         "raise --kv-timeout (0 = no limit)") from None
        except (AdapterRaised, SpecMutated) as exc:
            raise _usage(target, f"{exc}", "the factory must build an instance for any small "
                         "spec it supports and return it") from None
        except Exception as exc:  # noqa: BLE001 - any crash of the factory: a usage error
            raise _usage(target, f"{name}({spec}) raised {type(exc).__name__}: {exc}",
                         "the factory must build an instance for any small spec it "
                         "supports") from None
    raise _usage(target, f"{name} declined every probe spec it claims to support with "
                 f"UnsupportedSpec: {'; '.join(declined)}",
                 "declare the sizes it supports in IMPL_INFO (block_sizes, num_blocks_range) "
                 "so they match what the factory accepts")


def load_impls(value: str, *, call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
               search: Sequence[Path | str] = (".",)) -> list[ImplHandle]:
    """Load a comma list; names must be unique (they become test ids). Call it only when an
    implementation was asked for: an empty value or an empty entry (``""``, ``","``,
    ``"a,,b"``) is a usage error.

    Raises:
        ImplLoadError: naming the problem and the fix.
    """
    parts = value.split(",")
    if not value.strip() or any(not p.strip() for p in parts):
        what = "is empty" if not value.replace(",", "").strip() else "has an empty entry"
        raise ImplLoadError(
            f"kvcheck: --kv-impl={value}: the implementation list {what}\n"
            "  Fix: pass --kv-impl=package.module (or reference), a comma list without empty "
            "entries, or leave the option out to run without an implementation")
    handles = [load_impl(part, call_timeout=call_timeout, search=search) for part in parts]
    names = [h.name for h in handles]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ImplLoadError(
            f"kvcheck: --kv-impl={value}: implementations share the name(s) {dup}\n"
            "  Fix: give each IMPL_INFO a distinct name (it is the test-id suffix)"
        )
    return handles


def load_indexers(value: str, *, call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
                  search: Sequence[Path | str] = (".",)) -> list[ImplHandle]:
    """``--kv-indexer``: a comma list of indexer modules (``reference``: kvcheck's reference
    indexer), each loaded as ``load_impl`` does and required to declare ``indexer``.

    Raises:
        ImplLoadError: naming ``--kv-indexer``, the problem and the fix.
    """
    parts = value.split(",")
    if not value.strip() or any(not p.strip() for p in parts):
        raise ImplLoadError(
            f"kvcheck: --kv-indexer={value}: the indexer list is empty or has an empty entry\n"
            "  Fix: pass --kv-indexer=package.module (or reference), a comma list without "
            "empty entries")
    handles = []
    for part in parts:
        target = INDEXER_ALIASES.get(part.strip(), part.strip())
        try:
            handle = load_impl(target, call_timeout=call_timeout, search=search)
        except ImplLoadError as exc:
            raise ImplLoadError(str(exc).replace(f"--kv-impl={target}",
                                                 f"--kv-indexer={part.strip()}", 1)) from None
        if "indexer" not in handle.info.capabilities:
            raise ImplLoadError(
                f"kvcheck: --kv-indexer={part.strip()}: IMPL_INFO does not declare 'indexer' "
                f"(it declares {sorted(handle.info.capabilities)})\n"
                "  Fix: pass a router index module (make_indexer, capability 'indexer'; "
                "docs/indexers.md) to --kv-indexer, and managers to --kv-impl")
        handles.append(handle)
    return handles
