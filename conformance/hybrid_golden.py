"""Golden scenarios G1-G9 of the hybrid KV-cache groups spec
(docs/semantics.md#kv-cache-groups-hybrid-models), as data.

Every expected column (result, block tables, free queue, cache map, events) is copied from the
spec's tables, which were recorded from vLLM 0.33.0's and 0.10.2's own ``KVCacheManager`` on a
CPU. The tables are kept in the spec's notation (``·`` written ``|``, ``→`` written ``->``) and
parsed by the small helpers at the bottom into the frozen dataclasses below; a reader can put a
row next to the spec and compare it character for character.

What the spec leaves implicit and this module states (inferred from the tables; a replay of
these scripts through vLLM's own classes must reproduce every column):

* the requests (``GoldenScenario.requests``): prompt tokens (100, 101, ...; a request that
  shares only a prefix with another one diverges into fresh numbers), the decode tokens a
  request appends, and ``hash_numbers``: "Hn" of each of its full blocks at the hash block
  size (n = order of first appearance over the scenario: A's blocks first, then each newly
  seen block of a later request, decode blocks when they appear);
* per ``allocate_slots`` row, the request's ``num_computed_tokens`` at the call and how many
  of its decode tokens it holds then (``num_output_tokens``; a decode row appends one token
  before the call). The driver advances ``num_computed_tokens`` after a successful call by the
  hit tokens plus ``num_new_tokens``, as vLLM's scheduler does;
* under ``vllm-0.10`` only, ``null_ref_cnt``: the null block's ``ref_cnt`` after the row,
  derived by hand from docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups
  (+1 per null entry of a hit list that ``allocate_slots``
  touches, -1 per null entry of a freed table; 0.33 keeps it at 0). Not a recorded column.

Calls (``GoldenRow.op``):

* ``get_computed_blocks(X)``: the result is ``hit_blocks`` (one tuple per group, nulls = 0)
  and ``hit_tokens``;
* ``allocate_slots(X, n, hits)``: ``num_new_tokens = n``; with ``hits`` the preceding
  ``get_computed_blocks`` result is passed (``num_new_computed_tokens = hit_tokens``,
  ``new_computed_block_ids = hit_blocks``). The result is ``new_blocks`` (the newly allocated
  ids per group), or ``refused`` (vLLM returned None);
* ``free(X)``.

Expected state after each row: ``tables`` (``get_block_ids`` per request; a request not
listed holds nothing: one empty tuple per group), ``free_queue`` (head first), ``cache``
(``(hash number, group, block ids in lookup order)``, one entry per key ``hash‖group``),
``events`` (``take_events()`` of that row: ``BlockStored`` / ``BlockRemoved`` with their
hash numbers and ``group_idx``; ``group_idx`` is None under ``vllm-0.10``, whose events carry
no group).

Use ``SCENARIOS`` (every scenario of both profiles) or ``scenario(profile, name)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec

__all__ = [
    "SCENARIOS",
    "GoldenEvent",
    "GoldenRequest",
    "GoldenRow",
    "GoldenScenario",
    "Groups",
    "scenario",
]

#: One tuple of block ids per group, group 0 first.
Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class GoldenRequest:
    """A request of a scenario: its whole prompt, the decode tokens it appends one per decode
    row, and the hash number ("Hn") of each full block of ``prompt + output`` at the hash
    block size (empty with caching off)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...] = ()
    hash_numbers: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GoldenEvent:
    """``type`` is ``BlockStored`` or ``BlockRemoved``; ``hashes`` are hash numbers."""

    type: str
    group_idx: int | None
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GoldenRow:
    """One call and the state vLLM showed after it (see the module docstring)."""

    index: int
    op: str
    request_id: str
    num_new_tokens: int
    with_hits: bool
    num_computed_tokens: int
    num_output_tokens: int
    hit_blocks: Groups | None
    hit_tokens: int | None
    new_blocks: Groups | None
    refused: bool
    tables: tuple[tuple[str, Groups], ...]
    free_queue: tuple[int, ...]
    cache: tuple[tuple[int, int, tuple[int, ...]], ...]
    events: tuple[GoldenEvent, ...]
    null_ref_cnt: int | None

    def block_ids(self, request_id: str, num_groups: int) -> Groups:
        """The expected ``get_block_ids(request_id)`` after this row."""
        for rid, groups in self.tables:
            if rid == request_id:
                return groups
        return ((),) * num_groups


@dataclass(frozen=True, slots=True)
class GoldenScenario:
    """One table of docs/semantics.md#kv-cache-groups-hybrid-models under one profile."""

    name: str
    profile: str
    title: str
    spec: KVCacheSpec
    requests: tuple[GoldenRequest, ...]
    rows: tuple[GoldenRow, ...]

    @property
    def num_groups(self) -> int:
        return len(self.spec.kv_cache_groups)

    def request(self, request_id: str) -> GoldenRequest:
        for req in self.requests:
            if req.request_id == request_id:
                return req
        raise KeyError(request_id)


# --- parsing of the spec's notation (small helpers, no behaviour) -----------------------------

_CALL = re.compile(r"(get_computed_blocks|allocate_slots|free)\((\w+)(?:, (\d+))?(, hits)?\)$")
_LIST = re.compile(r"\[([\d, ]*)\]")


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def _groups(text: str) -> Groups:
    return tuple(_ids(m.group(1)) for m in _LIST.finditer(text))


def _tables(text: str) -> tuple[tuple[str, Groups], ...]:
    if not text:
        return ()
    return tuple((part.split("=", 1)[0].strip(), _groups(part.split("=", 1)[1]))
                 for part in text.split(";"))


