"""Hash functions, serialization bytes and NONE_HASH rules (docs/semantics.md#hashing-bytes).

Every expected value is a hex literal copied from docs/semantics.md or bytes built by hand from its
opcode listings; the code under test never produces its own expectation.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import textwrap

import cbor2
import pytest
import xxhash

from kvcheck.reference_impl.hashing import (
    DEFAULT_NONE_HASH_SEED,
    HASH_FUNCTIONS,
    get_hash_fn_by_name,
    resolve_none_hash,
    sha256,
    sha256_cbor,
    to_event_int,
    xxhash_cbor,
    xxhash_pickle,
)

NONE_HASH_SHA256_DEFAULT = bytes.fromhex(
    "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
)

# docs/semantics.md#golden-vectors: (algo, PYTHONHASHSEED or None if unset, NONE_HASH, b1, b2, u64).
GOLDEN = [
    (
        "sha256",
        None,
        "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
        "52a7f141c60918f65779927090482b5a24adbe68c8613a211a1eb4e3edd9361a",
        "bee96bce54f5fcaba04c4a3fc2491b30b48e29dbbd38a327d41bc1f76b956dde",
        1882140585328457242,
    ),
    (
        "sha256_cbor",
        None,
        "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
        "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111",
        "e1bc29393a2da9fd798f35ff04d215f846aee6df4b803ce3d43b57df56b58fb1",
        9561501211280363793,
    ),
    (
        "sha256",
        "0",
        "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c",
        "762b2e7e1520febd3a0aedb7358e8602facf3924440e18538fce057e23bae91d",
        "9e62b5a7ec298f33cb4c7d9e00b659874bb2432d23ad6879ad1746592a2b036b",
        10362225831949560093,
    ),
    (
        "sha256_cbor",
        "0",
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
        "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb",
        "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6",
        2164874634404590027,
    ),
    (
        "xxhash",
        "0",
        "6fb31cc38bba6066183f7f2104b9c051",
        "f3856cedd7e636094750c4546e855397",
        "0c9832567b17003b126077f57e0bb670",
        None,
    ),
    (
        "xxhash_cbor",
        "0",
        "1ebe36576dcb573f26b99533a20aaeca",
        "0a8577df5ee3430515a8cc1f6e3ac52e",
        "d152782cb4d753bde718a811a3b75e23",
        None,
    ),
]
GOLDEN_IDS = [f"{row[0]}-seed_{row[1] or 'unset_default'}" for row in GOLDEN]


def _framed_pickle(payload: bytes) -> bytes:
    """PROTO 5, then a FRAME header when the payload (STOP included) is >= 4 bytes."""
    frame = b"\x95" + len(payload).to_bytes(8, "little") if len(payload) >= 4 else b""
    return b"\x80\x05" + frame + payload


def _pickle_of_block(parent: bytes, four_small_ints: tuple[int, ...]) -> bytes:
    """Pickle of (parent32, (a, b, c, d), None), by hand (docs/semantics.md#serialization-bytes)."""
    assert len(parent) == 32 and all(0 <= t <= 255 for t in four_small_ints)
    toks = b"".join(b"K" + bytes([t]) for t in four_small_ints)  # BININT1 each
    payload = (
        b"\x43\x20" + parent + b"\x94"  # SHORT_BINBYTES(32) MEMOIZE
        + b"(" + toks + b"t\x94"  # MARK ... TUPLE MEMOIZE
        + b"N"  # NONE
        + b"\x87\x94."  # TUPLE3 MEMOIZE STOP
    )
    return _framed_pickle(payload)


def test_registry_has_exactly_vllm_algorithm_names() -> None:
    """The registry keys are vLLM's --prefix-caching-hash-algo names, mapped to our functions."""
    assert {
        "sha256": sha256,
        "sha256_cbor": sha256_cbor,
        "xxhash": xxhash_pickle,
        "xxhash_cbor": xxhash_cbor,
    } == HASH_FUNCTIONS


@pytest.mark.parametrize(("algo", "length"), [("sha256", 32), ("sha256_cbor", 32),
                                              ("xxhash", 16), ("xxhash_cbor", 16)])
def test_digest_lengths(algo: str, length: int) -> None:
    """sha256 digests are 32 bytes, xxh3-128 digests 16 bytes."""
    assert len(HASH_FUNCTIONS[algo]((b"x", (1,), None))) == length


@pytest.mark.parametrize(("algo", "seed", "none_hex", "b1_hex", "b2_hex", "u64"), GOLDEN,
                         ids=GOLDEN_IDS)
def test_golden_vectors(
    algo: str, seed: str | None, none_hex: str, b1_hex: str, b2_hex: str, u64: int | None
) -> None:
    """docs/semantics.md#golden-vectors: NONE_HASH, b1 = (1,2,3,4), b2 = (5,6,7,8), u64 of b1."""
    none_hash = resolve_none_hash(algo, "vllm-0.33", pythonhashseed=seed)
    assert none_hash.hex() == none_hex
    fn = get_hash_fn_by_name(algo)
    b1 = fn((none_hash, (1, 2, 3, 4), None))
    assert b1.hex() == b1_hex
    b2 = fn((b1, (5, 6, 7, 8), None))
    assert b2.hex() == b2_hex
    if u64 is not None:
        assert to_event_int(b1) == u64


def test_none_hash_seed_is_hashed_as_str_pickle() -> None:
    """docs/semantics.md#none-hash: pickle 80 05 95 12.. 8c 0e <14 B> 94 2e; CBOR 6e <14 B>."""
    seed = DEFAULT_NONE_HASH_SEED.encode("ascii")
    assert DEFAULT_NONE_HASH_SEED == "vllm-none-hash"
    expected_pickle = b"\x80\x05\x95\x12" + b"\x00" * 7 + b"\x8c\x0e" + seed + b"\x94\x2e"
    assert pickle.dumps(DEFAULT_NONE_HASH_SEED, protocol=pickle.HIGHEST_PROTOCOL) == expected_pickle
    assert sha256(DEFAULT_NONE_HASH_SEED) == hashlib.sha256(expected_pickle).digest()
    assert sha256(DEFAULT_NONE_HASH_SEED) == NONE_HASH_SHA256_DEFAULT
    expected_cbor = b"\x6e" + seed
    assert sha256_cbor(DEFAULT_NONE_HASH_SEED) == hashlib.sha256(expected_cbor).digest()
    assert xxhash_cbor(DEFAULT_NONE_HASH_SEED) == xxhash.xxh3_128_digest(expected_cbor)
    assert xxhash_pickle(DEFAULT_NONE_HASH_SEED) == xxhash.xxh3_128_digest(expected_pickle)


def test_block_pickle_bytes_match_spec_listing() -> None:
    """docs/semantics.md#serialization-bytes: pickle of (NONE_HASH, (0,1,2,3), None), sha256."""
    expected = _pickle_of_block(NONE_HASH_SHA256_DEFAULT, (0, 1, 2, 3))
    # Frame length 0x32 = 50 bytes, as docs/semantics.md#serialization-bytes lists.
    assert expected[2:11] == b"\x95\x32" + b"\x00" * 7
    obj = (NONE_HASH_SHA256_DEFAULT, (0, 1, 2, 3), None)
    assert pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) == expected
    assert sha256(obj) == hashlib.sha256(expected).digest()
    assert sha256(obj).hex() == "9da1c53089c000ad1a79a77c143b68dda00e2a85315bc1f690bbd03ba4a195dd"
    assert xxhash_pickle(obj) == xxhash.xxh3_128_digest(expected)


