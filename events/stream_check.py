"""The laws a KV-event stream obeys on its own, checked message by message (``kvcheck events
check``; docs/events.md, "Checking a stream").

A subscriber sees ``[topic, seq, payload]`` messages (``kvcheck.events.frames``). Whatever the
engine, a stream a router can rebuild a prefix index from must satisfy:

* **frames**: three frames, an 8-byte sequence frame, one topic throughout;
* **sequence**: from the first message on, each ``seq`` is the previous + 1. A jump is a
  *gap* (batches lost, e.g. past the PUB high-water mark), reported with its range; ``seq``
  back to 0 is a publisher *restart* (a new engine process: an empty cache); any other step
  back, or a ``seq`` seen before, is a *duplicate* or out-of-order delivery;
* **payload**: every payload decodes as the release's ``KVEventBatch``, hashes in one form;
* **data-parallel rank**: one rank throughout (a subscriber of one DP rank's port);
* **removals**: every ``BlockRemoved`` hash is held by the index rebuilt so far: the stream
  stored it (in the same group and medium) and has not removed it as often as it stored it
  (vLLM stores a hash once per physical copy and removes it once per copy evicted);
* **parents**: in groups that cache every block, a ``BlockStored``'s ``parent_block_hash``
  is null or held by the index (in sliding-window and Mamba groups it is the request's hash
  before the first new block, whose block may be null or masked, so it is not checked);
* **token counts**: ``token_ids`` fills whole blocks, at least one per hash; exactly one per
  hash in groups whose kind (0.33's ``kv_cache_spec_kind``) keeps every block (full and MLA
  attention). Sliding-window and Mamba groups skip null and masked blocks in
  ``block_hashes`` but not in ``token_ids`` (the consumer bug of AMD Infera #98);
* **group metadata**: one ``kv_cache_spec_kind`` and sliding window per group;
* ``AllBlocksCleared`` empties the index (every group and medium).

The index is *exact* only while the whole history is known: from ``seq`` 0, or from an
``AllBlocksCleared`` or a restart. A stream joined later, or after a gap, still has every
other law checked; removals and parents it cannot know about are counted as not checkable,
never reported as violations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from kvcheck.events.codec import Release, decode_batch
from kvcheck.events.errors import WireFormatError
from kvcheck.events.frames import unpack_frame, unpack_seq
from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved, BlockStored

__all__ = ["DENSE_KINDS", "Finding", "StreamChecker", "StreamReport", "check_stream"]

#: ``kv_cache_spec_kind`` values whose groups cache every block of a request (no null or
#: masked block can sit between two hashes): exactly one hash per ``block_size`` tokens.
DENSE_KINDS: Final = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


@dataclass(frozen=True, slots=True)
class Finding:
    """One broken law: where (message number from 0, its ``seq``, event index and field
    where known), the rule's short name and what was seen."""

    message: int
    seq: int | None
    rule: str
    detail: str
    event_index: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = [f"message {self.message}"
                 + ("" if self.seq is None else f" (seq {self.seq})")]
        if self.event_index is not None:
            where.append(f"event {self.event_index}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return f"{', '.join(where)}: [{self.rule}] {self.detail}"


@dataclass
class StreamReport:
    """What a stream held and which laws it broke. ``ok`` only when no law is broken."""

    release: str
    messages: int = 0
    batches: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    #: ``[first, last]`` seq of each publisher run (a restart begins a new one).
    runs: list[list[int]] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    restarts: int = 0
    duplicates: int = 0
    data_parallel_rank: int | None = None
    hash_form: str | None = None
    events_per_kind: Counter[str] = field(default_factory=Counter)
    #: (group, event kind) -> count.
    events_per_group: Counter[tuple[int, str]] = field(default_factory=Counter)
    group_kinds: dict[int, tuple[str, int | None]] = field(default_factory=dict)
    #: Removals and parents not checkable because the history before them is unknown.
    not_checkable: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def render(self, source: str = "stream", most: int = 20) -> str:
        """A summary a person reads: counts, then the findings (the first ``most``)."""
        hashes = f", hashes in the {self.hash_form} form" if self.hash_form else ""
        lines = [f"kvcheck events check: {source}, {self.release}{hashes}"]
        seqs = ("no sequence numbers" if not self.runs
                else "seq " + ", then ".join(f"{a}..{b}" for a, b in self.runs))
        rank = ("" if self.data_parallel_rank is None
                else f", data-parallel rank {self.data_parallel_rank}")
        lines.append(f"  {self.messages} messages ({self.batches} batches decoded), {seqs}, "
                     f"{len(self.gaps)} gaps, {self.restarts} restarts, "
                     f"{self.duplicates} duplicates{rank}")
        kinds = ", ".join(f"{kind} {self.events_per_kind[kind]}" for kind in
                          ("BlockStored", "BlockRemoved", "AllBlocksCleared"))
        lines.append(f"  events: {kinds}")
        for group in sorted({g for g, _ in self.events_per_group}):
            kind, window = self.group_kinds.get(group, (None, None))
            label = f" ({kind}{'' if window is None else f', window {window}'})" if kind else ""
            lines.append(f"  group {group}{label}: "
                         f"{self.events_per_group[group, 'BlockStored']} stored, "
                         f"{self.events_per_group[group, 'BlockRemoved']} removed")
        for start, end in self.gaps:
            lines.append(f"  gap: seq {start}..{end} missing ({_batches(end - start + 1)})")
        events = sum(self.events_per_kind.values())
        unknown = (f"; {self.not_checkable} removals or parents not checkable (history "
                   "before them unknown)" if self.not_checkable else "")
        if self.ok:
            lines.append(f"stream laws: all hold on {self.messages} messages, {events} "
                         f"events{unknown}")
        else:
            lines.append(f"stream laws: BROKEN, {len(self.findings)} findings on "
                         f"{self.messages} messages{unknown}; the first:")
            lines.extend(f"  {finding}" for finding in self.findings[:most])
            if len(self.findings) > most:
                lines.append(f"  ... and {len(self.findings) - most} more")
        return "\n".join(lines) + "\n"


_Key = tuple[int, "str | None", bytes]  # (group, medium, hash)


def _batches(count: int) -> str:
    return f"{count} batch" if count == 1 else f"{count} batches"


class StreamChecker:
    """Feed messages in arrival order (``feed``), then read the ``report``.

    Args:
        release: the wire format (``"vllm-0.33"``, ``"vllm-0.10"``).
        int_hashes: require the int (True) or bytes (False) hash form; None takes the first
            batch's form and requires it from then on.
        data_parallel_rank: the rank the stream must carry; None takes the first batch's.
    """

    def __init__(self, release: Release, *, int_hashes: bool | None = None,
                 data_parallel_rank: int | None = None) -> None:
        self.report = StreamReport(release=release)
        self._release: Release = release
        self._int_hashes = int_hashes
        self._rank = data_parallel_rank
        self._rank_fixed = data_parallel_rank is not None
        self._topic: bytes | None = None
        self._seen: set[int] = set()
        self._index: Counter[_Key] = Counter()
        #: group -> the largest ``block_size`` of its stores so far (a smaller one is a
        #: partial-block store: ``_stored``).
        self._largest_block: dict[int | None, int] = {}
        self._exact = False

    # ------------------------------------------------------------------ messages
    def feed(self, parts: Sequence[bytes], source: str = "live") -> None:
        """Check one message (its frames as received; ``source`` ``"replay"`` for a replay
        reply without its empty delimiter, as ``kvcheck events capture`` keeps it)."""
        report = self.report
        number = report.messages
        report.messages += 1
        topic: bytes | None
        try:
            if source == "replay" and len(parts) == 2 and self._release == "vllm-0.10":
                # 0.10.2's replay replies carry no topic (vLLM #45174): [seq, payload].
                topic, seq, payload = None, unpack_seq(parts[0], "message"), bytes(parts[1])
            else:
                frame = unpack_frame(parts, where="message")
                topic, seq, payload = frame.topic, frame.seq, frame.payload
        except WireFormatError as error:
            detail = str(error).removeprefix("message: ")
            if source == "replay" and len(parts) == 2:
                detail += (" (a replay reply without its topic frame: vLLM 0.10.2's form, "
                           "vLLM #45174; check it with --format vllm-0.10)")
            self._find(number, None, "frame", detail)
            return
        if topic is None:
            pass
        elif self._topic is None:
            self._topic = topic
        elif topic != self._topic:
            self._find(number, seq, "topic", f"topic {topic!r}, but the stream's first "
                       f"message had {self._topic!r}")
        if not self._sequence(number, seq):
            return
        try:
            batch = decode_batch(payload, release=self._release,
                                 int_hashes=self._int_hashes)
        except WireFormatError as error:
            self._find(number, seq, "payload", str(error), error.event_index, error.field)
            return
        report.batches += 1
        self._check_rank(number, seq, batch.data_parallel_rank)
        forms = {isinstance(h, int) for e in batch.wire_events
                 for h in getattr(e, "block_hashes", ())}
        if forms and self._int_hashes is None:
            self._int_hashes = forms.pop()  # decode_batch refuses mixed forms in one batch
            report.hash_form = "int" if self._int_hashes else "bytes"
        for index, (event, wire) in enumerate(zip(batch.events, batch.wire_events, strict=True)):
            self._event(number, seq, index, event, wire)

    def _sequence(self, number: int, seq: int) -> bool:
        """The sequence law; False when the message is not to be applied (a duplicate)."""
        report = self.report
        last = report.last_seq
        if last is None:
            report.first_seq = seq
            report.runs.append([seq, seq])
            self._exact = seq == 0
        elif seq == last + 1:
            pass
        elif seq == 0:
            report.restarts += 1
            self._find(number, seq, "sequence-restart",
                       f"seq went from {last} back to 0: the publisher restarted (a new engine "
                       "process, an empty cache); the index is cleared")
            self._index.clear()
            self._seen.clear()
            self._exact = True
            report.runs.append([0, 0])
        elif seq in self._seen:
            report.duplicates += 1
            self._find(number, seq, "sequence-duplicate",
                       f"seq {seq} was delivered before; this copy is not applied")
            return False
        elif seq > last:
            report.gaps.append((last + 1, seq - 1))
            self._find(number, seq, "sequence-gap",
                       f"seq {last + 1}..{seq - 1} missing ({_batches(seq - last - 1)} lost: "
                       "dropped past the PUB high-water mark, or a publisher fault); the "
                       "index is inexact until the next AllBlocksCleared")
            self._exact = False
        else:
            self._find(number, seq, "sequence-order",
                       f"seq {seq} after {last}: out of order (never seen before, so not a "
                       "duplicate); applied as it comes")
            self._exact = False
        self._seen.add(seq)
        report.last_seq = seq if last is None or seq > last or seq == 0 else last
        report.runs[-1][1] = report.last_seq
        return True

    def _check_rank(self, number: int, seq: int, rank: int | None) -> None:
        report = self.report
        if report.batches == 1 and not self._rank_fixed:
            self._rank = rank
        report.data_parallel_rank = self._rank
        if rank != self._rank:
            self._find(number, seq, "data-parallel-rank",
                       f"data_parallel_rank {rank}, but the stream's is {self._rank} (one "
                       "subscriber socket sees one DP rank's publisher)")

    # ------------------------------------------------------------------- events
    def _event(self, number: int, seq: int, index: int,
               event: BlockStored | BlockRemoved | AllBlocksCleared, wire: object) -> None:
        report = self.report
        kind = type(event).__name__
        report.events_per_kind[kind] += 1
        if isinstance(event, AllBlocksCleared):
            self._index.clear()
            self._exact = True
            return
        group = event.group_idx
        report.events_per_group[group, kind] += 1
        if isinstance(event, BlockRemoved):
            for i, block_hash in enumerate(event.block_hashes):
                key = (group, event.medium, block_hash)
                if self._index[key] > 0:
                    self._index[key] -= 1
                elif self._exact:
                    self._find(number, seq, "removed-unknown",
                               f"BlockRemoved of {block_hash.hex()} (group {group}, medium "
                               f"{event.medium!r}), which the stream does not hold: never "
                               "stored, or removed once more than stored",
                               index, f"block_hashes[{i}]")
                else:
                    report.not_checkable += 1
            return
        self._stored(number, seq, index, event, wire)

    def _stored(self, number: int, seq: int, index: int, event: BlockStored,
                wire: object) -> None:
        report = self.report
        group = event.group_idx
        spec_kind = getattr(wire, "kv_cache_spec_kind", None)
        if spec_kind is not None:
            meta = (spec_kind, getattr(wire, "kv_cache_spec_sliding_window", None))
            if report.group_kinds.setdefault(group, meta) != meta:
                self._find(number, seq, "group-metadata",
                           f"group {group} is {meta} here but {report.group_kinds[group]} "
                           "earlier in the stream", index, "kv_cache_spec_kind")
        parent = event.parent_block_hash
        # vLLM 0.33's partial-block store (a full-attention block larger than the hash block,
        # keyed by the prompt's last hash boundary inside it, docs/semantics.md#partial-block-
        # keys) has block_size the hash block's, smaller than the group's full stores, and
        # names as parent the chain hash one hash block earlier, which the group never stores
        # unless it ends a block: a router can chain it only by hashing the tokens itself.
        largest = self._largest_block.get(group, 0)
        partial = 0 < event.block_size < largest
        if event.block_size > largest:
            self._largest_block[group] = event.block_size
        # In sliding-window and Mamba groups the parent is the request's hash before the
        # first new block, whose own block may be null or masked: never stored in the group.
        if (parent is not None and self._dense(spec_kind) and not partial
                and self._index[group, event.medium, parent] <= 0):
            if self._exact:
                self._find(number, seq, "parent-unknown",
                           f"parent_block_hash {parent.hex()} is not held by the stream "
                           f"(group {group}, medium {event.medium!r}): a router cannot chain "
                           "this store", index, "parent_block_hash")
            else:
                report.not_checkable += 1
        self._token_count(number, seq, index, event, spec_kind)
        for block_hash in event.block_hashes:
            self._index[group, event.medium, block_hash] += 1

    def _token_count(self, number: int, seq: int, index: int, event: BlockStored,
                     spec_kind: str | None) -> None:
        size, tokens, hashes = event.block_size, len(event.token_ids), len(event.block_hashes)
        if size <= 0:
            self._find(number, seq, "token-count", f"block_size {size} is not positive",
                       index, "block_size")
            return
        dense = self._dense(spec_kind)
        if tokens % size:
            rule = f"{tokens} token_ids do not fill whole blocks of {size}"
        elif tokens // size < hashes:
            rule = f"{hashes} hashes for {tokens // size} block(s) of token_ids"
        elif dense and tokens // size != hashes:
            rule = (f"{tokens // size} block(s) of token_ids but {hashes} hashes in a "
                    f"{spec_kind or 'full-attention'} group, which caches every block")
        else:
            return
        self._find(number, seq, "token-count", f"{rule} (block_size {size})", index,
                   "token_ids")

    def _dense(self, spec_kind: str | None) -> bool:
        # 0.10.2 has one full-attention group; 0.33 names each group's kind (a 0.33 store
        # without a kind may come from any group: only the laws of every group apply).
        return (spec_kind in DENSE_KINDS if spec_kind is not None
                else self._release == "vllm-0.10")

    def _find(self, number: int, seq: int | None, rule: str, detail: str,
              event_index: int | None = None, field: str | None = None) -> None:
        self.report.findings.append(Finding(number, seq, rule, detail, event_index, field))


def check_stream(messages: Iterable[Sequence[bytes]], release: Release, *,
                 sources: Sequence[str] | None = None, int_hashes: bool | None = None,
                 data_parallel_rank: int | None = None) -> StreamReport:
    """Check every message (its frames, in arrival order; ``sources[i]`` ``"replay"`` or
    ``"live"``, all live when None) and return the report."""
    checker = StreamChecker(release, int_hashes=int_hashes,
                            data_parallel_rank=data_parallel_rank)
    for number, parts in enumerate(messages):
        checker.feed(parts, "live" if sources is None else sources[number])
    return checker.report
