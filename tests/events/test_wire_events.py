"""Events built in the wire form when they happen (``kvcheck.events.wire_events``): the same
bytes as ``encode_batch`` of the reference's dataclass events, the same protocol dicts, for
both releases and hash forms, and clear errors for what a release cannot carry."""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any

import pytest

from kvcheck.adapters.reference import ReferenceManager
from kvcheck.conformance.protocol import (
    KVCacheGroupSpec,
    KVCacheSpec,
    RequestView,
)
from kvcheck.events import WireFormatError, decode_batch, encode_batch
from kvcheck.events.wire_events import WireEventFactory, wire_event_factory
from kvcheck.events.workload import random_batches
from kvcheck.reference_impl import events as reference_events
from kvcheck.reference_impl.events import BlockStored


class DataclassEvents(ReferenceManager):
    """The reference adapter on its dataclass events (encoded at take time)."""

    wire_ready_events = False


WINDOWED = (KVCacheGroupSpec("full_attention"), KVCacheGroupSpec("sliding_window",
                                                                 sliding_window=6))
#: (profile, groups, the events' form when built wire-ready: None for the dataclasses)
SPECS = [("vllm-0.33", (), "vllm-0.33"), ("generic", (), "vllm-0.33"),
         ("vllm-0.10", (), "vllm-0.10"), ("vllm-0.33", WINDOWED, "vllm-0.33"),
         ("vllm-0.10", WINDOWED, None)]


def _spec(profile: str, groups: tuple[KVCacheGroupSpec, ...]) -> KVCacheSpec:
    return KVCacheSpec(num_blocks=24, block_size=4, enable_kv_cache_events=True,
                       profile=profile, kv_cache_groups=groups)


def _lockstep(a: Any, b: Any, seed: int, steps: int = 120) -> Any:
    """Drive ``a`` and ``b`` with the same random scheduler steps (new requests sharing
    prefixes, with LoRA and multimodal features; decode; free; reset); yield after each."""
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(40) for _ in range(rng.randrange(0, 20))) for _ in range(3)]
    running: dict[str, RequestView] = {}
    for step in range(steps):
        roll = rng.random()
        if roll < 0.4 or not running:
            rid = f"r{step}"
            prompt = rng.choice(prefixes) + tuple(rng.randrange(40)
                                                  for _ in range(rng.randrange(1, 14)))
            lora = ("adapter", 3, "/a") if rng.random() < 0.3 else None
            mm = ((f"img{rng.randrange(2)}", 1, 3),) if rng.random() < 0.3 else ()
            view = RequestView(rid, prompt, lora=lora, mm_features=mm)
            hits = [m.get_computed_blocks(view) for m in (a, b)]
            assert hits[0] == hits[1]
            ids, num_hit = hits[0]
            num_new = view.num_tokens - num_hit
            got = [m.allocate_slots(view, num_new, num_hit, ids) for m in (a, b)]
            assert (got[0] is None) == (got[1] is None)
            if got[0] is not None:
                running[rid] = RequestView(rid, prompt, (), view.num_tokens, lora, mm)
        elif roll < 0.75:
            rid = rng.choice(sorted(running))
            old = running[rid]
            view = RequestView(rid, old.prompt_token_ids,
                               old.output_token_ids + (rng.randrange(40),),
                               old.num_computed_tokens, old.lora, old.mm_features)
            if all(m.allocate_slots(view, 1) is not None for m in (a, b)):
                running[rid] = RequestView(rid, view.prompt_token_ids, view.output_token_ids,
                                           view.num_tokens, view.lora, view.mm_features)
            else:
                for m in (a, b):
                    m.free(rid)
                del running[rid]
        elif roll < 0.97:
            rid = rng.choice(sorted(running))
            for m in (a, b):
                m.free(rid)
            del running[rid]
        else:
            for rid in running:
                for m in (a, b):
                    m.free(rid)
            running.clear()
            assert a.reset_prefix_cache() and b.reset_prefix_cache()
        yield step


@pytest.mark.parametrize(("profile", "groups", "form"), SPECS,
                         ids=[f"{p}-{len(g) or 1}group" for p, g, _ in SPECS])
