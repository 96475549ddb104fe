"""``Driver`` and ``Check`` (kvcheck.conformance.driver) on the small fakes: what each op calls
with which arguments, how the request views advance, what the call log records, and the repro
program built from it (its head, its tail for a broken law or a diverging value, and that it
replays)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from harness_fakes import SPEC, FakeManager, HitsWholePrompt, handle

from kvcheck.conformance.driver import Check, Driver, output_token
from kvcheck.conformance.ops import add, decode, free, reset, schedule
from kvcheck.conformance.protocol import DESIGN_CAPABILITIES, RequestView

PROMPT = list(range(1, 10))  # 9 tokens: three blocks of 4, the last one partial
# output_token(rid, i) = 50_000 + (sum(map(ord, rid)) * 131 + 7 * i) % 10_000; ord("a") = 97.
A0, A1 = 52_707, 52_714


def driver() -> Driver:
    return Driver(handle(FakeManager), SPEC)


def test_output_tokens_are_a_function_of_request_and_position() -> None:
    assert [output_token("a", 0), output_token("a", 1)] == [A0, A1]
    assert output_token("b", 0) == 52_838  # 98 * 131 = 12_838


def test_prefill_in_chunks_then_decode_then_free() -> None:
    d = driver()
    answers = d.run([add("a", range(1, 7)), schedule("a", 4), schedule("a"), decode("a", 2),
                     free("a")])
    # Block ids one list per group (one group here); the log shows the adapter's flat lists.
    assert answers == [{}, {"hits": ([[]], 0), "new": [[0]]}, {"new": [[1]]}, {"new": [[]]}, {}]
    assert d.lines == [
        "views['a'] = RequestView('a', (1, 2, 3, 4, 5, 6))",
        "m.get_computed_blocks(views['a'])  # -> ([], 0)",
        "m.allocate_slots(views['a'], 4, 0, [])  # -> [0]",
        "views['a'] = replace(views['a'], num_computed_tokens=4)",
        "m.allocate_slots(views['a'], 2, 0, [])  # -> [1]",  # running: no lookup again
        "views['a'] = replace(views['a'], num_computed_tokens=6)",
        f"views['a'] = replace(views['a'], output_token_ids=({A0}, {A1}))",
        "m.allocate_slots(views['a'], 2, 0, [])  # -> []",
        "views['a'] = replace(views['a'], num_computed_tokens=8)",
        "m.free('a')  # -> None",
    ]
    assert d.last_call == {"get_computed_blocks": 1, "allocate_slots": 7, "free": 9}
    # Freed: not running, computed count back to 0, sampled tokens kept (preemption).
    assert d.running == set()
    assert d.views["a"] == RequestView("a", (1, 2, 3, 4, 5, 6), (A0, A1), 0)


def test_schedule_after_the_prompt_decodes() -> None:
    """Once the prompt is computed, ``schedule`` samples n tokens (1 when n is None)."""
    d = driver()
    d.run([add("a", [1, 2, 3, 4]), schedule("a")])
    assert d.apply(schedule("a")) == {"new": [[1]]}
    assert d.apply(schedule("a", 3)) == {"new": [[]]}
    view = d.views["a"]
    assert view.output_token_ids == (A0, A1, output_token("a", 2), output_token("a", 3))
    assert view.num_computed_tokens == 8


def test_request_extras_reach_the_view_and_the_log() -> None:
    d = driver()
    d.apply(add("b", [1, 2], lora=("l", 1, "/p"), mm=[("img", 0, 2)], salt="s",
                skip_read=True))
    assert d.views["b"] == RequestView("b", (1, 2), lora=("l", 1, "/p"),
                                       mm_features=(("img", 0, 2),), cache_salt="s",
                                       skip_reading_prefix_cache=True)
    assert d.lines == [("views['b'] = RequestView('b', (1, 2), lora=('l', 1, '/p'), "
                       "mm_features=(('img', 0, 2),), cache_salt='s', "
                       "skip_reading_prefix_cache=True)")]


def test_hits_are_passed_back_and_count_as_computed() -> None:
    d = driver()
    d.run([add("a", PROMPT), schedule("a"), add("b", PROMPT)])
    assert d.apply(schedule("b")) == {"hits": ([[0, 1]], 8), "new": [[3]]}
    assert d.lines[-3:] == ["m.get_computed_blocks(views['b'])  # -> ([0, 1], 8)",
                            "m.allocate_slots(views['b'], 1, 8, [0, 1])  # -> [3]",
                            "views['b'] = replace(views['b'], num_computed_tokens=9)"]
    assert d.tables() == {"a": [[0, 1, 2]], "b": [[0, 1, 3]]}


def test_failed_allocation_changes_nothing_on_the_driver_side() -> None:
    d = driver()
    d.apply(add("a", range(40)))  # 10 blocks of an 8-block pool
    assert d.apply(schedule("a")) == {"hits": ([[]], 0), "new": None}
    assert d.running == set() and d.views["a"].num_computed_tokens == 0
    assert d.lines[-1] == "m.allocate_slots(views['a'], 40, 0, [])  # -> None"


def test_preempted_request_is_looked_up_again_with_its_sampled_tokens() -> None:
    d = driver()
    d.run([add("a", PROMPT), schedule("a"), decode("a"), free("a")])
    # 10 tokens now; blocks 0 and 1 are cached, and 8 <= 10 - 1.
    assert d.apply(schedule("a")) == {"hits": ([[0, 1]], 8), "new": [[3]]}
    assert d.lines[-3:-1] == ["m.get_computed_blocks(views['a'])  # -> ([0, 1], 8)",
                              "m.allocate_slots(views['a'], 2, 8, [0, 1])  # -> [3]"]
    assert d.views["a"].num_computed_tokens == 10
    assert d.views["a"].output_token_ids == (A0,)


def test_reset_answers_what_the_manager_said() -> None:
    d = driver()
    d.run([add("a", PROMPT), schedule("a")])
    assert d.apply(reset()) == {"reset": False}  # a request holds blocks
    d.apply(free("a"))
    assert d.apply(reset()) == {"reset": True}
    assert d.lines[-1] == "m.reset_prefix_cache()  # -> True"


def test_unknown_op_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown op 'bogus' in \{'op': 'bogus'\}"):
        driver().apply({"op": "bogus"})


class Boom(FakeManager):
    def allocate_slots(self, *args: Any, **kwargs: Any) -> list[int] | None:
        raise RuntimeError("boom")


def test_a_raising_call_is_logged_and_propagates() -> None:
    d = Driver(handle(Boom), SPEC)
    d.apply(add("a", PROMPT))
    with pytest.raises(RuntimeError, match="boom"):
        d.apply(schedule("a"))
    assert d.lines[-1] == "m.allocate_slots(views['a'], 9, 0, [])  # raised RuntimeError"
    assert "allocate_slots" not in d.last_call  # only answered calls can be compared


def test_pool_facts_read_at_construction() -> None:
    d = Driver(handle(FakeManager, caps=frozenset({"manager"}), reserved=(0,)), SPEC)
    assert d.initial_free == 8  # what the fresh pool says, whatever is reserved
    assert d.reserved == frozenset({0}) and d.ordinary_block_ids == tuple(range(1, 8))
    assert d.capabilities == frozenset({"manager"})
    vllm = Driver(handle(FakeManager, caps=frozenset({"manager"})),
                  replace(SPEC, profile="vllm-0.33"))
    assert vllm.capabilities == frozenset({"manager"}) | DESIGN_CAPABILITIES
    assert vllm.reserved == frozenset({0})  # the vLLM profiles' null block by default


def test_hit_problems_wait_until_taken_once() -> None:
    d = Driver(handle(HitsWholePrompt), SPEC)
    d.run([add("a", range(1, 9)), schedule("a"), add("b", range(1, 9))])
    assert d.take_law_problems() == []
    d.apply(schedule("b"))
    problems = d.take_law_problems()
    assert len(problems) == 1 and problems[0].startswith("hit cap: get_computed_blocks('b')")
    assert d.take_law_problems() == []


# ---------------------------------------------------------------------- the repro program
def test_snippet_for_a_broken_law_exits_with_its_first_line() -> None:
    d = driver()
    d.run([add("a", [1, 2]), schedule("a")])
    lines = d.snippet("conservation: x\nsecond line").splitlines()
    assert lines[:9] == [
        "# kvcheck repro:",
        "#   conservation: x",
        "#   second line",
        "import sys",
        "from dataclasses import replace",
        "from kvcheck.conformance.protocol import KVCacheSpec, RequestView",
        lines[6],  # the loader import: its module is moving (see below)
        ("m = load_impl('harness_fakes').make_manager(KVCacheSpec(**{'num_blocks': 8, "
        "'block_size': 4, 'enable_caching': True, 'hash_algo': 'sha256', 'pythonhashseed': "
        "'0', 'enable_kv_cache_events': False, 'max_model_len': None, 'profile': 'generic'}))"),
        "views = {}",
    ]
    assert lines[6].startswith("from kvcheck.") and lines[6].endswith(".loader import load_impl")
    assert lines[9:] == [*d.lines, "sys.exit('kvcheck repro: conservation: x')"]


def test_snippet_check_on_a_call_names_its_last_answer() -> None:
    d = driver()
    d.run([add("a", range(1, 7)), schedule("a", 4), schedule("a")])
    check = Check("allocate_slots answer", [9], call="allocate_slots",
                  normalize="None if {0} is None else list({0})")
    lines = d.snippet("differs", check).splitlines()
    body = lines[lines.index("views = {}") + 1:]
    assert body[2] == "m.allocate_slots(views['a'], 4, 0, [])  # -> [0]"  # an earlier call
    assert body[4] == "got = m.allocate_slots(views['a'], 2, 0, [])  # -> [1]"  # the last one
    assert body[6:] == [
        "what = 'allocate_slots answer'",
        "got = None if got is None else list(got)",
        "expected = [9]",
        "if got != expected:",
        ('    sys.exit(f"kvcheck repro: {what} differs:\\n  expected {expected!r}\\n'
        '  got      {got!r}")'),
        "print('kvcheck repro: no divergence (fixed?)')",
    ]


def run_snippet(text: str) -> str | None:
    """Execute a repro in this process; the message it exits with (None: it ran through)."""
    try:
        exec(compile(text, "<repro>", "exec"), {"__name__": "__repro__"})
    except SystemExit as exc:
        return str(exc.code)
    return None


def test_snippet_replays_and_compares_an_expression(capsys: pytest.CaptureFixture[str]) -> None:
    """The repro loads ``harness_fakes`` (a loadable implementation), replays the calls and
    compares the value of the expression with the expected one."""
    d = driver()
    d.run([add("a", PROMPT), schedule("a"), free("a")])
    wrong = Check("free queue", [1, 2, 3], expression="list(m.free_block_ids())")
    assert run_snippet(d.snippet("", wrong)) == (
        "kvcheck repro: free queue differs:\n  expected [1, 2, 3]\n"
        "  got      [3, 4, 5, 6, 7, 2, 1, 0]")
    right = replace(wrong, expected=[3, 4, 5, 6, 7, 2, 1, 0])
    assert run_snippet(d.snippet("", right)) is None
    assert capsys.readouterr().out == "kvcheck repro: no divergence (fixed?)\n"
