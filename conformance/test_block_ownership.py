"""Block ownership across requests: no write into a block another live request holds (a law of
every profile, ``kvcheck.conformance.shared_writes``), and a block computed twice, which a
design with ``dedup_on_insert`` may rebind to the cached copy once its tokens are computed
(``kvcheck.conformance.rebinding``).

The laws judge every op of these workloads; the tests also check what they are about
directly, so that they fail with their own words if a law let the state pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.groups import one_group, one_group_tables
from kvcheck.conformance.ops import DecodeOp, ScheduleOp, add, decode, free, schedule

if TYPE_CHECKING:
    from kvcheck.conformance.differential import Pair, PairFactory


def _step(pair: Pair, op: ScheduleOp | DecodeOp) -> None:
    """Apply a schedule or decode ``op`` and check that the blocks at the positions it computed
    are held by its request alone."""
    rid = op["rid"]
    before = pair.impl.views[rid].num_computed_tokens if rid in pair.impl.running else 0
    got = one_group(pair.apply(op))
    assert got.get("new") is not None, f"{op} was refused: the pool is large enough"
    start = before + got.get("hits", ([], 0))[1]
    end = pair.impl.views[rid].num_computed_tokens
    tables = one_group_tables(pair.impl.tables())
    bs = pair.spec.block_size
    others = {b: r for r, ids in tables.items() if r != rid for b in ids}
    shared = [(i, tables[rid][i], others[tables[rid][i]])
              for i in range(start // bs, -(-end // bs)) if tables[rid][i] in others]
    assert not shared, (
        f"{op} computed positions {start}..{end - 1} of {rid!r} into blocks other live requests "
        f"hold, as (index, block, holder): {shared}; tables {tables}\n" + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
def test_new_tokens_are_written_only_into_blocks_no_other_request_holds(
        kv_pair: PairFactory) -> None:
    """Requests sharing cached blocks write their new tokens elsewhere: a block-aligned prompt
    equal to a live request's recomputes its last token into a block of its own, a longer one
    continues after the shared blocks, decodes of both sides append to their own blocks, and a
    preempted request re-admitted from the cache writes into its own blocks too."""
    pair = kv_pair(num_blocks=24, block_size=4)
    bs = pair.spec.block_size
    prompt = list(range(1, 2 * bs + 1))  # two full blocks, nothing after them
    pair.run([add("a", prompt)])
    _step(pair, schedule("a"))
    pair.run([add("same", prompt)])
    _step(pair, schedule("same"))  # hits at most the first block: the last token is recomputed
    pair.run([add("longer", [*prompt, 7, 7, 7])])
    _step(pair, schedule("longer"))  # may hit both blocks, then writes positions 2*bs.. anew
    for rid in ("a", "same", "longer", "a", "longer"):
        _step(pair, decode(rid, 1))
    pair.run([free("a"), add("a2", prompt), free("same")])
    _step(pair, schedule("a2"))
    _step(pair, decode("longer", 1))


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
def test_block_computed_twice_may_be_rebound_once_computed(kv_pair: PairFactory) -> None:
    """A block-aligned prompt equal to a live request's computes its last block a second time,
    into a new block. Once that forward pass has run, a design with ``dedup_on_insert`` may
    rebind the entry to the cached copy and free its own; any other design keeps its copy (the
    answer guard and the rebinding law judge which). Either way the copy is never shared while
    its tokens are computed, and a later request hits blocks that hold its tokens."""
    pair = kv_pair(num_blocks=24, block_size=4)
    bs = pair.spec.block_size
    prompt = list(range(1, 2 * bs + 1))
    pair.run([add("a", prompt), schedule("a"), add("b", prompt)])
    _step(pair, schedule("b"))
    copy = pair.impl.tables()["b"][0][1]
    assert copy != pair.impl.tables()["a"][0][1], "b computed its last block into a's block"
    _step(pair, decode("b", 1))  # b's block 1 is computed now: it may be rebound
    tables = one_group_tables(pair.impl.tables())
    if tables["b"][1] != copy:
        assert "dedup_on_insert" in pair.impl.capabilities, f"b's block 1 changed: {tables}"
        assert tables["b"][1] == tables["a"][1], f"rebound to a block a does not hold: {tables}"
    _step(pair, decode("a", 1))
    pair.run([free("a"), add("c", [*prompt, 9])])
    _step(pair, schedule("c"))  # the laws judge that c's hits hold its prefix
    pair.run([free("b"), free("c")])
