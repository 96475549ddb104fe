"""The suite side of kvcheck's pytest plugin: loading the implementations, the report header,
parametrizing ``kv_impl``, gating the suite's tests, and the fixtures users and the suite use.

Imported (and registered as a plugin) by the entry module ``kvcheck.plugin.plugin`` from its
``pytest_configure``, not when pytest loads its plugins: by then pytest-cov has started
measuring, so ``--cov=kvcheck`` sees this module and everything it imports.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kvcheck.conformance.call_floor import apply_floor, oracle_timeout
from kvcheck.conformance.call_limit import set_last_resort
from kvcheck.conformance.interrupts import watch_user_interrupts
from kvcheck.conformance.loader import (
    DEFAULT_CALL_TIMEOUT,
    ImplHandle,
    ImplLoadError,
    load_impl,
    load_impls,
    load_indexers,
)
from kvcheck.conformance.protocol import (
    KVCacheSpec,
    UnsupportedSpec,
    effective_capabilities,
)
from kvcheck.conformance.sizes import BLOCK_SIZES_PROPERTY, DeclaredSizes, recording_block_sizes
from kvcheck.plugin.completeness import SuiteInventory, is_suite_path, suite_key
from kvcheck.plugin.coverage import collection_properties
from kvcheck.plugin.option_bounds import check_max_examples, check_seed, check_timeout_bound
from kvcheck.plugin.outcomes import area_of
from kvcheck.plugin.outputs import claim_session_output
from kvcheck.plugin.resources import configure_resources
from kvcheck.plugin.selection import ID_FILE_OPTIONS, apply_id_file, read_id_file
from kvcheck.plugin.state import KV_STATE, KVSessionState, register

if TYPE_CHECKING:
    from hypothesis import settings as HypothesisSettings

    from kvcheck.conformance.differential import Pair

__all__ = ["configure"]

_NO_IMPL_REASON = (
    "no implementation selected: pass --kv-impl=MODULE (or set KV_IMPL) to run the kvcheck "
    "conformance suite"
)


def configure(config: pytest.Config) -> None:
    """The plugin's ``pytest_configure``: check every option and load the implementations
    (``UsageError`` on any problem), then register the session state and this module's hooks
    and fixtures."""
    config.addinivalue_line(
        "markers", "kv_capability(*names): needs these IMPL_INFO capabilities, else skipped")
    config.addinivalue_line(
        "markers", "kv_generic: a profile-independent law, also checked under --kv-profile=generic")
    config.addinivalue_line(
        "markers", "kv_profiles(*names): only meaningful under these profiles")
    # Every option is checked before anything runs: a bad value never costs a whole run.
    option_value = config.getoption("kv_impl")
    value = option_value if option_value is not None else os.environ.get("KV_IMPL", "")
    # Numeric options within bounds that fit the machine (kvcheck.plugin.option_bounds).
    max_examples = check_max_examples(config.getoption("kv_max_examples"))
    check_seed(config.getoption("kv_seed"))
    # Read now, in the xdist controller too: read at collection, in the workers, an unreadable
    # file crashed them and the controller printed an INTERNALERROR instead of the problem.
    config.stash[_ID_FILES] = {flag: read_id_file(path, flag)
                               for flag, dest in ID_FILE_OPTIONS.items()
                               if (path := config.getoption(dest))}
    timeout = _call_timeout(config)
    # --kv-max-memory, and forks, threads and children watched from before the first call.
    resources = configure_resources(config)
    # A Ctrl-C is noted, so a KeyboardInterrupt an adapter raises is not taken for one.
    watch_user_interrupts()
    if float(config.getini("faulthandler_timeout") or 0) > 0:
        # pytest's faulthandler_timeout owns faulthandler's one timer; the call limit's last
        # resort for GIL-holding hangs must not take it over.
        set_last_resort(False)
    try:
        # An explicit --kv-impl= (empty, or only commas) is a mistake, not "no implementation".
        # A module in the current folder or the rootdir is found, as pytest's `pythonpath`
        # setting would find it.
        search = (Path.cwd(), config.rootpath)
        impls = (load_impls(value, call_timeout=timeout, search=search)
                 if value.strip() or option_value is not None else [])
        indexer_value = config.getoption("kv_indexer")
        if indexer_value is not None:
            impls += load_indexers(indexer_value, call_timeout=timeout, search=search)
            names = [h.name for h in impls]
            shared = sorted({n for n in names if names.count(n) > 1})
            if shared:
                raise ImplLoadError(
                    f"kvcheck: --kv-impl / --kv-indexer: implementations share the name(s) "
                    f"{shared}\n  Fix: give each IMPL_INFO a distinct name (it is the test-id "
                    "suffix)")
        oracle_value = (config.getoption("kv_oracle") or "reference").strip()
        oracle = (_load_oracle(oracle_value, timeout)
                  if any(h.indexer_factory is None or h.factory is not None for h in impls)
                  or oracle_value != "reference" else None)
    except ImplLoadError as exc:
        raise pytest.UsageError(str(exc)) from None
    report_path = config.getoption("kv_report")
    if report_path is not None and impls and not hasattr(config, "workerinput"):
        # Claimed (locked) only where it is written: not by a benchmark run or the
        # --kv-inventory subprocess, which would otherwise find the parent's lock.
        writes = not (config.hook.pytest_kvcheck_bench_active(config=config)
                      or config.getoption("kv_inventory"))
        claim_session_output(config, report_path, "--kv-report", example="kvcheck.jsonl",
                             writes=writes)
    state = KVSessionState(config, impls, config.getoption("kv_profile"), max_examples,
                           config.getoption("kv_seed"), report_path, oracle, value, timeout,
                           indexer_value=config.getoption("kv_indexer"))
    notes: list[str] = config.stash.get(_TIMEOUT_NOTES, [])
    state.selection_warnings.extend(notes)  # said in the summary too
    register(config, state)
    resources.start(state)  # the memory limit, and the hooks for forks and leftovers
    config.pluginmanager.register(sys.modules[__name__], "kvcheck-suite")
    if (impls and config.args_source != pytest.Config.ArgsSource.ARGS
            and not config.hook.pytest_kvcheck_bench_active(config=config)):
        # `pytest --kv-impl=X` with no paths runs the whole shipped suite (in a benchmark run,
        # --kv-bench, the benchmark plugin points at its benchmarks instead).
        import kvcheck.conformance

        config.args = [str(Path(kvcheck.conformance.__file__).parent)]
        # The header must not claim the ini's testpaths were run.
        config.args_source = pytest.Config.ArgsSource.ARGS


#: The ids of each id file given (``ID_FILE_OPTIONS``), read once, at configure.
_ID_FILES = pytest.StashKey[dict[str, list[str]]]()
#: What an id file's option does to the tests it lists.
_ID_FILE_MARKS = {
    "--kv-skips-file": pytest.mark.skip(reason="listed in --kv-skips-file"),
    "--kv-xfails-file": pytest.mark.xfail(reason="listed in --kv-xfails-file", strict=False),
}


#: Why --kv-timeout was raised to this machine's floor (shown in the header and the summary).
_TIMEOUT_NOTES = pytest.StashKey[list[str]]()


def _call_timeout(config: pytest.Config) -> float:
    """``--kv-timeout`` in seconds (0: no limit), raised to this machine's floor
    (``kvcheck.conformance.call_floor``) with a note when below it."""
    timeout = config.getoption("kv_timeout")
    if timeout is None:
        return DEFAULT_CALL_TIMEOUT
    if not timeout >= 0 or timeout == float("inf"):
        raise pytest.UsageError(
            f"kvcheck: --kv-timeout={timeout}: must be a finite number of seconds >= 0\n"
            f"  Fix: pass e.g. --kv-timeout={DEFAULT_CALL_TIMEOUT:g}, or 0 for no limit")
    check_timeout_bound(float(timeout))
    timeout, note = apply_floor(float(timeout))
    config.stash[_TIMEOUT_NOTES] = [note] if note else []
    return timeout


def _load_oracle(value: str, call_timeout: float) -> ImplHandle:
    """``--kv-oracle``: loaded and checked like ``--kv-impl`` (UsageError naming the option);
    not the implementation under test, it runs under ``oracle_timeout(call_timeout)``."""
    try:
        return load_impl(value, call_timeout=oracle_timeout(call_timeout))
    except ImplLoadError as exc:
        raise pytest.UsageError(str(exc).replace("--kv-impl=", "--kv-oracle=", 1)) from None


def _note_lines(impl: ImplHandle) -> list[str]:
    """An adapter module's ``PROFILE_NOTE`` (how the wrapped release relates to the profile)."""
    note = getattr(impl.module, "PROFILE_NOTE", None)
    return [f"  note: {note}"] if isinstance(note, str) and note else []


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(KV_STATE, None)
    if state is None or not state.impls:
        return []
    seed = "derandomized" if state.seed is None else str(state.seed)
    lines = []
    for impl in state.impls:
        lines.append(
            f"kvcheck: {impl.name} {impl.info.version} ({impl.module.__name__}) "
            f"profile={state.profile_for(impl)} seed={seed} "
            f"max_examples={state.max_examples}"
        )
        lines.append(f"  capabilities: {', '.join(sorted(impl.info.capabilities))}; "
                     f"hash algos: {', '.join(impl.info.hash_algos)}")
        lines.extend(_note_lines(impl))
    oracle = state.oracle
    if oracle is not None:
        lines.append(f"kvcheck: oracle {oracle.name} {oracle.info.version} "
                     f"({oracle.module.__name__}) claims profile={oracle.info.profile}")
        # The reference follows whatever profile a spec asks for; other oracles (vLLM) are
        # one release and behave as the profile they claim.
        fixed = oracle.module.__name__ != "kvcheck.adapters.reference"
        if fixed:
            lines.extend(_note_lines(oracle))
        for impl in state.impls:
            active = state.profile_for(impl)
            if fixed and active not in ("generic", oracle.info.profile):
                lines.append(f"kvcheck warning: differential tests of {impl.name} run under "
                             f"profile {active}, but the oracle behaves as "
                             f"{oracle.info.profile}: pass --kv-profile={oracle.info.profile}")
    lines += [f"kvcheck: {note}" for note in config.stash.get(_TIMEOUT_NOTES, [])]
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kv_impl" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[KV_STATE]
    if not state.impls:
        metafunc.parametrize(
            "kv_impl", [pytest.param(None, marks=pytest.mark.skip(reason=_NO_IMPL_REASON))],
            ids=["no-impl"], scope="session")
        return
    metafunc.parametrize("kv_impl", state.impls, ids=[h.name for h in state.impls],
                         scope="session")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Gate the suite's tests and take the inventory of applicable ones. ``tryfirst``: this
    sees every collected test before ``-k`` / ``-m`` / ``--deselect`` / ``--lf`` remove
    some, so deselected tests are counted as applicable but not run."""
    state = config.stash[KV_STATE]
    inventory = state.inventory = SuiteInventory()
    suite: list[pytest.Item] = []
    for item in items:
        impl = getattr(getattr(item, "callspec", None), "params", {}).get("kv_impl")
        if not isinstance(impl, ImplHandle):
            continue
        profile = state.profile_for(impl)
        in_suite = is_suite_path(item.path)
        # Carried to the xdist controller with every report.
        item.user_properties.extend(
            [("kv_impl", impl.name), ("kv_profile", profile), ("kv_area", area_of(item.nodeid)),
             ("kv_suite", in_suite)])
        item.user_properties.extend(collection_properties(item))  # why it may not apply
        reason = _not_applicable(item, impl, profile)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        if state.seed is not None and hasattr(item, "obj") and hasattr(item.obj, "hypothesis"):
            from hypothesis import seed as hypothesis_seed  # only when --kv-seed is given

            hypothesis_seed(state.seed)(item.obj)
        if in_suite:
            suite.append(item)
            inventory.files.add(item.path.name)
            if reason is None:
                inventory.applicable.setdefault(impl.name, []).append(suite_key(item.nodeid))
    for flag, ids in config.stash.get(_ID_FILES, {}).items():  # skips, then xfails
        marked, messages = apply_id_file(suite, ids, _ID_FILE_MARKS[flag], flag)
        if flag == "--kv-skips-file":
            inventory.skipped_by_file = {suite_key(nodeid) for nodeid in marked}
        # Said once, in the summary (a PytestWarning too would repeat it).
        state.selection_warnings.extend(messages)
    inventory.node_selection = any("::" in str(arg) and is_suite_path(str(arg).split("::")[0])
                                   for arg in config.args)


#: Implementations of another kind than a manager, by their capability.
_OTHER_KINDS = {"indexer": "an indexer", "offload": "an offload tier"}


def _not_applicable(item: pytest.Item, impl: ImplHandle, profile: str) -> str | None:
    """Why ``item`` does not apply to ``impl`` under ``profile`` (None: it applies)."""
    capabilities = effective_capabilities(impl.info, profile)
    if capabilities.isdisjoint({"manager", "block_pool"}):
        # Another kind of implementation (a router's index, an offload tier): only its own
        # area is about it.
        marked = {c for mark in item.iter_markers("kv_capability") for c in mark.args}
        for kind, what in _OTHER_KINDS.items():
            if kind in capabilities and kind not in marked:
                return (f"{impl.name} does not declare capability 'manager' ({what}: only the "
                        f"{kind} area applies)")
    for mark in item.iter_markers("kv_capability"):
        missing = [c for c in mark.args if c not in capabilities]
        if missing:
            if any("indexer" in m.args for m in item.iter_markers("kv_capability")) \
                    and "indexer" not in capabilities:
                missing = ["indexer"]  # another kind of implementation's area, whatever else
            return (f"{impl.name} does not declare capability "
                    f"{', '.join(repr(c) for c in missing)} (IMPL_INFO.capabilities)")
    if profile == "generic" and item.get_closest_marker("kv_generic") is None:
        return "checks exact vLLM behaviour; not run under --kv-profile=generic"
    only = item.get_closest_marker("kv_profiles")
    if only is not None and profile not in only.args:
        return f"only meaningful under {', '.join(only.args)} (active: {profile})"
    return None


def pytest_deselected(items: list[pytest.Item]) -> None:
    state = items[0].config.stash.get(KV_STATE, None) if items else None
    if state is not None and state.inventory is not None:
        state.inventory.deselected.update(suite_key(i.nodeid) for i in items
                                          if is_suite_path(i.path))


def pytest_collection_finish(session: pytest.Session) -> None:
    state = session.config.stash.get(KV_STATE, None)
    if state is None:
        return
    if state.inventory is None:  # nothing with kv_impl was collected
        state.inventory = SuiteInventory()
    state.inventory.collect_errors = sorted(set(state.collect_errors))
    state.inventory.files.update(state.collect_errors)
    state.inventory.known = True
    target = session.config.getoption("kv_inventory")
    if target:
        from kvcheck.results.io import write_atomic

        write_atomic(target, json.dumps(state.inventory.to_wire()))


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """A factory that declines a test's spec (``UnsupportedSpec``) skips that test. The block
    sizes of the managers a test of ``kv_impl`` built are its ``kv_block_sizes`` user property
    (sorted ints, ``kvcheck.conformance.sizes``)."""
    with recording_block_sizes() as used:
        try:
            return (yield)
        except UnsupportedSpec as exc:
            pytest.skip(f"the implementation declines this spec: {exc}")
        finally:
            if "kv_impl" in getattr(getattr(pyfuncitem, "callspec", None), "params", {}):
                pyfuncitem.user_properties.append((BLOCK_SIZES_PROPERTY, sorted(used)))


# ---------------------------------------------------------------- fixtures for users and the suite
@pytest.fixture(scope="session")
def kv_profile(kv_impl: ImplHandle, pytestconfig: pytest.Config) -> str:
    """The profile the current implementation is checked against."""
    return pytestconfig.stash[KV_STATE].profile_for(kv_impl)


@pytest.fixture
def kv_sizes(kv_impl: ImplHandle, kv_profile: str) -> DeclaredSizes:
    """The block and pool sizes scripted tests run at for the current implementation under
    the active profile (``kvcheck.conformance.sizes``: the usual ones, or declared ones under
    ``generic``)."""
    return DeclaredSizes.of(kv_impl.info, kv_profile)


@pytest.fixture
def kv_spec(kv_profile: str, kv_sizes: DeclaredSizes) -> KVCacheSpec:
    """A default small spec (16 blocks of 4 tokens, or the sizes ``kv_sizes`` maps them to)
    for the active profile."""
    return kv_sizes.spec(num_blocks=16, block_size=4, profile=kv_profile)


@pytest.fixture(scope="session")
def kv_reference(pytestconfig: pytest.Config) -> ImplHandle:
    """kvcheck's reference implementation, through the same protocol (the oracle)."""
    state = pytestconfig.stash.get(KV_STATE, None)
    timeout = state.call_timeout if state is not None else DEFAULT_CALL_TIMEOUT
    return load_impl("reference", call_timeout=oracle_timeout(timeout))  # never the one blamed


