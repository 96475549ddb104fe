"""Bad indexers and bad input around them: every broken rule of the indexer protocol fails
naming the call, the answer and the rule (``kvcheck.conformance.indexer_guard``); a module that
cannot be an indexer is a usage error naming the fix (``load_indexers``); an indexer that raises
or hangs fails its tests and the session goes on; a file that is not an indexer trace is an
input error, not an indexer failure."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kvcheck.conformance.call_limit import AdapterTimeout, CallLimit
from kvcheck.conformance.guard import ProtocolViolation
from kvcheck.conformance.indexer_driver import IndexerMismatch, replay_indexer_trace
from kvcheck.conformance.indexer_guard import GuardedIndexer
from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext
from kvcheck.conformance.loader import ImplLoadError, load_indexers
from kvcheck.errors import KVCheckInputError

pytest_plugins = ["pytester"]

CONFIG = IndexerConfig(block_size=4)


class Answering:
    """An indexer whose ``match`` returns ``answer`` and whose apply returns ``applied``."""

    def __init__(self, answer: Any, applied: Any = None) -> None:
        self.answer, self.applied = answer, applied

    def apply_batch(self, worker_id: str, seq: int, payload: bytes, replay: bool = False) -> Any:
        return self.applied

    def apply_events(self, worker_id: str, seq: int, batch: Any, replay: bool = False) -> Any:
        batch["events"].append({"type": "AllBlocksCleared"})  # writes into what it was given

    def match(self, token_ids: Any, context: Any) -> Any:
        return self.answer

    def remove_worker(self, worker_id: str) -> Any:
        return None


def guarded(raw: Any, *, decoded: bool = False, limit: float = 0) -> GuardedIndexer:
    index = GuardedIndexer(raw, impl="fake", config=CONFIG, limit=CallLimit(limit, "fake"),
                           decoded=decoded)
    index.deliver("w0", 0, b"", {"ts": 0.0, "events": [], "data_parallel_rank": None}, False)
    return index


@pytest.mark.parametrize(("answer", "rule"), [
    ([("w0", 1)], "must be a mapping of worker id to matched blocks, not a list"),
    (None, "must be a mapping of worker id to matched blocks, not a NoneType"),
    ({0: 1}, "worker ids are str, got 0"),
    ({"w9": 1}, "names worker 'w9', which never sent a batch (known workers: ['w0'])"),
    ({"w0": -1}, "worker 'w0': matched blocks must be an int in [0, 2]"),
    ({"w0": 3}, "worker 'w0': matched blocks must be an int in [0, 2]"),
    ({"w0": True}, "worker 'w0': matched blocks must be an int in [0, 2]"),
    ({"w0": 1.0}, "worker 'w0': matched blocks must be an int in [0, 2]"),
])
def test_bad_match_answers_are_protocol_violations(answer: Any, rule: str) -> None:
    with pytest.raises(ProtocolViolation) as info:
        guarded(Answering(answer)).match(list(range(9)), MatchContext())
    message = str(info.value)
    assert message.startswith("fake.match(") and rule in message, message


def test_a_removed_worker_may_not_be_named() -> None:
    index = guarded(Answering({"w0": 1}))
    index.remove_worker("w0")
    with pytest.raises(ProtocolViolation, match="names worker 'w0', which was removed"):
        index.match(list(range(9)), MatchContext())


def test_apply_must_return_none() -> None:
    index = guarded(Answering({}))
    index.raw.applied = 7
    with pytest.raises(ProtocolViolation, match=r"fake.apply_batch\('w0', 1, '<0 bytes>', "
                                                r"False\) returned 7: must return None"):
        index.deliver("w0", 1, b"", {}, False)


def test_an_index_that_changes_the_batch_it_was_given_is_refused() -> None:
    with pytest.raises(ProtocolViolation, match="changed the batch it was given"):
        guarded(Answering({}), decoded=True)


def test_an_index_that_hangs_fails_with_the_call_named() -> None:
    class Hanging(Answering):
        def match(self, token_ids: Any, context: Any) -> Any:
            while True:
                pass

    with pytest.raises(AdapterTimeout, match=r"fake\.match"):
        guarded(Hanging({}), limit=0.3).match([1, 2, 3, 4], MatchContext())


# ------------------------------------------------------------------------------ loading
MODULES = {
    "no_factory": 'IMPL_INFO = ImplInfo("nf", "1", frozenset({"indexer", "int_hashes"}))\n',
    "no_form": 'IMPL_INFO = ImplInfo("nh", "1", frozenset({"indexer"}))\n'
               "def make_indexer(config):\n    return None\n",
    "no_match": 'IMPL_INFO = ImplInfo("nm", "1", frozenset({"indexer", "int_hashes"}))\n'
                "class I:\n    def apply_batch(self, w, s, p, replay=False): pass\n"
                "def make_indexer(config):\n    return I()\n",
    "replay_alone": 'IMPL_INFO = ImplInfo("ra", "1", frozenset({"manager", "replay"}))\n',
    "crashing": 'IMPL_INFO = ImplInfo("cr", "1", frozenset({"indexer", "int_hashes"}))\n'
                "def make_indexer(config):\n    raise RuntimeError('boom')\n",
}


@pytest.mark.parametrize(("module", "problem", "fix"), [
    ("no_factory", "capability 'indexer' is declared but the module has no make_indexer",
     "define def make_indexer(config: IndexerConfig)"),
    ("no_form", "declares 'indexer' but neither 'int_hashes' nor 'bytes_hashes'",
     "declare the forms the index reads"),
    ("no_match", ("capability 'indexer' is declared but the indexer (I) lacks match, "
                  "remove_worker"), "implement match, remove_worker"),
    ("replay_alone", "declares 'replay' without 'indexer'", "declare 'indexer' as well"),
    ("crashing", "make_indexer(IndexerConfig(block_size=4",
     "make_indexer must build an index for any config it supports"),
    ("kvcheck.adapters.reference", "IMPL_INFO does not declare 'indexer'",
     "managers to --kv-impl"),
])
def test_modules_that_cannot_be_indexers_are_usage_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, problem: str,
        fix: str) -> None:
    if module in MODULES:
        (tmp_path / f"idx_{module}.py").write_text(
            "from kvcheck.conformance.protocol import ImplInfo\n" + MODULES[module],
            encoding="utf-8")
        module = f"idx_{module}"
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplLoadError) as info:
        load_indexers(module, search=(tmp_path,))
    message = str(info.value)
    assert message.startswith(f"kvcheck: --kv-indexer={module}: "), message
    problem_text, _, fix_text = message.partition("\n  Fix: ")
    assert problem in problem_text and fix in fix_text, message


@pytest.mark.parametrize("value", ["", ",", "reference,,"])
def test_an_empty_indexer_list_is_a_usage_error(value: str) -> None:
    with pytest.raises(ImplLoadError, match="the indexer list is empty or has an empty entry"):
        load_indexers(value)


# ------------------------------------------------------------------------------ sessions
RAISING = textwrap.dedent("""\
    from kvcheck.adapters.reference_indexer import *  # noqa: F403
    from kvcheck.adapters.reference_indexer import IMPL_INFO as _INFO, ReferenceIndexer
    import dataclasses
    IMPL_INFO = dataclasses.replace(_INFO, name="raising")
    class Raising(ReferenceIndexer):
        def match(self, token_ids, context):
            raise ZeroDivisionError("the index broke")
    def make_indexer(config):
        return Raising(config)
    """)


def test_a_raising_indexer_fails_its_tests_and_the_session_ends(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(raising=RAISING)
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("--kv-indexer=raising", "--kv-max-examples=3",
                                           "-p", "no:cacheprovider", "-k", "sequence_reset or "
                                           "removed_worker")
    result.stdout.fnmatch_lines(["*ZeroDivisionError: the index broke*",
                                 "*verdict: raising does NOT conform to vllm-0.33*"])
    assert result.ret == 1


def test_a_name_shared_by_an_implementation_and_an_indexer_is_a_usage_error(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(twin="from kvcheck.adapters.reference_indexer import *  # noqa: F403\n"
                             "import dataclasses\n"
                             "IMPL_INFO = dataclasses.replace(IMPL_INFO, name='reference')\n")
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("--kv-impl=reference", "--kv-indexer=twin",
                                           "-p", "no:cacheprovider")
    result.stderr.re_match_lines([r".*implementations share the name\(s\) \['reference'\]"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


# ------------------------------------------------------------------------------ traces
def test_a_file_that_is_not_an_indexer_trace_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "t.indexer.json"
    path.write_text(json.dumps({"trace_version": 1, "ops": []}), encoding="utf-8")
    with pytest.raises(KVCheckInputError, match=r"not an indexer trace \(KeyError"):
        replay_indexer_trace(path)
    path.write_text("{", encoding="utf-8")
    with pytest.raises(KVCheckInputError, match="not an indexer trace"):
        replay_indexer_trace(path)
    good = {"indexer_trace_version": 1, "impl": "reference", "config": {"block_size": 4},
            "probe": {"tokens": [1], "context": {"lora": None, "cache_salt": None,
                                                 "mm_features": []}}, "expected": {}}
    for action, problem in (({"deliver": "w0", "seq": 0, "replay": False, "payload": "zz"},
                             "non-hexadecimal"),
                            ({"deliver": "w0", "seq": -1, "replay": False, "payload": ""},
                             "an int seq >= 0")):
        path.write_text(json.dumps({**good, "actions": [action]}), encoding="utf-8")
        with pytest.raises(KVCheckInputError, match=problem):
            replay_indexer_trace(path)


def test_a_failure_writes_a_trace_that_replays_the_failure(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant's failing run writes a trace; replayed on the mutant it fails the same way,
    on the reference index it answers the truth."""
    mutants = Path(__file__).resolve().parent.parent / "indexers"
    monkeypatch.setenv("PYTHONPATH", str(mutants))
    monkeypatch.syspath_prepend(str(mutants))
    result = pytester.runpytest_subprocess(
        "--kv-indexer=mut_idx_all_cleared_ignored", "-p", "no:cacheprovider",
        "-k", "all_blocks_cleared")
    assert result.ret == 1
    traces = list((pytester.path / ".kvcheck" / "repro").glob("*.indexer.json"))
    assert len(traces) == 1, traces
    with pytest.raises(IndexerMismatch, match="worker 'w0': 3 block"):
        replay_indexer_trace(traces[0], "mut_idx_all_cleared_ignored")
    assert replay_indexer_trace(traces[0], "kvcheck.adapters.reference_indexer") == {"w1": 3}


