"""The stream checker (``kvcheck.events.stream_check``): the reference's own streams hold
every law in both releases and hash forms, and each fault a consumer meets (a lost batch, a
restart, a duplicate, a removal of what was never stored, a sparse group's token count in a
dense group, another release's bytes...) is named with its message, seq, event, field and
rule."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("msgspec")

from kvcheck.events import encode_batch
from kvcheck.events.frames import Frame, pack_frame
from kvcheck.events.stream_check import StreamReport, check_stream
from kvcheck.events.workload import manager_streams
from kvcheck.reference_impl.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

A, B, C = (bytes([n]) * 32 for n in (1, 2, 3))
FULL = (("full_attention", None),)


def _messages(batches: list[tuple[KVCacheEvent, ...]], *, release: str = "vllm-0.33",
              first_seq: int = 0, int_hashes: bool = True, rank: int | None = 0,
              meta: tuple[tuple[str, int | None], ...] | None = FULL) -> list[list[bytes]]:
    return [pack_frame(Frame(b"", first_seq + n, encode_batch(
                events, ts=float(n), data_parallel_rank=rank, release=release,  # type: ignore[arg-type]
                int_hashes=int_hashes, group_metadata=meta if release == "vllm-0.33" else None)))
            for n, events in enumerate(batches)]


def _store(*hashes: bytes, parent: bytes | None = None, tokens: int | None = None,
           group: int = 0) -> BlockStored:
    count = len(hashes) * 2 if tokens is None else tokens
    return BlockStored(hashes, parent, tuple(range(count)), 2, None, group_idx=group)


def _rules(report: StreamReport) -> list[str]:
    return [finding.rule for finding in report.findings]


@pytest.mark.parametrize(("release", "int_hashes"), [
    ("vllm-0.33", True), ("vllm-0.33", False), ("vllm-0.10", True), ("vllm-0.10", False)])
def test_the_references_streams_hold_every_law(release: str, int_hashes: bool) -> None:
    checked = removals = 0
    for stream in itertools.islice(manager_streams(release, 11), 25):
        batches = list(stream)
        messages = [pack_frame(Frame(b"", seq, encode_batch(
            b.events, ts=float(seq), data_parallel_rank=0, release=release,  # type: ignore[arg-type]
            int_hashes=int_hashes,
            group_metadata=b.group_metadata if release == "vllm-0.33" else None)))
            for seq, b in enumerate(batches)]
        report = check_stream(messages, release)  # type: ignore[arg-type]
        assert report.ok, report.render()
        assert report.not_checkable == 0  # from seq 0 on, every removal and parent is known
        checked += report.batches
        removals += report.events_per_kind["BlockRemoved"]
    assert checked > 300 and removals > 100  # the laws had something to bite on


def test_a_lost_batch_is_a_gap_with_its_range_and_later_removals_are_not_blamed() -> None:
    messages = _messages([(_store(A),), (_store(B),), (_store(C),), (BlockRemoved((B,)),)])
    report = check_stream([messages[0], messages[3]], "vllm-0.33")
    assert _rules(report) == ["sequence-gap"]
    assert report.gaps == [(1, 2)]
    assert "seq 1..2 missing (2 batches lost" in str(report.findings[0])
    assert report.not_checkable == 1  # B's removal: stored in the lost batch, maybe
    assert "gap: seq 1..2 missing (2 batches)" in report.render()


def test_after_a_gap_all_blocks_cleared_makes_the_index_exact_again() -> None:
    messages = _messages([(_store(A),), (_store(B),), (AllBlocksCleared(),),
                          (BlockRemoved((A,)),)])
    report = check_stream([messages[0], messages[2], messages[3]], "vllm-0.33")
    assert _rules(report) == ["sequence-gap", "removed-unknown"]
    assert report.findings[1].seq == 3 and report.findings[1].field == "block_hashes[0]"


def test_a_restart_clears_the_index_and_is_reported() -> None:
    first = _messages([(_store(A),), (_store(B, parent=A),)])
    second = _messages([(_store(C),), (BlockRemoved((A,)),)])
    report = check_stream(first + second, "vllm-0.33")
    assert _rules(report) == ["sequence-restart", "removed-unknown"]
    assert report.restarts == 1 and report.runs == [[0, 1], [0, 1]]
    assert "seq 0..1, then 0..1, 0 gaps, 1 restarts" in report.render()
    assert "from 1 back to 0: the publisher restarted" in report.findings[0].detail


def test_a_duplicate_delivery_is_reported_and_not_applied_twice() -> None:
    messages = _messages([(_store(A),), (BlockRemoved((A,)),), (_store(B),)])
    report = check_stream([messages[0], messages[1], messages[1], messages[2]], "vllm-0.33")
    # Applied twice, the second removal of A would also be a removed-unknown finding.
    assert _rules(report) == ["sequence-duplicate"]
    assert report.duplicates == 1 and report.findings[0].message == 2


def test_removing_what_was_never_stored_or_removing_it_twice() -> None:
    report = check_stream(_messages([(_store(A),), (BlockRemoved((A,)),),
                                     (BlockRemoved((A, B)),)]), "vllm-0.33")
    assert _rules(report) == ["removed-unknown", "removed-unknown"]
    assert [(f.seq, f.event_index, f.field) for f in report.findings] == [
        (2, 0, "block_hashes[0]"), (2, 0, "block_hashes[1]")]
    assert "never stored, or removed once more than stored" in report.findings[0].detail


def test_a_hash_on_two_physical_blocks_is_removed_once_per_copy() -> None:
    # vLLM stores a hash once per physical copy and removes it once per copy evicted
    # (vLLM PR #55092): the index counts copies.
    ok = check_stream(_messages([(_store(A), _store(A)), (BlockRemoved((A,)),),
                                 (_store(B, parent=A),), (BlockRemoved((A,)),)]), "vllm-0.33")
    assert ok.ok, ok.render()
    report = check_stream(_messages([(_store(A),), (BlockRemoved((A,)),),
                                     (_store(B, parent=A),)]), "vllm-0.33")
    assert _rules(report) == ["parent-unknown"]
    assert report.findings[0].field == "parent_block_hash"


def test_a_partial_block_store_may_name_a_parent_the_stream_never_stored() -> None:
    """vLLM 0.33's partial-block store (block_size the hash block's, smaller than the group's
    full stores) names the chain hash one hash block earlier as parent: not a finding. The same
    unknown parent on a store at the group's block size still is."""
    full = BlockStored((A,), None, tuple(range(4)), 4, None, group_idx=0)
    partial = BlockStored((B,), C, (8, 9), 2, None, group_idx=0)
    ok = check_stream(_messages([(full, partial), (BlockRemoved((A, B)),)]), "vllm-0.33")
    assert ok.ok, ok.render()
    orphan = BlockStored((B,), C, tuple(range(4)), 4, None, group_idx=0)
    report = check_stream(_messages([(full, orphan)]), "vllm-0.33")
    assert _rules(report) == ["parent-unknown"]


