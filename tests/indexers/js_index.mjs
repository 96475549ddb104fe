// A KV-aware router's prefix index in JavaScript (Node.js, no packages), checked by kvcheck
// through kvcheck.adapters.subprocess_indexer (js_indexer.py beside this file): the indexer
// protocol as JSON Lines on stdin/stdout, batches decoded (capability decoded_events), every
// hash a hex string. Blocks are keyed by content, as llm-d and Dynamo key them: the parent's
// engine hash, the block's tokens and its LoRA adapter, learnt from the BlockStored events.
import { createInterface } from "node:readline";

let config = null;
let workers = new Map();

function worker(id) {
  if (!workers.has(id)) {
    workers.set(id, { lastLive: null, applied: -1, pending: new Map(),
                      copies: new Map(), content: new Map() });
  }
  return workers.get(id);
}

const GPU = (medium) => medium === undefined || medium === null || medium === "GPU";
const loraKey = (event) =>
  config.release === "vllm-0.10" ? String(event.lora_id ?? "") : String(event.lora_name ?? "");
const contentKey = (parent, tokens, lora) => `${parent ?? "-"}|${tokens.join(",")}|${lora}`;

function applyEvents(w, events) {
  const bs = config.block_size, group = config.match_group;
  for (const e of events) {
    if (e.type === "AllBlocksCleared") { w.copies.clear(); continue; }
    if ((e.group_idx ?? 0) !== group || !GPU(e.medium)) continue;
    if (e.type === "BlockStored") {
      let parent = e.parent_block_hash;
      const full = Math.floor(e.token_ids.length / bs);
      e.block_hashes.slice(0, full).forEach((h, i) => {
        w.content.set(contentKey(parent, e.token_ids.slice(i * bs, (i + 1) * bs), loraKey(e)), h);
        w.copies.set(h, (w.copies.get(h) ?? 0) + 1);
        parent = h;
      });
    } else if (e.type === "BlockRemoved") {
      for (const h of e.block_hashes) {
        const left = (w.copies.get(h) ?? 0) - 1;
        if (left > 0) w.copies.set(h, left); else w.copies.delete(h);
      }
    }
  }
}

function apply({ worker: id, seq, replay, batch }) {
  for (const e of batch.events) {  // refuse before changing anything
    if (e.type === "BlockStored" && (e.group_idx ?? 0) === config.match_group
        && e.block_size !== config.block_size) {
      return { error: `${id}: blocks of ${e.block_size}, configured for ${config.block_size}` };
    }
  }
  const w = worker(id);
  if (!replay) {
    if (w.lastLive !== null && seq < w.lastLive) {  // a restarted engine: empty cache
      w.copies.clear(); w.applied = -1; w.pending.clear();
    }
    w.lastLive = seq;
  }
  if (seq <= w.applied || w.pending.has(seq)) return { ok: true };  // delivered before
  w.pending.set(seq, batch.events);
  while (w.pending.has(w.applied + 1)) {  // in sequence order: a gap waits for its replay
    w.applied += 1;
    applyEvents(w, w.pending.get(w.applied));
    w.pending.delete(w.applied);
  }
  return { ok: true };
}

function match({ tokens, context }) {
  const bs = config.block_size, result = {};
  const lora = context.lora === null ? ""
    : String(config.release === "vllm-0.10" ? context.lora[1] : context.lora[0]);
  for (const [id, w] of workers) {
    let parent = null, count = 0;
    for (let start = 0; start + bs <= tokens.length; start += bs) {
      const h = w.content.get(contentKey(parent, tokens.slice(start, start + bs), lora));
      if (h === undefined || !w.copies.has(h)) break;
      parent = h; count += 1;
    }
    if (count) result[id] = count;
  }
  return { result };
}

const ops = {
  init: (req) => { config = req.config; workers = new Map(); return { ok: true }; },
  apply,
  match,
  remove_worker: (req) => { workers.delete(req.worker); return { ok: true }; },
};

const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
  const req = JSON.parse(line);
  const answer = ops[req.op] ? ops[req.op](req) : { error: `unknown op ${req.op}` };
  process.stdout.write(JSON.stringify(answer) + "\n");
});
