"""Block hashes: golden vectors, chaining, increments, lookahead (docs/semantics.md#hashing-bytes).

Expected hashes are spec hex literals or recomputed here with hashlib + pickle/CBOR directly.
"""

from __future__ import annotations

import hashlib
import pickle
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.reference_impl.block_hasher import (
    RequestBlockHasher,
    hash_block_tokens,
    hash_request_tokens,
)
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.hashing import HASH_FUNCTIONS, sha256
from kvcheck.reference_impl.profiles import get_profile
from kvcheck.reference_impl.request import LoRARequest, MultiModalFeature, Request

# docs/semantics.md#golden-vectors, seed unset (>= 0.29, sha256) and "0" rows: (NONE_HASH, b1, b2).
NONE_SHA256 = bytes.fromhex("066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198")
B1_SHA256 = "52a7f141c60918f65779927090482b5a24adbe68c8613a211a1eb4e3edd9361a"
B2_SHA256 = "bee96bce54f5fcaba04c4a3fc2491b30b48e29dbbd38a327d41bc1f76b956dde"
CHAINS = [
    ("sha256", "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
     B1_SHA256, B2_SHA256),
    ("sha256_cbor", "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
     "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111",
     "e1bc29393a2da9fd798f35ff04d215f846aee6df4b803ce3d43b57df56b58fb1"),
    ("sha256", "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c",
     "762b2e7e1520febd3a0aedb7358e8602facf3924440e18538fce057e23bae91d",
     "9e62b5a7ec298f33cb4c7d9e00b659874bb2432d23ad6879ad1746592a2b036b"),
    ("sha256_cbor", "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
     "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb",
     "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6"),
    ("xxhash", "6fb31cc38bba6066183f7f2104b9c051", "f3856cedd7e636094750c4546e855397",
     "0c9832567b17003b126077f57e0bb670"),
    ("xxhash_cbor", "1ebe36576dcb573f26b99533a20aaeca", "0a8577df5ee3430515a8cc1f6e3ac52e",
     "d152782cb4d753bde718a811a3b75e23"),
]
CHAIN_IDS = ["sha256-unset", "sha256_cbor-unset", "sha256-seed0", "sha256_cbor-seed0",
             "xxhash-seed0", "xxhash_cbor-seed0"]


def _ref_sha256(obj: Any) -> bytes:
    """Independent sha256-of-pickle, for expectations docs/semantics.md has no literal for."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _hasher(**kwargs: Any) -> RequestBlockHasher:
    kwargs.setdefault("none_hash", NONE_SHA256)
    return RequestBlockHasher(4, "sha256", **kwargs)


def _request(tokens: list[int], hasher: RequestBlockHasher | None = None, **kwargs: Any) -> Request:
    return Request("r", tokens, block_hasher=hasher or _hasher(), **kwargs)


@pytest.mark.parametrize(("algo", "none_hex", "b1_hex", "b2_hex"), CHAINS, ids=CHAIN_IDS)
def test_request_hashes_match_golden_chain(
    algo: str, none_hex: str, b1_hex: str, b2_hex: str
) -> None:
    """docs/semantics.md#golden-vectors: [1..8, 9] hashes b1 and b2; the partial third block not."""
    hasher = RequestBlockHasher(4, algo, none_hash=bytes.fromhex(none_hex))
    req = Request("r", [1, 2, 3, 4, 5, 6, 7, 8, 9], block_hasher=hasher)
    assert [h.hex() for h in req.block_hashes] == [b1_hex, b2_hex]
    assert [h.hex() for h in hash_request_tokens(hasher, [1, 2, 3, 4, 5, 6, 7, 8])] == [
        b1_hex, b2_hex
    ]


@pytest.mark.parametrize(("algo", "none_hex", "b1_hex", "b2_hex"), CHAINS, ids=CHAIN_IDS)
def test_hash_block_tokens_golden(algo: str, none_hex: str, b1_hex: str, b2_hex: str) -> None:
    """hash_block_tokens(fn, parent, toks, None) reproduces b1 (no parent) and b2 (parent b1)."""
    fn = HASH_FUNCTIONS[algo]
    none_hash = bytes.fromhex(none_hex)
    b1 = hash_block_tokens(fn, None, [1, 2, 3, 4], none_hash=none_hash)
    assert b1.hex() == b1_hex
    assert hash_block_tokens(fn, b1, (5, 6, 7, 8), None, none_hash=none_hash).hex() == b2_hex


