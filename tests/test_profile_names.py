"""Profile names are written once, in ``kvcheck.conformance.protocol.Profile`` (a Literal);
everything else that has to know them agrees with it."""

from __future__ import annotations

from typing import get_args

from kvcheck.conformance.protocol import PROFILES, VLLM_PROFILES, Profile
from kvcheck.reference_impl.profiles import BEHAVIOURS, DEFAULT_PROFILE


def test_the_literal_is_the_list() -> None:
    names = get_args(Profile)
    assert names == PROFILES and "generic" in names
    assert tuple(p for p in names if p != "generic") == VLLM_PROFILES


def test_the_reference_has_a_behaviour_for_every_vllm_profile() -> None:
    assert sorted(BEHAVIOURS) == sorted(VLLM_PROFILES)
    assert DEFAULT_PROFILE in VLLM_PROFILES
    assert all(b.name == name for name, b in BEHAVIOURS.items())


def test_the_plugin_option_choices_are_the_profiles() -> None:
    """The plugin spells the names out so that declaring its options imports nothing heavy
    (coverage of kvcheck starts after the entry point is imported): the copy must match."""
    import kvcheck.plugin.plugin as plugin

    assert tuple(plugin._PROFILES) == PROFILES
