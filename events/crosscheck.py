"""Byte-identity with vLLM's own encoder, run where vLLM is installed.

    python -m kvcheck.events.crosscheck --batches 3000 --seed 0

For the installed vLLM's release (0.33 or 0.10.2), random batches of the reference's events
(``workload.random_batches``) are encoded twice per hash form: by ``encode_batch`` and by
vLLM's publisher encoder (``msgspec.msgpack.Encoder``) on vLLM's own structs, built from the
same events with vLLM's ``maybe_convert_block_hash`` under
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`` and ``=0``. The bytes must be identical, vLLM's
decoder (``msgspec.msgpack.Decoder(KVEventBatch)``) must read kvcheck's bytes back to the
structs vLLM built, and ``decode_batch`` must read vLLM's bytes back to the events. Prints
one summary line; exits 1 naming the first batch that differs, 2 without vLLM.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

import msgspec

from kvcheck.errors import KVCheckInputError
from kvcheck.events.capture import Capture, capture
from kvcheck.events.codec import GroupMetadata, Release, decode_batch, encode_batch
from kvcheck.events.errors import NoVLLMError
from kvcheck.events.publisher import EventPublisher, offset_endpoint_port
from kvcheck.events.stream_check import check_stream
from kvcheck.events.workload import StepBatch, manager_streams, random_batches
from kvcheck.reference_impl.events import BlockRemoved, BlockStored, KVCacheEvent

__all__ = ["NoVLLMError", "compare_batch", "installed_release", "main", "vllm_event"]

_ENV = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"


def installed_release() -> tuple[Release, str]:
    """The release profile of the installed vLLM and its version.

    Raises:
        NoVLLMError: vLLM is missing or of a release this module has no form for.
    """
    try:
        import vllm
    except ImportError:
        raise NoVLLMError("kvcheck.events.crosscheck needs vLLM installed "
                          "(scripts/vllm-cpu-env.sh builds an environment)") from None
    version = str(vllm.__version__)
    for prefix, release in (("0.33.", "vllm-0.33"), ("0.10.", "vllm-0.10")):
        if version.startswith(prefix):
            return release, version  # type: ignore[return-value]
    raise NoVLLMError(f"kvcheck.events.crosscheck: no wire form for vLLM {version} "
                      "(known: 0.33.x, 0.10.x)")


def vllm_event(event: KVCacheEvent, release: Release, meta: GroupMetadata) -> object:
    """vLLM's struct for ``event``, built as vLLM's block pool builds it (hashes through
    vLLM's ``maybe_convert_block_hash``, which reads the environment variable)."""
    from vllm.distributed import kv_events as kv
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    if isinstance(event, BlockStored):
        hashes = [maybe_convert_block_hash(h) for h in event.block_hashes]
        parent = (None if event.parent_block_hash is None
                  else maybe_convert_block_hash(event.parent_block_hash))
        common = dict(block_hashes=hashes, parent_block_hash=parent,
                      token_ids=list(event.token_ids), block_size=event.block_size,
                      lora_id=event.lora_id, medium=event.medium)
        if release == "vllm-0.10":
            return kv.BlockStored(**common)
        stored = kv.BlockStored(**common, lora_name=event.lora_name,
                                extra_keys=(None if event.extra_keys is None
                                            else list(event.extra_keys)),
                                group_idx=event.group_idx)
        # KVCacheManager.take_events annotates stores with the group's spec.
        stored.kv_cache_spec_kind, stored.kv_cache_spec_sliding_window = meta[event.group_idx]
        return stored
    if isinstance(event, BlockRemoved):
        hashes = [maybe_convert_block_hash(h) for h in event.block_hashes]
        if release == "vllm-0.10":
            return kv.BlockRemoved(block_hashes=hashes, medium=event.medium)
        return kv.BlockRemoved(block_hashes=hashes, medium=event.medium,
                               group_idx=event.group_idx)
    return kv.AllBlocksCleared()


def _expected_events(events: Sequence[KVCacheEvent], int_hashes: bool
                     ) -> list[KVCacheEvent]:
    """The events ``decode_batch`` must give back: int-form hashes keep their last 8 bytes."""
    def cut(h: bytes) -> bytes:
        return h[-8:] if int_hashes else h
    out: list[KVCacheEvent] = []
    for event in events:
        if isinstance(event, BlockStored):
            parent = None if event.parent_block_hash is None else cut(event.parent_block_hash)
            extra = event.extra_keys
            out.append(BlockStored(tuple(map(cut, event.block_hashes)), parent,
                                   event.token_ids, event.block_size, event.lora_id,
                                   event.medium, event.lora_name, extra, event.group_idx))
        elif isinstance(event, BlockRemoved):
            out.append(BlockRemoved(tuple(map(cut, event.block_hashes)), event.medium,
                                    event.group_idx))
        else:
            out.append(event)
    return out


def _plain(value: object) -> object:
    """``value`` with every tuple a list, as msgpack (which has only arrays) gives it back."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def compare_batch(batch: StepBatch, release: Release, *, ts: float,
                  data_parallel_rank: int | None, int_hashes: bool) -> str | None:
    """None when kvcheck and vLLM agree on this batch in this hash form, else what differs."""
    from vllm.distributed import kv_events as kv

    os.environ[_ENV] = "1" if int_hashes else "0"
    meta = batch.group_metadata
    ours = encode_batch(batch.events, ts=ts, data_parallel_rank=data_parallel_rank,
                        release=release, int_hashes=int_hashes,
                        group_metadata=meta if release == "vllm-0.33" else None)
    structs = kv.KVEventBatch(ts=ts, events=[vllm_event(e, release, meta)
                                             for e in batch.events],
                              data_parallel_rank=data_parallel_rank)
    theirs = msgspec.msgpack.Encoder().encode(structs)
    if ours != theirs:
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                  min(len(ours), len(theirs)))
        return (f"bytes differ at byte {at}: kvcheck {ours[at:at + 24].hex()}... vLLM "
                f"{theirs[at:at + 24].hex()}... (lengths {len(ours)}, {len(theirs)})")
    read_back = msgspec.msgpack.Decoder(kv.KVEventBatch).decode(ours)
    # msgpack has no tuples: compare as msgpack-shaped values (extra keys' pairs are lists).
    if _plain(msgspec.to_builtins(read_back)) != _plain(msgspec.to_builtins(structs)):
        return f"vLLM's decoder reads kvcheck's bytes as {read_back!r}, not {structs!r}"
    decoded = decode_batch(theirs, release=release, int_hashes=int_hashes)
    if list(decoded.events) != _expected_events(batch.events, int_hashes):
        return f"decode_batch reads vLLM's bytes as {decoded.events!r}"
    return None


# ------------------------------------------------------------------- the publishers
_OFFSET_CASES = (("tcp://*:5557", 0), ("tcp://*:5557", 3), ("tcp://127.0.0.1:6000", 1),
                 ("tcp://*:0", 2), ("inproc://kv", 2), ("ipc://kv.sock", 0),
                 ("ipc://kv.sock", 1))


def _free_ports(count: int) -> list[int]:
    """Ports free right now (plain sockets: closing one frees its port at once, where a ZMQ
    socket unbinds later, in its I/O thread)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _observe(publish: Callable[[], None], endpoint: str,
             replay_endpoint: str) -> tuple[Capture, Capture]:
    """What a live subscriber (connected before ``publish``) and then a replay from 0 get."""
    live: list[Capture] = []
    thread = threading.Thread(target=lambda: live.append(capture(endpoint, idle_s=1.5)),
                              daemon=True)
    thread.start()
    time.sleep(0.5)  # the subscription reaches the PUB socket
    publish()
    thread.join(60)
    replayed = capture(endpoint, replay_endpoint=replay_endpoint, idle_s=0.3)
    return live[0], replayed


def compare_publishers(release: Release, seed: int, count: int = 60) -> str | None:
    """None when ``EventPublisher`` and vLLM's ``ZmqEventPublisher`` send the same frames
    (live and replayed) for one reference engine's stream, the checker passes vLLM's stream,
    and both offset endpoints alike per data-parallel rank; else what differs."""
    from vllm.distributed import kv_events as kv

    os.environ[_ENV] = "1"
    batches = list(itertools.islice(next(manager_streams(release, seed, steps=None)), count))
    meta = [b.group_metadata for b in batches]
    payloads = [encode_batch(b.events, ts=float(n), data_parallel_rank=0, release=release,
                             group_metadata=m if release == "vllm-0.33" else None)
                for n, (b, m) in enumerate(zip(batches, meta, strict=True))]
    structs = [kv.KVEventBatch(ts=float(n), events=[vllm_event(e, release, m)
                                                    for e in b.events], data_parallel_rank=0)
               for n, (b, m) in enumerate(zip(batches, meta, strict=True))]
    pub_port, replay_port = _free_ports(2)
    endpoint, replay = f"tcp://*:{pub_port}", f"tcp://*:{replay_port}"
    reach = (f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
    theirs_pub = kv.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay,
                                      buffer_steps=count, topic="kv@pod")
    try:
        def publish_theirs() -> None:
            for struct in structs:
                theirs_pub.publish(struct)
            deadline = time.monotonic() + 30
            while theirs_pub._event_queue.qsize() and time.monotonic() < deadline:
                time.sleep(0.05)  # its thread sends asynchronously
        theirs = _observe(publish_theirs, *reach)
    finally:
        theirs_pub.shutdown()
    # Fresh ports: vLLM's sockets unbind later, in ZMQ's I/O thread.
    pub_port, replay_port = _free_ports(2)
    endpoint, replay = f"tcp://*:{pub_port}", f"tcp://*:{replay_port}"
    reach = (f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
    with EventPublisher(endpoint, replay_endpoint=replay, buffer_steps=count,
                        topic="kv@pod", release=release) as ours_pub:
        def publish_ours() -> None:
            for payload in payloads:
                ours_pub.publish(payload)
        ours = _observe(publish_ours, *reach)
    for what, a, b in (("live", ours[0], theirs[0]), ("replayed", ours[1], theirs[1])):
        if a.messages != b.messages:
            at = next((i for i, (x, y) in enumerate(zip(a.messages, b.messages,
                                                        strict=False)) if x != y),
                      min(len(a.messages), len(b.messages)))
            return (f"{what} messages differ at message {at} of {len(b.messages)} (vLLM) / "
                    f"{len(a.messages)} (kvcheck): vLLM {b.messages[at:at + 1]!r:.200} kvcheck "
                    f"{a.messages[at:at + 1]!r:.200}")
    if len(theirs[0].messages) != count or len(theirs[1].messages) != count:
        return (f"vLLM's publisher delivered {len(theirs[0].messages)} live and "
                f"{len(theirs[1].messages)} replayed messages, not {count}")
    for what, cap in (("live", theirs[0]), ("replayed", theirs[1])):
        report = check_stream(cap.messages, release, sources=cap.sources)
        if not report.ok:
            return f"the checker rejects vLLM's {what} stream:\n{report.render()}"
    for case, rank in _OFFSET_CASES:
        mine = _outcome(lambda e, r: offset_endpoint_port(e, r, release), case, rank)
        vllm = _outcome(kv.ZmqEventPublisher.offset_endpoint_port, case, rank)
        if mine != vllm:
            return f"offset_endpoint_port({case!r}, {rank}): kvcheck {mine}, vLLM {vllm}"
    return None


def _outcome(fn: Callable[[str, int], str | None], endpoint: str, rank: int) -> str:
    try:
        return repr(fn(endpoint, rank))
    except (ValueError, KVCheckInputError):
        return "an error"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcheck.events.crosscheck",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--publisher-batches", type=int, default=60,
                        help="batches sent through both publishers on loopback (default 60)")
    args = parser.parse_args(argv)
    try:
        release, version = installed_release()
    except NoVLLMError as error:
        print(error, file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    kinds: collections.Counter[str] = collections.Counter()
    groups: set[int] = set()
    sparse = 0
    saved = os.environ.get(_ENV)
    try:
        for number, batch in enumerate(random_batches(release, args.seed, args.batches)):
            ts, rank = rng.uniform(0, 2e9), rng.choice((None, 0, 1, 7))
            for int_hashes in (True, False):
                problem = compare_batch(batch, release, ts=ts, data_parallel_rank=rank,
                                        int_hashes=int_hashes)
                if problem:
                    form = "int" if int_hashes else "bytes"
                    print(f"crosscheck {release} (vLLM {version}): batch {number} (seed "
                          f"{args.seed}, {form} hashes, {len(batch.events)} events): {problem}")
                    return 1
            for event in batch.events:
                kinds[type(event).__name__] += 1
                if isinstance(event, (BlockStored, BlockRemoved)):
                    groups.add(event.group_idx)
                if isinstance(event, BlockStored) and \
                        len(event.token_ids) != len(event.block_hashes) * event.block_size:
                    sparse += 1
    finally:
        if saved is None:
            os.environ.pop(_ENV, None)
        else:
            os.environ[_ENV] = saved
    counts = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    print(f"crosscheck {release} (vLLM {version}): {args.batches} batches x 2 hash forms "
          f"identical to vLLM's encoder and read back by its decoder ({counts}; groups "
          f"{sorted(groups)}; {sparse} sparse stores; seed {args.seed})")
    saved = os.environ.get(_ENV)
    try:
        problem = compare_publishers(release, args.seed, args.publisher_batches)
    finally:
        if saved is None:
            os.environ.pop(_ENV, None)
        else:
            os.environ[_ENV] = saved
    if problem:
        print(f"crosscheck {release} (vLLM {version}): publishers: {problem}")
        return 1
    print(f"crosscheck {release} (vLLM {version}): kvcheck's EventPublisher sends vLLM's "
          f"ZmqEventPublisher's frames, live and replayed, for {args.publisher_batches} "
          "batches of one engine; kvcheck events check passes vLLM's stream; DP port offsets "
          f"agree on {len(_OFFSET_CASES)} endpoints")
    return 0


if __name__ == "__main__":
    sys.exit(main())