@pytest.mark.parametrize("parent", [None, b""])
def test_falsy_parent_becomes_none_hash(parent: bytes | None) -> None:
    """None and b"" both mean 'first block': the parent slot holds NONE_HASH."""
    got = hash_block_tokens(sha256, parent, [1, 2, 3, 4], none_hash=NONE_SHA256)
    assert got.hex() == B1_SHA256
    assert got == _ref_sha256((NONE_SHA256, (1, 2, 3, 4), None))


def test_hash_block_tokens_equals_hash_of_the_triple() -> None:
    """hash_block_tokens(fn, p, toks, extra) == fn((p, tuple(toks), extra)) for a real parent."""
    parent = bytes.fromhex(B1_SHA256)
    extra = (("mm", "img", -1),)
    got = hash_block_tokens(sha256, parent, [9, 10, 11, 12], extra, none_hash=NONE_SHA256)
    assert got == _ref_sha256((parent, (9, 10, 11, 12), extra))


def test_empty_tuple_extra_differs_from_none() -> None:
    """() as extra keys hashes differently from None (the generator never produces ())."""
    with_none = hash_block_tokens(sha256, None, (1, 2, 3, 4), None, none_hash=NONE_SHA256)
    with_empty = hash_block_tokens(sha256, None, (1, 2, 3, 4), (), none_hash=NONE_SHA256)
    assert with_none.hex() == B1_SHA256
    assert with_empty != with_none


def test_large_int_tokens_golden() -> None:
    """docs/semantics.md#golden-vectors: (0,255,256,65535), (65536, 2**31, 151643, 7), no seed."""
    req = _request([0, 255, 256, 65535, 65536, 2**31, 151643, 7])
    assert [h.hex() for h in req.block_hashes] == [
        "a460e553ebf9a4709aec4c9f4b483550241baed2a0bb0b60e35dc02dbfa7abbe",
        "56b08fb02b4ae4d539e944e39704b595d676228e21f4cd7c473a9d09e6787452",
    ]


def test_block_zero_to_three_golden() -> None:
    """docs/semantics.md#golden-vectors: block (0,1,2,3), no extras, default seed."""
    assert _request([0, 1, 2, 3]).block_hashes[0].hex() == (
        "9da1c53089c000ad1a79a77c143b68dda00e2a85315bc1f690bbd03ba4a195dd"
    )


def test_cache_salt_golden() -> None:
    """docs/semantics.md#golden-vectors: salt "s1" keys block 0 only; block 1 has extra None."""
    req = _request([1, 2, 3, 4, 5, 6, 7, 8], cache_salt="s1")
    assert [h.hex() for h in req.block_hashes] == [
        "212c5a48b6305994093ea27595471850f18a87464e7fd5d5757baaa7745b5639",
        "45d34e640da9e8a7b91cf6f92cf7a2956f8f07658021756b56e2c4dd76ebecc4",
    ]


def test_lora_golden() -> None:
    """docs/semantics.md#golden-vectors: LoRA "a" at "/p/a" gives extra (("lora","a","/p/a"),)."""
    req = _request([1, 2, 3, 4], lora_request=LoRARequest("a", 1, "/p/a"))
    assert req.block_hashes[0].hex() == (
        "98de0ba772b690624cbe537cde796c68ec42f1d61139c588293748ce7f7fcb60"
    )


def test_lora_path_change_and_salt_vs_lora_name() -> None:
    """A changed LoRA path changes the hash; a salt equal to a LoRA name does not collide."""
    toks = [1, 2, 3, 4]
    a = _request(toks, lora_request=LoRARequest("a", 1, "/p/a")).block_hashes
    b = _request(toks, lora_request=LoRARequest("a", 1, "/p/b")).block_hashes
    salt = _request(toks, cache_salt="a").block_hashes
    lora_no_path = _request(toks, lora_request=LoRARequest("a", 1)).block_hashes
    assert len({a[0], b[0], salt[0], lora_no_path[0]}) == 4


