"""The benchmark command-line tools refuse bad arguments before any work (issue 23, item 7):
exit 2 and one line on stderr naming the argument, the value, the bound and the fix; nothing
is loaded, measured, counted or written (``kvcheck.bench.cli_args``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from kvcheck.bench import (
    count_spread,
    counted,
    kernel_crosscheck,
    request_speed,
    stability,
    sweep,
)
from kvcheck.bench.cli_args import BenchArgumentParser, float_in, int_in, names_in

Main = Callable[[Sequence[str] | None], int]

CASES: list[tuple[str, Main, list[str], list[str]]] = [
    # stability: each of these used to run (or hang, or pass whatever moved) silently.
    ("stability", stability.main, ["--rounds", "0"], ["--rounds", "[1, 10000]", "Fix"]),
    ("stability", stability.main, ["--rounds", "-3"], ["--rounds", "-3", "[1, 10000]"]),
    ("stability", stability.main, ["--rounds", "1000000000"], ["--rounds", "[1, 10000]"]),
    ("stability", stability.main, ["--max-rounds", "0"], ["--max-rounds", "[1, 10000]"]),
    ("stability", stability.main, ["--warmup", "-1"], ["--warmup", "[0, 1000]"]),
    ("stability", stability.main, ["--scale", "nan"], ["--scale", "finite", "(0, 64]"]),
    ("stability", stability.main, ["--scale", "1e9"], ["--scale", "(0, 64]"]),
    ("stability", stability.main, ["--scale", "0"], ["--scale", "(0, 64]"]),
    ("stability", stability.main, ["--min-time", "nan"], ["--min-time", "[0, 3600]"]),
    ("stability", stability.main, ["--min-time", "inf"], ["--min-time", "[0, 3600]"]),
    ("stability", stability.main, ["--min-time", "-1"], ["--min-time", "[0, 3600]"]),
    ("stability", stability.main, ["--tolerance", "nan"], ["--tolerance", "[0, 1000]"]),
    ("stability", stability.main, ["--runs", "-1"], ["--runs", "[0, 100]"]),
    ("stability", stability.main, ["--runs", "0"], ["--runs", "without --layers"]),
    ("stability", stability.main, ["--hash-algos", "md5"], ["--hash-algos", "'md5'", "sha256"]),
    ("stability", stability.main, ["--seed", "-1"], ["--seed", "[0, 2^63-1]"]),
    ("stability", stability.main, ["--seed", str(2**64)], ["--seed", "[0, 2^63-1]"]),
    ("stability", stability.main, ["--rounds", "seven"], ["--rounds", "seven is not an int"]),
    # sweep: a negative seed was a traceback from inside the first point.
    ("sweep", sweep.main, ["--seed", "-5"], ["--seed", "[0, 2^63-1]"]),
    ("sweep", sweep.main, ["--rounds", "1000000000"], ["--rounds", "[1, 10000]"]),
    ("sweep", sweep.main, ["--warmup", "-1"], ["--warmup", "[0, 1000]"]),
    # request_speed: each of these was a traceback (ZeroDivisionError, IndexError, ...).
    ("request_speed", request_speed.main, ["--requests", "0"], ["--requests", "[1, 100000]"]),
    ("request_speed", request_speed.main, ["--rounds", "0"], ["--rounds", "[1, 10000]"]),
    ("request_speed", request_speed.main, ["--hash-algo", "md5"], ["--hash-algo", "'md5'"]),
    ("request_speed", request_speed.main, ["--prompt-tokens", "-5"],
     ["--prompt-tokens", "[1, 1048576]"]),
    ("request_speed", request_speed.main, ["--requests", "100000", "--prompt-tokens", "100000"],
     ["--requests", "tokens per round", "Fix"]),
    # counted / count_spread: tracebacks (unknown bench, NaN scale) or silently serial (jobs).
    ("counted", counted.main, ["--bench", "nosuch"], ["--bench", "['nosuch']", "scheduler"]),
    ("counted", counted.main, ["--bench", "hashing,hashing"], ["--bench", "named twice"]),
    ("counted", counted.main, ["--scale", "nan"], ["--scale", "(0, 64]", "--scale 0.05"]),
    ("counted", counted.main, ["--jobs", "0"], ["--jobs", "[1, 64]"]),
    ("counted", counted.main, ["--wall-rounds", "-1"], ["--wall-rounds", "[0, 10000]"]),
    ("counted", counted.main, ["--profile", "vllm-9"], ["--profile", "'vllm-9'", "vllm-0.33"]),
    ("count_spread", count_spread.main, ["--max-spread", "nan"],
     ["--max-spread", "[0, 100]"]),
    ("count_spread", count_spread.main, ["--bench", ","], ["--bench", "no counted benchmark"]),
    ("count_spread", count_spread.main, ["--jobs", "100000"], ["--jobs", "[1, 64]"]),
    # kernel_crosscheck: an --allow-missing for an op --op leaves out allowed nothing.
    ("kernel_crosscheck", kernel_crosscheck.main,
     ["--op", "store_kv_cache", "--allow-missing", "paged_attention_decode"],
     ["--allow-missing", "not among the ops", "Fix"]),
    ("kernel_crosscheck", kernel_crosscheck.main, ["--op", "nosuch"],
     ["--op", "invalid choice", "store_kv_cache"]),
]


@pytest.mark.parametrize(("tool", "main", "argv", "words"), CASES,
                         ids=[f"{c[0]}:{' '.join(c[2])}" for c in CASES])
def test_bad_argument_is_one_line_and_exit_2(tool: str, main: Main, argv: list[str],
                                             words: list[str], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Refused while parsing: exit 2, one stderr line ``python -m kvcheck.bench.TOOL: error:
    argument ...``, nothing on stdout, no implementation loaded, nothing written."""
    monkeypatch.chdir(tmp_path)

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("an implementation was loaded before the arguments were checked")

    monkeypatch.setattr("kvcheck.conformance.loader.load_impl", no_load)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"python -m kvcheck.bench.{tool}: error: argument "), err
    for word in words:
        assert word in lines[0], (word, err)
    assert list(tmp_path.iterdir()) == []


