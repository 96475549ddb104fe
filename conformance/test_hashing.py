"""Hashing: golden block-hash vectors per (algorithm, PYTHONHASHSEED), chaining, extra keys
(LoRA, multimodal items, cache_salt), determinism across processes, and the NONE_HASH root.

The golden hex strings below are copied from docs/semantics.md#golden-vectors (computed
with vLLM 0.33.0's own code); they are literals on purpose, so a bug in kvcheck's reference
cannot hide a bug in the implementation. External routers and replicas (llm-d, Dynamo, LMCache)
recompute these hashes, so a silent change breaks them (peer-systems §4 rows 3, 4, 5, 21, 22).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.groups import one_group
from kvcheck.conformance.ops import RequestExtras, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.conformance.sizes import tokens

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.sizes import DeclaredSizes

pytestmark = pytest.mark.kv_capability("manager")

#: Algorithms each profile's vLLM offers (docs/semantics.md#hash-algorithms: 0.10.2 has two).
OFFERED_ALGOS: dict[str, tuple[str, ...]] = {
    "vllm-0.33": ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"),
    "vllm-0.10": ("sha256", "sha256_cbor"),
}

#: docs/semantics.md#golden-vectors: prompt (1..9), block size 4; b1 = (1,2,3,4), b2 = (5,6,7,8).
#: Seed None = PYTHONHASHSEED unset: deterministic only from vLLM 0.29 on (vllm-0.33 profile).
GOLDEN: dict[tuple[str, str | None], tuple[str, str]] = {
    ("sha256", None): (
        "52a7f141c60918f65779927090482b5a24adbe68c8613a211a1eb4e3edd9361a",
        "bee96bce54f5fcaba04c4a3fc2491b30b48e29dbbd38a327d41bc1f76b956dde",
    ),
    ("sha256_cbor", None): (
        "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111",
        "e1bc29393a2da9fd798f35ff04d215f846aee6df4b803ce3d43b57df56b58fb1",
    ),
    ("sha256", "0"): (
        "762b2e7e1520febd3a0aedb7358e8602facf3924440e18538fce057e23bae91d",
        "9e62b5a7ec298f33cb4c7d9e00b659874bb2432d23ad6879ad1746592a2b036b",
    ),
    ("sha256_cbor", "0"): (
        "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb",
        "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6",
    ),
    ("xxhash", "0"): (
        "f3856cedd7e636094750c4546e855397",
        "0c9832567b17003b126077f57e0bb670",
    ),
    ("xxhash_cbor", "0"): (
        "0a8577df5ee3430515a8cc1f6e3ac52e",
        "d152782cb4d753bde718a811a3b75e23",
    ),
}
GOLDEN_PROMPT = (1, 2, 3, 4, 5, 6, 7, 8, 9)

#: docs/semantics.md#golden-vectors, more sha256 vectors (PYTHONHASHSEED unset, vLLM 0.33).
LARGE_INT_PROMPT = (0, 255, 256, 65535, 65536, 2**31, 151643, 7, 9)
LARGE_INT_HASHES = (
    "a460e553ebf9a4709aec4c9f4b483550241baed2a0bb0b60e35dc02dbfa7abbe",
    "56b08fb02b4ae4d539e944e39704b595d676228e21f4cd7c473a9d09e6787452",
)
SALT_S1_HASHES = (  # (1,2,3,4) + (("cache_salt", "s1"),), then (5,6,7,8) + None
    "212c5a48b6305994093ea27595471850f18a87464e7fd5d5757baaa7745b5639",
    "45d34e640da9e8a7b91cf6f92cf7a2956f8f07658021756b56e2c4dd76ebecc4",
)
# (1,2,3,4) + (("lora", "a", "/p/a"),)
LORA_A_HASH = "98de0ba772b690624cbe537cde796c68ec42f1d61139c588293748ce7f7fcb60"


def _seed_id(seed: str | None) -> str:
    return "seedunset" if seed is None else f"seed{seed}"


GOLDEN_PARAMS = [
    pytest.param(algo, seed, id=f"{algo}-{_seed_id(seed)}") for algo, seed in GOLDEN
]
SEED0_PARAMS = [
    pytest.param(algo, "0", id=f"{algo}-seed0") for algo, seed in GOLDEN if seed == "0"
]


def _skip_unless_offered(kv_impl: ImplHandle, kv_profile: str, algo: str,
                         seed: str | None) -> None:
    """Skip a vector the implementation or the profile's vLLM cannot produce."""
    if algo not in kv_impl.info.hash_algos:
        pytest.skip(f"{kv_impl.name} does not list {algo!r} in IMPL_INFO.hash_algos")
    if algo not in OFFERED_ALGOS.get(kv_profile, ()):
        pytest.skip(f"{kv_profile}'s vLLM does not offer {algo!r}")
    if seed is None and kv_profile != "vllm-0.33":
        pytest.skip(f"with PYTHONHASHSEED unset, {kv_profile}'s NONE_HASH is random per process")