def test_wire_ready_events_give_the_dataclasses_bytes_and_dicts(
        profile: str, groups: tuple[KVCacheGroupSpec, ...], form: str | None) -> None:
    spec = _spec(profile, groups)
    wire, plain = ReferenceManager(spec), DataclassEvents(spec)
    factory = wire.manager.block_pool.event_factory
    assert plain.manager.block_pool.event_factory is reference_events
    if form is None:  # 0.10.2's wire form has no group_idx: the dataclasses stay
        assert factory is reference_events
    else:
        assert isinstance(factory, WireEventFactory) and factory.release == form
    kinds: set[str] = set()
    for step in _lockstep(wire, plain, seed=len(groups) * 10 + len(profile)):
        if step % 2:
            events = wire.take_events()
            assert events == plain.take_events(), step
            kinds.update(e["type"] for e in events)
            kinds.update(f"{name} set" for e in events for name in ("lora_name", "extra_keys")
                         if e.get(name) is not None)
        elif form is not None:
            payload = wire.take_event_batch(float(step))
            assert payload == plain.take_event_batch(float(step)), step
            kinds.update(type(e).__name__
                         for e in decode_batch(payload, release=form).events)
    # every kind of event was compared, with a LoRA name and extra keys where 0.33 sets them
    tagged = {"lora_name set", "extra_keys set"} if profile != "vllm-0.10" else set()
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"} | tagged


def test_events_off_or_opted_out_stay_dataclasses() -> None:
    off = ReferenceManager(KVCacheSpec(num_blocks=8, block_size=4))
    assert off.manager.block_pool.event_factory is reference_events


@pytest.mark.parametrize("release", ["vllm-0.33", "vllm-0.10"])
@pytest.mark.parametrize("int_hashes", [False, True], ids=["bytes", "int"])
def test_the_factory_builds_what_encode_batch_writes(release: Any, int_hashes: bool) -> None:
    """Every event of 300 random steps' batches, rebuilt through the factory from its
    dataclass fields (the keywords the pool passes), encodes to ``encode_batch``'s bytes."""
    seen = 0
    for number, batch in enumerate(random_batches(release, seed=7, count=300)):
        metadata = batch.group_metadata if release == "vllm-0.33" else None
        factory = wire_event_factory(release, int_hashes=int_hashes, group_metadata=metadata)
        built = []
        for event in batch.events:
            fields = asdict(event)
            if release == "vllm-0.10":  # the pool under 0.10 sets none of these
                assert fields.get("group_idx", 0) == 0
            built.append(getattr(factory, type(event).__name__)(**fields))
        want = encode_batch(batch.events, ts=float(number), release=release,
                            int_hashes=int_hashes, group_metadata=metadata)
        assert factory.encode(built, float(number)) == want, number
        seen += len(built)
    assert seen > 600


def test_what_a_release_cannot_carry_is_refused() -> None:
    with pytest.raises(WireFormatError, match=r"unknown release 'vllm-0\.9'"):
        wire_event_factory("vllm-0.9")  # type: ignore[arg-type]
    with pytest.raises(WireFormatError, match=r"0\.10\.2's events carry no KV-cache spec"):
        wire_event_factory("vllm-0.10", group_metadata=[("full_attention", None)])
    old = wire_event_factory("vllm-0.10")
    stored = asdict(BlockStored((bytes(32),), None, (1, 2), 2, None))
    for field, value in (("lora_name", "a"), ("extra_keys", (None,)), ("group_idx", 1)):
        with pytest.raises(WireFormatError, match=f"0.10.2's events have no {field} field"):
            old.BlockStored(**{**stored, field: value})
    with pytest.raises(WireFormatError, match="no group_idx field, got 2"):
        old.BlockRemoved(block_hashes=(bytes(32),), medium="GPU", group_idx=2)
    new = wire_event_factory("vllm-0.33", group_metadata=[("full_attention", None)])
    with pytest.raises(WireFormatError, match="group_metadata has no entry for group 1"):
        new.BlockStored(**{**stored, "group_idx": 1})