def test_sweep_unknown_impl_is_exit_2_without_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Was a 20-line ImplLoadError traceback; now the loader's message, as ``--impl``."""
    assert sweep.main(["--quick", "--impl", "no_such_module_xyz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m kvcheck.bench.sweep: error: --impl no_such_module_xyz: "
                          "cannot import 'no_such_module_xyz'"), err
    assert "Traceback" not in err and "Fix:" in err


def test_counted_bad_case_and_impl_are_refused_before_counting(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown ``--case`` is named before valgrind is looked for; an unknown ``--impl`` is
    one line (it was the counting child's traceback, after valgrind had started)."""

    def no_counting(*args: object, **kwargs: object) -> None:
        raise AssertionError("counting started")

    monkeypatch.setattr(counted, "count_cases", no_counting)
    monkeypatch.setattr(counted, "unavailable_reason", lambda: "valgrind is not installed")
    assert counted.main(["--bench", "hashing", "--case", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "--case 'nosuch': no case of --bench hashing" in err and "sha256" in err
    monkeypatch.setattr(counted, "unavailable_reason", lambda: None)
    assert counted.main(["--impl", "no_such_module_xyz", "--bench", "hashing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m kvcheck.bench.counted: error: --impl no_such_module_xyz: "
                          "cannot import"), err
    assert "Traceback" not in err


def test_counted_report_folder_is_refused_before_counting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--report DIR`` was found out only when the record was written, after counting."""
    monkeypatch.setattr(counted, "count_cases", lambda *a, **k: pytest.fail("counted"))
    assert counted.main(["--bench", "hashing", "--report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (f"python -m kvcheck.bench.counted: error: --report {tmp_path}: is a directory"
            in err), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("parse", "text"), [
    (int_in(1, 9, "things"), "1" * 5000),   # past Python's int-string limit: no traceback
    (float_in(0, 1, "a fraction"), "1e400"),  # overflows to inf
    (float_in(0, 1, "a fraction"), "-nan"),
    (names_in(("a", "b"), "name"), ""),
])
def test_type_functions_refuse_edge_spellings(parse: Callable[[str], object], text: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    parser = BenchArgumentParser(prog="tool")
    parser.add_argument("--x", type=parse)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--x", text])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tool: error: argument --x: "), err
    assert len(err) < 300  # a 5000-digit value is shown cut short


def test_type_functions_accept_good_values() -> None:
    """Values inside the bounds parse to themselves (a list for ``names_in``)."""
    for value, parse in ((7, int_in(1, 1000, "")), (0.1, float_in(0.0, 10.0, ""))):
        assert parse(str(value)) == value
    assert names_in(("scheduler", "hashing"), "b")("scheduler, hashing") == ["scheduler",
                                                                              "hashing"]