def _cache(text: str) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    out = []
    for item in text.split():
        m = re.fullmatch(r"H(\d+)/g(\d+)->([\d,]+)", item)
        assert m, item
        out.append((int(m.group(1)), int(m.group(2)), _ids(m.group(3))))
    return tuple(out)


def _events(text: str) -> tuple[GoldenEvent, ...]:
    out = []
    for m in re.finditer(r"([SR])(?:g(\d+))?\(([H\d,]*)\)", text):
        kind = "BlockStored" if m.group(1) == "S" else "BlockRemoved"
        group = None if m.group(2) is None else int(m.group(2))
        hashes = tuple(int(h[1:]) for h in m.group(3).split(",") if h)
        out.append(GoldenEvent(kind, group, hashes))
    return tuple(out)


def _row(call: str, result: str, tables: str, queue: str, cache: str, events: str, *,
         computed: int = 0, outputs: int = 0, null: int | None = None) -> GoldenRow:
    m = _CALL.match(call)
    assert m, call
    op = m.group(1)
    hit_blocks: Groups | None = None
    hit_tokens: int | None = None
    new_blocks: Groups | None = None
    if op == "get_computed_blocks":
        blocks, tokens = result.rsplit(",", 1)
        hit_blocks, hit_tokens = _groups(blocks), int(tokens.split()[0])
    elif op == "allocate_slots" and result != "None":
        new_blocks = _groups(result)
    return GoldenRow(
        index=0, op=op, request_id=m.group(2), num_new_tokens=int(m.group(3) or 0),
        with_hits=m.group(4) is not None, num_computed_tokens=computed,
        num_output_tokens=outputs, hit_blocks=hit_blocks, hit_tokens=hit_tokens,
        new_blocks=new_blocks, refused=op == "allocate_slots" and result == "None",
        tables=_tables(tables), free_queue=_ids(queue.strip("[]")), cache=_cache(cache),
        events=_events(events), null_ref_cnt=null)


def _scenario(name: str, profile: str, title: str, spec: KVCacheSpec,
              requests: tuple[GoldenRequest, ...], rows: list[GoldenRow]) -> GoldenScenario:
    numbered = tuple(
        GoldenRow(**{**{f: getattr(r, f) for f in GoldenRow.__dataclass_fields__}, "index": i})
        for i, r in enumerate(rows, 1))
    return GoldenScenario(name, profile, title, spec, requests, numbered)


# --- layouts ------------------------------------------------------------------------------------

V033, V010 = "vllm-0.33", "vllm-0.10"
FULL = KVCacheGroupSpec("full_attention", 2)
SWA4 = KVCacheGroupSpec("sliding_window", 2, sliding_window=4)
SWA8 = KVCacheGroupSpec("sliding_window", 2, sliding_window=8)
CHUNK4 = KVCacheGroupSpec("chunked_local_attention", 2, attention_chunk_size=4)


def _spec(profile: str, num_blocks: int, *groups: KVCacheGroupSpec, caching: bool = True,
          events: bool = True, retention: int | None = None) -> KVCacheSpec:
    return KVCacheSpec(
        num_blocks=num_blocks, block_size=2, enable_caching=caching, hash_algo="sha256",
        pythonhashseed="0", enable_kv_cache_events=events, profile=profile,
        kv_cache_groups=groups, prefix_cache_retention_interval=retention)


def _tok(start: int, stop: int) -> tuple[int, ...]:
    return tuple(range(start, stop))


def _hn(start: int, stop: int) -> tuple[int, ...]:
    return tuple(range(start, stop + 1))


# Requests, shared by both profiles where the scripts agree.
_G1 = (GoldenRequest("A", _tok(100, 110), (110, 111), _hn(1, 6)),)
_G2 = (GoldenRequest("A", _tok(100, 110), (), _hn(1, 5)),
       GoldenRequest("B", _tok(100, 110), (), _hn(1, 5)),
       # C shares only 8 tokens with A: its block 4 is a new hash (H6).
       GoldenRequest("C", _tok(100, 108) + (110, 111, 112), (), (1, 2, 3, 4, 6)))
_G3 = (GoldenRequest("A", _tok(100, 114), (), _hn(1, 7)),
       GoldenRequest("B", _tok(100, 114), (), _hn(1, 7)))
_G4 = (GoldenRequest("A", _tok(100, 111), (111, 112), _hn(1, 6)),
       GoldenRequest("B", _tok(100, 111), (), _hn(1, 5)))
# C repeats A's prompt after B evicted A's full-attention blocks.
_G5 = (GoldenRequest("A", _tok(100, 108), (), _hn(1, 4)),
       GoldenRequest("B", _tok(108, 116), (), _hn(5, 8)),
       GoldenRequest("C", _tok(100, 108), (), _hn(1, 4)))
_G6 = (GoldenRequest("A", _tok(100, 112), (), _hn(1, 6)),
       GoldenRequest("B", _tok(100, 112), (), _hn(1, 6)))
# Hashes at the hash block size 2 (the SWA group, bs 4, reads H2, H4, H6).
_G7 = (GoldenRequest("A", _tok(100, 113), (), _hn(1, 6)),
       GoldenRequest("B", _tok(100, 113), (), _hn(1, 6)))
_G8 = _G2[:2]
_G9 = (GoldenRequest("A", _tok(100, 109), (109,)),
       GoldenRequest("B", _tok(110, 113)))


# --- vLLM 0.33.0 (docs/semantics.md#kv-cache-groups-hybrid-models) --------------------------------