def test_block_cbor_bytes_match_spec_listing() -> None:
    """docs/semantics.md#serialization-bytes: CBOR 83 · 58 20 <32 B> · 84 00 01 02 03 · f6."""
    expected = b"\x83\x58\x20" + NONE_HASH_SHA256_DEFAULT + b"\x84\x00\x01\x02\x03\xf6"
    obj = (NONE_HASH_SHA256_DEFAULT, (0, 1, 2, 3), None)
    assert cbor2.dumps(obj, canonical=True) == expected
    assert sha256_cbor(obj) == hashlib.sha256(expected).digest()
    assert xxhash_cbor(obj) == xxhash.xxh3_128_digest(expected)


# docs/semantics.md#serialization-bytes integer table: value, pickle opcode + argument, CBOR.
INT_ENCODINGS = [
    (255, "4b ff", "18 ff"),
    (256, "4d 00 01", "19 01 00"),
    (65535, "4d ff ff", "19 ff ff"),
    (65536, "4a 00 00 01 00", "1a 00 01 00 00"),
    (2**31 - 1, "4a ff ff ff 7f", "1a 7f ff ff ff"),
    (2**31, "8a 05 00 00 00 80 00", "1a 80 00 00 00"),
    (-1, "4a ff ff ff ff", "20"),
]


