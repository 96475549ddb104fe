"""vLLM's four block-hash functions and the ``NONE_HASH`` root (docs/semantics.md#hashing-bytes).

Contract: ``HASH_FUNCTIONS[name](obj)`` returns exactly the digest vLLM computes for the same
Python object, so a ``BlockHash`` produced here equals the one vLLM stores. There is no
module-global ``NONE_HASH``: ``resolve_none_hash`` returns the root parent and the caller (the
request block hasher) carries it, so two hashers with different seeds can coexist in one process.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import pickle
from collections.abc import Callable
from typing import Final

import cbor2
import xxhash as _xxhash

from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.profiles import ProfileBehaviour, get_profile

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "HASH_FUNCTIONS",
    "NON_CRYPTO_HASH_ALGOS",
    "HashFn",
    "get_hash_fn_by_name",
    "resolve_none_hash",
    "sha256",
    "sha256_cbor",
    "to_event_int",
    "xxhash_cbor",
    "xxhash_pickle",
]

_logger = logging.getLogger(__name__)

# A hash function maps any picklable / CBOR-encodable object to a digest (32 B or 16 B).
HashFn = Callable[[object], bytes]

# vLLM >= 0.29 hashes this *str* (not bytes) to get NONE_HASH when PYTHONHASHSEED is unset.
DEFAULT_NONE_HASH_SEED: Final = "vllm-none-hash"

# Algorithms whose NONE_HASH stays random (and warns) with PYTHONHASHSEED unset under the
# "default_seed" policy: a public, fixed root would make a non-cryptographic hash easier to
# collide on purpose, so vLLM only makes the cryptographic ones deterministic.
NON_CRYPTO_HASH_ALGOS: Final = frozenset({"xxhash", "xxhash_cbor"})

# 2**64 - 1: KV events with integer hashes publish only the low 64 bits (the last 8 bytes).
_U64_MASK: Final = (1 << 64) - 1


def _pickle_bytes(obj: object) -> bytes:
    # HIGHEST_PROTOCOL is 5 on every Python this project supports; vLLM uses the same constant.
    # Pickle memoizes by object identity, so equal-but-distinct strings serialize differently
    # (docs/semantics.md#serialization-bytes); to get vLLM's bytes, build the same objects.
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor_bytes(obj: object) -> bytes:
    # Canonical CBOR: shortest integer encodings, deterministic map key order, no identity effects.
    return cbor2.dumps(obj, canonical=True)


def sha256(obj: object) -> bytes:
    """vLLM's default ``sha256``: SHA-256 (32 bytes) of the protocol-5 pickle of ``obj``."""
    return hashlib.sha256(_pickle_bytes(obj)).digest()


def sha256_cbor(obj: object) -> bytes:
    """vLLM's ``sha256_cbor``: SHA-256 (32 bytes) of the canonical CBOR encoding of ``obj``.

    The portable choice: the encoding does not depend on Python object identity.
    """
    return hashlib.sha256(_cbor_bytes(obj)).digest()


def xxhash_pickle(obj: object) -> bytes:
    """vLLM's ``xxhash`` (>= 0.13): XXH3-128 digest (16 bytes) of the **pickle** of ``obj``.

    Named ``xxhash_pickle`` so it does not shadow the ``xxhash`` package; registered in
    ``HASH_FUNCTIONS`` under vLLM's name ``"xxhash"``.
    """
    return _xxhash.xxh3_128_digest(_pickle_bytes(obj))


def xxhash_cbor(obj: object) -> bytes:
    """vLLM's ``xxhash_cbor`` (>= 0.13): XXH3-128 digest (16 bytes) of canonical CBOR."""
    return _xxhash.xxh3_128_digest(_cbor_bytes(obj))


# Keyed by the names of vLLM's ``--prefix-caching-hash-algo`` option.
HASH_FUNCTIONS: Final[dict[str, HashFn]] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash_pickle,
    "xxhash_cbor": xxhash_cbor,
}


