// A KV-aware router's prefix index in JavaScript (Node.js, no packages), checked by kvcheck
// over the wire protocol (docs/wire-protocol.md):
//
//     pytest --kv-indexer='exec:node tests/indexers/js_index.mjs'
//
// JSON Lines on stdin/stdout, one request and one answer per line; batches decoded
// (capability decoded_events), every hash a hex string. Blocks are keyed by content, as
// llm-d and Dynamo key them: the parent's engine hash, the block's tokens and its LoRA
// adapter, learnt from the BlockStored events.
import { createInterface } from "node:readline";

// What kvcheck checks this index as. A test fixture of kvcheck: versioned with it, so its
// version is the kvcheck_version init brings.
const implInfo = (kvcheckVersion) => ({
  name: "js-index",
  version: String(kvcheckVersion ?? "0"),
  profile: "vllm-0.33",
  capabilities: ["indexer", "int_hashes", "bytes_hashes", "decoded_events", "replay", "lora",
                 "kv_cache_groups"],
  hash_algos: [],
});

// An error answer's code (docs/wire-protocol.md, "Messages").
class WireError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

const GPU = (medium) => medium === undefined || medium === null || medium === "GPU";
const contentKey = (parent, tokens, lora) => `${parent ?? "-"}|${tokens.join(",")}|${lora}`;

// One index (make_indexer): its config and, per worker, what it learnt from the stream.
class Index {
  constructor(config) {
    this.config = config;
    this.workers = new Map();
  }

  worker(id) {
    if (!this.workers.has(id)) {
      this.workers.set(id, { lastLive: null, applied: -1, pending: new Map(),
                             copies: new Map(), content: new Map() });
    }
    return this.workers.get(id);
  }

  loraKey(event) {
    return this.config.release === "vllm-0.10" ? String(event.lora_id ?? "")
      : String(event.lora_name ?? "");
  }

  applyEvents(w, events) {
    const bs = this.config.block_size, group = this.config.match_group;
    for (const e of events) {
      if (e.type === "AllBlocksCleared") { w.copies.clear(); continue; }
      if ((e.group_idx ?? 0) !== group || !GPU(e.medium)) continue;
      if (e.type === "BlockStored") {
        let parent = e.parent_block_hash;
        const full = Math.floor(e.token_ids.length / bs);
        e.block_hashes.slice(0, full).forEach((h, i) => {
          w.content.set(contentKey(parent, e.token_ids.slice(i * bs, (i + 1) * bs),
                                   this.loraKey(e)), h);
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

  apply_events({ worker_id: id, seq, batch, replay }) {
    const config = this.config, hashBlock = config.hash_block_size ?? config.block_size;
    for (const e of batch.events) {  // refuse before changing anything
      // vLLM 0.33's partial-block key (one hash of one hash block, in a group of larger
      // blocks) is legitimate and never a block: applyEvents finds no full block in it.
      const partialKey = hashBlock < config.block_size && e.block_size === hashBlock
        && e.block_hashes?.length === 1 && e.token_ids?.length === hashBlock;
      if (e.type === "BlockStored" && (e.group_idx ?? 0) === config.match_group
          && e.block_size !== config.block_size && !partialKey) {
        throw new WireError("invalid_argument",
          `${id}: blocks of ${e.block_size}, configured for ${config.block_size}`);
      }
    }
    const w = this.worker(id);
    if (!replay) {
      if (w.lastLive !== null && seq < w.lastLive) {  // a restarted engine: empty cache
        w.copies.clear(); w.applied = -1; w.pending.clear();
      }
      w.lastLive = seq;
    }
    if (seq <= w.applied || w.pending.has(seq)) return null;  // delivered before
    w.pending.set(seq, batch.events);
    while (w.pending.has(w.applied + 1)) {  // in sequence order: a gap waits for its replay
      w.applied += 1;
      this.applyEvents(w, w.pending.get(w.applied));
      w.pending.delete(w.applied);
    }
    return null;
  }

  apply_batch() {  // the msgpack bytes: this index declares decoded_events instead
    throw new WireError("internal", "js-index reads decoded batches (apply_events) only");
  }

  match({ token_ids: tokens, context }) {
    const config = this.config, bs = config.block_size, result = {};
    const lora = context.lora === null ? ""
      : String(config.release === "vllm-0.10" ? context.lora[1] : context.lora[0]);
    for (const [id, w] of this.workers) {
      let parent = null, count = 0;
      for (let start = 0; start + bs <= tokens.length; start += bs) {
        const h = w.content.get(contentKey(parent, tokens.slice(start, start + bs), lora));
        if (h === undefined || !w.copies.has(h)) break;
        parent = h; count += 1;
      }
      if (count) result[id] = count;
    }
    return result;
  }

  remove_worker({ worker_id: id }) { this.workers.delete(id); return null; }
}

const METHODS = new Set(["apply_events", "apply_batch", "match", "remove_worker"]);
const objects = new Map();  // handle -> Index
let nextHandle = 1;
let shuttingDown = false;

// The result of one request (a method without a handle, or an index's method).
function dispatch(req) {
  const params = req.params ?? {};
  if (req.handle !== undefined) {
    const index = objects.get(req.handle);
    if (index === undefined) throw new WireError("internal", `unknown handle ${req.handle}`);
    if (!METHODS.has(req.method)) {
      throw new WireError("internal", `unknown indexer method ${JSON.stringify(req.method)}`);
    }
    return index[req.method](params);
  }
  switch (req.method) {
    case "init":
      return { protocol: 1, impl_info: implInfo(params.kvcheck_version) };
    case "make_indexer": {
      const handle = nextHandle++;
      objects.set(handle, new Index(params.config));
      return { handle };
    }
    case "release":
      for (const handle of params.handles ?? []) objects.delete(handle);
      return null;
    case "shutdown":
      shuttingDown = true;
      return null;
    default:
      throw new WireError("internal", `unknown method ${JSON.stringify(req.method)}`);
  }
}

function answer(line) {
  let req;
  try {
    req = JSON.parse(line);
  } catch (err) {
    return { id: null, error: { code: "internal", message: `not a JSON request line: ${err}` } };
  }
  const id = req?.id ?? null;
  try {
    return { id, result: dispatch(req) };
  } catch (err) {
    const code = err instanceof WireError ? err.code : "internal";
    return { id, error: { code, message: String(err?.message ?? err) } };
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on("line", (line) => {
  if (shuttingDown) return;
  process.stdout.write(JSON.stringify(answer(line)) + "\n");
  if (shuttingDown) {  // answered shutdown: exit 0 once the answer is written
    lines.close();
    process.stdout.write("", () => process.exit(0));
  }
});
// End of input: readline closes, nothing is left to do and Node exits with status 0.