@pytest.mark.parametrize(("value", "pickle_hex", "cbor_hex"), INT_ENCODINGS,
                         ids=[str(v) for v, _, _ in INT_ENCODINGS])
def test_integer_encodings(value: int, pickle_hex: str, cbor_hex: str) -> None:
    """Pickle picks BININT1/BININT2/BININT/LONG1 by value; CBOR uses the shortest head."""
    expected_pickle = _framed_pickle(bytes.fromhex(pickle_hex) + b".")
    assert pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL) == expected_pickle
    assert sha256(value) == hashlib.sha256(expected_pickle).digest()
    assert xxhash_pickle(value) == xxhash.xxh3_128_digest(expected_pickle)
    expected_cbor = bytes.fromhex(cbor_hex)
    assert cbor2.dumps(value, canonical=True) == expected_cbor
    assert sha256_cbor(value) == hashlib.sha256(expected_cbor).digest()
    assert xxhash_cbor(value) == xxhash.xxh3_128_digest(expected_cbor)


def test_pickle_memoizes_equal_strings_by_identity() -> None:
    """Equal but distinct "mm" strings pickle to 40 B instead of 37 B; sha256 differs, CBOR not."""
    shared = "mm"
    # Built at run time: equal to "mm" but another object (a literal would be interned).
    distinct = "".join(["m", "m"])  # noqa: FLY002
    assert shared == distinct and shared is not distinct
    same_obj = ((shared, "x", 1), (shared, "y", 2))
    two_objs = ((shared, "x", 1), (distinct, "y", 2))
    assert len(pickle.dumps(same_obj, protocol=pickle.HIGHEST_PROTOCOL)) == 37
    assert len(pickle.dumps(two_objs, protocol=pickle.HIGHEST_PROTOCOL)) == 40
    assert sha256(same_obj) != sha256(two_objs)
    assert xxhash_pickle(same_obj) != xxhash_pickle(two_objs)
    assert sha256_cbor(same_obj) == sha256_cbor(two_objs)
    assert xxhash_cbor(same_obj) == xxhash_cbor(two_objs)


def test_unknown_algorithm_error_lists_known_names() -> None:
    """An unknown name raises ValueError naming every known algorithm."""
    with pytest.raises(ValueError, match="sha256, sha256_cbor, xxhash, xxhash_cbor"):
        get_hash_fn_by_name("md5")


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_profile_0_10_rejects_xxhash(algo: str) -> None:
    """vLLM 0.10.2 offers only sha256 and sha256_cbor."""
    assert get_hash_fn_by_name(algo, "vllm-0.33") is HASH_FUNCTIONS[algo]
    with pytest.raises(ValueError, match=r"vllm-0\.10"):
        get_hash_fn_by_name(algo, "vllm-0.10")
    with pytest.raises(ValueError, match="not offered"):
        resolve_none_hash(algo, "vllm-0.10", pythonhashseed="0")


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_none_hash_with_seed_hashes_the_seed_string(profile: str) -> None:
    """Seed set: hash_fn(seed) in both versions; the str "0" is pickled, not b"0"."""
    expected_pickle = _framed_pickle(b"\x8c\x01" + b"0" + b"\x94.")
    got = resolve_none_hash("sha256", profile, pythonhashseed="0")
    assert got == hashlib.sha256(expected_pickle).digest()
    assert got.hex() == "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"
    assert got != hashlib.sha256(pickle.dumps(b"0", protocol=5)).digest()
    assert resolve_none_hash("sha256_cbor", profile, pythonhashseed="0").hex() == (
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    )