G1_033 = _scenario(
    'G1', V033, 'full + SWA(w=4), bs 2, 16 blocks: prefill 10, decode 2, free',
    _spec(V033, 16, FULL, SWA4), _G1, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]",
         "",
         ""),
    _row("allocate_slots(A, 10, hits)", "new [1,2,3,4,5] | [6,7,8,9,10]",
         "A=[1,2,3,4,5] | [6,7,8,9,10]",
         "[11, 12, 13, 14, 15]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "Sg0(H1,H2,H3,H4,H5) Sg1(H1,H2,H3,H4,H5)",
         computed=0, outputs=0),
    _row("allocate_slots(A, 1)", "new [11] | [12]",
         "A=[1,2,3,4,5,11] | [0,0,0,9,10,12]",
         "[13, 14, 15, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "",
         computed=10, outputs=1),
    _row("allocate_slots(A, 1)", "new [] | []",
         "A=[1,2,3,4,5,11] | [0,0,0,0,10,12]",
         "[13, 14, 15, 8, 7, 6, 9]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->11 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10 H6/g1->12",
         "Sg0(H6) Sg1(H6)",
         computed=11, outputs=2),
    _row("free(A)", "",
         "",
         "[13, 14, 15, 8, 7, 6, 9, 11, 5, 4, 3, 2, 1, 12, 10]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->11 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10 H6/g1->12",
         ""),
])

G2_033 = _scenario(
    'G2', V033, 'full + SWA(w=4), bs 2: re-hit after free; partial-prefix hit',
    _spec(V033, 16, FULL, SWA4), _G2, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]",
         "",
         ""),
    _row("allocate_slots(A, 10, hits)", "new [1,2,3,4,5] | [6,7,8,9,10]",
         "A=[1,2,3,4,5] | [6,7,8,9,10]",
         "[11, 12, 13, 14, 15]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "Sg0(H1,H2,H3,H4,H5) Sg1(H1,H2,H3,H4,H5)",
         computed=0, outputs=0),
    _row("free(A)", "",
         "",
         "[11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 10, 9, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         ""),
    _row("get_computed_blocks(B)", "[1,2,3,4] | [0,0,8,9], 8 tok",
         "B=[] | []",
         "[11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 10, 9, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         ""),
    _row("allocate_slots(B, 2, hits)", "new [11] | [12]",
         "B=[1,2,3,4,11] | [0,0,8,9,12]",
         "[13, 14, 15, 5, 10, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5,11 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10,12",
         "Sg0(H5) Sg1(H5)",
         computed=0, outputs=0),
    _row("get_computed_blocks(C)", "[1,2,3,4] | [0,0,8,9], 8 tok",
         "B=[1,2,3,4,11] | [0,0,8,9,12]; C=[] | []",
         "[13, 14, 15, 5, 10, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5,11 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10,12",
         ""),
    _row("allocate_slots(C, 3, hits)", "new [13,14] | [15,5]",
         "B=[1,2,3,4,11] | [0,0,8,9,12]; C=[1,2,3,4,13,14] | [0,0,8,9,15,5]",
         "[10, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->11 H6/g0->13 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10,12 H6/g1->15",
         "Rg0(H5) Sg0(H6) Sg1(H6)",
         computed=0, outputs=0),
    _row("free(B)", "",
         "C=[1,2,3,4,13,14] | [0,0,8,9,15,5]",
         "[10, 7, 6, 11, 12]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->11 H6/g0->13 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10,12 H6/g1->15",
         ""),
    _row("free(C)", "",
         "",
         "[5, 14, 10, 7, 6, 11, 12, 13, 4, 3, 2, 1, 15, 9, 8]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->11 H6/g0->13 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10,12 H6/g1->15",
         ""),
])

G3_033 = _scenario(
    'G3', V033, 'SWA only (w=4, bs 2), 12 blocks: 14-token prompt in chunks of 4; re-hit',
    _spec(V033, 12, SWA4), _G3, [
    _row("get_computed_blocks(A)", "[], 0 tok",
         "A=[]",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "",
         ""),
    _row("allocate_slots(A, 4, hits)", "new [1,2]",
         "A=[1,2]",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "H1/g0->1 H2/g0->2",
         "Sg0(H1,H2)",
         computed=0, outputs=0),
    _row("allocate_slots(A, 4)", "new [3,4]",
         "A=[1,2,3,4]",
         "[5, 6, 7, 8, 9, 10, 11]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4",
         "Sg0(H3,H4)",
         computed=4, outputs=0),
    _row("allocate_slots(A, 4)", "new [5,6]",
         "A=[0,0,3,4,5,6]",
         "[7, 8, 9, 10, 11, 2, 1]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6",
         "Sg0(H5,H6)",
         computed=8, outputs=0),
    _row("allocate_slots(A, 2)", "new [7]",
         "A=[0,0,0,0,5,6,7]",
         "[8, 9, 10, 11, 2, 1, 4, 3]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7",
         "Sg0(H7)",
         computed=12, outputs=0),
    _row("free(A)", "",
         "",
         "[8, 9, 10, 11, 2, 1, 4, 3, 7, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7",
         ""),
    _row("get_computed_blocks(B)", "[0,0,0,0,5,6], 12 tok",
         "B=[]",
         "[8, 9, 10, 11, 2, 1, 4, 3, 7, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7",
         ""),
    _row("allocate_slots(B, 2, hits)", "new [8]",
         "B=[0,0,0,0,5,6,8]",
         "[9, 10, 11, 2, 1, 4, 3, 7]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7,8",
         "Sg0(H7)",
         computed=0, outputs=0),
    _row("free(B)", "",
         "",
         "[9, 10, 11, 2, 1, 4, 3, 7, 8, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7,8",
         ""),
])