def test_salt_changes_every_block_through_chaining() -> None:
    """Same salt -> same hashes; a different salt changes every block, not only block 0."""
    toks = list(range(12))
    s1 = _request(toks, cache_salt="s1").block_hashes
    assert _request(toks, cache_salt="s1").block_hashes == s1
    s2 = _request(toks, cache_salt="s2").block_hashes
    plain = _request(toks).block_hashes
    assert all(x != y for x, y in zip(s1, s2, strict=True))
    assert all(x != y for x, y in zip(s1, plain, strict=True))


@pytest.mark.parametrize("changed_block", [0, 1, 2, 3])
def test_changing_block_j_changes_every_hash_from_j_on(changed_block: int) -> None:
    """Chaining: one token changed in block j changes hashes j.. and leaves 0..j-1 alone."""
    toks = list(range(100, 116))
    base = _request(toks).block_hashes
    toks[changed_block * 4 + 2] += 1
    changed = _request(toks).block_hashes
    assert changed[:changed_block] == base[:changed_block]
    assert all(x != y for x, y in zip(changed[changed_block:], base[changed_block:], strict=True))


def test_partial_blocks_are_never_hashed() -> None:
    """7 tokens with block_size 4 -> 1 hash; the 8th token completes block 1."""
    req = _request([1, 2, 3, 4, 5, 6, 7])
    assert [h.hex() for h in req.block_hashes] == [B1_SHA256]
    req.append_output_token_ids(8)
    assert [h.hex() for h in req.block_hashes] == [B1_SHA256, B2_SHA256]
    hasher = _hasher()
    assert hasher(req) == []  # nothing new: the hasher returns only new full blocks
    assert hash_request_tokens(hasher, [1, 2, 3]) == []


def test_incremental_equals_one_shot_with_all_extras() -> None:
    """Appending one token at a time gives the one-shot hashes (0.33, LoRA + MM + salt + embeds)."""
    toks = list(range(50, 75))
    embeds = np.arange(10 * 2, dtype=np.float32).reshape(10, 2)
    extras: dict[str, Any] = {
        "lora_request": LoRARequest("a", 1, "/p/a"),
        "mm_features": [MultiModalFeature("i0", 1, 3), MultiModalFeature("i1", 5, 6)],
        "cache_salt": "s",
        "prompt_embeds": embeds,
    }
    one_shot = _request(toks, **extras).block_hashes
    incremental = _request(toks[:10], **extras)
    for tok in toks[10:]:
        incremental.append_output_token_ids(tok)
    assert incremental.block_hashes == one_shot
    assert len(one_shot) == 6