def test_none_hash_empty_seed_counts_as_set() -> None:
    """PYTHONHASHSEED="" is set (as os.getenv reports it): hash_fn(""), not the default."""
    expected_pickle = _framed_pickle(b"\x8c\x00\x94.")
    got = resolve_none_hash("sha256", pythonhashseed="")
    assert got == hashlib.sha256(expected_pickle).digest()


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_none_hash_unset_default_seed_is_stable(algo: str) -> None:
    """≥0.29, seed unset: hash_fn("vllm-none-hash"), the same on every call."""
    expected = {
        "sha256": "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
        "sha256_cbor": "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
    }[algo]
    values = {resolve_none_hash(algo, "vllm-0.33", pythonhashseed=None) for _ in range(3)}
    assert values == {bytes.fromhex(expected)}


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_none_hash_unset_xxhash_is_random_and_never_default(algo: str) -> None:
    """≥0.29, seed unset, xxhash variants: hash_fn(os.urandom(32).hex()), random per call."""
    seed = DEFAULT_NONE_HASH_SEED.encode("ascii")
    default = {
        "xxhash": xxhash.xxh3_128_digest(_framed_pickle(b"\x8c\x0e" + seed + b"\x94.")),
        "xxhash_cbor": xxhash.xxh3_128_digest(b"\x6e" + seed),
    }[algo]
    values = [resolve_none_hash(algo, "vllm-0.33", pythonhashseed=None) for _ in range(8)]
    assert len(set(values)) == len(values)
    assert default not in values
    assert all(len(v) == 16 for v in values)


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_none_hash_unset_0_10_is_32_random_bytes(algo: str) -> None:
    """0.10.2 (urandom policy), seed unset: raw os.urandom(32), random per call."""
    values = [resolve_none_hash(algo, "vllm-0.10", pythonhashseed=None) for _ in range(8)]
    assert all(len(v) == 32 for v in values)
    assert len(set(values)) == len(values)
    assert NONE_HASH_SHA256_DEFAULT not in values


def test_none_hash_reads_environment_when_not_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Omitting pythonhashseed reads os.environ["PYTHONHASHSEED"] at call time."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert resolve_none_hash("sha256").hex() == (
        "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"
    )
    monkeypatch.delenv("PYTHONHASHSEED")
    assert resolve_none_hash("sha256") == NONE_HASH_SHA256_DEFAULT
    # An explicit None wins over a set variable.
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert resolve_none_hash("sha256", pythonhashseed=None) == NONE_HASH_SHA256_DEFAULT


def test_to_event_int_is_last_8_bytes_unsigned() -> None:
    """int.from_bytes(h, "big") & (2**64-1): the last 8 bytes, big-endian, never negative."""
    digest = bytes(range(24)) + b"\xff" * 8
    assert to_event_int(digest) == 2**64 - 1
    digest = bytes(range(32))
    assert to_event_int(digest) == int.from_bytes(bytes(range(24, 32)), "big")
    xx = bytes.fromhex("f3856cedd7e636094750c4546e855397")
    assert to_event_int(xx) == 0x4750C4546E855397


_CHILD = textwrap.dedent(
    """
    from kvcheck.reference_impl.block_hasher import RequestBlockHasher, hash_request_tokens
    for algo in ("sha256", "sha256_cbor", "xxhash"):
        hasher = RequestBlockHasher(4, algo)
        print(algo, hasher.none_hash.hex(),
              *(h.hex() for h in hash_request_tokens(hasher, [1, 2, 3, 4, 5, 6, 7, 8])))
    """
)


def _run_child(seed: str | None) -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[0]: line.split()[1:] for line in out.splitlines()}


def test_hashes_are_deterministic_across_processes() -> None:
    """Same PYTHONHASHSEED -> same hashes in two processes; unset: sha256 default, xxhash random."""
    seeded_a, seeded_b = _run_child("0"), _run_child("0")
    assert seeded_a == seeded_b
    assert seeded_a["sha256"] == [
        "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c",
        "762b2e7e1520febd3a0aedb7358e8602facf3924440e18538fce057e23bae91d",
        "9e62b5a7ec298f33cb4c7d9e00b659874bb2432d23ad6879ad1746592a2b036b",
    ]
    assert seeded_a["xxhash"][1:] == [
        "f3856cedd7e636094750c4546e855397",
        "0c9832567b17003b126077f57e0bb670",
    ]
    unset_a, unset_b = _run_child(None), _run_child(None)
    for algo in ("sha256", "sha256_cbor"):
        assert unset_a[algo] == unset_b[algo]
    assert unset_a["sha256"][1] == (
        "52a7f141c60918f65779927090482b5a24adbe68c8613a211a1eb4e3edd9361a"
    )
    assert unset_a["sha256_cbor"][1] == (
        "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111"
    )
    # xxhash with an unset seed has a random root per process.
    assert unset_a["xxhash"][0] != unset_b["xxhash"][0]
