"""Pytest plugin for the nano runs (``-p nano_no_shrink``): Hypothesis without its shrink
phase. A failing mutant only needs its verdict; shrinking would spend most of the run."""

from __future__ import annotations

from hypothesis import Phase, settings

settings.register_profile("nano-no-shrink", phases=[Phase.explicit, Phase.reuse, Phase.generate])


def pytest_configure(config: object) -> None:
    settings.load_profile("nano-no-shrink")