G4_033 = _scenario(
    'G4', V033, 'chunked local alone (chunk 4, bs 2), 12 blocks: 11-token prompt, decode 2, re-hit',
    _spec(V033, 12, CHUNK4), _G4, [
    _row("get_computed_blocks(A)", "[0,0,0,0], 8 tok",
         "A=[]",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "",
         ""),
    _row("allocate_slots(A, 3, hits)", "new [1,2]",
         "A=[0,0,0,0,1,2]",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "H5/g0->1",
         "Sg0(H5)",
         computed=0, outputs=0),
    _row("allocate_slots(A, 1)", "new []",
         "A=[0,0,0,0,1,2]",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "H5/g0->1 H6/g0->2",
         "Sg0(H6)",
         computed=11, outputs=1),
    _row("allocate_slots(A, 1)", "new [3]",
         "A=[0,0,0,0,0,0,3]",
         "[4, 5, 6, 7, 8, 9, 10, 11, 2, 1]",
         "H5/g0->1 H6/g0->2",
         "",
         computed=12, outputs=2),
    _row("free(A)", "",
         "",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 1]",
         "H5/g0->1 H6/g0->2",
         ""),
    _row("get_computed_blocks(B)", "[0,0,0,0,1], 10 tok",
         "B=[]",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 1]",
         "H5/g0->1 H6/g0->2",
         ""),
    _row("allocate_slots(B, 1, hits)", "new [3]",
         "B=[0,0,0,0,1,3]",
         "[4, 5, 6, 7, 8, 9, 10, 11, 2]",
         "H5/g0->1 H6/g0->2",
         "",
         computed=0, outputs=0),
    _row("free(B)", "",
         "",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 1]",
         "H5/g0->1 H6/g0->2",
         ""),
])

