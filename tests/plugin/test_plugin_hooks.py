"""The conformance and benchmark plugins cooperate only through kvcheck.plugin.hooks: each
works with the other disabled, and any plugin answering the hooks is heard."""

from __future__ import annotations

import pytest
from kv_helpers import make_ref


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", *args)


def test_without_the_bench_plugin_the_suite_runs_and_gives_a_verdict(
        pytester: pytest.Pytester) -> None:
    """No test paths: the conformance plugin still points at its suite, and says its verdict."""
    result = run(pytester, "-p", "no:kvcheck-bench", make_ref(pytester))
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*kvcheck conformance: ref*",
                                 "verdict: ref conforms to vllm-0.33*"])
    assert "kvcheck-bench" not in result.stdout.str()


def test_without_the_bench_plugin_kv_bench_is_an_unknown_option(
        pytester: pytest.Pytester) -> None:
    result = run(pytester, "-p", "no:kvcheck-bench", "--kv-impl=reference", "--kv-bench")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --kv-bench*"])


def test_the_bench_plugin_loads_without_the_conformance_plugin(
        pytester: pytest.Pytester) -> None:
    """It declares the shared hooks itself, so its own hook implementation is not unknown."""
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:kvcheck", "test_plain.py")
    result.assert_outcomes(passed=1)
    help_text = pytester.runpytest("-p", "no:kvcheck", "--help").stdout.str()
    assert "--kv-bench-scale=F" in help_text and "--kv-impl=MODULE" not in help_text


def test_a_plugin_answering_bench_active_silences_the_verdict(
        pytester: pytest.Pytester) -> None:
    """Not the benchmark plugin (disabled here) but a conftest answers the hook: the
    conformance plugin prints no verdict, writes no record, and leaves the test paths."""
    pytester.makeconftest("def pytest_kvcheck_bench_active(config):\n    return True\n")
    pytester.makepyfile(test_mine="def test_mine(kv_impl):\n    assert kv_impl.name\n")
    result = run(pytester, "-p", "no:kvcheck-bench", make_ref(pytester), "--kv-report=r.jsonl")
    result.assert_outcomes(passed=1)  # only this folder: the suite was not pointed at
    out = result.stdout.str()
    assert "verdict:" not in out and "kvcheck conformance" not in out
    assert not (pytester.path / "r.jsonl").exists()


@pytest.mark.parametrize(("args", "answer"), [
    (("--kv-impl=reference",), "{'reference': 'vllm-0.33'}"),
    (("--kv-impl=reference", "--kv-profile=generic"), "{'reference': 'generic'}"),
    ((), "None"),
])
def test_the_conformance_plugin_answers_profiles(pytester: pytest.Pytester, args: tuple[str, ...],
                                                 answer: str) -> None:
    pytester.makeconftest(
        "def pytest_report_header(config):\n"
        "    return [f'profiles: {config.hook.pytest_kvcheck_profiles(config=config)}']\n")
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = run(pytester, "-p", "no:kvcheck-bench", *args, "test_mine.py", "--collect-only")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"profiles: {answer}"])
