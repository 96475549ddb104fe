"""Control, not a mutant: the mutant wiring of ``_mutant_base`` with no bug injected.

It must pass the whole suite, so every failure a ``mut_*`` module shows is its bug's doing.
"""

from _mutant_base import build

IMPL_INFO, make_kv_cache_manager, make_block_pool = build("ctl_wiring")