G5_033 = _scenario(
    'G5', V033, 'full + SWA(w=4), bs 2, 11 blocks: eviction under pressure',
    _spec(V033, 11, FULL, SWA4), _G5, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]",
         "",
         ""),
    _row("allocate_slots(A, 8, hits)", "new [1,2,3,4] | [5,6,7,8]",
         "A=[1,2,3,4] | [5,6,7,8]",
         "[9, 10]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H1/g1->5 H2/g1->6 H3/g1->7 H4/g1->8",
         "Sg0(H1,H2,H3,H4) Sg1(H1,H2,H3,H4)",
         computed=0, outputs=0),
    _row("free(A)", "",
         "",
         "[9, 10, 4, 3, 2, 1, 8, 7, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H1/g1->5 H2/g1->6 H3/g1->7 H4/g1->8",
         ""),
    _row("get_computed_blocks(B)", "[] | [], 0 tok",
         "B=[] | []",
         "[9, 10, 4, 3, 2, 1, 8, 7, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H1/g1->5 H2/g1->6 H3/g1->7 H4/g1->8",
         ""),
    _row("allocate_slots(B, 8, hits)", "new [9,10,4,3] | [2,1,8,7]",
         "B=[9,10,4,3] | [2,1,8,7]",
         "[6, 5]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         "Rg0(H4) Rg0(H3) Rg0(H2) Rg0(H1) Rg1(H4) Rg1(H3) Sg0(H5,H6,H7,H8) Sg1(H5,H6,H7,H8)",
         computed=0, outputs=0),
    _row("get_computed_blocks(C)", "[] | [], 0 tok",
         "B=[9,10,4,3] | [2,1,8,7]; C=[] | []",
         "[6, 5]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         ""),
    _row("allocate_slots(C, 8, hits)", "None",
         "B=[9,10,4,3] | [2,1,8,7]; C=[] | []",
         "[6, 5]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         "",
         computed=0, outputs=0),
    _row("free(B)", "",
         "C=[] | []",
         "[6, 5, 3, 4, 10, 9, 7, 8, 1, 2]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         ""),
    _row("free(C)", "",
         "",
         "[6, 5, 3, 4, 10, 9, 7, 8, 1, 2]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         ""),
])

G6_033 = _scenario(
    'G6', V033, 'full + SWA(w=4) + SWA(w=8), bs 2, 24 blocks (0.33)',
    _spec(V033, 24, FULL, SWA4, SWA8), _G6, [
    _row("get_computed_blocks(A)", "[] | [] | [], 0 tok",
         "A=[] | [] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]",
         "",
         ""),
    _row("allocate_slots(A, 12, hits)",
         "new [1,2,3,4,5,6] | [7,8,9,10,11,12] | [13,14,15,16,17,18]",
         "A=[1,2,3,4,5,6] | [7,8,9,10,11,12] | [13,14,15,16,17,18]",
         "[19, 20, 21, 22, 23]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H1/g1->7 H2/g1->8 H3/g1->9 "
         "H4/g1->10 H5/g1->11 H6/g1->12 H1/g2->13 H2/g2->14 H3/g2->15 H4/g2->16 H5/g2->17 "
         "H6/g2->18",
         "Sg0(H1,H2,H3,H4,H5,H6) Sg1(H1,H2,H3,H4,H5,H6) Sg2(H1,H2,H3,H4,H5,H6)",
         computed=0, outputs=0),
    _row("free(A)", "",
         "",
         "[19, 20, 21, 22, 23, 6, 5, 4, 3, 2, 1, 12, 11, 10, 9, 8, 7, 18, 17, 16, 15, 14, 13]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H1/g1->7 H2/g1->8 H3/g1->9 "
         "H4/g1->10 H5/g1->11 H6/g1->12 H1/g2->13 H2/g2->14 H3/g2->15 H4/g2->16 H5/g2->17 "
         "H6/g2->18",
         ""),
    _row("get_computed_blocks(B)", "[1,2,3,4,5] | [0,0,0,10,11] | [0,14,15,16,17], 10 tok",
         "B=[] | [] | []",
         "[19, 20, 21, 22, 23, 6, 5, 4, 3, 2, 1, 12, 11, 10, 9, 8, 7, 18, 17, 16, 15, 14, 13]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H1/g1->7 H2/g1->8 H3/g1->9 "
         "H4/g1->10 H5/g1->11 H6/g1->12 H1/g2->13 H2/g2->14 H3/g2->15 H4/g2->16 H5/g2->17 "
         "H6/g2->18",
         ""),
    _row("allocate_slots(B, 2, hits)", "new [19] | [20] | [21]",
         "B=[1,2,3,4,5,19] | [0,0,0,10,11,20] | [0,14,15,16,17,21]",
         "[22, 23, 6, 12, 9, 8, 7, 18, 13]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6,19 H1/g1->7 H2/g1->8 H3/g1->9 "
         "H4/g1->10 H5/g1->11 H6/g1->12,20 H1/g2->13 H2/g2->14 H3/g2->15 H4/g2->16 H5/g2->17 "
         "H6/g2->18,21",
         "Sg0(H6) Sg1(H6) Sg2(H6)",
         computed=0, outputs=0),
    _row("free(B)", "",
         "",
         "[22, 23, 6, 12, 9, 8, 7, 18, 13, 19, 5, 4, 3, 2, 1, 20, 11, 10, 21, 17, 16, 15, 14]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6,19 H1/g1->7 H2/g1->8 H3/g1->9 "
         "H4/g1->10 H5/g1->11 H6/g1->12,20 H1/g2->13 H2/g2->14 H3/g2->15 H4/g2->16 H5/g2->17 "
         "H6/g2->18,21",
         ""),
])

G7_033 = _scenario(
    'G7', V033, 'full bs 2 + SWA(w=8) bs 4, 20 blocks: LCM 4, hash block 2 (0.33)',
    _spec(V033, 20, FULL, KVCacheGroupSpec("sliding_window", 4, sliding_window=8)), _G7, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]",
         "",
         ""),
    _row("allocate_slots(A, 13, hits)", "new [1,2,3,4,5,6,7] | [8,9,10,11]",
         "A=[1,2,3,4,5,6,7] | [8,9,10,11]",
         "[12, 13, 14, 15, 16, 17, 18, 19]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H2/g1->8 H4/g1->9 H6/g1->10",
         "Sg0(H1,H2,H3,H4,H5,H6) Sg1(H2,H4,H6)",
         computed=0, outputs=0),
    _row("free(A)", "",
         "",
         "[11, 7, 12, 13, 14, 15, 16, 17, 18, 19, 6, 5, 4, 3, 2, 1, 10, 9, 8]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H2/g1->8 H4/g1->9 H6/g1->10",
         ""),
    _row("get_computed_blocks(B)", "[1,2,3,4,5,6] | [0,9,10], 12 tok",
         "B=[] | []",
         "[11, 7, 12, 13, 14, 15, 16, 17, 18, 19, 6, 5, 4, 3, 2, 1, 10, 9, 8]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H2/g1->8 H4/g1->9 H6/g1->10",
         ""),
    _row("allocate_slots(B, 1, hits)", "new [11] | [7]",
         "B=[1,2,3,4,5,6,11] | [0,9,10,7]",
         "[12, 13, 14, 15, 16, 17, 18, 19, 8]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H2/g1->8 H4/g1->9 H6/g1->10",
         "",
         computed=0, outputs=0),
    _row("free(B)", "",
         "",
         "[7, 11, 12, 13, 14, 15, 16, 17, 18, 19, 8, 6, 5, 4, 3, 2, 1, 10, 9]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H2/g1->8 H4/g1->9 H6/g1->10",
         ""),
])

G8_033 = _scenario(
    'G8', V033, 'as G2 but prefix_cache_retention_interval=0 (0.33 engine default)',
    _spec(V033, 16, FULL, SWA4, retention=0), _G8, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]",
         "",
         ""),
    _row("allocate_slots(A, 10, hits)", "new [1,2,3,4,5] | [6,7,8,9,10]",
         "A=[1,2,3,4,5] | [6,7,8,9,10]",
         "[11, 12, 13, 14, 15]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H3/g1->8 H4/g1->9",
         "Sg0(H1,H2,H3,H4,H5) Sg1(H3,H4)",
         computed=0, outputs=0),
    _row("free(A)", "",
         "",
         "[10, 7, 6, 11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 9, 8]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H3/g1->8 H4/g1->9",
         ""),
    _row("get_computed_blocks(B)", "[1,2,3,4] | [0,0,8,9], 8 tok",
         "B=[] | []",
         "[10, 7, 6, 11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 9, 8]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H3/g1->8 H4/g1->9",
         ""),
    _row("allocate_slots(B, 2, hits)", "new [10] | [7]",
         "B=[1,2,3,4,10] | [0,0,8,9,7]",
         "[6, 11, 12, 13, 14, 15, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5,10 H3/g1->8 H4/g1->9",
         "Sg0(H5) Sg1()",
         computed=0, outputs=0),
    _row("free(B)", "",
         "",
         "[7, 6, 11, 12, 13, 14, 15, 5, 10, 4, 3, 2, 1, 9, 8]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5,10 H3/g1->8 H4/g1->9",
         ""),
])

