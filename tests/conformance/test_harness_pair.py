"""``Pair`` (kvcheck.conformance.differential) on two small fakes: a divergence in an answer
(new block ids, hits) or in an observation (the free queue) fails with the op number, the op,
both values and a repro ending on that value; laws come before the comparison; an exception
names its side; the trace written on failure holds the ops run so far and loads back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness_fakes import SPEC, FakeManager, ForwardFree, LeakOnFree, LifoBlocks, NoCaching, handle

from kvcheck.conformance.differential import ConformanceMismatch, Pair, load_trace
from kvcheck.conformance.ops import add, free, schedule

PROMPT = list(range(1, 10))  # 9 tokens: three blocks of 4


def mismatch(impl: type[FakeManager], ops: list[dict[str, Any]],
             oracle: type[FakeManager] = FakeManager) -> str:
    """The message of the ConformanceMismatch ``impl`` vs ``oracle`` (named "fake") raises."""
    pair = Pair(handle(impl, name="mine"), handle(oracle), SPEC)
    with pytest.raises(ConformanceMismatch) as info:
        pair.run(ops)
    return str(info.value)


def test_identical_designs_agree_and_the_answer_is_the_implementations() -> None:
    pair = Pair(handle(FakeManager, name="mine"), handle(FakeManager), SPEC)
    pair.run([add("a", PROMPT), schedule("a"), add("b", PROMPT)])
    assert pair.apply(schedule("b")) == {"hits": ([[0, 1]], 8), "new": [[3]]}
    assert len(pair.ops) == 4


def test_different_new_blocks_name_the_op_and_both_answers() -> None:
    message = mismatch(LifoBlocks, [add("a", PROMPT), schedule("a")])
    assert message.splitlines()[0] == (
        "after op #2 {'op': 'schedule', 'rid': 'a', 'num_tokens': None}: answer differs: "
        "implementation {'hits': ([], 0), 'new': [7, 6, 5]}, "
        "fake {'hits': ([], 0), 'new': [0, 1, 2]}")
    # The repro ends on the allocate_slots answer, normalised to a list.
    assert "got = m.allocate_slots(views['a'], 9, 0, [])  # -> [7, 6, 5]" in message
    assert message.endswith("expected = [0, 1, 2]\nif got != expected:\n"
                            '    sys.exit(f"kvcheck repro: {what} differs:\\n  expected '
                            '{expected!r}\\n  got      {got!r}")\n'
                            "print('kvcheck repro: no divergence (fixed?)')")
    assert "got = None if got is None else list(got)" in message


def test_different_hits_name_get_computed_blocks() -> None:
    message = mismatch(NoCaching, [add("a", PROMPT), schedule("a"), add("b", PROMPT),
                                   schedule("b")])
    assert message.splitlines()[0] == (
        "after op #4 {'op': 'schedule', 'rid': 'b', 'num_tokens': None}: answer differs: "
        "implementation {'hits': ([], 0), 'new': [3, 4, 5]}, "
        "fake {'hits': ([0, 1], 8), 'new': [3]}")
    assert "got = m.get_computed_blocks(views['b'])  # -> ([], 0)" in message
    assert ("what = 'get_computed_blocks answer'\ngot = (list(got[0]), got[1])\n"
            "expected = ([0, 1], 8)\n") in message


def test_different_free_queue_names_the_observation() -> None:
    """Same answers; the freed blocks go back in another order."""
    message = mismatch(ForwardFree, [add("a", PROMPT), schedule("a"), free("a")])
    assert message.splitlines()[0] == (
        "after op #3 {'op': 'free', 'rid': 'a'}: free queue (head first) differs: "
        "implementation [3, 4, 5, 6, 7, 0, 1, 2], fake [3, 4, 5, 6, 7, 2, 1, 0]")
    assert ("what = 'free queue (head first)'\ngot = list(m.free_block_ids())\n"
            "expected = [3, 4, 5, 6, 7, 2, 1, 0]\n") in message


def test_free_queue_is_not_compared_unless_both_declare_it() -> None:
    caps = frozenset({"manager", "prefix_caching"})
    pair = Pair(handle(ForwardFree, name="mine", caps=caps), handle(FakeManager), SPEC)
    pair.run([add("a", PROMPT), schedule("a"), free("a")])  # no mismatch raised
    assert pair.oracle is not None  # the difference is there, unobserved:
    assert pair.impl.manager.free_block_ids() == [3, 4, 5, 6, 7, 0, 1, 2]
    assert pair.oracle.manager.free_block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]


def test_a_broken_law_is_reported_before_any_difference() -> None:
    """The leak also changes the free queue; the law is what the failure names."""
    first = mismatch(LeakOnFree, [add("a", PROMPT), schedule("a"), free("a")]).splitlines()[0]
    assert first.startswith("after op #3 {'op': 'free', 'rid': 'a'}: conservation: ")
    assert "differs" not in first


def test_laws_alone_without_an_oracle() -> None:
    pair = Pair(handle(LeakOnFree), None, SPEC)
    assert pair.apply(add("a", PROMPT)) == {}
    assert pair.apply(schedule("a")) == {"hits": ([[]], 0), "new": [[0, 1, 2]]}
    with pytest.raises(ConformanceMismatch, match=r"^after op #3 .*: conservation: "):
        pair.apply(free("a"))


class Boom(FakeManager):
    def allocate_slots(self, *args: Any, **kwargs: Any) -> list[int] | None:
        raise RuntimeError("boom")


def test_an_exception_names_the_side_that_raised() -> None:
    mine = mismatch(Boom, [add("a", PROMPT), schedule("a")])
    assert mine.splitlines()[0] == ("after op #2 {'op': 'schedule', 'rid': 'a', "
                                    "'num_tokens': None}: RuntimeError from the "
                                    "implementation: boom")
    assert "m.allocate_slots(views['a'], 9, 0, [])  # raised RuntimeError" in mine
    theirs = mismatch(FakeManager, [add("a", PROMPT), schedule("a")], oracle=Boom)
    assert theirs.splitlines()[0].endswith(": RuntimeError from the oracle (fake): boom")


def test_trace_holds_the_ops_so_far_and_loads_back(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    pair = Pair(handle(ForwardFree, name="mine"), handle(FakeManager), SPEC)
    pair.trace_name = "test_pair[x]"
    ops = [add("a", PROMPT), schedule("a"), free("a"), add("b", PROMPT)]
    with pytest.raises(ConformanceMismatch) as info:
        pair.run(ops)
    (trace,) = (tmp_path / ".kvcheck" / "repro").glob("*.json")
    relative = trace.relative_to(tmp_path)
    assert f"trace written to {relative} (kvcheck replay {relative} --kv-impl=harness_fakes)" \
        in str(info.value)
    loaded = load_trace(trace)
    assert loaded["ops"] == ops[:3]  # the fourth op never ran
    assert loaded["impl"] == "harness_fakes" and loaded["spec"] == SPEC
    repro = trace.with_suffix(".py").read_text()
    assert str(info.value).endswith(repro.rstrip("\n"))  # the repro in the message, verbatim
