"""kvcheck's pytest plugin (pytest11 entry point ``kvcheck``).

Every option lives here, not in a conftest, so it also works with ``--pyargs``::

    pytest --kv-impl=mypkg.kv_adapter            # the whole shipped suite
    pytest --kv-impl=reference,mypkg.kv_adapter  # each as its own parametrization
    pytest --pyargs kvcheck.conformance --kv-impl=... -n 2 --kv-report=r.jsonl

Flow: ``pytest_configure`` loads and checks the implementations (``UsageError`` on any contract
problem), ``pytest_generate_tests`` parametrizes ``kv_impl``, ``pytest_collection_modifyitems``
applies capability / profile gating and the skip / xfail files, ``pytest_runtest_logreport``
collects outcomes (on the xdist controller too), and the terminal summary and ``--kv-report``
record are produced at the end.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from kvcheck.conformance.protocol import PROFILES, KVCacheSpec
from kvcheck.plugin.loader import ImplHandle, load_impl, load_impls
from kvcheck.plugin.report import SessionOutcomes, area_of, render_summary, write_report
from kvcheck.plugin.selection import apply_id_file, read_id_file

__all__ = ["KV_STATE", "KVSessionState"]

# Assertion helpers imported by the suite get pytest's rewriting (readable failure diffs).
pytest.register_assert_rewrite("kvcheck.conformance.assertions")

_DEFAULT_MAX_EXAMPLES = 40
_NO_IMPL_REASON = (
    "no implementation selected: pass --kv-impl=MODULE (or set KV_IMPL) to run the kvcheck "
    "conformance suite"
)


class KVSessionState:
    """Resolved options and collected outcomes; lives in ``config.stash[KV_STATE]``.

    Registered as a plugin object too, so its hook methods see every report, including those
    xdist workers send to the controller.
    """

    def __init__(self, config: pytest.Config, impls: list[ImplHandle], profile: str | None,
                 max_examples: int, seed: int | None, report_path: str | None,
                 oracle: ImplHandle | None = None) -> None:
        self.config = config
        self.impls = impls
        # What kv_pair compares the implementation with (--kv-oracle; the reference by
        # default). None until needed when no implementation is selected.
        self.oracle = oracle
        self.profile_override = profile
        self.max_examples = max_examples
        self.seed = seed
        self.report_path = report_path
        self.outcomes = SessionOutcomes()
        self.selection_warnings: list[str] = []

    def profile_for(self, impl: ImplHandle) -> str:
        """``--kv-profile`` if given, else the profile the implementation claims."""
        return self.profile_override or impl.info.profile

    @property
    def reports_conformance(self) -> bool:
        """Whether this process prints the verdict and writes the record: an implementation
        was selected, this is not an xdist worker (the controller aggregates), and the run is
        not a ``--kv-bench`` run (benchmark outcomes are no conformance verdict)."""
        return (bool(self.impls) and not hasattr(self.config, "workerinput")
                and not self.config.getoption("kv_bench", False))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if "kv_impl" in props:
            self.outcomes.add(report, props)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.reports_conformance:
            return
        for impl in self.impls:
            for line in render_summary(impl, self.profile_for(impl), self.outcomes):
                terminalreporter.write_line(line)
        for message in self.selection_warnings:
            terminalreporter.write_line(f"kvcheck warning: {message}", yellow=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.reports_conformance or not self.report_path:
            return
        path = write_report(self.report_path, self.impls, self.profile_for, self.outcomes,
                            self.seed)
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line(f"kvcheck: result record written to {path}")


KV_STATE = pytest.StashKey[KVSessionState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcheck", "kvcheck paged KV-cache conformance")
    group.addoption(
        "--kv-impl", default=None, metavar="MODULE[:FACTORY][,...]",
        help="implementation(s) under test: a module defining IMPL_INFO and "
             "make_kv_cache_manager(spec), 'module:factory', or the alias 'reference'; a "
             "comma list runs each as its own parametrization (env KV_IMPL as fallback)",
    )
    group.addoption(
        "--kv-oracle", default="reference", metavar="MODULE[:FACTORY]",
        help="what differential tests (the kv_pair fixture) compare each implementation with: "
             "'reference' (default), 'vllm' (the installed vLLM, kvcheck.adapters.vllm) or "
             "any adapter module; kv_reference stays kvcheck's reference",
    )
    group.addoption(
        "--kv-profile", default=None, choices=PROFILES,
        help="behaviour to check against: vllm-0.33, vllm-0.10, or generic (invariants only, "
             "for radix-tree engines); default: the profile IMPL_INFO claims",
    )
    group.addoption(
        "--kv-max-examples", type=int, default=_DEFAULT_MAX_EXAMPLES, metavar="N",
        help=f"Hypothesis examples per property/differential test (default "
             f"{_DEFAULT_MAX_EXAMPLES})",
    )
    group.addoption(
        "--kv-seed", type=int, default=None, metavar="N",
        help="random seed for generated workloads; default: derandomized (the same examples "
             "on every run, as CI wants)",
    )
    group.addoption(
        "--kv-report", default=None, metavar="PATH",
        help="write a versioned JSON Lines result record (one line per implementation), "
             "atomically",
    )
    group.addoption(
        "--kv-xfails-file", default=None, metavar="PATH",
        help="file of test-id substrings expected to fail (known deviations)",
    )
    group.addoption(
        "--kv-skips-file", default=None, metavar="PATH",
        help="file of test-id substrings to skip",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kv_capability(*names): needs these IMPL_INFO capabilities, else skipped")
    config.addinivalue_line(
        "markers", "kv_generic: a profile-independent law, also checked under --kv-profile=generic")
    config.addinivalue_line(
        "markers", "kv_profiles(*names): only meaningful under these profiles")
    value = config.getoption("kv_impl") or os.environ.get("KV_IMPL") or ""
    max_examples = config.getoption("kv_max_examples")
    if max_examples < 1:
        raise pytest.UsageError(
            f"kvcheck: --kv-max-examples={max_examples}: must be >= 1\n"
            "  Fix: pass a positive number of examples, e.g. --kv-max-examples=40")
    impls = load_impls(value) if value.strip() else []
    oracle_value = (config.getoption("kv_oracle") or "reference").strip()
    oracle = (_load_oracle(oracle_value) if impls or oracle_value != "reference" else None)
    state = KVSessionState(config, impls, config.getoption("kv_profile"), max_examples,
                           config.getoption("kv_seed"), config.getoption("kv_report"), oracle)
    config.stash[KV_STATE] = state
    config.pluginmanager.register(state, "kvcheck-session")
    if impls and config.args_source != pytest.Config.ArgsSource.ARGS:
        # `pytest --kv-impl=X` with no paths runs the whole shipped suite.
        import kvcheck.conformance

        config.args = [str(Path(kvcheck.conformance.__file__).parent)]


def _load_oracle(value: str) -> ImplHandle:
    """``--kv-oracle``: loaded and checked like ``--kv-impl`` (UsageError naming the option)."""
    try:
        return load_impl(value)
    except pytest.UsageError as exc:
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
        fixed = oracle.module.__name__ != "kvcheck.reference_impl.adapter"
        if fixed:
            lines.extend(_note_lines(oracle))
        for impl in state.impls:
            active = state.profile_for(impl)
            if fixed and active not in ("generic", oracle.info.profile):
                lines.append(f"kvcheck warning: differential tests of {impl.name} run under "
                             f"profile {active}, but the oracle behaves as "
                             f"{oracle.info.profile}: pass --kv-profile={oracle.info.profile}")
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash[KV_STATE]
    for item in items:
        impl = getattr(getattr(item, "callspec", None), "params", {}).get("kv_impl")
        if not isinstance(impl, ImplHandle):
            continue
        profile = state.profile_for(impl)
        # Carried to the xdist controller with every report.
        item.user_properties.extend(
            [("kv_impl", impl.name), ("kv_profile", profile), ("kv_area", area_of(item.nodeid))])
        for mark in item.iter_markers("kv_capability"):
            missing = [c for c in mark.args if not impl.has(c)]
            if missing:
                item.add_marker(pytest.mark.skip(
                    reason=f"{impl.name} does not declare capability "
                           f"{', '.join(repr(c) for c in missing)} (IMPL_INFO.capabilities)"))
        if profile == "generic" and item.get_closest_marker("kv_generic") is None:
            item.add_marker(pytest.mark.skip(
                reason="checks exact vLLM behaviour; not run under --kv-profile=generic"))
        only = item.get_closest_marker("kv_profiles")
        if only is not None and profile not in only.args:
            item.add_marker(pytest.mark.skip(
                reason=f"only meaningful under {', '.join(only.args)} (active: {profile})"))
        if state.seed is not None and hasattr(item, "obj") and hasattr(item.obj, "hypothesis"):
            item.obj._hypothesis_internal_use_seed = state.seed
    for option, mark in (
        ("kv_skips_file", pytest.mark.skip(reason="listed in --kv-skips-file")),
        ("kv_xfails_file", pytest.mark.xfail(reason="listed in --kv-xfails-file", strict=False)),
    ):
        path = config.getoption(option)
        if path:
            flag = "--" + option.replace("_", "-")
            ids = read_id_file(path, flag)
            for message in apply_id_file(items, ids, mark, flag):
                state.selection_warnings.append(message)
                warnings.warn(pytest.PytestWarning(message), stacklevel=1)


# ---------------------------------------------------------------- fixtures for users and the suite
@pytest.fixture(scope="session")
def kv_profile(kv_impl: ImplHandle, pytestconfig: pytest.Config) -> str:
    """The profile the current implementation is checked against."""
    return pytestconfig.stash[KV_STATE].profile_for(kv_impl)


@pytest.fixture
def kv_spec(kv_profile: str) -> KVCacheSpec:
    """A default small spec (16 blocks of 4 tokens) for the active profile."""
    return KVCacheSpec(num_blocks=16, block_size=4, profile=kv_profile)


@pytest.fixture(scope="session")
def kv_reference() -> ImplHandle:
    """kvcheck's reference implementation, through the same protocol (the oracle)."""
    return load_impl("reference")


@pytest.fixture(scope="session")
def kv_settings(pytestconfig: pytest.Config) -> Any:
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
        state.oracle = _load_oracle(pytestconfig.getoption("kv_oracle") or "reference")
    return state.oracle


@pytest.fixture
def kv_pair(kv_impl: ImplHandle, kv_oracle: ImplHandle, kv_profile: str,
            request: pytest.FixtureRequest) -> Any:
    """``kv_pair(spec=None, **spec_fields) -> Pair``: the implementation and the oracle
    (``--kv-oracle``, the reference by default) driven in lockstep (no oracle under
    ``--kv-profile=generic``: laws only). A mismatch writes its trace under
    ``.kvcheck/repro/`` named after the test."""
    from kvcheck.conformance.differential import Pair

    def make(spec: KVCacheSpec | None = None, *, with_oracle: bool = True,
             **fields: Any) -> Pair:
        if spec is None:
            fields.setdefault("num_blocks", 16)
            fields.setdefault("block_size", 4)
            spec = KVCacheSpec(profile=kv_profile, **fields)
        oracle = None if kv_profile == "generic" or not with_oracle else kv_oracle
        pair = Pair(kv_impl, oracle, spec)
        pair.trace_name = request.node.name
        return pair

    return make