@pytest.fixture(scope="session")
def kv_settings(pytestconfig: pytest.Config) -> HypothesisSettings:
    """Hypothesis settings for the suite: --kv-max-examples, no deadline (Triton JIT and
    CUDA init make first calls slow), derandomized unless --kv-seed is given."""
    from hypothesis import HealthCheck, settings

    state = pytestconfig.stash[KV_STATE]
    return settings(
        max_examples=state.max_examples,
        deadline=None,
        derandomize=state.seed is None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
        print_blob=False,
    )


@pytest.fixture(scope="session")
def kv_seed(pytestconfig: pytest.Config) -> int | None:
    """``--kv-seed`` (None: derandomized)."""
    return pytestconfig.stash[KV_STATE].seed


@pytest.fixture(scope="session")
def kv_oracle(pytestconfig: pytest.Config) -> ImplHandle:
    """The oracle ``kv_pair`` compares with: ``--kv-oracle`` (kvcheck's reference by default)."""
    state = pytestconfig.stash[KV_STATE]
    if state.oracle is None:
        state.oracle = _load_oracle(pytestconfig.getoption("kv_oracle") or "reference",
                                    state.call_timeout)
    return state.oracle


@pytest.fixture
def kv_pair(kv_impl: ImplHandle, kv_oracle: ImplHandle, kv_profile: str,
            kv_sizes: DeclaredSizes, request: pytest.FixtureRequest) -> Callable[..., Pair]:
    """``kv_pair(spec=None, **spec_fields) -> Pair``: the implementation and the oracle
    (``--kv-oracle``, the reference by default) driven in lockstep (no oracle under
    ``--kv-profile=generic``: laws only). A mismatch writes its trace under
    ``.kvcheck/repro/`` named after the test. Without ``spec``, ``num_blocks`` (16) and
    ``block_size`` (4) of a single-group spec are the sizes the test is written for: the
    pair runs at the sizes ``kv_sizes`` maps them to (the same ones, except under
    ``generic`` for an implementation declaring other sizes), so the test reads
    ``pair.spec.block_size`` and states its workload in blocks."""
    from kvcheck.conformance.differential import Pair

    def make(spec: KVCacheSpec | None = None, *, with_oracle: bool = True,
             **fields: Any) -> Pair:  # Any: KVCacheSpec's keyword fields, passed on as given
        if spec is None:
            fields.setdefault("num_blocks", 16)
            fields.setdefault("block_size", 4)
            if not fields.get("kv_cache_groups"):
                fields["num_blocks"] = kv_sizes.num_blocks(fields["num_blocks"])
                fields["block_size"] = kv_sizes.block_size(fields["block_size"])
            spec = KVCacheSpec(profile=kv_profile, **fields)
        oracle = None if kv_profile == "generic" or not with_oracle else kv_oracle
        pair = Pair(kv_impl, oracle, spec)
        pair.trace_name = request.node.name
        return pair

    return make


def pytest_kvcheck_profiles(config: pytest.Config) -> dict[str, str] | None:
    """Each selected implementation's active profile, in ``--kv-impl`` order (for the
    benchmark plugin's records; see ``kvcheck.plugin.hooks``)."""
    state = config.stash.get(KV_STATE, None)
    if state is None or not state.impls:
        return None
    return {impl.name: state.profile_for(impl) for impl in state.impls}

