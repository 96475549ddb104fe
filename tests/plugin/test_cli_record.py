"""`kvcheck record`: recording a corpus (written atomically), `--check` passing on an up-to-date
corpus and failing on a stale one with the trace and step named, and exit 2 on unusable
input."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from kv_helpers import reference_without_kernels

from kvcheck import atomic
from kvcheck.conformance.recorded import decode_corpus, encode_corpus, load_corpus
from kvcheck.conformance.recorder import (
    DEFAULT_TRACES,
    default_traces,
    trace_indices,
    trace_plan,
)
from kvcheck.plugin import cli
from kvcheck.plugin.cli import main


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two traces of the reference under vllm-0.10, recorded by the command."""
    path = tmp_path_factory.mktemp("corpus") / "ref.cbor.xz"
    assert main(["record", "--kv-impl=reference", "--kv-profile=vllm-0.10", "--traces", "2",
                 "--seed", "3", "-o", str(path)]) == 0
    return path


def test_record_writes_a_loadable_corpus(corpus_file: Path) -> None:
    corpus = load_corpus(corpus_file)
    header = corpus["header"]
    assert (header["profile"], header["impl"], header["target"], header["seed"],
            header["traces"]) == ("vllm-0.10", "reference", "reference", 3, 2)
    assert [t["name"] for t in corpus["traces"]] == [trace_plan(i, "vllm-0.10").name
                                                     for i in range(2)]
    # Every state field the reference declares was recorded on the first trace (events on).
    assert corpus["traces"][0]["fields"] == sorted(
        ["events", "free", "hashes", "queue", "refs", "tables"])
    assert [p.name for p in corpus_file.parent.iterdir()] == [corpus_file.name]  # no temp file


def test_check_passes_on_an_up_to_date_corpus(corpus_file: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "--check", str(corpus_file)]) == 0
    assert (f"kvcheck record: {corpus_file} is up to date: 2 traces"
            in capsys.readouterr().out)


def test_check_names_the_first_stale_step(corpus_file: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    corpus = load_corpus(corpus_file)
    stale = copy.deepcopy(corpus)
    trace = stale["traces"][1]
    index, step = next((i, s) for i, s in enumerate(trace["steps"])
                       if i >= 10 and "new" in s["answer"] and s["answer"]["new"])
    step["answer"]["new"] = [*step["answer"]["new"], 999]
    path = tmp_path / "stale.cbor.xz"
    path.write_bytes(encode_corpus(stale))
    assert main(["record", "--check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"kvcheck record: {path} is stale: recorded from reference" in out
    assert f"at trace {trace['name']}, step #{index + 1}: answer differs: shipped " in out
    assert (f"Fix: record it again: kvcheck record --kv-impl=reference --kv-profile=vllm-0.10 "
            f"--traces 2 --seed 3 -o {path}") in out


def test_check_of_a_broken_file_is_an_input_error(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.cbor.xz"
    path.write_bytes(b"not xz at all")
    assert main(["record", "--check", str(path)]) == 2
    assert "kvcheck record: " in capsys.readouterr().err


def test_failed_write_keeps_the_old_file(corpus_file: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The corpus is written to a temporary file and moved into place: a failure leaves the
    old file as it was and no temporary file behind."""
    target = tmp_path / "out.cbor.xz"
    target.write_bytes(b"old corpus")

    def refuse(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", refuse)
    assert main(["record", "--kv-impl=reference", "--kv-profile=vllm-0.33", "--traces", "1",
                 "-o", str(target), "--force"]) == 2  # --force: the old file is no corpus
    assert "cannot write" in capsys.readouterr().err
    assert target.read_bytes() == b"old corpus"
    assert os.listdir(tmp_path) == ["out.cbor.xz"]


@pytest.mark.parametrize(("argv", "message"), [
    (["record"], "pass -o PATH (record a corpus) or --check PATH"),
    (["record", "-o", "a", "--check", "b"], "one of the two"),
    (["record", "--kv-impl=reference", "--traces", "0", "-o", "x"], "--traces 0"),
    (["record", "--kv-impl=reference", "--kv-profile=generic", "-o", "x"],
     "--kv-profile=generic: a corpus records one vLLM profile"),
])
def test_bad_arguments(argv: list[str], message: str, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_default_trace_count_matches_the_recorder() -> None:
    assert cli._DEFAULT_TRACES == DEFAULT_TRACES


def test_the_default_records_the_traces_the_profile_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --traces, every planned trace the profile's vLLM runs: under vllm-0.10 the
    multi-group plans its release accepts, not those only 0.33 accepts (which come last);
    --check records the same traces again from the header's count."""
    path = tmp_path / "all.cbor.xz"
    assert main(["record", "--kv-impl=reference", "--kv-profile=vllm-0.10", "-o",
                 str(path)]) == 0
    corpus = load_corpus(path)
    count = default_traces("vllm-0.10")
    assert corpus["header"]["traces"] == count == DEFAULT_TRACES - 5
    assert trace_indices("vllm-0.10", count) == list(range(count))
    assert [t["name"] for t in corpus["traces"]] == [trace_plan(i, "vllm-0.10").name
                                                     for i in range(count)]
    assert sum(bool(t["spec"].get("kv_cache_groups")) for t in corpus["traces"]) == 7
    capsys.readouterr()
    assert main(["record", "--check", str(path)]) == 0
    assert f"up to date: {count} traces" in capsys.readouterr().out


def test_recorded_corpus_round_trips_through_bytes(corpus_file: Path) -> None:
    data = corpus_file.read_bytes()
    assert encode_corpus(decode_corpus(data, "x")) == data


def test_an_implementation_without_groups_is_told_which_traces_it_can_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The default traces include multi-group layouts: an implementation that does not
    declare kv_cache_groups is refused before anything is recorded, naming the first such
    trace, what it needs and the --traces that records the ones before it."""
    (tmp_path / "onegroup.py").write_text(reference_without_kernels(name="onegroup").replace(
        '- {"kernels"}', '- {"kernels", "kv_cache_groups", "sliding_window", '
        '"chunked_local_attention", "cross_attention", "mamba", "fine_grained_hits", '
        '"boundary_state_offloads", "mamba_checkpoints", "dcp", "prefix_match_unit", '
        '"mamba_dcp", "mamba_shared_prefix_checkpoint"}'),
        encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "c.cbor.xz"
    assert main(["record", "--kv-impl=onegroup", "--kv-profile=vllm-0.33", "-o",
                 str(out)]) == 2
    assert ("kvcheck record: trace 68 (t68-swa-chat-bs4-events) has several KV-cache groups "
            "and needs ['kv_cache_groups', 'sliding_window'], which onegroup does not declare; "
            "record the "
            "traces before it with --traces 68") in capsys.readouterr().err
    assert not out.exists()