def _prefilled(kv_impl: ImplHandle, spec: KVCacheSpec, prompt: Sequence[int], rid: str = "r",
               **extras: Unpack[RequestExtras]) -> Driver:
    """A driver whose request ``rid`` has ``prompt`` fully prefilled."""
    driver = Driver(kv_impl, spec)
    driver.run([add(rid, prompt, **extras), schedule(rid)])
    return driver


def _hex(driver: Driver, rid: str = "r") -> list[str]:
    return [bytes(h).hex() for h in driver.manager.block_hashes(rid)]


# ------------------------------------------------------------------------------ golden vectors
@pytest.mark.kv_capability("block_hashes")
@pytest.mark.parametrize(("algo", "seed"), GOLDEN_PARAMS)
def test_golden_block_hashes(kv_impl: ImplHandle, kv_profile: str, algo: str,
                             seed: str | None) -> None:
    """Prompt (1..9), block size 4: both block hashes equal vLLM's for this algo and seed."""
    _skip_unless_offered(kv_impl, kv_profile, algo, seed)
    spec = KVCacheSpec(num_blocks=8, block_size=4, hash_algo=algo, pythonhashseed=seed,
                       profile=kv_profile)
    driver = _prefilled(kv_impl, spec, GOLDEN_PROMPT)
    got, want = _hex(driver), list(GOLDEN[(algo, seed)])
    assert got == want, (
        f"{algo}, PYTHONHASHSEED={seed!r}: block_hashes {got}, vLLM gives {want}\n"
        + driver.snippet())


@pytest.mark.kv_capability("block_hashes")
@pytest.mark.parametrize(("algo", "seed"), SEED0_PARAMS)
def test_fixed_seed_root_is_not_random(kv_impl: ImplHandle, kv_profile: str, algo: str,
                                       seed: str) -> None:
    """With PYTHONHASHSEED "0" two fresh managers give the golden first-block hash (a NONE_HASH
    that is random under a fixed seed, vllm#17088, fails)."""
    _skip_unless_offered(kv_impl, kv_profile, algo, seed)
    spec = KVCacheSpec(num_blocks=8, block_size=4, hash_algo=algo, pythonhashseed=seed,
                       profile=kv_profile)
    driver = _prefilled(kv_impl, spec, GOLDEN_PROMPT)
    firsts = [_hex(driver)[:1]]
    driver = _prefilled(kv_impl, spec, GOLDEN_PROMPT)  # a second, fresh manager
    firsts.append(_hex(driver)[:1])
    want = [GOLDEN[(algo, seed)][0]]
    assert firsts == [want, want], (
        f"{algo}, PYTHONHASHSEED='0': first block hash of two managers {firsts}, vLLM gives "
        f"{want[0]}\n" + driver.snippet())


