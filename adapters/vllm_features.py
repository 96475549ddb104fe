"""Feature detection and profile selection for the vLLM adapter (no vLLM import here).

The adapter (``kvcheck.adapters.vllm``) never trusts a version string alone: it *observes* the
few behaviours kvcheck's profiles differ in (docs/semantics.md#differences), driving tiny objects of
the installed vLLM, and picks the profile whose free order matches:

* ``free_unhashed``: where ``BlockPool.free_blocks`` puts an unhashed block with prefix
  caching on: ``"head"`` (0.24+, vllm#42656) or ``"tail"`` (<= 0.23, 0.10.2);
* ``free_caching_off``: the same with prefix caching off: ``"head"`` (0.24-0.26, 0.28+) or
  ``"tail"`` (<= 0.23, and the 0.27.0 regression vllm#48017);
* ``none_hash``: the root hash with PYTHONHASHSEED unset: ``"default_seed"``
  (``sha256("vllm-none-hash")``, 0.29+) or ``"urandom"`` (<= 0.28);
* ``extra_keys``: how a LoRA adapter enters the block hash: ``"tagged"``
  (``("lora", name, path)``, 0.31+), ``"lora_name"`` (the bare name, ~0.13-0.30) or
  ``"bare"`` (``lora_int_id``, 0.10.2); ``None`` when it could not be observed;
* ``mm_keys``: how a multimodal item enters it: ``"tagged"`` (``("mm", id, offset)``, 0.31+),
  ``"with_offset"`` (``(id, offset)``, by 0.20) or ``"bare"`` (the identifier, 0.10.2);
* ``event_extra_keys``: whether ``BlockStored`` events carry ``extra_keys`` (``"published"``,
  0.20+ at least) or not (``"absent"``, 0.10.2).

kvcheck has two exact profiles, ``vllm-0.33`` and ``vllm-0.10``. A release between them that
matches neither in every respect (0.11-0.30, notably 0.27.0 with caching off) is mapped to the
profile with its free order and the differences are spelled out in ``PROFILE_NOTE`` (printed in
the pytest header), so failures of exactly those tests are expected rather than mislabelled.
The observations are also compared with the version table for the release the installation
reports: when they disagree, a patch, fork or plugin changed vLLM, and it is held to its
release's profile (``choose_profile``) with a warning in the note.

Everything here takes the objects it drives as arguments, so it is unit-tested with fakes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Protocol

from kvcheck.errors import KVCheckFailure

__all__ = [
    "PROFILE_BEHAVIOUR",
    "Behaviour",
    "ProfileChoice",
    "choose_profile",
    "describe_profile",
    "detect_event_extra_keys",
    "detect_extra_key_format",
    "detect_free_order",
    "detect_mm_key_format",
    "detect_none_hash",
    "profile_differences",
    "pythonhashseed",
    "release_behaviour",
    "release_differences",
    "select_profile",
]


@dataclass(frozen=True)
class Behaviour:
    """The version-gated behaviours of one vLLM installation (see the module docstring)."""

    free_unhashed: str
    free_caching_off: str
    none_hash: str
    extra_keys: str | None = None
    mm_keys: str | None = None
    event_extra_keys: str | None = None


#: What each kvcheck profile expects (docs/semantics.md#differences).
PROFILE_BEHAVIOUR: dict[str, Behaviour] = {
    "vllm-0.33": Behaviour(free_unhashed="head", free_caching_off="head",
                           none_hash="default_seed", extra_keys="tagged", mm_keys="tagged",
                           event_extra_keys="published"),
    "vllm-0.10": Behaviour(free_unhashed="tail", free_caching_off="tail",
                           none_hash="urandom", extra_keys="bare", mm_keys="bare",
                           event_extra_keys="absent"),
}

_WORDS: dict[str, dict[str, str]] = {
    "free_unhashed": {
        "head": "unhashed freed blocks go to the head of the free queue (LIFO reuse)",
        "tail": "unhashed freed blocks go to the tail of the free queue (append-all)",
    },
    "free_caching_off": {
        "head": "with prefix caching off, freed blocks go to the head (LIFO reuse)",
        "tail": "with prefix caching off, freed blocks go to the tail (FIFO reuse, as in "
                "<= 0.23 and the 0.27.0 regression vllm#48017)",
    },
    "none_hash": {
        "default_seed": "with PYTHONHASHSEED unset, NONE_HASH is hash('vllm-none-hash')",
        "urandom": "with PYTHONHASHSEED unset, NONE_HASH is random per process",
    },
    "mm_keys": {
        "tagged": "a multimodal item is keyed ('mm', identifier, offset in block)",
        "with_offset": "a multimodal item is keyed (identifier, offset in block) (the ~0.20-0.30 "
                       "format)",
        "bare": "a multimodal item is keyed by its bare identifier",
    },
    "event_extra_keys": {
        "published": "BlockStored events carry extra_keys per block",
        "absent": "BlockStored events carry no extra_keys",
    },
    "extra_keys": {
        "tagged": "a LoRA adapter is keyed ('lora', name, path)",
        "lora_name": "a LoRA adapter is keyed by its bare name (the 0.13-0.30 format)",
        "bare": "a LoRA adapter is keyed by its lora_int_id",
    },
}


def _say(name: str, value: str | None) -> str:
    return _WORDS.get(name, {}).get(value or "", f"{name}={value}")


def profile_differences(behaviour: Behaviour, profile: str) -> list[str]:
    """How ``behaviour`` differs from what ``profile`` expects, one sentence per behaviour
    (behaviours that could not be observed, None, are not compared)."""
    want = PROFILE_BEHAVIOUR[profile]
    out = []
    for f in fields(Behaviour):
        got, expected = getattr(behaviour, f.name), getattr(want, f.name)
        if got is not None and got != expected:
            out.append(f"{_say(f.name, got)}, where {profile} expects: "
                       f"{_say(f.name, expected)}")
    return out


def select_profile(behaviour: Behaviour) -> tuple[str, list[str]]:
    """The kvcheck profile for ``behaviour`` and how it differs from it.

    The free order of unhashed blocks decides (it is what the profiles' golden traces pin);
    every other observed difference is returned as a sentence (empty list: an exact match).
    """
    profile = "vllm-0.33" if behaviour.free_unhashed == "head" else "vllm-0.10"
    return profile, profile_differences(behaviour, profile)


def release_behaviour(version: str) -> Behaviour | None:
    """What the released vLLM ``version`` does, per docs/semantics.md#release-history;
    None for a version string without a ``MAJOR.MINOR`` prefix. Fields the table leaves
    uncertain (the LoRA key of 0.11-0.12) are None."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    if match is None:
        return None
    release = (int(match.group(1)), int(match.group(2)))
    unhashed = "head" if release >= (0, 24) else "tail"
    caching_off = "tail" if release < (0, 24) or release == (0, 27) else "head"
    none_hash = "default_seed" if release >= (0, 29) else "urandom"
    if release >= (0, 31):
        extra: str | None = "tagged"
    elif release >= (0, 13):
        extra = "lora_name"
    elif release < (0, 11):
        extra = "bare"
    else:
        extra = None
    if release >= (0, 31):
        mm: str | None = "tagged"
    elif release >= (0, 20):
        mm = "with_offset"
    elif release < (0, 12):
        mm = "bare"
    else:
        mm = None
    if release >= (0, 20):
        events: str | None = "published"
    elif release < (0, 11):
        events = "absent"
    else:
        events = None
    return Behaviour(unhashed, caching_off, none_hash, extra, mm, events)


def release_differences(version: str, behaviour: Behaviour) -> list[str]:
    """How an installation differs from the release ``version`` (a patch, a fork or a plugin
    changed it); empty when it does not, or when the release is unknown."""
    release = release_behaviour(version)
    if release is None:
        return []
    out = []
    for f in fields(Behaviour):
        got, expected = getattr(behaviour, f.name), getattr(release, f.name)
        if got is not None and expected is not None and got != expected:
            out.append(f"{_say(f.name, got)}, where the {version} release: "
                       f"{_say(f.name, expected)}")
    return out


@dataclass(frozen=True)
class ProfileChoice:
    """The profile the adapter claims, and why.

    Attributes:
        profile: the profile the suite checks against by default.
        inherent: how the release itself (or, for an unknown release, the observed
            behaviour) differs from ``profile`` (0.11-0.30 releases; empty for 0.10.2, 0.33).
        patched: how the observed behaviour differs from the release it reports (a patch,
            fork or plugin); empty for an unmodified release.
        observed_profile: the profile the observed free order alone would select.
    """

    profile: str
    inherent: list[str]
    patched: list[str]
    observed_profile: str


def choose_profile(behaviour: Behaviour, release_version: str) -> ProfileChoice:
    """Pick the profile for an installation that behaves as ``behaviour`` and reports
    ``release_version``.

    An unmodified release behaves as its version-table entry, so the observed free order and
    the release agree on the profile. When they disagree, the installation was changed (the
    point of checking a patched vLLM) and it is held to its release's profile, so the change
    shows up as failures rather than as conformance to another release. Without a known
    release, the observed behaviour alone decides.
    """
    observed_profile, observed_diffs = select_profile(behaviour)
    release = release_behaviour(release_version)
    if release is None:
        return ProfileChoice(observed_profile, observed_diffs, [], observed_profile)
    profile, inherent = select_profile(release)
    return ProfileChoice(profile, inherent, release_differences(release_version, behaviour),
                         observed_profile)


def describe_profile(version: str, choice: ProfileChoice, extra: Sequence[str] = (),
                     release: str | None = None) -> str:
    """The one-paragraph note printed in the pytest header (``PROFILE_NOTE``); ``release``
    (default ``version``) is the release the installation is compared with."""
    release = release or version
    subject = f"The {release} release" if choice.patched else f"vLLM {release}"
    if choice.inherent:
        text = (f"{subject} matches no kvcheck profile exactly; checked against the "
                f"closest, {choice.profile} (same free order), but: "
                + "; ".join(choice.inherent)
                + ". Tests of those behaviours are expected to fail on this release.")
    else:
        text = (f"{subject} behaves as profile {choice.profile} in every version-gated "
                "respect.")
    parts = [text]
    if choice.patched:
        parts.append(
            f"WARNING: this vLLM does not behave like the {release} release (a patch, fork or "
            "plugin changed it): " + "; ".join(choice.patched) + f". It is checked against "
            f"the release's profile, {choice.profile}, so tests of those behaviours fail.")
        if choice.observed_profile != choice.profile:
            parts.append(f"Its observed free order is that of {choice.observed_profile}: pass "
                         f"--kv-profile={choice.observed_profile} to check it against that.")
    return " ".join([*parts, *extra])


# ------------------------------------------------------------------------------ detection
class _ProbeBlock(Protocol):
    @property
    def block_id(self) -> int: ...


class _ProbeFreeQueue(Protocol):
    def get_all_free_blocks(self) -> Sequence[_ProbeBlock]: ...


class ProbePool(Protocol):
    """What ``detect_free_order`` drives of vLLM's ``BlockPool``."""

    def get_new_blocks(self, num_blocks: int, /) -> Sequence[_ProbeBlock]: ...

    def free_blocks(self, ordered_blocks: Sequence[_ProbeBlock], /) -> None: ...

    @property
    def free_block_queue(self) -> _ProbeFreeQueue: ...


def detect_free_order(make_pool: Callable[[bool], ProbePool]) -> tuple[str, str]:
    """``(free_unhashed, free_caching_off)``, observed on two 10-block pools.

    ``make_pool(enable_caching)`` builds a vLLM ``BlockPool``; three blocks are allocated and
    freed last-first (as a request frees them); the queue head tells where they went.
    """
    out = []
    for caching in (True, False):
        pool = make_pool(caching)
        blocks = pool.get_new_blocks(3)
        pool.free_blocks(list(reversed(blocks)))
        queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        freed = {b.block_id for b in blocks}
        if set(queue[:3]) == freed:
            out.append("head")
        elif set(queue[-3:]) == freed:
            out.append("tail")
        else:
            raise KVCheckFailure(f"freed blocks {sorted(freed)} are neither at the head nor "
                                 f"at the tail of the free queue {queue}")
    return out[0], out[1]


@contextmanager
def pythonhashseed(seed: str | None) -> Iterator[None]:
    """Set (or unset, for None) ``PYTHONHASHSEED`` in ``os.environ``, restoring it after."""
    old = os.environ.get("PYTHONHASHSEED")
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = old


# Any: vLLM's kv_cache_utils module, whose NONE_HASH global is swapped and restored.
def detect_none_hash(utils: Any, hash_fn: Callable[[object], bytes]) -> str:
    """``"default_seed"`` or ``"urandom"``: what ``utils.init_none_hash(hash_fn)`` (sha256)
    gives with PYTHONHASHSEED unset. ``utils`` is vLLM's ``kv_cache_utils``; its module global
    ``NONE_HASH`` is restored afterwards."""
    saved = getattr(utils, "NONE_HASH", None)
    try:
        roots = []
        for _ in range(2):
            with pythonhashseed(None):
                utils.init_none_hash(hash_fn)
            roots.append(bytes(utils.NONE_HASH))
    finally:
        utils.NONE_HASH = saved
    if roots[0] == roots[1] == bytes(hash_fn("vllm-none-hash")):
        return "default_seed"
    return "urandom"


def detect_mm_key_format(
        extra_keys_of_mm_block: Callable[[], Sequence[object] | None]) -> str | None:
    """``"tagged"``, ``"with_offset"`` or ``"bare"`` from the extra keys vLLM generates for the
    first block of a request whose only extra is one multimodal item; None when they cannot be
    observed."""
    try:
        keys = extra_keys_of_mm_block()
    except Exception:  # noqa: BLE001 - internals differ per release: not observable here
        return None
    if not keys:
        return None
    key = keys[0]
    if isinstance(key, tuple) and key[:1] == ("mm",):
        return "tagged"
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int):
        return "with_offset"
    if isinstance(key, str):
        return "bare"
    return None


def detect_event_extra_keys(block_stored_fields: Iterable[str] | None) -> str | None:
    """``"published"`` or ``"absent"``: whether vLLM's ``BlockStored`` has ``extra_keys``
    (``block_stored_fields``: its field names; None when unknown)."""
    if block_stored_fields is None:
        return None
    return "published" if "extra_keys" in set(block_stored_fields) else "absent"


def detect_extra_key_format(
        extra_keys_of_lora_block: Callable[[], Sequence[object] | None]) -> str | None:
    """``"tagged"``, ``"lora_name"`` or ``"bare"`` from the extra keys vLLM generates for the
    first block of a request with LoRA adapter ``("kvcheck-probe", 7, "/kvcheck/probe")`` and
    nothing else; None when they cannot be observed."""
    try:
        keys = extra_keys_of_lora_block()
    except Exception:  # noqa: BLE001 - internals differ per release: not observable here
        return None
    if not keys:
        return None
    key = keys[0]
    if isinstance(key, tuple) and key[:1] == ("lora",):
        return "tagged"
    if isinstance(key, str):
        return "lora_name"
    if isinstance(key, int):
        return "bare"
    return None