G9_033 = _scenario(
    'G9', V033, 'caching off, full + SWA(w=4), bs 2, 14 blocks',
    _spec(V033, 14, FULL, SWA4, caching=False), _G9, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]",
         "",
         ""),
    _row("allocate_slots(A, 9, hits)", "new [1,2,3,4,5] | [6,7,8,9,10]",
         "A=[1,2,3,4,5] | [6,7,8,9,10]",
         "[11, 12, 13]",
         "",
         "",
         computed=0, outputs=0),
    _row("allocate_slots(A, 1)", "new [] | []",
         "A=[1,2,3,4,5] | [0,0,0,9,10]",
         "[8, 7, 6, 11, 12, 13]",
         "",
         "",
         computed=9, outputs=1),
    _row("get_computed_blocks(B)", "[] | [], 0 tok",
         "A=[1,2,3,4,5] | [0,0,0,9,10]; B=[] | []",
         "[8, 7, 6, 11, 12, 13]",
         "",
         ""),
    _row("allocate_slots(B, 3, hits)", "new [8,7] | [6,11]",
         "A=[1,2,3,4,5] | [0,0,0,9,10]; B=[8,7] | [6,11]",
         "[12, 13]",
         "",
         "",
         computed=0, outputs=0),
    _row("free(A)", "",
         "B=[8,7] | [6,11]",
         "[10, 9, 5, 4, 3, 2, 1, 12, 13]",
         "",
         ""),
    _row("free(B)", "",
         "",
         "[11, 6, 7, 8, 10, 9, 5, 4, 3, 2, 1, 12, 13]",
         "",
         ""),
])

# --- vLLM 0.10.2 (docs/semantics.md#kv-cache-groups-hybrid-models) --------------------------------

G1_010 = _scenario(
    'G1', V010, 'full + SWA(w=4), bs 2, 16 blocks: prefill 10, decode 2, free',
    _spec(V010, 16, FULL, SWA4), _G1, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]",
         "",
         "",
         null=0),
    _row("allocate_slots(A, 10, hits)", "new [1,2,3,4,5] | [6,7,8,9,10]",
         "A=[1,2,3,4,5] | [6,7,8,9,10]",
         "[11, 12, 13, 14, 15]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "S(H1,H2,H3,H4,H5) S(H1,H2,H3,H4,H5)",
         computed=0, outputs=0, null=0),
    _row("allocate_slots(A, 1)", "new [11] | [12]",
         "A=[1,2,3,4,5,11] | [0,0,0,9,10,12]",
         "[13, 14, 15, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "",
         computed=10, outputs=1, null=0),
    _row("allocate_slots(A, 1)", "new [] | []",
         "A=[1,2,3,4,5,11] | [0,0,0,0,10,12]",
         "[13, 14, 15, 8, 7, 6, 9]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->11 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10 H6/g1->12",
         "S(H6) S(H6)",
         computed=11, outputs=2, null=0),
    _row("free(A)", "",
         "",
         "[13, 14, 15, 8, 7, 6, 9, 11, 5, 4, 3, 2, 1, 12, 10]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->11 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10 H6/g1->12",
         "",
         null=-4),
])

G2_010 = _scenario(
    'G2', V010, 'full + SWA(w=4), bs 2: re-hit after free; partial-prefix hit',
    _spec(V010, 16, FULL, SWA4), _G2, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]",
         "",
         "",
         null=0),
    _row("allocate_slots(A, 10, hits)", "new [1,2,3,4,5] | [6,7,8,9,10]",
         "A=[1,2,3,4,5] | [6,7,8,9,10]",
         "[11, 12, 13, 14, 15]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "S(H1,H2,H3,H4,H5) S(H1,H2,H3,H4,H5)",
         computed=0, outputs=0, null=0),
    _row("free(A)", "",
         "",
         "[11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 10, 9, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "",
         null=0),
    _row("get_computed_blocks(B)", "[1,2,3,4] | [0,0,8,9], 8 tok",
         "B=[] | []",
         "[11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 10, 9, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "",
         null=0),
    _row("allocate_slots(B, 2, hits)", "new [11] | [12]",
         "B=[1,2,3,4,11] | [0,0,8,9,12]",
         "[13, 14, 15, 5, 10, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5,11 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10,12",
         "S(H5) S(H5)",
         computed=0, outputs=0, null=2),
    _row("get_computed_blocks(C)", "[1,2,3,4] | [0,0,8,9], 8 tok",
         "B=[1,2,3,4,11] | [0,0,8,9,12]; C=[] | []",
         "[13, 14, 15, 5, 10, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5,11 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10,12",
         "",
         null=2),
    _row("allocate_slots(C, 3, hits)", "new [13,14] | [15,5]",
         "B=[1,2,3,4,11] | [0,0,8,9,12]; C=[1,2,3,4,13,14] | [0,0,8,9,15,5]",
         "[10, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->11 H6/g0->13 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10,12 H6/g1->15",
         "R(H5) S(H6) S(H6)",
         computed=0, outputs=0, null=4),
    _row("free(B)", "",
         "C=[1,2,3,4,13,14] | [0,0,8,9,15,5]",
         "[10, 7, 6, 11, 12]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->11 H6/g0->13 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10,12 H6/g1->15",
         "",
         null=2),
    _row("free(C)", "",
         "",
         "[10, 7, 6, 11, 12, 14, 13, 4, 3, 2, 1, 5, 15, 9, 8]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->11 H6/g0->13 H1/g1->6 H2/g1->7 H3/g1->8 "
         "H4/g1->9 H5/g1->10,12 H6/g1->15",
         "",
         null=0),
])