@pytest.mark.kv_capability("block_hashes")
@pytest.mark.kv_profiles("vllm-0.33")
def test_large_token_ids_hash_losslessly(kv_impl: ImplHandle, kv_profile: str) -> None:
    """Token ids 255/256/65535/65536/2**31/151643 hash as vLLM encodes them (no truncation)."""
    _skip_unless_offered(kv_impl, kv_profile, "sha256", None)
    spec = KVCacheSpec(num_blocks=8, block_size=4, pythonhashseed=None, profile=kv_profile)
    driver = _prefilled(kv_impl, spec, LARGE_INT_PROMPT)
    got = _hex(driver)
    assert got == list(LARGE_INT_HASHES), (
        f"prompt {LARGE_INT_PROMPT}: block_hashes {got}, vLLM gives {list(LARGE_INT_HASHES)}\n"
        + driver.snippet())


@pytest.mark.kv_capability("block_hashes", "extra_keys")
@pytest.mark.kv_profiles("vllm-0.33")
def test_golden_salted_hashes(kv_impl: ImplHandle, kv_profile: str) -> None:
    """cache_salt "s1" keys block 0 as ("cache_salt", "s1"); block 1 has no extra key."""
    _skip_unless_offered(kv_impl, kv_profile, "sha256", None)
    spec = KVCacheSpec(num_blocks=8, block_size=4, pythonhashseed=None, profile=kv_profile)
    driver = _prefilled(kv_impl, spec, GOLDEN_PROMPT, salt="s1")
    got = _hex(driver)
    assert got == list(SALT_S1_HASHES), (
        f"salt 's1': block_hashes {got}, vLLM gives {list(SALT_S1_HASHES)}\n" + driver.snippet())


@pytest.mark.kv_capability("block_hashes", "extra_keys")
@pytest.mark.kv_profiles("vllm-0.33")
def test_golden_lora_hash(kv_impl: ImplHandle, kv_profile: str) -> None:
    """LoRA ("a", id, "/p/a") keys block 0 as ("lora", "a", "/p/a")."""
    _skip_unless_offered(kv_impl, kv_profile, "sha256", None)
    spec = KVCacheSpec(num_blocks=8, block_size=4, pythonhashseed=None, profile=kv_profile)
    driver = _prefilled(kv_impl, spec, (1, 2, 3, 4, 5), lora=("a", 1, "/p/a"))
    got = _hex(driver)
    assert got == [LORA_A_HASH], (
        f"LoRA ('a', '/p/a'): block_hashes {got}, vLLM gives {[LORA_A_HASH]}\n"
        + driver.snippet())


# ------------------------------------------------------------------------------ chaining
_BASE = tuple(range(100, 121))  # 5 full blocks of 4 and one partial token


def _mutated(j: int) -> tuple[int, ...]:
    """``_BASE`` with one token of block ``j`` changed."""
    tokens = list(_BASE)
    tokens[j * 4 + (1 if j < 5 else 0)] += 1000
    return tuple(tokens)


@pytest.mark.kv_capability("block_hashes")
def test_changing_block_j_changes_hashes_from_j_on(kv_impl: ImplHandle, kv_profile: str) -> None:
    """Hashes chain: changing a token of block j changes every hash from j on, none before."""
    driver = Driver(kv_impl, KVCacheSpec(num_blocks=64, block_size=4, profile=kv_profile))
    driver.run([add("base", _BASE), schedule("base")])
    base = _hex(driver, "base")
    assert len(base) == 5, f"21 tokens in blocks of 4 make 5 hashes, got {len(base)}"
    for j in range(5):
        rid = f"mut{j}"
        driver.run([add(rid, _mutated(j)), schedule(rid)])
        got = _hex(driver, rid)
        same = [a == b for a, b in zip(base, got, strict=False)]
        assert len(got) == 5 and same == [i < j for i in range(5)], (
            f"token changed in block {j}: hash equal to the unchanged prompt's per block "
            f"{same}, expected {[i < j for i in range(5)]}\n" + driver.snippet())


