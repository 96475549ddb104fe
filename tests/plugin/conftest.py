"""Imported before any pytester run of this folder.

pytester's in-process runs drop the modules they imported when they end; numpy and torch
refuse to be imported twice in one process, so everything the suite imports is imported here
first and stays (torch and triton only when the ``kernels`` extra is installed).
"""

from __future__ import annotations

import os

import numpy as np  # noqa: F401

import kvcheck.adapters.reference
import kvcheck.conformance.differential
import kvcheck.conformance.workload_machine

try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import
    import triton  # noqa: F401

    import kvcheck.gpu_kernels.conformance  # noqa: F401
except ImportError:
    pass
