"""``python -m kvcheck.bench.event_codec``: its arguments and its answer without vLLM (the
figures themselves need vLLM: CI's vLLM stages print them)."""

from __future__ import annotations

import importlib.util

import pytest

from kvcheck.bench import event_codec


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_without_vllm_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert event_codec.main(["--batches", "5", "--pairs", "2"]) == 2
    assert "needs vLLM installed" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "bound"), [
    (["--batches", "0"], "0 is not an int in [1, 1000000] (batches per round)"),
    (["--pairs", "1"], "1 is not an int in [2, 10000] (timed pairs per figure)"),
    (["--seed", "-1"], "-1 is not an int in [0, 2^63-1]"),
])
def test_impossible_sizes_are_refused(argv: list[str], bound: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        event_codec.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m kvcheck.bench.event_codec: error: argument {argv[0]}: "
                          f"{bound}"), err
    assert err.count("\n") == 1


def test_the_pairs_alternate_abba() -> None:
    order: list[str] = []
    event_codec._paired(lambda: order.append("A"), lambda: order.append("B"), 4)
    assert order == ["A", "B", "A", "B", "B", "A", "A", "B", "B", "A"]  # 2 warm-up calls
