"""Compatibility name: the implementation loader lives in ``kvcheck.conformance.loader``.

Kept so that repro snippets written by kvcheck 0.1 (``from kvcheck.plugin.loader import
load_impl``) and adapters' own tests keep working; new code imports the loader from
``kvcheck.conformance.loader``.
"""

from kvcheck.conformance.loader import (
    ALIASES,
    DEFAULT_CALL_TIMEOUT,
    ImplHandle,
    ImplLoadError,
    load_impl,
    load_impls,
)

__all__ = ["ALIASES", "DEFAULT_CALL_TIMEOUT", "ImplHandle", "ImplLoadError", "load_impl",
           "load_impls"]
