"""KV events on the wire (capability ``event_wire``): stream = cache.

An implementation with ``event_wire`` hands kvcheck each step's events as the msgpack payload
vLLM's ``ZmqEventPublisher`` sends (``take_event_batch(ts)``). The suite then checks what a
KV-aware router depends on (docs/events.md):

* the stream's own laws (``kvcheck.events.stream_check``): the payload decodes in the
  profile's wire format (0.33's tagged maps; 0.10.2's tagged arrays), one hash form
  throughout, every ``BlockRemoved`` of a hash the stream holds, parents known, token and
  hash counts per the group's kind;
* the router's index (``WireIndex``: copies counted per physical block, as vLLM emits them)
  against the engine's own answers after every step: every hit the engine returns is a
  prefix the stream announced; the stream never claims more cached blocks than the pool has;
  and where the design hits whatever it holds (the vLLM profiles; ``caches_running_requests``
  under generic) every announced prefix is hit, up to vLLM's cap of ``num_tokens - 1``;
* under the vLLM profiles, the bytes equal the oracle's for the same calls (``--kv-oracle``:
  the reference, or real vLLM, whose adapter hands over vLLM's own encoder's bytes), up to
  the hash form the implementation chose.

Known consumer bugs each have a mutant that fails this area (tests/mutants/mut_wire_*.py).
The replay socket's topic frame (vLLM #45174) is a publisher property, not a payload one:
``kvcheck events check`` judges it on a live stream.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

# A dependency of kvcheck; absent only from an install without its dependencies.
pytest.importorskip("msgspec", reason="the events_wire area decodes the implementation's "
                    "bytes with msgspec: pip install msgspec")

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.ops import Op, add, decode, free, reset, schedule
from kvcheck.conformance.protocol import DESIGN_CAPABILITIES, KVCacheGroupSpec, KVCacheSpec
from kvcheck.conformance.wire_index import WireIndex
from kvcheck.events.codec import Release, decode_batch, encode_batch
from kvcheck.events.errors import WireFormatError
from kvcheck.events.frames import Frame, pack_frame
from kvcheck.events.stream_check import StreamChecker

if TYPE_CHECKING:
    from kvcheck.conformance.loader import ImplHandle

pytestmark = pytest.mark.kv_capability("manager", "event_wire")

_TOPIC = b"kv-events"
#: Seeds of the random workloads (each ~60 ops over a pool small enough to evict).
_SEEDS = (0, 1, 2)


#: The byte tests run under the vLLM profiles only, which imply vLLM's whole design.
_DESIGN = DESIGN_CAPABILITIES


def _release(profile: str) -> Release:
    return "vllm-0.10" if profile == "vllm-0.10" else "vllm-0.33"


def _random_ops(seed: int, block_size: int, caps: frozenset[str], steps: int = 60) -> list[Op]:
    """Plain requests over 3 shared prefixes: chunked prefills, decodes, frees, and where
    ``caps`` (the driver's capabilities) has them, skip-read requests (a second physical copy
    of cached content), multi-token decodes and a rare reset once everything is freed."""
    skip_read = "skip_reading_prefix_cache" in caps
    most_decoded = 3 if "multi_token_decode" in caps else 1
    resets = "reset_prefix_cache" in caps
    rng = random.Random(seed * 7919 + block_size)
    prefixes = [[rng.randrange(1, 40) for _ in range(rng.randrange(block_size, 4 * block_size))]
                for _ in range(3)]
    ops: list[Op] = []
    running: list[str] = []
    for n in range(steps):
        roll = rng.random()
        if roll < 0.35 or not running:
            rid = f"r{n}"
            prompt = rng.choice(prefixes) + [rng.randrange(1, 40)
                                             for _ in range(rng.randrange(1, 2 * block_size))]
            ops.append(add(rid, prompt, skip_read=skip_read and rng.random() < 0.2))
            ops.append(schedule(rid, rng.choice((None, None, block_size + 1))))
            running.append(rid)
        elif roll < 0.75:
            rid = rng.choice(running)
            ops.append(schedule(rid) if rng.random() < 0.3
                       else decode(rid, rng.randrange(1, most_decoded + 1)))
        elif roll < 0.97 or len(running) > 1 or not resets:
            ops.append(free(running.pop(rng.randrange(len(running)))))
        else:
            ops.extend([free(running.pop()), reset()])
    return ops


def _fine_grained_ops(seed: int, hash_block: int, steps: int = 12) -> list[Op]:
    """Requests that make fine-grained partial hits (docs/semantics.md#fine-grained-partial-hits):
    a prompt prefilled up to its last hash boundary, then the rest and two decode steps (its
    state there is cached, inside a Mamba block, and copied as it goes on), then a request
    sharing the prompt to that boundary or a few tokens past it (a hit ending inside a block:
    copy-on-write), decoded once; frees now and then, so hits also land on freed blocks."""
    rng = random.Random(seed * 7919 + hash_block)
    ops: list[Op] = []
    running: list[str] = []
    for n in range(steps):
        prompt = [rng.randrange(1, 40) for _ in range(rng.randrange(2 * hash_block,
                                                                     8 * hash_block))]
        boundary = (len(prompt) - 1) // hash_block * hash_block
        producer, sharer = f"p{n}", f"s{n}"
        ops += [add(producer, prompt), schedule(producer, boundary), schedule(producer),
                decode(producer), decode(producer)]
        shared = prompt[:boundary + rng.randrange(hash_block)] + [100 + n]
        ops += [add(sharer, shared), schedule(sharer), decode(sharer)]
        running += [producer, sharer]
        while len(running) > 3 or (running and rng.random() < 0.3):
            ops.append(free(running.pop(rng.randrange(len(running)))))
    return ops + [free(rid) for rid in running]


class _PayloadShown:
    """A payload as its repro comment shows it: its size and first bytes (the snippet replays
    the call; the whole payload is the implementation's to print)."""

    def __init__(self, payload: object) -> None:
        self.payload = payload

    def __repr__(self) -> str:
        if not isinstance(self.payload, (bytes, bytearray)):
            return repr(self.payload)
        head = bytes(self.payload[:24]).hex()
        return f"<{len(self.payload)} bytes {head}{'...' if len(self.payload) > 24 else ''}>"


class _Wire:
    """One driver's stream: drains a batch after every op, checks the stream's laws and keeps
    the router's index."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.release = _release(driver.spec.profile)
        self.checker = StreamChecker(self.release)
        self.index = WireIndex()
        self.seq = 0

    def drain(self) -> bytes:
        ts = float(self.seq)
        payload = self.driver.logged_call(f"m.take_event_batch({ts!r})",
                                          self.driver.manager.take_event_batch, ts,
                                          shown=_PayloadShown)
        self.checker.feed(pack_frame(Frame(_TOPIC, self.seq, payload)))
        self.seq += 1
        findings = self.checker.report.findings
        assert not findings, (f"the event stream breaks a law: {findings[0]}\n"
                              + self.driver.snippet())
        self.index.feed(decode_batch(payload, release=self.release))
        return payload


def _check_hits(wire: _Wire, view_tokens: list[int], num_hit: int, announced: int,
                exact: bool) -> None:
    driver, bs = wire.driver, wire.driver.spec.block_size
    where = (f"the router's index held {announced} leading block(s) of the prompt "
             f"({len(view_tokens)} tokens, block size {bs}); the engine hit {num_hit} "
             "token(s)\n" + driver.snippet())
    assert num_hit <= announced * bs, (
        "a hit the stream never announced (or announced removed): a router scores this "
        "worker too low; " + where)
    if exact:
        want = min(announced, (len(view_tokens) - 1) // bs) * bs
        assert num_hit >= want, (
            "the stream holds blocks the engine does not hit (a removal missing, or a store "
            "of blocks that are not cached): a router sends requests here for nothing; "
            + where)


def _run_checked(driver: Driver, ops: list[Op], exact: bool) -> _Wire:
    wire = _Wire(driver)
    usable = len(driver.ordinary_block_ids)
    for op in ops:
        announced, tokens = None, []
        if op["op"] == "schedule" and op["rid"] not in driver.running:
            view = driver.views[op["rid"]]
            if not view.skip_reading_prefix_cache:
                tokens = list(view.prompt_token_ids) + list(view.output_token_ids)
                announced = wire.index.cached_prefix_blocks(tokens, driver.spec.block_size)
        result = driver.apply(op)
        if announced is not None and "hits" in result:
            _check_hits(wire, tokens, result["hits"][1], announced, exact)
        wire.drain()
        held = sum(wire.index.cached_hashes().values())
        assert held <= usable, (
            f"the stream holds {held} cached blocks, more than the pool's {usable}: stores "
            "without their removals\n" + driver.snippet())
    return wire


def _spec(profile: str, block_size: int, num_blocks: int = 14,
          groups: tuple[KVCacheGroupSpec, ...] = ()) -> KVCacheSpec:
    return KVCacheSpec(num_blocks=num_blocks, block_size=block_size, profile=profile,
                       enable_kv_cache_events=True, kv_cache_groups=groups)


# ------------------------------------------------------------------------ stream = cache
@pytest.mark.kv_generic
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("seed", _SEEDS)
def test_router_index_from_the_stream_equals_the_engines_hits(
        kv_impl: ImplHandle, kv_profile: str, seed: int, block_size: int) -> None:
    """Random workloads: after every op the batch decodes and keeps the stream's laws, every
    hit was announced, the stream never holds more blocks than the pool, and (vLLM profiles,
    ``caches_running_requests``) every announced prefix is hit."""
    driver = Driver(kv_impl, _spec(kv_profile, block_size))
    caps = driver.capabilities
    exact = kv_profile != "generic" or "caches_running_requests" in caps
    _run_checked(driver, _random_ops(seed, block_size, caps), exact)


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching", "skip_reading_prefix_cache")
def test_a_hash_on_two_blocks_stays_announced_until_both_are_evicted(
        kv_impl: ImplHandle, kv_profile: str) -> None:
    """A prompt computed twice (the second time without reading the cache) sits on two
    physical copies. Evicting one copy leaves the other hitting: the stream must still hold
    the hash (vLLM sends one BlockStored and one BlockRemoved per copy; a router counts them,
    vLLM PR #55092). Evicting the other too leaves nothing announced."""
    driver = Driver(kv_impl, _spec(kv_profile, 4, num_blocks=10))
    usable = len(driver.ordinary_block_ids)
    prompt = list(range(1, 10))  # 2 full blocks + 1 token
    wire = _Wire(driver)

    def run(*ops: Op) -> None:
        for op in ops:
            driver.apply(op)
            wire.drain()

    run(add("a", prompt), schedule("a"), add("b", prompt, skip_read=True), schedule("b"))
    copies = wire.index.cached_hashes()
    assert sorted(copies.values()) == [2, 2], (
        f"two copies of 2 blocks computed, the stream holds {dict(copies)}\n" + driver.snippet())
    # b's copies go; a's stay in use. The pressure request takes every block but a's 3.
    run(free("b"), add("c", range(100, 100 + 4 * (usable - 3))), schedule("c"))
    assert sorted(wire.index.cached_hashes().values())[-2:] == [1, 1], (
        "one copy of each hash evicted, the other still held by 'a': the stream must still "
        f"hold each hash once; it holds {dict(wire.index.cached_hashes())}\n" + driver.snippet())
    announced = wire.index.cached_prefix_blocks(prompt, 4)
    result = driver.apply(add("d", prompt))
    result = driver.apply(schedule("d"))
    wire.drain()
    _check_hits(wire, prompt, result["hits"][1], announced, exact=True)
    run(free("a"), free("d"), free("c"),
        add("e", range(500, 500 + 4 * usable - 1)), schedule("e"))
    left = wire.index.cached_prefix_blocks(prompt, 4)
    assert left == 0, (
        f"every block was taken by 'e', yet the stream still holds {left} block(s) of the "
        "prompt: a removal is missing\n" + driver.snippet())


# ------------------------------------------------------------------------ the bytes
def _comparable(mine: bytes, theirs: bytes, release: Release) -> bytes:
    """``theirs`` in ``mine``'s hash form (the protocol allows either; vLLM's default is the
    int form, kvcheck's adapters send bytes)."""
    try:
        mine_batch = decode_batch(mine, release=release)
        theirs_batch = decode_batch(theirs, release=release)
    except WireFormatError:
        return theirs
    mine_int = any(isinstance(h, int) for e in mine_batch.wire.events
                   for h in getattr(e, "block_hashes", ()))
    theirs_int = any(isinstance(h, int) for e in theirs_batch.wire.events
                     for h in getattr(e, "block_hashes", ()))
    if mine_int == theirs_int:
        return theirs
    meta = theirs_batch.group_metadata() if release == "vllm-0.33" else None
    return encode_batch(theirs_batch.events, ts=theirs_batch.ts, release=release,
                        int_hashes=mine_int, group_metadata=meta or None)


def _first_difference(mine: bytes, theirs: bytes, release: Release) -> str:
    try:
        a = decode_batch(mine, release=release).wire_events
        b = decode_batch(theirs, release=release).wire_events
    except WireFormatError as error:
        return f"the implementation's payload does not decode: {error}"
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"event {i}: implementation {x!r}\n  oracle {y!r}"
    return f"{len(a)} events, the oracle's {len(b)}"


def _check_layout_bytes(kv_impl: ImplHandle, kv_oracle: ImplHandle, spec: KVCacheSpec,
                        ops: list[Op], feature: str) -> None:
    """``_check_bytes`` on a layout both sides must support: skipped, saying so, where the
    implementation declines ``spec`` or the oracle does not declare ``feature``."""
    if not kv_impl.info.supports(spec) or not kv_oracle.has(feature):
        pytest.skip(f"{kv_impl.name} or the oracle ({kv_oracle.name}) does not declare "
                    f"{feature} for this layout")
    _check_bytes(kv_impl, kv_oracle, spec, ops)


def _check_bytes(kv_impl: ImplHandle, kv_oracle: ImplHandle, spec: KVCacheSpec,
                 ops: list[Op]) -> None:
    if not kv_oracle.has("event_wire"):
        pytest.skip(f"the oracle {kv_oracle.name} does not declare capability 'event_wire' "
                    "(--kv-oracle)")
    mine, theirs = _Wire(Driver(kv_impl, spec)), _Wire(Driver(kv_oracle, spec))
    for step, op in enumerate(ops):
        mine.driver.apply(op)
        theirs.driver.apply(op)
        got, want = mine.drain(), theirs.drain()
        want = _comparable(got, want, mine.release)
        assert got == want, (
            f"after op {step} ({op}) the payload differs from the oracle's "
            f"({kv_oracle.name}): {_first_difference(got, want, mine.release)}\n"
            f"implementation {got.hex()}\noracle         {want.hex()}\n"
            + mine.driver.snippet())


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("seed", _SEEDS[:2])
def test_payload_bytes_equal_the_oracles(kv_impl: ImplHandle, kv_oracle: ImplHandle,
                                         kv_profile: str, seed: int, block_size: int) -> None:
    """Under a vLLM profile every step's payload equals the oracle's byte for byte (timestamp
    and hash form aside: both are the caller's and the deployment's)."""
    spec = _spec(kv_profile, block_size)
    _check_bytes(kv_impl, kv_oracle, spec, _random_ops(seed, block_size, _DESIGN))


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("kv_cache_groups", "sliding_window")
@pytest.mark.parametrize("retention", [0, 16])
@pytest.mark.parametrize("seed", _SEEDS[:2])
def test_sparse_group_payloads_equal_the_oracles(kv_impl: ImplHandle, kv_oracle: ImplHandle,
                                                 kv_profile: str, seed: int,
                                                 retention: int) -> None:
    """Full attention beside a sliding window whose cache keeps one block per ``retention``
    tokens (0.33's ``prefix_cache_retention_interval``): the window's stores span the tokens
    of the blocks it masks while naming only the blocks it keeps (``len(token_ids) >
    len(block_hashes) * block_size``, AMD Infera #98, llm-d-router #2363), with the group's
    kind and window, byte for byte as the oracle sends them."""
    groups = (KVCacheGroupSpec("full_attention", 4),
              KVCacheGroupSpec("sliding_window", 4, sliding_window=6))
    spec = replace(_spec(kv_profile, 4, num_blocks=29, groups=groups),
                   prefix_cache_retention_interval=retention)
    if not kv_impl.info.supports(spec):
        pytest.skip(f"{kv_impl.name} does not support this layout")
    _check_bytes(kv_impl, kv_oracle, spec, _random_ops(seed, 4, _DESIGN))


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("kv_cache_groups", "sliding_window")
@pytest.mark.parametrize("seed", _SEEDS[:2])
def test_partial_key_payloads_equal_the_oracles(kv_impl: ImplHandle, kv_oracle: ImplHandle,
                                                kv_profile: str, seed: int) -> None:
    """Full attention at 16-token blocks beside a sliding window at 4 (hash block 4): the
    block holding a prompt's last hash boundary is also keyed by the hash there, a store of
    one hash whose ``block_size`` is the hash block's, 4, not the group's, and whose parent is
    the chain hash one hash block earlier, which the stream need not hold
    (docs/semantics.md#partial-block-keys); its eviction removes every key of the block; byte
    for byte as the oracle sends them, and the stream laws hold."""
    groups = (KVCacheGroupSpec("full_attention", 16),
              KVCacheGroupSpec("sliding_window", 4, sliding_window=6))
    spec = _spec(kv_profile, 4, num_blocks=29, groups=groups)
    if not kv_impl.info.supports(spec):
        pytest.skip(f"{kv_impl.name} does not support this layout")
    _check_bytes(kv_impl, kv_oracle, spec, _random_ops(seed, 4, _DESIGN))


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("kv_cache_groups", "sliding_window", "cache_salt", "multimodal")
def test_partial_key_payloads_carry_their_blocks_extra_keys(kv_impl: ImplHandle,
                                                            kv_oracle: ImplHandle,
                                                            kv_profile: str) -> None:
    """The partial-key layout of ``test_partial_key_payloads_equal_the_oracles`` with salted
    and multimodal requests: a partial key's store carries the extra keys of the hash block
    it ends (an image's identifier and offset where one lies there), not its neighbours',
    byte for byte as the oracle sends them."""
    groups = (KVCacheGroupSpec("full_attention", 16),
              KVCacheGroupSpec("sliding_window", 4, sliding_window=6))
    spec = _spec(kv_profile, 4, num_blocks=29, groups=groups)
    if not kv_impl.info.supports(spec):
        pytest.skip(f"{kv_impl.name} does not support this layout")
    # Caching stops at the scheduler block (16 tokens): a prompt of 17 to 31 tokens gets its
    # partial key, at its last hash boundary inside the second block, once decoding has
    # taken the request to 32 tokens.
    prompt = list(range(1, 40))
    ops: list[Op] = []
    requests = [add("r0", prompt[:22], mm=[("img", 16, 4)]),
                add("r1", prompt[:26], mm=[("img", 18, 6)], salt="s1"),
                add("r2", prompt[:23], salt="s2"),
                add("r3", prompt[:30], mm=[("img", 9, 3), ("vid", 24, 4)])]
    for request in requests:
        rid = request["rid"]
        ops += [request, schedule(rid),
                *(decode(rid) for _ in range(32 - len(request["prompt"]))), free(rid)]
    _check_bytes(kv_impl, kv_oracle, spec, ops)


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("fine_grained_hits")  # implies mamba (the loader checks it)
@pytest.mark.parametrize("seed", _SEEDS[:2])
def test_fine_grained_hit_payloads_equal_the_oracles(kv_impl: ImplHandle,
                                                     kv_oracle: ImplHandle, kv_profile: str,
                                                     seed: int) -> None:
    """Full attention at 8-token blocks beside a Mamba "align" group at 12 (hash block 4):
    fine-grained partial hits (docs/semantics.md#fine-grained-partial-hits), their
    copy-on-write blocks cached once full and the copies' retained blocks released where the
    driver drains them, byte for byte as the oracle sends them."""
    groups = (KVCacheGroupSpec("full_attention", 8),
              KVCacheGroupSpec("mamba", 12, mamba_cache_mode="align"))
    spec = _spec(kv_profile, 4, num_blocks=29, groups=groups)
    _check_layout_bytes(kv_impl, kv_oracle, spec, _fine_grained_ops(seed, 4),
                        "fine_grained_hits")


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("eagle", "kv_cache_groups", "sliding_window")
@pytest.mark.parametrize("seed", _SEEDS[:2])
def test_eagle_payloads_equal_the_oracles(kv_impl: ImplHandle, kv_oracle: ImplHandle,
                                          kv_profile: str, seed: int) -> None:
    """Full attention at 4-token blocks beside a sliding window at 8 with EAGLE
    (docs/semantics.md#prefix-cache-hits): each group caches up to the aligned boundary and
    the full-attention group one block past it, the groups' stores in group order within a
    batch, byte for byte as the oracle sends them."""
    groups = (KVCacheGroupSpec("full_attention", 4),
              KVCacheGroupSpec("sliding_window", 8, sliding_window=8))
    spec = replace(_spec(kv_profile, 4, num_blocks=41, groups=groups), use_eagle=True)
    _check_layout_bytes(kv_impl, kv_oracle, spec, _random_ops(seed, 4, _DESIGN), "eagle")


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("mamba_checkpoints")  # implies mamba (the loader checks it)
@pytest.mark.parametrize("retention", [None, 0])
@pytest.mark.parametrize("seed", _SEEDS[:2])
def test_mamba_checkpoint_payloads_equal_the_oracles(kv_impl: ImplHandle,
                                                     kv_oracle: ImplHandle, kv_profile: str,
                                                     seed: int, retention: int | None) -> None:
    """Full attention at 4-token blocks beside a Mamba "align" group at 8 with one prefill
    checkpoint block aligned on 4 tokens (docs/semantics.md#mamba-prefill-checkpoints), with
    and without sparse retention: a checkpoint block is keyed anew at its position, every key
    it had removed first (one ``BlockRemoved`` each) and a ``BlockStored`` sent for the new
    key even when the block carried it before; chunked prefills reach it, byte for byte as
    the oracle sends them."""
    groups = (KVCacheGroupSpec("full_attention", 4),
              KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align",
                               num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=4))
    spec = replace(_spec(kv_profile, 4, num_blocks=41, groups=groups),
                   prefix_cache_retention_interval=retention)
    _check_layout_bytes(kv_impl, kv_oracle, spec, _random_ops(seed, 4, _DESIGN),
                        "mamba_checkpoints")


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("mamba")  # implies kv_cache_groups (the loader checks it)
@pytest.mark.parametrize("seed", _SEEDS[:2])
def test_mamba_group_payloads_equal_the_oracles(kv_impl: ImplHandle, kv_oracle: ImplHandle,
                                                kv_profile: str, seed: int) -> None:
    """Full attention beside a Mamba "align" group (docs/semantics.md#mamba-groups): the
    Mamba group's stores name the hashes of its non-null blocks only while ``token_ids`` span
    every block of the range, and a range of nulls still sends a store with no hash, byte for
    byte as the oracle sends them."""
    groups = (KVCacheGroupSpec("full_attention", 4),
              KVCacheGroupSpec("mamba", 4, mamba_cache_mode="align"))
    spec = _spec(kv_profile, 4, num_blocks=29, groups=groups)
    if not kv_impl.info.supports(spec) or not kv_oracle.has("mamba"):
        pytest.skip(f"{kv_impl.name} or the oracle does not support this layout")
    _check_bytes(kv_impl, kv_oracle, spec, _random_ops(seed, 4, _DESIGN))