@settings(max_examples=40, deadline=None)
@given(
    toks=st.lists(st.integers(0, 2**33), min_size=1, max_size=40),
    prompt_len=st.integers(1, 40),
    chunks=st.lists(st.integers(1, 7), min_size=1, max_size=40),
    block_size=st.sampled_from([1, 2, 3, 4, 8]),
    lookahead=st.integers(0, 3),
)
def test_incremental_equals_one_shot_property(
    toks: list[int], prompt_len: int, chunks: list[int], block_size: int, lookahead: int
) -> None:
    """Any split into prompt + appended chunks gives the one-shot hashes (0.33, MM + salt)."""
    prompt_len = min(prompt_len, len(toks))
    hasher = RequestBlockHasher(block_size, "sha256_cbor", none_hash=b"\x01" * 32,
                                num_lookahead_tokens=lookahead)
    extras: dict[str, Any] = {
        "mm_features": [MultiModalFeature("i0", 0, 3), MultiModalFeature("i1", 4, 9)],
        "cache_salt": "salt",
    }
    one_shot = Request("a", toks, block_hasher=hasher, **extras).block_hashes
    req = Request("b", toks[:prompt_len], block_hasher=hasher, **extras)
    pos = prompt_len
    for size in chunks:
        if pos >= len(toks):
            break
        req.append_output_token_ids(toks[pos : pos + size])
        pos += size
    req.append_output_token_ids(toks[pos:])
    assert req.block_hashes == one_shot
    assert len(one_shot) == max(0, (len(toks) - lookahead) // block_size)


def test_decode_block_overlapping_image_gets_its_key() -> None:
    """0.33: a block completed in decode that still overlaps an image carries ("mm", id, off)."""
    req = _request([10, 11, 12, 13, 14, 15], mm_features=[MultiModalFeature("img", 2, 4)])
    (b0,) = req.block_hashes
    assert b0 == _ref_sha256((NONE_SHA256, (10, 11, 12, 13), (("mm", "img", 2),)))
    req.append_output_token_ids([16, 17])
    assert req.block_hashes[1] == _ref_sha256((b0, (14, 15, 16, 17), (("mm", "img", -2),)))


def test_v0_10_incremental_scan_starts_at_last_item() -> None:
    """0.10.2 quirk: incremental blocks see only the last MM item, so they can differ from one-shot.

    Images a = [1, 9), b = [9, 10); block [8, 12) overlaps both. One-shot it carries ("a", "b");
    completed by appended tokens it carries only "b". 0.33 gives the same hashes both ways.
    """
    feats = [MultiModalFeature("a", 1, 8), MultiModalFeature("b", 9, 1)]
    toks = list(range(12))
    for profile, equal in (("vllm-0.10", False), ("vllm-0.33", True)):
        hasher = RequestBlockHasher(4, "sha256", profile=profile, none_hash=NONE_SHA256)
        one_shot = Request("a", toks, block_hasher=hasher, mm_features=feats).block_hashes
        req = Request("b", toks[:10], block_hasher=hasher, mm_features=feats)
        req.append_output_token_ids(toks[10:])
        assert req.block_hashes[:2] == one_shot[:2]
        assert (req.block_hashes[2] == one_shot[2]) is equal, profile
    hasher = RequestBlockHasher(4, "sha256", profile="vllm-0.10", none_hash=NONE_SHA256)
    req = Request("c", toks[:10], block_hasher=hasher, mm_features=feats)
    req.append_output_token_ids(toks[10:])
    assert req.block_hashes[1] == _ref_sha256((_ref_sha256((NONE_SHA256, (0, 1, 2, 3), ("a",))),
                                              (4, 5, 6, 7), ("a",)))
    assert req.block_hashes[2] == _ref_sha256((req.block_hashes[1], (8, 9, 10, 11), ("b",)))


def test_v0_10_bare_keys_in_hash() -> None:
    """0.10.2 hashes bare keys: (lora_int_id, mm_hash, salt) on block 0."""
    hasher = RequestBlockHasher(4, "sha256", profile="vllm-0.10", none_hash=NONE_SHA256)
    req = Request("r", [1, 2, 3, 4], block_hasher=hasher, cache_salt="s1",
                  lora_request=LoRARequest("a", 3, "/p/a"),
                  mm_features=[MultiModalFeature("img", 0, 2)])
    assert req.block_hashes == [_ref_sha256((NONE_SHA256, (1, 2, 3, 4), (3, "img", "s1")))]


def test_prompt_embeds_enter_the_hash() -> None:
    """0.33: block i carries ("prompt_embeds", sha256(embeds[i*bs:(i+1)*bs].tobytes()))."""
    embeds = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    req = _request([1, 2, 3, 4], prompt_embeds=embeds)
    digest = hashlib.sha256(embeds.tobytes()).digest()
    assert req.block_hashes == [
        _ref_sha256((NONE_SHA256, (1, 2, 3, 4), (("prompt_embeds", digest),)))
    ]
    other = _request([1, 2, 3, 4], prompt_embeds=embeds + 1).block_hashes
    assert other != req.block_hashes


@pytest.mark.parametrize("lookahead", [1, 2, 3])
def test_lookahead_extra_keys_and_delay(lookahead: int) -> None:
    """L > 0: extra keys (E, *next L tokens); a block is hashed once its next L tokens exist."""
    hasher = _hasher(num_lookahead_tokens=lookahead)
    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    req = _request(toks[: 4 + lookahead - 1], hasher)
    assert req.block_hashes == []
    req.append_output_token_ids(toks[4 + lookahead - 1])
    expected = _ref_sha256((NONE_SHA256, (1, 2, 3, 4), (None, *toks[4 : 4 + lookahead])))
    assert req.block_hashes == [expected]
    assert expected.hex() != B1_SHA256
    assert hash_request_tokens(hasher, toks[: 4 + lookahead]) == [expected]


def test_lookahead_one_keeps_normal_extra_keys() -> None:
    """L = 1 with a salt: block 0's extra is ((("cache_salt","s1"),), t_4)."""
    req = _request([1, 2, 3, 4, 5], _hasher(num_lookahead_tokens=1), cache_salt="s1")
    assert req.block_hashes == [
        _ref_sha256((NONE_SHA256, (1, 2, 3, 4), ((("cache_salt", "s1"),), 5)))
    ]
    other = _request([1, 2, 3, 4, 6], _hasher(num_lookahead_tokens=1), cache_salt="s1")
    assert other.block_hashes != req.block_hashes


def test_lookahead_key_covers_an_item_in_the_lookahead_tokens() -> None:
    """L = 1: E covers the block and its lookahead token (vLLM 0.33's
    generate_lookahead_block_hash_extra_keys), so an image starting at token 4 is in block 0's
    key, at offset 4 from the block's start, and again in block 1's (the scan resumes at it)."""
    req = _request([1, 2, 3, 4, 5, 6, 7, 8, 9], _hasher(num_lookahead_tokens=1),
                   mm_features=(MultiModalFeature("img", 4, 2),))
    first = _ref_sha256((NONE_SHA256, (1, 2, 3, 4), ((("mm", "img", 4),), 5)))
    second = _ref_sha256((first, (5, 6, 7, 8), ((("mm", "img", 0),), 9)))
    assert req.block_hashes == [first, second]


def test_lookahead_rejected_under_v0_10() -> None:
    """0.10.2 has no lookahead hashing; asking for it is a ValueError naming the profile."""
    with pytest.raises(ValueError, match=r"vllm-0\.10"):
        RequestBlockHasher(4, profile="vllm-0.10", none_hash=NONE_SHA256, num_lookahead_tokens=1)
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        RequestBlockHasher(4, none_hash=NONE_SHA256, num_lookahead_tokens=-1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"block_size": 0}, "block_size must be >= 1"),
     ({"block_size": 4, "none_hash": b""}, "none_hash must be non-empty bytes"),
     ({"block_size": 4, "hash_algo": "xxhash", "profile": "vllm-0.10"},
      "'xxhash' is not offered by profile 'vllm-0.10'"),
     ({"block_size": 4, "hash_algo": "md5"}, "unknown prefix-caching hash algorithm 'md5'")],
    ids=["block_size_0", "empty_none_hash", "xxhash_under_0_10", "unknown_algo"],
)
def test_constructor_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    """Invalid configuration fails at construction with a misuse error (a ValueError)."""
    with pytest.raises(KVCacheMisuseError, match=re.escape(message)):
        RequestBlockHasher(**kwargs)


