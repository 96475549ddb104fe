"""The benchmark tests run bench code in this process, whose heap holds whatever the tests
before them left (an xdist worker has run in-process suites by then: millions of objects).

The bench collects garbage before every timed round (``gc.collect()``, outside the timing):
over such a heap each collection took a tenth of a second and more, so a test of a few
dozen rounds took 50 s in the whole run and 5 s alone (an A/A stability run: 29 s against
0.3 s over a heap of three million lists). The heap the test found is frozen for its
duration (``gc.freeze``: collections skip it; no collection first, which would cost the
same again) and handed back after; the test's own objects are collected as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _frozen_heap() -> Iterator[None]:
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