G3_010 = _scenario(
    'G3', V010, 'SWA only (w=4, bs 2), 12 blocks: 14-token prompt in chunks of 4; re-hit',
    _spec(V010, 12, SWA4), _G3, [
    _row("get_computed_blocks(A)", "[], 0 tok",
         "A=[]",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "",
         "",
         null=0),
    _row("allocate_slots(A, 4, hits)", "new [1,2]",
         "A=[1,2]",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "H1/g0->1 H2/g0->2",
         "S(H1,H2)",
         computed=0, outputs=0, null=0),
    _row("allocate_slots(A, 4)", "new [3,4]",
         "A=[1,2,3,4]",
         "[5, 6, 7, 8, 9, 10, 11]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4",
         "S(H3,H4)",
         computed=4, outputs=0, null=0),
    _row("allocate_slots(A, 4)", "new [5,6]",
         "A=[0,0,3,4,5,6]",
         "[7, 8, 9, 10, 11, 2, 1]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6",
         "S(H5,H6)",
         computed=8, outputs=0, null=0),
    _row("allocate_slots(A, 2)", "new [7]",
         "A=[0,0,0,0,5,6,7]",
         "[8, 9, 10, 11, 2, 1, 4, 3]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7",
         "S(H7)",
         computed=12, outputs=0, null=0),
    _row("free(A)", "",
         "",
         "[8, 9, 10, 11, 2, 1, 4, 3, 7, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7",
         "",
         null=-4),
    _row("get_computed_blocks(B)", "[0,0,0,0,5,6], 12 tok",
         "B=[]",
         "[8, 9, 10, 11, 2, 1, 4, 3, 7, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7",
         "",
         null=-4),
    _row("allocate_slots(B, 2, hits)", "new [8]",
         "B=[0,0,0,0,5,6,8]",
         "[9, 10, 11, 2, 1, 4, 3, 7]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7,8",
         "S(H7)",
         computed=0, outputs=0, null=0),
    _row("free(B)", "",
         "",
         "[9, 10, 11, 2, 1, 4, 3, 7, 8, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H6/g0->6 H7/g0->7,8",
         "",
         null=-4),
])

G4_010 = _scenario(
    'G4', V010, 'chunked local alone (chunk 4, bs 2), 12 blocks: 11-token prompt, decode 2, re-hit',
    _spec(V010, 12, CHUNK4, events=False), _G4, [
    _row("get_computed_blocks(A)", "[0,0,0,0], 8 tok",
         "A=[]",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "",
         "",
         null=0),
    _row("allocate_slots(A, 3, hits)", "new [1,2]",
         "A=[0,0,0,0,1,2]",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "H5/g0->1",
         "",
         computed=0, outputs=0, null=4),
    _row("allocate_slots(A, 1)", "new []",
         "A=[0,0,0,0,1,2]",
         "[3, 4, 5, 6, 7, 8, 9, 10, 11]",
         "H5/g0->1 H6/g0->2",
         "",
         computed=11, outputs=1, null=4),
    _row("allocate_slots(A, 1)", "new [3]",
         "A=[0,0,0,0,0,2,3]",
         "[4, 5, 6, 7, 8, 9, 10, 11, 1]",
         "H5/g0->1 H6/g0->2",
         "",
         computed=12, outputs=2, null=4),
    _row("free(A)", "",
         "",
         "[4, 5, 6, 7, 8, 9, 10, 11, 1, 3, 2]",
         "H5/g0->1 H6/g0->2",
         "",
         null=-1),
    _row("get_computed_blocks(B)", "[0,0,0,0,1], 10 tok",
         "B=[]",
         "[4, 5, 6, 7, 8, 9, 10, 11, 1, 3, 2]",
         "H5/g0->1 H6/g0->2",
         "",
         null=-1),
    _row("allocate_slots(B, 1, hits)", "new [4]",
         "B=[0,0,0,0,1,4]",
         "[5, 6, 7, 8, 9, 10, 11, 3, 2]",
         "H5/g0->1 H6/g0->2",
         "",
         computed=0, outputs=0, null=3),
    _row("free(B)", "",
         "",
         "[5, 6, 7, 8, 9, 10, 11, 3, 2, 4, 1]",
         "H5/g0->1 H6/g0->2",
         "",
         null=-1),
])

