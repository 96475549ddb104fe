"""Profile selection and feature detection of the vLLM adapter, with fakes (no vLLM needed)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from kvcheck.adapters.vllm_features import (
    PROFILE_BEHAVIOUR,
    Behaviour,
    ProfileChoice,
    choose_profile,
    describe_profile,
    detect_event_extra_keys,
    detect_extra_key_format,
    detect_free_order,
    detect_mm_key_format,
    detect_none_hash,
    pythonhashseed,
    release_behaviour,
    release_differences,
    select_profile,
)
from kvcheck.reference_impl.hashing import sha256

# What the releases of docs/semantics.md#release-history show when observed.
# 0.10.2, 0.20.0, 0.27.0 and 0.33.0 were observed by running them; the rest is that table.
RELEASES = {
    "0.10.2": Behaviour("tail", "tail", "urandom", "bare", "bare", "absent"),
    "0.20.0": Behaviour("tail", "tail", "urandom", "lora_name", "with_offset", "published"),
    "0.24": Behaviour("head", "head", "urandom", "lora_name", "with_offset", "published"),
    "0.27.0": Behaviour("head", "tail", "urandom", "lora_name", "with_offset", "published"),
    "0.28": Behaviour("head", "head", "urandom", "lora_name", "with_offset", "published"),
    "0.30": Behaviour("head", "head", "default_seed", "lora_name", "with_offset", "published"),
    "0.33.0": Behaviour("head", "head", "default_seed", "tagged", "tagged", "published"),
}


@pytest.mark.parametrize(("release", "profile", "num_differences"), [
    ("0.10.2", "vllm-0.10", 0),
    ("0.20.0", "vllm-0.10", 3),
    ("0.24", "vllm-0.33", 3),
    ("0.27.0", "vllm-0.33", 4),
    ("0.28", "vllm-0.33", 3),
    ("0.30", "vllm-0.33", 2),
    ("0.33.0", "vllm-0.33", 0),
])
def test_select_profile_by_free_order(release: str, profile: str, num_differences: int) -> None:
    got, differences = select_profile(RELEASES[release])
    assert got == profile
    assert len(differences) == num_differences, differences


def test_027_caching_off_regression_is_named() -> None:
    choice = choose_profile(RELEASES["0.27.0"], "0.27.0")
    assert choice.profile == "vllm-0.33" and choice.patched == []
    assert any("prefix caching off" in d and "vllm#48017" in d for d in choice.inherent)
    note = describe_profile("0.27.0", choice)
    assert "matches no kvcheck profile exactly" in note and "vllm-0.33" in note
    assert "expected to fail" in note and "WARNING" not in note


def test_unobserved_extra_keys_are_not_a_difference() -> None:
    behaviour = Behaviour("head", "head", "default_seed", None, None, None)
    assert select_profile(behaviour) == ("vllm-0.33", [])


def test_exact_match_note() -> None:
    note = describe_profile("0.33.0", choose_profile(RELEASES["0.33.0"], "0.33.0"),
                            ["slot_mapping not declared: x."])
    assert note.startswith("vLLM 0.33.0 behaves as profile vllm-0.33")
    assert note.endswith("slot_mapping not declared: x.")


@pytest.mark.parametrize("release", list(RELEASES))
def test_unmodified_release_profile_is_its_observed_one(release: str) -> None:
    choice = choose_profile(RELEASES[release], release)
    assert choice.profile == choice.observed_profile == select_profile(RELEASES[release])[0]
    assert choice.patched == []


def test_unknown_release_uses_observed_behaviour() -> None:
    choice = choose_profile(RELEASES["0.10.2"], "dev")
    assert choice == ProfileChoice("vllm-0.10", [], [], "vllm-0.10")


def test_profiles_cover_protocol_profiles() -> None:
    from kvcheck.conformance.protocol import PROFILES

    assert set(PROFILE_BEHAVIOUR) == set(PROFILES) - {"generic"}


# ------------------------------------------------------------------------------ detection
class _Block:
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id


class _FakePool:
    """A BlockPool-shaped fake: ``prepend`` says where freed blocks go."""

    def __init__(self, num_blocks: int, prepend: bool) -> None:
        self.queue = [_Block(i) for i in range(1, num_blocks)]
        self.prepend = prepend
        self.free_block_queue = SimpleNamespace(get_all_free_blocks=lambda: list(self.queue))

    def get_new_blocks(self, n: int) -> list[_Block]:
        out, self.queue = self.queue[:n], self.queue[n:]
        return out

    def free_blocks(self, blocks: list[_Block]) -> None:
        self.queue = blocks + self.queue if self.prepend else self.queue + blocks


@pytest.mark.parametrize(("caching_on", "caching_off"), [
    ("head", "head"), ("tail", "tail"), ("head", "tail")])
def test_detect_free_order(caching_on: str, caching_off: str) -> None:
    def make_pool(caching: bool) -> _FakePool:
        return _FakePool(10, (caching_on if caching else caching_off) == "head")

    assert detect_free_order(make_pool) == (caching_on, caching_off)


def _fake_utils(policy: str) -> Any:
    utils = SimpleNamespace(NONE_HASH=b"kept")

    def init_none_hash(hash_fn: Any) -> None:
        seed = os.environ.get("PYTHONHASHSEED")
        if seed is not None:
            utils.NONE_HASH = hash_fn(seed)
        elif policy == "default_seed":
            utils.NONE_HASH = hash_fn("vllm-none-hash")
        else:
            utils.NONE_HASH = os.urandom(32)

    utils.init_none_hash = init_none_hash
    return utils


@pytest.mark.parametrize("policy", ["default_seed", "urandom"])
def test_detect_none_hash_restores_global_and_env(policy: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    utils = _fake_utils(policy)
    assert detect_none_hash(utils, sha256) == policy
    assert utils.NONE_HASH == b"kept"
    assert os.environ["PYTHONHASHSEED"] == "123"


def test_pythonhashseed_sets_unsets_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pythonhashseed("0"):
        assert os.environ["PYTHONHASHSEED"] == "0"
    assert "PYTHONHASHSEED" not in os.environ
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    with pythonhashseed(None):
        assert "PYTHONHASHSEED" not in os.environ
    assert os.environ["PYTHONHASHSEED"] == "7"


def _raise() -> Any:
    raise AttributeError("no lora here")


@pytest.mark.parametrize(("keys", "expected"), [
    (lambda: (("lora", "kvcheck-probe", "/kvcheck/probe"),), "tagged"),
    (lambda: ("kvcheck-probe",), "lora_name"),
    (lambda: (7,), "bare"),
    (lambda: None, None),
    (lambda: ((1, 2),), None),
    (_raise, None),
])
def test_detect_extra_key_format(keys: Any, expected: str | None) -> None:
    assert detect_extra_key_format(keys) == expected


@pytest.mark.parametrize("version", list(RELEASES))
def test_release_table_matches_observed_releases(version: str) -> None:
    """The version table reproduces what each release shows (0.10.2 and 0.33.0 were observed
    by running them; the others are the documented history)."""
    assert release_behaviour(version) == RELEASES[version]
    assert release_differences(version, RELEASES[version]) == []


def test_release_table_edges() -> None:
    assert release_behaviour("0.27.3").free_caching_off == "tail"
    assert release_behaviour("0.23.0") == Behaviour("tail", "tail", "urandom", "lora_name",
                                                    "with_offset", "published")
    assert release_behaviour("0.11.0").extra_keys is None
    assert release_behaviour("0.15.1").mm_keys is None
    assert release_behaviour("0.34.0.dev5+gabc") == RELEASES["0.33.0"]
    assert release_behaviour("dev") is None
    assert release_differences("dev", RELEASES["0.33.0"]) == []


def test_patched_release_is_held_to_its_release_profile() -> None:
    """A 0.33.0 whose BlockPool was patched to append every freed block has 0.10's free
    order: it is still checked as vllm-0.33 (so the patch fails), with a warning."""
    patched = Behaviour("tail", "tail", "default_seed", "tagged", "tagged", "published")
    choice = choose_profile(patched, "0.33.0")
    assert (choice.profile, choice.observed_profile) == ("vllm-0.33", "vllm-0.10")
    assert choice.inherent == [] and len(choice.patched) == 2
    note = describe_profile("dev", choice, [], "0.33.0")
    assert "does not behave like the 0.33.0 release" in note
    assert "checked against the release's profile, vllm-0.33" in note
    assert "--kv-profile=vllm-0.10" in note


def test_detect_free_order_ignores_order_within_the_freed_blocks() -> None:
    class Reversing(_FakePool):
        def free_blocks(self, blocks: list[_Block]) -> None:
            super().free_blocks(list(reversed(blocks)))

    assert detect_free_order(lambda caching: Reversing(10, caching)) == ("head", "tail")


def test_detect_free_order_rejects_a_scattered_queue() -> None:
    class Scattering(_FakePool):
        def free_blocks(self, blocks: list[_Block]) -> None:
            self.queue = self.queue[:2] + blocks + self.queue[2:]

    with pytest.raises(AssertionError, match="neither at the head nor at the tail"):
        detect_free_order(lambda caching: Scattering(10, caching))


@pytest.mark.parametrize(("keys", "expected"), [
    (lambda: (("mm", "kvcheck-img", 1),), "tagged"),
    (lambda: (("kvcheck-img", 1),), "with_offset"),
    (lambda: ("kvcheck-img",), "bare"),
    (lambda: None, None),
    (_raise, None),
])
def test_detect_mm_key_format(keys: Any, expected: str | None) -> None:
    assert detect_mm_key_format(keys) == expected


def test_detect_event_extra_keys() -> None:
    assert detect_event_extra_keys(("block_hashes", "extra_keys")) == "published"
    assert detect_event_extra_keys(("block_hashes", "medium")) == "absent"
    assert detect_event_extra_keys(None) is None