def get_hash_fn_by_name(name: str, profile: str | ProfileBehaviour | None = None) -> HashFn:
    """Return the hash function vLLM registers under ``name``.

    Args:
        name: one of ``HASH_FUNCTIONS`` (``"sha256"``, ``"sha256_cbor"``, ``"xxhash"``,
            ``"xxhash_cbor"``).
        profile: when given (a name or a ``ProfileBehaviour``), also require that the
            profile's release offers the algorithm, e.g. vLLM 0.10.2 has only sha256 and
            sha256_cbor.

    Raises:
        KVCacheMisuseError: unknown algorithm (the message lists the known ones), or one the
            profile's release does not offer (the message lists what it does offer).
    """
    if name not in HASH_FUNCTIONS:
        known = ", ".join(sorted(HASH_FUNCTIONS))
        raise KVCacheMisuseError(f"unknown prefix-caching hash algorithm {name!r}; known: {known}")
    if profile is not None:
        prof = get_profile(profile)
        if name not in prof.hash_algos:
            offered = ", ".join(prof.hash_algos)
            raise KVCacheMisuseError(
                f"hash algorithm {name!r} is not offered by profile {prof.name!r} "
                f"(vLLM {prof.vllm_version}); it offers: {offered}"
            )
    return HASH_FUNCTIONS[name]


class _FromEnv(enum.Enum):
    """Sentinel type: 'read PYTHONHASHSEED from os.environ' (``None`` means explicitly unset)."""

    TOKEN = enum.auto()


_FROM_ENV: Final = _FromEnv.TOKEN


def resolve_none_hash(
    hash_algo: str,
    profile: str | ProfileBehaviour | None = None,
    pythonhashseed: str | _FromEnv | None = _FROM_ENV,
) -> bytes:
    """The root parent hash for ``hash_algo`` under ``profile`` (docs/semantics.md#none-hash).

    Args:
        hash_algo: a name accepted by ``get_hash_fn_by_name(hash_algo, profile)``.
        profile: profile name or ``ProfileBehaviour``; ``None`` is the default profile (0.33).
        pythonhashseed: the value of ``PYTHONHASHSEED`` to assume. Omitted: read
            ``os.environ`` now. ``None``: the variable is unset. A ``str`` (including ``""``,
            as ``os.getenv`` would return it) counts as set.

    Returns:
        - seed set: ``hash_fn(seed)``; the *str* is hashed, not its bytes.
        - unset, ``none_hash == "default_seed"`` (>= 0.29): ``hash_fn("vllm-none-hash")`` for
          sha256 / sha256_cbor (deterministic); ``hash_fn(os.urandom(32).hex())`` for the xxhash
          variants, a fresh random value on every call (logged as a warning).
        - unset, ``none_hash == "urandom"`` (<= 0.28, 0.10.2): ``os.urandom(32)``, 32 raw random
          bytes whatever the algorithm.

    Raises:
        KVCacheMisuseError: as ``get_hash_fn_by_name``.
    """
    prof = get_profile(profile)
    hash_fn = get_hash_fn_by_name(hash_algo, prof)
    seed = os.environ.get("PYTHONHASHSEED") if pythonhashseed is _FROM_ENV else pythonhashseed
    if seed is not None:
        return hash_fn(seed)
    if prof.none_hash == "urandom":
        if hash_algo == "sha256_cbor":
            # 0.10.2 warns here: sha256_cbor is chosen for reproducibility, which a random root
            # defeats.
            _logger.warning(
                "PYTHONHASHSEED is unset: NONE_HASH is random, so %s block hashes are not "
                "reproducible across processes", hash_algo
            )
        return os.urandom(32)
    if hash_algo in NON_CRYPTO_HASH_ALGOS:
        _logger.warning(
            "PYTHONHASHSEED is unset and %s is not a cryptographic hash: NONE_HASH is random "
            "per process", hash_algo
        )
        return hash_fn(os.urandom(32).hex())
    return hash_fn(DEFAULT_NONE_HASH_SEED)


def to_event_int(block_hash: bytes) -> int:
    """The integer KV events publish for a hash (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``).

    ``int.from_bytes(block_hash, "big") & (2**64 - 1)``: the **last 8 bytes** read as an
    unsigned big-endian integer, in ``[0, 2**64)``. Pass the bare ``BlockHash``, not the
    group-suffixed key (whose last 4 bytes are the group id).
    """
    return int.from_bytes(block_hash, "big") & _U64_MASK
