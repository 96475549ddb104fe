"""Every error the kernel checks raise, in one place."""

from __future__ import annotations

from kvcheck.errors import KVCheckFailure

__all__ = ["KernelMismatch"]


class KernelMismatch(KVCheckFailure):
    """A kernel's output differs from its torch reference beyond the op's tolerance, or has
    the wrong shape; the message names the op, the case, the first and the worst element."""
