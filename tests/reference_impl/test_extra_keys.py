"""Extra keys: order, formats, salt placement, multimodal scans (docs/semantics.md#extra-keys)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvcheck.reference_impl.extra_keys import (
    generate_block_hash_extra_keys,
    to_event_extra_keys,
)
from kvcheck.reference_impl.request import LoRARequest, MultiModalFeature, Request

V033 = "vllm-0.33"
V010 = "vllm-0.10"


def _request(num_tokens: int = 16, **kwargs: object) -> Request:
    """A request with tokens 0..num_tokens-1 and no hasher (keys are computed by hand here)."""
    return Request("r", list(range(num_tokens)), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("profile", [V033, V010])
def test_no_extras_is_none_not_empty_tuple(profile: str) -> None:
    """A block without extras gets None, never ()."""
    keys, next_idx = generate_block_hash_extra_keys(_request(), 0, 4, 0, profile)
    assert keys is None
    assert next_idx == 0


def test_tagged_order_lora_mm_salt_embeds() -> None:
    """0.33: ("lora", name, path), ("mm", id, off), ("cache_salt", s), ("prompt_embeds", d)."""
    embeds = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    req = _request(
        lora_request=LoRARequest("adapter", 7, "/p/adapter"),
        mm_features=[MultiModalFeature("img0", 1, 2)],
        cache_salt="salt",
        prompt_embeds=embeds,
    )
    keys, _ = generate_block_hash_extra_keys(req, 0, 4, 0, V033)
    assert keys == (
        ("lora", "adapter", "/p/adapter"),
        ("mm", "img0", 1),
        ("cache_salt", "salt"),
        ("prompt_embeds", hashlib.sha256(embeds[0:4].tobytes()).digest()),
    )


def test_bare_order_lora_int_id_mm_hash_salt_and_no_embeds() -> None:
    """0.10.2: lora_int_id, mm_hash, salt; prompt embeds are not part of the key."""
    req = _request(
        lora_request=LoRARequest("adapter", 7, "/p/adapter"),
        mm_features=[MultiModalFeature("img0", 1, 2)],
        cache_salt="salt",
        prompt_embeds=np.zeros((16, 3), dtype=np.float32),
    )
    keys, _ = generate_block_hash_extra_keys(req, 0, 4, 0, V010)
    assert keys == (7, "img0", "salt")


@pytest.mark.parametrize(("profile", "salt_key"), [(V033, ("cache_salt", "s1")), (V010, "s1")])
def test_salt_only_on_block_zero(profile: str, salt_key: object) -> None:
    """cache_salt enters only the block that starts at token 0."""
    req = _request(cache_salt="s1")
    assert generate_block_hash_extra_keys(req, 0, 4, 0, profile)[0] == (salt_key,)
    assert generate_block_hash_extra_keys(req, 4, 8, 0, profile)[0] is None


@pytest.mark.parametrize("profile", [V033, V010])
def test_empty_salt_is_ignored(profile: str) -> None:
    """A falsy salt ("") adds nothing."""
    assert generate_block_hash_extra_keys(_request(cache_salt=""), 0, 4, 0, profile)[0] is None


def test_lora_key_carries_name_and_path() -> None:
    """0.33 LoRA key is ("lora", name, path): a changed path gives a different key."""
    a = _request(lora_request=LoRARequest("a", 1, "/p/a"))
    b = _request(lora_request=LoRARequest("a", 1, "/p/b"))
    assert generate_block_hash_extra_keys(a, 4, 8, 0, V033)[0] == (("lora", "a", "/p/a"),)
    assert generate_block_hash_extra_keys(b, 4, 8, 0, V033)[0] == (("lora", "a", "/p/b"),)


def test_salt_equal_to_lora_name_gives_different_key() -> None:
    """Tags keep a salt "a" apart from a LoRA named "a"."""
    lora = generate_block_hash_extra_keys(_request(lora_request=LoRARequest("a", 1)), 0, 4, 0)
    salt = generate_block_hash_extra_keys(_request(cache_salt="a"), 0, 4, 0)
    assert lora[0] == (("lora", "a", ""),)
    assert salt[0] == (("cache_salt", "a"),)
    assert lora[0] != salt[0]


def test_mm_offsets_relative_to_block_start_and_negative() -> None:
    """An image [2, 11) spans blocks 0-2 with offsets 2, -2, -6; block 3 has no key."""
    req = _request(mm_features=[MultiModalFeature("img", 2, 9)])
    idx = 0
    got = []
    for start in range(0, 16, 4):
        keys, idx = generate_block_hash_extra_keys(req, start, start + 4, idx, V033)
        got.append(keys)
    assert got == [(("mm", "img", 2),), (("mm", "img", -2),), (("mm", "img", -6),), None]


def test_several_mm_items_in_one_block_share_the_tag_object() -> None:
    """Three items in block [0, 4) give three keys in order; the "mm" tag is one object."""
    feats = [MultiModalFeature("a", 0, 2), MultiModalFeature("b", 2, 1),
             MultiModalFeature("c", 3, 3)]
    keys, next_idx = generate_block_hash_extra_keys(_request(mm_features=feats), 0, 4, 0, V033)
    assert keys == (("mm", "a", 0), ("mm", "b", 2), ("mm", "c", 3))
    assert next_idx == 2  # "c" continues into the next block
    # Pickle memoizes by identity: one tag object, as vLLM (docs/semantics.md#serialization-bytes).
    assert keys is not None and keys[0][0] is keys[1][0] is keys[2][0]


def test_v0_33_block_starting_at_item_end_does_not_carry_it() -> None:
    """0.33 overlap is half-open: item [0, 4) is not in block [4, 8)."""
    req = _request(mm_features=[MultiModalFeature("img", 0, 4)])
    assert generate_block_hash_extra_keys(req, 0, 4, 0, V033) == ((("mm", "img", 0),), 1)
    assert generate_block_hash_extra_keys(req, 4, 8, 0, V033) == (None, 1)
    # Nor is an item starting at the block's end in the block.
    req = _request(mm_features=[MultiModalFeature("img", 4, 2)])
    assert generate_block_hash_extra_keys(req, 0, 4, 0, V033) == (None, 0)


def test_v0_10_block_starting_at_item_end_still_carries_it() -> None:
    """0.10.2 compares strictly: a block starting exactly at the item's end still gets its hash."""
    req = _request(mm_features=[MultiModalFeature("img", 0, 4)])
    # The block holding the item's last token moves the scan past it...
    assert generate_block_hash_extra_keys(req, 0, 4, 0, V010) == (("img",), 1)
    # ...yet a scan started at the item still gives it to the next block (start == item end).
    assert generate_block_hash_extra_keys(req, 4, 8, 0, V010) == (("img",), 1)
    # An item starting at the block's end is not in the block.
    req = _request(mm_features=[MultiModalFeature("img", 4, 2)])
    assert generate_block_hash_extra_keys(req, 0, 4, 0, V010) == (None, 0)
    # One token later the early return (last item end < start) applies; the index is unchanged.
    req = _request(mm_features=[MultiModalFeature("img", 0, 3)])
    assert generate_block_hash_extra_keys(req, 4, 8, 0, V010) == (None, 0)


