"""vLLM's own failure on EAGLE beside a chunked local attention group whose hits drop, on the
real vLLM (docs/semantics.md#not-covered-yet): the evidence behind the refusal of the vLLM
adapter and the reference, kept as a test so a vLLM release that fixes it is noticed.

Runs only where vLLM is importable (an environment built by scripts/vllm-cpu-env.sh; run it
with that environment's python). The adapter's refusal is bypassed (``unsupported_reason``
patched to None) and the layout replayed through kvcheck's ``Driver``: the first lookup
fails vLLM's assertion ``drop_eagle_block is False`` in
``ChunkedLocalAttentionManager.find_longest_cache_hit`` when the chunked group drops EAGLE's
block (every group does when none is flagged ``is_eagle_group``, always in vLLM 0.10.2; under
0.33 a flagged chunked group, or one sharing a flagged group's spec), while vLLM 0.33 runs an
unflagged chunked group beside a flagged group of another spec.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from kvcheck.conformance.ops import add, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (build it: scripts/vllm-cpu-env.sh)")

FULL = KVCacheGroupSpec("full_attention", 4)
CHUNK = KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=8)
PROMPT = tuple(range(100, 121))


def _first_lookup(monkeypatch: pytest.MonkeyPatch, groups: tuple[KVCacheGroupSpec, ...],
                  ) -> object:
    """The answer to a sibling's schedule after a 21-token prompt was cached, on vLLM's own
    ``KVCacheManager`` with ``use_eagle`` and the adapter's refusal bypassed."""
    from kvcheck.adapters import vllm_kv_config
    from kvcheck.conformance.driver import Driver
    from kvcheck.conformance.loader import load_impl

    monkeypatch.setattr(vllm_kv_config, "unsupported_reason", lambda spec: None)
    spec = KVCacheSpec(num_blocks=40, block_size=4, kv_cache_groups=groups, use_eagle=True,
                       pythonhashseed="0")
    driver = Driver(load_impl("vllm"), spec)
    driver.run([add("a", PROMPT), schedule("a"), free("a"), add("b", (*PROMPT, 7))])
    return driver.apply(schedule("b"))


def test_a_dropping_chunked_group_fails_vllms_assertion(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvcheck.adapters.vllm_kv_config import HAS_EAGLE_GROUPS

    flagged = dataclasses.replace(CHUNK, is_eagle_group=True)
    layouts = [(FULL, CHUNK), (CHUNK,)]
    if HAS_EAGLE_GROUPS:
        layouts += [(FULL, flagged), (FULL, flagged, CHUNK)]
    for groups in layouts:
        with pytest.raises(Exception, match="not supported for eagle \\+ chunked local"):
            _first_lookup(monkeypatch, groups)


def test_an_unflagged_chunked_group_beside_a_flagged_one_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvcheck.adapters.vllm_kv_config import HAS_EAGLE_GROUPS

    if not HAS_EAGLE_GROUPS:
        pytest.skip("this vLLM release has no is_eagle_group (vLLM 0.33's per-group flag)")
    got = _first_lookup(monkeypatch, (dataclasses.replace(FULL, is_eagle_group=True), CHUNK))
    # 21 tokens cached: full attention finds 20 and drops a block; the chunk's 8-token blocks
    # below 16 are null.
    assert got["hits"] == ([[1, 2, 3, 4], [0, 0, 0, 0]], 16), got
