"""Fixtures for the reference's unit tests (plain helpers live in tests/kv_helpers.py)."""

from __future__ import annotations

import pytest
from kv_helpers import PROFILES


@pytest.fixture(params=PROFILES)
def profile(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]
