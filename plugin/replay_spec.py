"""Can ``kvcheck replay`` hand a trace's spec to an implementation at all?

A spec outside what the implementation declares is the trace's problem, not the
implementation's: replaying it would read as a divergence or a protocol violation (a
single-group design answers a two-group spec with flat lists). So before anything runs the
spec must be one the ``ImplInfo`` claims:

* its pool and every group's block size within ``block_sizes`` / ``num_blocks_range``
  (``ImplInfo.supports``);
* for a multi-group spec (``kv_cache_groups``), the ``kv_cache_groups`` capability and the
  capability of each group's kind (``sliding_window``, ``chunked_local_attention``), under
  the trace's profile.
"""

from __future__ import annotations

from kvcheck.conformance.protocol import (
    ImplInfo,
    KVCacheSpec,
    effective_capabilities,
    group_capabilities,
)

__all__ = ["replay_spec_problem"]


def replay_spec_problem(trace: str, spec: KVCacheSpec, name: str, info: ImplInfo) -> str | None:
    """Why ``spec`` (of the trace file ``trace``) cannot be replayed on ``name`` (None: it
    can); the message names what the trace needs, what is declared, and the fix."""
    if spec.kv_cache_groups:
        missing = sorted(group_capabilities(spec) - effective_capabilities(info, spec.profile))
        if missing:
            kinds = ", ".join(g.kind for g in spec.kv_cache_groups)
            return (f"{trace}: the trace's spec has {len(spec.kv_cache_groups)} KV-cache "
                    f"group(s) ({kinds}), which need capability "
                    f"{', '.join(repr(c) for c in missing)}; {name} does not declare it "
                    "(IMPL_INFO.capabilities), so there is nothing to replay: replay it on an "
                    "implementation that declares it (e.g. --kv-impl=reference)")
    if not info.supports(spec):
        sizes = sorted({spec.group_block_size(g) for g in range(len(spec.groups))})
        shown = (f"block_size={spec.block_size}" if not spec.kv_cache_groups
                 else f"group block sizes {sizes}")
        return (f"{trace}: the trace's pool (num_blocks={spec.num_blocks}, {shown}) is "
                f"outside what {name} declares (block_sizes={info.block_sizes}, "
                f"num_blocks_range={info.num_blocks_range})")
    return None
