"""Profile-independent laws checked on an implementation after every op, with or without
an oracle (they are all that ``--kv-profile=generic`` checks)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvcheck.conformance.driver import Driver

__all__ = ["check_laws"]


def check_laws(driver: Driver) -> list[str]:
    """The broken laws (empty when all hold). Each message names its terms."""
    problems: list[str] = []
    spec, mgr = driver.spec, driver.manager
    caps = driver.impl.info.capabilities
    tables = driver.tables()
    holders: Counter[int] = Counter()
    for rid, ids in tables.items():
        for block_id in ids:
            holders[block_id] += 1
        bad = [b for b in ids if not 0 <= b < spec.num_blocks]
        if bad:
            problems.append(f"request {rid!r} holds out-of-range block ids {bad}")
        dup = sorted(b for b, n in Counter(ids).items() if n > 1)
        if dup:
            problems.append(f"request {rid!r} holds blocks {dup} more than once")
        if spec.profile != "generic" and 0 in ids:
            problems.append(f"request {rid!r} holds the null block 0")
        need = -(-driver.views[rid].num_computed_tokens // spec.block_size)
        if len(ids) < need:
            problems.append(f"request {rid!r} has {driver.views[rid].num_computed_tokens} "
                            f"computed tokens but only {len(ids)} blocks of {spec.block_size}")
    num_free = mgr.num_free_blocks()
    if spec.profile != "generic":
        usable = spec.num_blocks - 1
        if num_free + len(holders) != usable:
            problems.append(
                f"conservation: num_free_blocks ({num_free}) + distinct blocks held by "
                f"running requests ({len(holders)}) = {num_free + len(holders)} != usable "
                f"blocks ({usable} = num_blocks {spec.num_blocks} - null block)")
    if "free_queue_order" in caps:
        queue = list(mgr.free_block_ids())
        if len(queue) != num_free:
            problems.append(f"free queue holds {len(queue)} blocks but num_free_blocks() "
                            f"is {num_free}")
        held_and_free = sorted(set(queue) & set(holders))
        if held_and_free:
            problems.append(f"blocks {held_and_free} are both free and held by a request")
        if len(set(queue)) != len(queue):
            problems.append("the free queue lists a block twice")
    if "ref_counts" in caps:
        for block_id in range(1, spec.num_blocks):
            rc = mgr.ref_cnt(block_id)
            if rc != holders[block_id]:
                problems.append(f"block {block_id}: ref_cnt {rc} but {holders[block_id]} "
                                "request(s) hold it")
    if "invariants" in caps:
        try:
            mgr.check_invariants()
        except AssertionError as exc:
            problems.append(f"the implementation's own check_invariants(): {exc}")
    return problems