@pytest.mark.kv_capability("block_hashes")
def test_repeated_block_content_gets_distinct_hashes(kv_impl: ImplHandle, kv_profile: str) -> None:
    """Identical block contents at different positions hash differently (a content-only hash,
    sglang#13488, makes self-referential event chains)."""
    driver = _prefilled(kv_impl, KVCacheSpec(num_blocks=16, block_size=4, profile=kv_profile),
                        [7] * 16 + [8])
    got = _hex(driver)
    assert len(got) == 4 and len(set(got)) == 4, (
        f"4 blocks of (7, 7, 7, 7): hashes {got} must be 4 distinct values\n" + driver.snippet())


@pytest.mark.kv_capability("prefix_caching")
def test_changing_block_j_stops_prefix_hit_at_j(kv_impl: ImplHandle, kv_profile: str) -> None:
    """A later request that differs from a cached one in block j hits exactly blocks [0, j)."""
    driver = Driver(kv_impl, KVCacheSpec(num_blocks=16, block_size=4, profile=kv_profile))
    driver.run([add("base", _BASE), schedule("base")])
    table = driver.tables()["base"][0]
    for j in range(6):  # j == 5 changes the partial last block: all 5 full blocks hit
        rid = f"mut{j}"
        driver.apply(add(rid, _mutated(j)))
        got = one_group(driver.apply(schedule(rid)))["hits"]
        want = (table[:j], 4 * j)
        assert (list(got[0]), got[1]) == want, (
            f"request differing in block {j}: get_computed_blocks -> {got}, expected {want}\n"
            + driver.snippet())
        driver.apply(free(rid))


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
@pytest.mark.parametrize("delta", [256, 65536, 2**24], ids=["8bit", "16bit", "24bit"])
def test_token_ids_are_not_truncated(kv_impl: ImplHandle, kv_profile: str,
                                     kv_sizes: DeclaredSizes, delta: int) -> None:
    """Token 1 and token 1 + 2**k are different: a prompt differing only there gets no hit
    (8-bit truncation, vllm-mlx#444); looked up while the first request runs, or once it
    finished without caches_running_requests."""
    driver = Driver(kv_impl, kv_sizes.spec(num_blocks=16, block_size=4, profile=kv_profile))
    # GOLDEN_PROMPT at 4: 2 full blocks and a token.
    prompt = list(range(1, 1 + tokens(2, driver.spec.block_size, 1)))
    driver.run([add("a", prompt), schedule("a")])
    if "caches_running_requests" not in driver.capabilities:
        driver.apply(free("a"))  # a design caching at finish caches a's blocks now
    driver.apply(add("b", [1 + delta, *prompt[1:]]))
    hits, num = one_group(driver.apply(schedule("b")))["hits"]
    assert num == 0 and not hits, (
        f"prompts differing in token 0 (1 vs {1 + delta}) shared a prefix hit of {num} tokens "
        f"({hits})\n" + driver.snippet())


# ------------------------------------------------------------------------------ extra keys
_EXTRA_PROMPT = tuple(range(1, 21))  # 5 full blocks of 4
# img1 spans blocks 1-2: block 1 holds img0's tail (offset -2) and img1 (offset 1); block 2
# holds img1's middle (offset -3); img2 sits at the start of block 3.
_MM = [("img0", 2, 3), ("img1", 5, 6), ("img2", 12, 1)]
EXTRA_CASES: dict[str, RequestExtras] = {
    "lora": {"lora": ("sql", 3, "/adapters/sql")},
    "mm": {"mm": _MM},
    "salt": {"salt": "tenant-a"},
    "lora-mm-salt": {"lora": ("sql", 3, "/adapters/sql"), "mm": _MM, "salt": "tenant-a"},
}