def test_hasher_attributes_and_env_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attributes expose the configuration; none_hash comes from PYTHONHASHSEED when omitted."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    hasher = RequestBlockHasher(4)
    assert hasher.block_size == 4
    assert hasher.hash_algo == "sha256"
    assert hasher.hash_fn is HASH_FUNCTIONS["sha256"]
    assert hasher.profile is get_profile("vllm-0.33")
    assert hasher.num_lookahead_tokens == 0
    assert hasher.none_hash == NONE_SHA256
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert RequestBlockHasher(4, "sha256_cbor").none_hash.hex() == (
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    )


def test_v0_10_unset_seed_gives_random_root_per_hasher(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.10.2 with PYTHONHASHSEED unset: each hasher draws a random 32-byte root."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    a = RequestBlockHasher(4, profile="vllm-0.10")
    b = RequestBlockHasher(4, profile="vllm-0.10")
    assert len(a.none_hash) == 32 and a.none_hash != b.none_hash
    assert NONE_SHA256 not in (a.none_hash, b.none_hash)
    assert hash_request_tokens(a, [1, 2, 3, 4]) != hash_request_tokens(b, [1, 2, 3, 4])


def test_hash_request_tokens_continues_a_chain() -> None:
    """parent_block_hash continues an existing chain; equals hashing the whole list."""
    hasher = _hasher()
    toks = list(range(13))
    full = hash_request_tokens(hasher, toks)
    assert len(full) == 3
    assert hash_request_tokens(hasher, toks[4:], parent_block_hash=full[0]) == full[1:]
    assert _request(toks, hasher).block_hashes == full