def test_removals_and_stores_are_per_group_and_medium() -> None:
    meta = (("full_attention", None), ("full_attention", None))
    report = check_stream(_messages([(_store(A),), (BlockRemoved((A,), group_idx=1),),
                                     (BlockRemoved((A,), medium="CPU"),)], meta=meta),
                          "vllm-0.33")
    assert _rules(report) == ["removed-unknown", "removed-unknown"]
    assert "group 1" in report.findings[0].detail
    assert "medium 'CPU'" in report.findings[1].detail


def test_a_stream_joined_late_checks_nothing_it_cannot_know() -> None:
    report = check_stream(_messages([(BlockRemoved((A,)),), (_store(C, parent=B),)],
                                    first_seq=7), "vllm-0.33")
    assert report.ok and report.not_checkable == 2 and report.first_seq == 7
    assert "2 removals or parents not checkable" in report.render()


def test_token_counts_dense_groups_exact_sparse_groups_at_least() -> None:
    meta = (("full_attention", None), ("sliding_window", 4))
    sparse = _store(B, tokens=6, group=1)  # 3 blocks of tokens, 1 hash: null blocks skipped
    ok = check_stream(_messages([(sparse,)], meta=meta), "vllm-0.33")
    assert ok.ok, ok.render()
    report = check_stream(_messages([(_store(A, tokens=6),), (_store(C, tokens=3),),
                                     (_store(A, B, tokens=2),)], meta=meta), "vllm-0.33")
    assert _rules(report) == ["token-count"] * 3
    details = [f.detail for f in report.findings]
    assert details[0].startswith("3 block(s) of token_ids but 1 hashes in a full_attention "
                                 "group")
    assert details[1].startswith("3 token_ids do not fill whole blocks of 2")
    assert details[2].startswith("2 hashes for 1 block(s) of token_ids")


def test_a_groups_kind_may_not_change() -> None:
    first = _messages([(_store(A),)], meta=(("full_attention", None),))
    second = _messages([(_store(B),)], first_seq=1, meta=(("sliding_window", 4),))
    report = check_stream(first + second, "vllm-0.33")
    assert _rules(report) == ["group-metadata"]
    assert report.findings[0].field == "kv_cache_spec_kind"


def test_frames_topic_and_rank() -> None:
    good = _messages([(_store(A),), (_store(B),), (_store(C),)])
    other_topic = [b"kv@pod", *good[1][1:]]
    other_rank = _messages([(_store(C),)], first_seq=2, rank=1)[0]
    report = check_stream([good[0][:2], other_topic, other_rank], "vllm-0.33")
    assert _rules(report) == ["frame", "topic", "data-parallel-rank"]
    assert "2 frames; vLLM's publisher sends 3" in report.findings[0].detail
    assert report.findings[0].seq is None
    assert "data_parallel_rank 1, but the stream's is 0" in report.findings[2].detail


def test_another_releases_bytes_and_a_change_of_hash_form_are_payload_findings() -> None:
    old = _messages([(_store(A),)], release="vllm-0.10")
    report = check_stream(old, "vllm-0.33")
    assert _rules(report) == ["payload"]
    assert "vllm-0.10" in report.findings[0].detail  # the decoder names the other form
    mixed = _messages([(_store(A),)]) + _messages([(_store(B),)], first_seq=1,
                                                  int_hashes=False)
    report = check_stream(mixed, "vllm-0.33")
    assert _rules(report) == ["payload"] and report.hash_form == "int"


def test_the_summary_counts_events_per_kind_and_group() -> None:
    meta = (("full_attention", None), ("sliding_window", 4))
    report = check_stream(_messages([(_store(A), _store(B, group=1)),
                                     (BlockRemoved((A,)), AllBlocksCleared())], meta=meta),
                          "vllm-0.33")
    text = report.render("s.kvcap")
    assert "events: BlockStored 2, BlockRemoved 1, AllBlocksCleared 1" in text
    assert "group 0 (full_attention): 1 stored, 1 removed" in text
    assert "group 1 (sliding_window, window 4): 1 stored, 0 removed" in text
    assert text.rstrip().endswith("stream laws: all hold on 2 messages, 4 events")