def test_v0_10_item_ending_inside_block_stops_at_block_end() -> None:
    """0.10.2: an item continuing past the block stops the scan at that item."""
    feats = [MultiModalFeature("a", 1, 2), MultiModalFeature("b", 3, 4)]
    req = _request(mm_features=feats)
    assert generate_block_hash_extra_keys(req, 0, 4, 0, V010) == (("a", "b"), 1)
    assert generate_block_hash_extra_keys(req, 4, 8, 1, V010) == (("b",), 2)


def test_v0_10_negative_start_index_sees_only_the_last_item() -> None:
    """0.10.2: start_mm_idx=-1 (incremental blocks) skips every item but the last."""
    feats = [MultiModalFeature("a", 2, 3), MultiModalFeature("b", 6, 1)]
    req = _request(mm_features=feats)
    assert generate_block_hash_extra_keys(req, 4, 8, 0, V010) == (("a", "b"), 2)
    assert generate_block_hash_extra_keys(req, 4, 8, -1, V010) == (("b",), 2)


def test_v0_33_scan_index_points_at_first_unfinished_item() -> None:
    """0.33 returns the first item the block does not finish, or the item the scan stopped at."""
    feats = [MultiModalFeature("a", 0, 2), MultiModalFeature("b", 5, 6),
             MultiModalFeature("c", 12, 1)]
    req = _request(mm_features=feats)
    assert generate_block_hash_extra_keys(req, 0, 4, 0, V033) == ((("mm", "a", 0),), 1)
    assert generate_block_hash_extra_keys(req, 4, 8, 1, V033) == ((("mm", "b", 1),), 1)
    assert generate_block_hash_extra_keys(req, 8, 12, 1, V033) == ((("mm", "b", -3),), 2)
    assert generate_block_hash_extra_keys(req, 12, 16, 2, V033) == ((("mm", "c", 0),), 3)
    # Starting from 0 gives the same keys: earlier, finished items are skipped.
    assert generate_block_hash_extra_keys(req, 8, 12, 0, V033) == ((("mm", "b", -3),), 2)


def test_prompt_embeds_digest_per_block_and_cache() -> None:
    """The digest is sha256 of the block's slice bytes; a supplied cache is filled and reused."""
    embeds = np.arange(6 * 2, dtype=np.float16).reshape(6, 2)
    req = _request(6, prompt_embeds=embeds)
    cache: dict[tuple[int, int], bytes] = {}
    keys, _ = generate_block_hash_extra_keys(req, 0, 4, 0, V033, prompt_embeds_cache=cache)
    digest = hashlib.sha256(embeds[0:4].tobytes()).digest()
    assert keys == (("prompt_embeds", digest),)
    assert cache == {(0, 4): digest}
    cache[(4, 8)] = b"cached"
    keys, _ = generate_block_hash_extra_keys(req, 4, 8, 0, V033, prompt_embeds_cache=cache)
    assert keys == (("prompt_embeds", b"cached"),)
    # Without a cache the slice is hashed as is: [4, 8) of a 6-token prompt is 2 rows.
    keys, _ = generate_block_hash_extra_keys(req, 4, 8, 0, V033)
    assert keys == (("prompt_embeds", hashlib.sha256(embeds[4:6].tobytes()).digest()),)


def test_to_event_extra_keys_strips_tags() -> None:
    """Events publish LoRA name and salt bare, MM as (identifier, offset), embeds as the digest."""
    tagged = (
        ("lora", "adapter", "/p/adapter"),
        ("mm", "img0", -3),
        ("mm", "img1", 2),
        ("cache_salt", "salt"),
        ("prompt_embeds", b"\x01\x02"),
    )
    assert to_event_extra_keys(tagged) == (
        "adapter", ("img0", -3), ("img1", 2), "salt", b"\x01\x02"
    )
    assert to_event_extra_keys(None) is None


def test_to_event_extra_keys_rejects_bare_keys() -> None:
    """0.10.2's bare keys are not the tagged format; converting them is an error."""
    with pytest.raises(ValueError, match="not a tagged extra key"):
        to_event_extra_keys((7, "img0", "salt"))