@pytest.mark.kv_capability("block_hashes", "extra_keys")
@pytest.mark.parametrize("case", list(EXTRA_CASES))
def test_extra_keys_change_every_block_hash_as_reference(kv_pair: PairFactory, case: str) -> None:
    """LoRA / multimodal items (negative offsets, several per block) / cache_salt: the hashes
    equal the reference's through chunked prefill and decode, and differ from the same tokens
    without extras in every block (the salt is on block 0 only and reaches the rest by chaining)."""
    pair = kv_pair(num_blocks=32, block_size=4)
    extras = EXTRA_CASES[case]
    pair.run([add("x", _EXTRA_PROMPT, **extras), schedule("x", 6), schedule("x"),
              decode("x", 5), add("plain", _EXTRA_PROMPT), schedule("plain")])
    mine = [bytes(h) for h in pair.impl.manager.block_hashes("x")]
    plain = [bytes(h) for h in pair.impl.manager.block_hashes("plain")]
    if pair.oracle is not None:
        theirs = [bytes(h) for h in pair.oracle.manager.block_hashes("x")]
        assert mine == theirs, (
            f"{case}: block_hashes {[h.hex() for h in mine]}, reference "
            f"{[h.hex() for h in theirs]}\n" + pair.impl.snippet())
    shared = [i for i, (a, b) in enumerate(zip(mine, plain, strict=False)) if a == b]
    assert len(mine) == 6 and len(plain) == 5 and not shared, (
        f"{case}: blocks {shared} hash the same with and without {extras}\n"
        + pair.impl.snippet())


# (cached request's extras, probe's extras, blocks the probe hits per profile); the prompt has
# 3 full blocks of 4 plus one token, so a full hit is 3 blocks.
ISOLATION_CASES: dict[str, tuple[RequestExtras, RequestExtras, dict[str, int]]] = {
    "salt-same": ({"salt": "s1"}, {"salt": "s1"}, {"vllm-0.33": 3, "vllm-0.10": 3}),
    "salt-different": ({"salt": "s1"}, {"salt": "s2"}, {"vllm-0.33": 0, "vllm-0.10": 0}),
    "salt-vs-none": ({"salt": "s1"}, {}, {"vllm-0.33": 0, "vllm-0.10": 0}),
    "none-vs-salt": ({}, {"salt": "s1"}, {"vllm-0.33": 0, "vllm-0.10": 0}),
    "salt-vs-lora-named-alike": ({"salt": "s1"}, {"lora": ("s1", 1, "/s1")},
                                 {"vllm-0.33": 0, "vllm-0.10": 0}),
    "lora-same": ({"lora": ("a", 1, "/p/a")}, {"lora": ("a", 1, "/p/a")},
                  {"vllm-0.33": 3, "vllm-0.10": 3}),
    "lora-different": ({"lora": ("a", 1, "/p/a")}, {"lora": ("b", 2, "/p/b")},
                       {"vllm-0.33": 0, "vllm-0.10": 0}),
    "lora-vs-none": ({"lora": ("a", 1, "/p/a")}, {}, {"vllm-0.33": 0, "vllm-0.10": 0}),
    # 0.33 keys LoRA by (name, path); 0.10.2 by the integer id (docs/semantics.md#extra-keys).
    "lora-path-changed": ({"lora": ("a", 1, "/p/a")}, {"lora": ("a", 1, "/p/a2")},
                          {"vllm-0.33": 0, "vllm-0.10": 3}),
    "mm-same": ({"mm": [("img0", 1, 6)]}, {"mm": [("img0", 1, 6)]},
                {"vllm-0.33": 3, "vllm-0.10": 3}),
    "mm-other-image": ({"mm": [("img0", 1, 6)]}, {"mm": [("img1", 1, 6)]},
                       {"vllm-0.33": 0, "vllm-0.10": 0}),
    "mm-other-image-in-block-1": ({"mm": [("img0", 5, 2)]}, {"mm": [("img1", 5, 2)]},
                                  {"vllm-0.33": 1, "vllm-0.10": 1}),
    # 0.33 keys the item's offset in the block; 0.10.2 only its identifier.
    "mm-same-image-moved": ({"mm": [("img0", 5, 2)]}, {"mm": [("img0", 6, 2)]},
                            {"vllm-0.33": 1, "vllm-0.10": 3}),
}


