"""The block and pool sizes a scripted test runs at for the implementation under test, and the
record of the block sizes each test ran at.

A scripted test is written for a *usual* block size (4 tokens, a few at 16) and pool size, and
states its workload in blocks: ``tokens(blocks, block_size, offset)``, never a literal token
count. ``DeclaredSizes`` maps the usual sizes to sizes the implementation declares:

* under the vLLM profiles, and for an implementation declaring no sizes
  (``ImplInfo.block_sizes`` / ``num_blocks_range`` None), the usual sizes exactly (vLLM's
  results never change);
* under ``generic`` with ``ImplInfo.block_sizes``: the usual size if declared, else the smallest
  declared one (a design supporting only 256, 512 and 768 runs every test at 256); tests where
  the size matters also run at the next larger declared size (512), never under the vLLM
  profiles or without declared sizes;
* under ``generic`` with ``ImplInfo.num_blocks_range``: the usual pool size clamped into it.

So no scripted test is skipped only because the size it was written for is not supported.

``recording_block_sizes()`` collects the block sizes of every manager and block pool the
implementation (or an oracle) builds while it is open; the plugin opens it around each
test's call and records the sizes as the test's ``kv_block_sizes`` user property (a sorted
list of ints) for the verdict and the record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, KVCacheSpecOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["BLOCK_SIZES_PROPERTY", "DeclaredSizes", "note_spec", "recording_block_sizes",
           "tokens"]

#: The user property (``item.user_properties``) holding the block sizes a test ran at.
BLOCK_SIZES_PROPERTY = "kv_block_sizes"


def tokens(blocks: int, block_size: int, offset: int = 0) -> int:
    """A workload length stated in blocks: ``blocks * block_size + offset`` tokens (``offset``
    may be negative: one token short of ``blocks`` full blocks is ``offset=-1``)."""
    return blocks * block_size + offset


@dataclass(frozen=True, slots=True)
class DeclaredSizes:
    """The sizes scripted tests run at for one implementation under one profile.

    Attributes:
        block_sizes: the declared block sizes that bind the tests (None: any size, the usual
            ones are kept).
        num_blocks_range: the declared ``(min, max)`` pool sizes that bind them (None: any).
    """

    block_sizes: tuple[int, ...] | None = None
    num_blocks_range: tuple[int, int] | None = None

    @classmethod
    def of(cls, info: ImplInfo, profile: str) -> DeclaredSizes:
        """The sizes for ``info`` under ``profile``: its declarations under ``generic``, none
        under a vLLM profile (the usual sizes stay)."""
        if profile != "generic":
            return cls()
        sizes = None if info.block_sizes is None else tuple(sorted(set(info.block_sizes)))
        return cls(sizes, info.num_blocks_range)

    def block_size(self, usual: int) -> int:
        """The block size a test written for ``usual`` runs at."""
        if self.block_sizes is None or usual in self.block_sizes:
            return usual
        return self.block_sizes[0]

    def block_sizes_for(self, usual: int) -> list[int]:
        """For tests where the block size matters: ``block_size(usual)`` and, when declared
        sizes bind the tests, the next larger declared size (if there is one)."""
        first = self.block_size(usual)
        larger = [b for b in self.block_sizes or () if b > first]
        return [first, *larger[:1]]

    def num_blocks(self, usual: int) -> int:
        """The pool size (blocks, reserved ones included) a test written for ``usual`` runs
        at: ``usual`` clamped into ``num_blocks_range``."""
        if self.num_blocks_range is None:
            return usual
        low, high = self.num_blocks_range
        return min(max(usual, low), high)

    def spec(self, *, num_blocks: int, block_size: int, profile: str,
             **fields: Unpack[KVCacheSpecOptions]) -> KVCacheSpec:
        """A single-group ``KVCacheSpec`` at the sizes a test written for ``num_blocks`` blocks
        of ``block_size`` tokens runs at; ``fields``: its other fields."""
        return KVCacheSpec(num_blocks=self.num_blocks(num_blocks),
                           block_size=self.block_size(block_size), profile=profile, **fields)


# Open recordings, innermost last (one per running test; nested only in kvcheck's own tests).
_RECORDINGS: list[set[int]] = []


@contextlib.contextmanager
def recording_block_sizes() -> Iterator[set[int]]:
    """Collect, into the set yielded, the block sizes of every spec ``note_spec`` sees while
    the block is open."""
    used: set[int] = set()
    _RECORDINGS.append(used)
    try:
        yield used
    finally:
        # By identity: another open recording may hold the same sizes.
        del _RECORDINGS[next(i for i, r in enumerate(_RECORDINGS) if r is used)]


def note_spec(spec: KVCacheSpec) -> None:
    """A manager or block pool is being built for ``spec``: its block sizes (every KV-cache
    group's) go into the innermost open recording, if any."""
    if _RECORDINGS:
        _RECORDINGS[-1].update(spec.group_block_size(g) for g in range(len(spec.groups)))