@pytest.mark.parametrize(("fields", "problem"), [
    ({"num_hash_lookahead_tokens": -1}, "must be an int >= 0, got -1"),
    ({"num_hash_lookahead_tokens": True}, "must be an int >= 0, got True"),
    ({"num_hash_lookahead_tokens": 1.0}, "must be an int >= 0, got 1.0"),
    ({"num_hash_lookahead_tokens": 2, "release": "vllm-0.10"},
     "vLLM 0.10.2 hashes without lookahead"),
])
def test_impossible_hash_lookahead_is_refused(fields: dict[str, Any], problem: str) -> None:
    """A lookahead no vLLM worker hashes with is refused when the config is built, naming the
    field and the fix."""
    with pytest.raises(KVCheckInputError, match=problem):
        IndexerConfig(block_size=4, **fields)


def test_the_wire_and_traces_leave_a_zero_lookahead_out() -> None:
    """``config_to_dict``: an index written before ``num_hash_lookahead_tokens`` existed gets
    the config it always got; a non-zero lookahead is sent, and read back the same."""
    from kvcheck.conformance.indexer_protocol import config_to_dict

    assert "num_hash_lookahead_tokens" not in config_to_dict(CONFIG)
    config = IndexerConfig(block_size=4, num_hash_lookahead_tokens=2)
    assert config_to_dict(config)["num_hash_lookahead_tokens"] == 2
    assert IndexerConfig(**config_to_dict(config)) == config  # type: ignore[arg-type]