@pytest.mark.kv_capability("prefix_caching", "extra_keys")
@pytest.mark.parametrize("case", list(ISOLATION_CASES))
def test_extra_keys_isolate_prefix_hits(kv_impl: ImplHandle, kv_profile: str, case: str) -> None:
    """Same salt / LoRA / image hits; a different one misses from the first block it keys
    (salt isolation, GHSA-rm76-4mrf-v9r8; vllm#56655)."""
    cached, probe, want_blocks = ISOLATION_CASES[case]
    driver = Driver(kv_impl, KVCacheSpec(num_blocks=16, block_size=4, profile=kv_profile))
    prompt = list(range(40, 53))
    driver.run([add("cached", prompt, **cached), schedule("cached"), add("probe", prompt, **probe)])
    hits, num = one_group(driver.apply(schedule("probe")))["hits"]
    want = want_blocks[kv_profile]
    assert num == 4 * want and list(hits) == driver.tables()["cached"][0][:want], (
        f"{case}: cached with {cached}, probe with {probe}: hit {num} tokens ({list(hits)}), "
        f"expected {want} blocks\n" + driver.snippet())


# ------------------------------------------------------------------------------ processes
_CHILD = r"""
import json, sys
from kvcheck.conformance.driver import Driver
from kvcheck.conformance.ops import add, schedule
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.conformance.loader import load_impl

target, profile, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
# Folders left off PYTHONPATH (see _child_pythonpath) are searched for the module only now,
# after kvcheck is imported, so a checkout's kvcheck/ cannot shadow the installed one.
impl = load_impl(target, search=json.loads(sys.argv[4]))
out = {}
for algo, seed in cases:
    spec = KVCacheSpec(num_blocks=8, block_size=4, hash_algo=algo, pythonhashseed=seed,
                       profile=profile)
    driver = Driver(impl, spec)
    driver.run([add("r", [1, 2, 3, 4, 5, 6, 7, 8, 9]), schedule("r")])
    out[f"{algo}|{seed}"] = [bytes(h).hex() for h in driver.manager.block_hashes("r")]
print(json.dumps(out))
"""
_CHILD_ENV_SEED = "4242"  # deliberately not the spec's seed: the spec must win


def _process_cases(kv_impl: ImplHandle, kv_profile: str,
                   ) -> tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]]:
    """(deterministic cases, random-root cases) this implementation and profile support."""
    algos = [a for a in OFFERED_ALGOS.get(kv_profile, ()) if a in kv_impl.info.hash_algos]
    fixed: list[tuple[str, str | None]] = [(a, "0") for a in algos]
    random_root: list[tuple[str, str | None]] = []
    for algo in algos:
        if kv_profile == "vllm-0.33" and algo in ("sha256", "sha256_cbor"):
            fixed.append((algo, None))
        else:  # 0.10.2: urandom root; 0.33: xxhash roots stay random (docs/semantics.md#none-hash)
            random_root.append((algo, None))
    return fixed, random_root


def _child_pythonpath() -> tuple[str, list[str]]:
    """(PYTHONPATH for the child, folders it searches for the implementation afterwards).

    The path is this process's sys.path, absolute, minus folders whose ``kvcheck/`` is not the
    kvcheck imported here (a source checkout's near-empty ``kvcheck/`` would shadow the
    install); those folders may still hold the implementation (a clone's root holding
    ``mypkg/``), so the child's loader searches them once kvcheck is imported."""
    import kvcheck

    installed = os.path.dirname(os.path.abspath(kvcheck.__file__))
    keep, later = [], []
    for path_entry in sys.path:
        entry = os.path.abspath(path_entry or os.curdir)
        candidate = os.path.join(entry, "kvcheck")
        if os.path.isdir(candidate) and os.path.abspath(candidate) != installed:
            later.append(entry)
            continue
        keep.append(entry)
    return os.pathsep.join(keep), later