G5_010 = _scenario(
    'G5', V010, 'full + SWA(w=4), bs 2, 11 blocks: eviction under pressure',
    _spec(V010, 11, FULL, SWA4), _G5, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]",
         "",
         "",
         null=0),
    _row("allocate_slots(A, 8, hits)", "new [1,2,3,4] | [5,6,7,8]",
         "A=[1,2,3,4] | [5,6,7,8]",
         "[9, 10]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H1/g1->5 H2/g1->6 H3/g1->7 H4/g1->8",
         "S(H1,H2,H3,H4) S(H1,H2,H3,H4)",
         computed=0, outputs=0, null=0),
    _row("free(A)", "",
         "",
         "[9, 10, 4, 3, 2, 1, 8, 7, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H1/g1->5 H2/g1->6 H3/g1->7 H4/g1->8",
         "",
         null=0),
    _row("get_computed_blocks(B)", "[] | [], 0 tok",
         "B=[] | []",
         "[9, 10, 4, 3, 2, 1, 8, 7, 6, 5]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H1/g1->5 H2/g1->6 H3/g1->7 H4/g1->8",
         "",
         null=0),
    _row("allocate_slots(B, 8, hits)", "new [9,10,4,3] | [2,1,8,7]",
         "B=[9,10,4,3] | [2,1,8,7]",
         "[6, 5]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         "R(H4) R(H3) R(H2) R(H1) R(H4) R(H3) S(H5,H6,H7,H8) S(H5,H6,H7,H8)",
         computed=0, outputs=0, null=0),
    _row("get_computed_blocks(C)", "[] | [], 0 tok",
         "B=[9,10,4,3] | [2,1,8,7]; C=[] | []",
         "[6, 5]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         "",
         null=0),
    _row("allocate_slots(C, 8, hits)", "None",
         "B=[9,10,4,3] | [2,1,8,7]; C=[] | []",
         "[6, 5]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         "",
         computed=0, outputs=0, null=0),
    _row("free(B)", "",
         "C=[] | []",
         "[6, 5, 3, 4, 10, 9, 7, 8, 1, 2]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         "",
         null=0),
    _row("free(C)", "",
         "",
         "[6, 5, 3, 4, 10, 9, 7, 8, 1, 2]",
         "H5/g0->9 H6/g0->10 H7/g0->4 H8/g0->3 H1/g1->5 H2/g1->6 H5/g1->2 H6/g1->1 H7/g1->8 "
         "H8/g1->7",
         "",
         null=0),
])

G6P_010 = _scenario(
    "G6'", V010, '(0.10.2) SWA(w=4) group 0 + full group 1, bs 2, 16 blocks',
    _spec(V010, 16, SWA4, FULL), _G8, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]",
         "",
         "",
         null=0),
    _row("allocate_slots(A, 10, hits)", "new [1,2,3,4,5] | [6,7,8,9,10]",
         "A=[1,2,3,4,5] | [6,7,8,9,10]",
         "[11, 12, 13, 14, 15]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "S(H1,H2,H3,H4,H5) S(H1,H2,H3,H4,H5)",
         computed=0, outputs=0, null=0),
    _row("free(A)", "",
         "",
         "[11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 10, 9, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "",
         null=0),
    _row("get_computed_blocks(B)", "[0,0,3,4] | [6,7,8,9], 8 tok",
         "B=[] | []",
         "[11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 10, 9, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10",
         "",
         null=0),
    _row("allocate_slots(B, 2, hits)", "new [11] | [12]",
         "B=[0,0,3,4,11] | [6,7,8,9,12]",
         "[13, 14, 15, 5, 2, 1, 10]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5,11 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10,12",
         "S(H5) S(H5)",
         computed=0, outputs=0, null=2),
    _row("free(B)", "",
         "",
         "[13, 14, 15, 5, 2, 1, 10, 11, 4, 3, 12, 9, 8, 7, 6]",
         "H1/g0->1 H2/g0->2 H3/g0->3 H4/g0->4 H5/g0->5,11 H1/g1->6 H2/g1->7 H3/g1->8 H4/g1->9 "
         "H5/g1->10,12",
         "",
         null=0),
])

G9_010 = _scenario(
    'G9', V010, 'caching off, full + SWA(w=4), bs 2, 14 blocks',
    _spec(V010, 14, FULL, SWA4, caching=False), _G9, [
    _row("get_computed_blocks(A)", "[] | [], 0 tok",
         "A=[] | []",
         "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]",
         "",
         "",
         null=0),
    _row("allocate_slots(A, 9, hits)", "new [1,2,3,4,5] | [6,7,8,9,10]",
         "A=[1,2,3,4,5] | [6,7,8,9,10]",
         "[11, 12, 13]",
         "",
         "",
         computed=0, outputs=0, null=0),
    _row("allocate_slots(A, 1)", "new [] | []",
         "A=[1,2,3,4,5] | [0,0,0,9,10]",
         "[11, 12, 13, 8, 7, 6]",
         "",
         "",
         computed=9, outputs=1, null=0),
    _row("get_computed_blocks(B)", "[] | [], 0 tok",
         "A=[1,2,3,4,5] | [0,0,0,9,10]; B=[] | []",
         "[11, 12, 13, 8, 7, 6]",
         "",
         "",
         null=0),
    _row("allocate_slots(B, 3, hits)", "new [11,12] | [13,8]",
         "A=[1,2,3,4,5] | [0,0,0,9,10]; B=[11,12] | [13,8]",
         "[7, 6]",
         "",
         "",
         computed=0, outputs=0, null=0),
    _row("free(A)", "",
         "B=[11,12] | [13,8]",
         "[7, 6, 5, 4, 3, 2, 1, 10, 9]",
         "",
         "",
         null=-3),
    _row("free(B)", "",
         "",
         "[7, 6, 5, 4, 3, 2, 1, 10, 9, 12, 11, 8, 13]",
         "",
         "",
         null=-3),
])

#: Every scenario: 0.33 G1-G9, then 0.10.2 G1-G5, G6', G9.
SCENARIOS: tuple[GoldenScenario, ...] = (
    G1_033,
    G2_033,
    G3_033,
    G4_033,
    G5_033,
    G6_033,
    G7_033,
    G8_033,
    G9_033,
    G1_010,
    G2_010,
    G3_010,
    G4_010,
    G5_010,
    G6P_010,
    G9_010,
)


def scenario(profile: str, name: str) -> GoldenScenario:
    """The scenario ``name`` (``"G1"`` ... ``"G9"``, ``"G6'"``) under ``profile``."""
    for sc in SCENARIOS:
        if sc.profile == profile and sc.name == name:
            return sc
    raise KeyError(f"no golden scenario {name!r} under {profile!r}")