@pytest.fixture(scope="module")
def child_hashes(kv_impl: ImplHandle, kv_profile: str,
                 tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Block hashes of the golden prompt computed in a fresh interpreter whose environment
    PYTHONHASHSEED differs from the spec's, for every (algo, seed) case."""
    fixed, random_root = _process_cases(kv_impl, kv_profile)
    # The child sees this process's sys.path, so an implementation importable here (a
    # --kv-impl module found through pytest's rootdir, say) is importable there too.
    pythonpath, search_later = _child_pythonpath()
    env = dict(os.environ, PYTHONHASHSEED=_CHILD_ENV_SEED, PYTHONPATH=pythonpath)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, kv_impl.target, kv_profile, json.dumps(fixed + random_root),
         json.dumps(search_later)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
        # `-c` puts the cwd first on sys.path: a fresh folder, so nothing there shadows a
        # module; an exec: engine's command is relative to this process's folder instead.
        cwd=os.getcwd() if kv_impl.target.startswith("exec:")
        else tmp_path_factory.mktemp("kvcheck-child"))
    assert proc.returncode == 0, (
        f"the child process hashing with --kv-impl={kv_impl.target} failed "
        f"(rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    hashes: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return hashes


@pytest.mark.kv_capability("block_hashes")
@pytest.mark.parametrize(("algo", "seed"), GOLDEN_PARAMS)
def test_hashes_identical_across_processes(kv_impl: ImplHandle, kv_profile: str,
                                           child_hashes: dict[str, list[str]], algo: str,
                                           seed: str | None) -> None:
    """Another interpreter (with a different PYTHONHASHSEED in its environment) computes the
    same block hashes for the same spec (vllm#17088: NONE_HASH random under a fixed seed)."""
    _skip_unless_offered(kv_impl, kv_profile, algo, seed)
    if (algo, seed) not in _process_cases(kv_impl, kv_profile)[0]:
        pytest.skip(f"{algo} with PYTHONHASHSEED unset has a random root under {kv_profile}")
    spec = KVCacheSpec(num_blocks=8, block_size=4, hash_algo=algo, pythonhashseed=seed,
                       profile=kv_profile)
    driver = _prefilled(kv_impl, spec, GOLDEN_PROMPT)
    here, there = _hex(driver), child_hashes[f"{algo}|{seed}"]
    assert here == there and len(here) == 2, (
        f"{algo}, spec pythonhashseed={seed!r}: this process {here}, a child process with env "
        f"PYTHONHASHSEED={_CHILD_ENV_SEED} {there}\n" + driver.snippet())


@pytest.mark.kv_capability("block_hashes")
@pytest.mark.parametrize("algo", list(OFFERED_ALGOS["vllm-0.33"]))
def test_unset_seed_root_is_random_per_process(kv_impl: ImplHandle, kv_profile: str,
                                               child_hashes: dict[str, list[str]],
                                               algo: str) -> None:
    """With PYTHONHASHSEED unset, vLLM 0.10's root (every algo) and 0.33's xxhash roots are
    random per process: a predictable root aids crafted collisions (docs/semantics.md#none-hash)."""
    _skip_unless_offered(kv_impl, kv_profile, algo, "0")
    if (algo, None) not in _process_cases(kv_impl, kv_profile)[1]:
        pytest.skip(f"{algo} with PYTHONHASHSEED unset is deterministic under {kv_profile} "
                    "(checked by test_hashes_identical_across_processes)")
    spec = KVCacheSpec(num_blocks=8, block_size=4, hash_algo=algo, pythonhashseed=None,
                       profile=kv_profile)
    driver = _prefilled(kv_impl, spec, GOLDEN_PROMPT)
    here, there = _hex(driver), child_hashes[f"{algo}|None"]
    assert len(here) == 2 and here[0] != there[0], (
        f"{algo}, PYTHONHASHSEED unset: two processes agree on block hash {here[0]}; "
        f"{kv_profile} derives the root from os.urandom\n" + driver.snippet())
