#!/usr/bin/env node
// jsvllmkv: a paged KV-cache manager following vLLM 0.33 (profile "vllm-0.33"), served over
// kvcheck's wire protocol (docs/wire-protocol.md): JSON Lines on stdin/stdout, one answer per
// request, logs on stderr only. Node.js 20, standard library only.
//
//   pytest --kv-impl='exec:node engines/js/vllmkv.mjs' --kv-profile=vllm-0.33
//
// Environment (optional, for experiments): JSVLLMKV_HASH_ALGOS (comma list, default all
// four: sha256, sha256_cbor, xxhash, xxhash_cbor) overrides the algorithms declared in
// impl_info.hash_algos; every one of them is implemented whatever is declared.
// JSVLLMKV_CAPABILITIES (comma list) overrides the declared capabilities.
import { createInterface } from "node:readline";
import { EngineError, KVCacheManager, BlockPool } from "./manager.mjs";
import { HASH_FUNCTIONS } from "./hashing.mjs";
import { buildBatch, flashinferCsr, reqToToken } from "./batch.mjs";
import { encodeBatch } from "./eventwire.mjs";

const PROTOCOL = 1;

const DEFAULT_CAPABILITIES = [
  "manager", "prefix_caching", "block_hashes", "extra_keys", "free_queue_order", "ref_counts",
  "events", "event_wire", "slot_mapping", "invariants", "batch_metadata", "block_pool",
  // implied by the vLLM profiles; declared for runs under --kv-profile=generic
  "reset_prefix_cache", "caching_off", "skip_reading_prefix_cache", "lookahead",
  "multi_token_decode", "caches_running_requests",
];

function listFromEnv(name, fallback) {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  return raw.split(",").map((s) => s.trim()).filter(Boolean);
}

const IMPL_INFO = {
  name: "jsvllmkv",
  version: "0.1.0",
  profile: "vllm-0.33",
  capabilities: listFromEnv("JSVLLMKV_CAPABILITIES", DEFAULT_CAPABILITIES),
  hash_algos: listFromEnv("JSVLLMKV_HASH_ALGOS",
                          ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]),
  reserved_block_ids: [0], // the null block (the vLLM profiles' default; declared for generic)
  block_sizes: null,
  num_blocks_range: null,
  ref_cnt_counts_cache: false,
  commit: null,
};

const log = (...args) => process.stderr.write(`jsvllmkv: ${args.join(" ")}\n`);

// ------------------------------------------------------------------------------ objects
const objects = new Map();
let nextHandle = 1;

function checkSpec(spec) {
  if (!spec || typeof spec !== "object") throw new EngineError("internal", "spec missing");
  if (spec.kv_cache_groups && spec.kv_cache_groups.length) {
    throw new EngineError("not_supported", "kv_cache_groups: jsvllmkv models one full-attention group");
  }
  if (!Number.isInteger(spec.block_size) || spec.block_size < 1) {
    throw new EngineError("not_supported", `block_size ${spec.block_size}`);
  }
  if (!Number.isInteger(spec.num_blocks) || spec.num_blocks < 1) {
    throw new EngineError("not_supported", `num_blocks ${spec.num_blocks}: the null block needs one`);
  }
  const algo = spec.hash_algo ?? "sha256";
  if (!(algo in HASH_FUNCTIONS)) throw new EngineError("not_supported", `hash_algo ${algo}`);
}

function register(obj) {
  const handle = nextHandle++;
  objects.set(handle, obj);
  return { handle };
}

const MANAGER_METHODS = {
  get_computed_blocks: (m, p) => m.getComputedBlocks(p.request),
  allocate_slots: (m, p) => m.allocateSlots(p.request, p.num_new_tokens, p.num_new_computed_tokens,
    p.new_computed_block_ids, p.num_lookahead_tokens),
  free: (m, p) => { m.free(p.request_id); return null; },
  get_block_ids: (m, p) => m.getBlockIds(p.request_id),
  num_free_blocks: (m) => m.pool.numFreeBlocks(),
  reset_prefix_cache: (m) => m.pool.resetPrefixCache(),
  free_block_ids: (m) => m.pool.freeBlockIds(),
  ref_cnt: (m, p) => {
    if (!Number.isInteger(p.block_id) || p.block_id < 0 || p.block_id >= m.pool.numBlocks) {
      throw new EngineError("internal", `block id ${p.block_id} out of range`);
    }
    return m.pool.refCnt[p.block_id];
  },
  block_hashes: (m, p) => m.blockHashes(p.request_id),
  take_events: (m) => m.pool.takeEvents(),
  take_event_batch: (m, p) => encodeBatch(m.pool.takeEvents(), p.ts).toString("hex"),
  slot_mapping: (m, p) => m.slotMapping(p.request_id, p.start, p.end),
  check_invariants: (m) => m.checkInvariants(),
  build_batch: (m, p) => buildBatch(m.blockSize, p.block_tables, p.num_computed_tokens,
    p.num_scheduled_tokens, p.num_padded_tokens, p.dcp_world_size, p.dcp_rank,
    p.cp_kv_cache_interleave_size),
  flashinfer_csr: (m, p) => flashinferCsr(m.blockSize, p.block_tables, p.seq_lens),
  req_to_token: (m, p) => reqToToken(m.blockSize, p.block_tables, p.seq_lens),
};

const POOL_METHODS = {
  get_new_blocks: (pool, p) => pool.getNewBlocks(p.num_blocks),
  free_blocks: (pool, p) => { pool.freeBlocks(p.ordered_block_ids); return null; },
  touch: (pool, p) => { pool.touch(p.block_ids); return null; },
  cache_full_blocks: (pool, p) => {
    pool.cacheFullBlocks(p.request, p.block_ids, p.num_cached_blocks, p.num_full_blocks);
    return null;
  },
  get_cached_block: (pool, p) => pool.getCachedBlock(String(p.block_hash).toLowerCase()),
  num_free_blocks: (pool) => pool.numFreeBlocks(),
  free_block_ids: (pool) => pool.freeBlockIds(),
};

function dispatch(msg) {
  const p = msg.params || {};
  switch (msg.method) {
    case "init":
      return { protocol: PROTOCOL, impl_info: IMPL_INFO };
    case "make_kv_cache_manager":
      checkSpec(p.spec);
      return register(new KVCacheManager(p.spec));
    case "make_block_pool":
      checkSpec(p.spec);
      return register(new BlockPool(p.spec));
    case "release":
      for (const h of p.handles || []) objects.delete(h);
      return null;
    case "shutdown":
      return null;
    case "make_indexer":
    case "kv_page_size_bytes":
    case "kv_sizing_plan":
    case "kv_cache_view_shape":
    case "kv_block_sizes":
      throw new EngineError("not_supported", `${msg.method}: not offered by jsvllmkv`);
    default:
      break;
  }
  if (msg.handle === undefined || msg.handle === null) {
    throw new EngineError("internal", `unknown method ${msg.method}`);
  }
  const obj = objects.get(msg.handle);
  if (!obj) throw new EngineError("internal", `unknown handle ${msg.handle}`);
  const table = obj instanceof KVCacheManager ? MANAGER_METHODS : POOL_METHODS;
  const fn = Object.prototype.hasOwnProperty.call(table, msg.method) ? table[msg.method] : null;
  if (!fn) throw new EngineError("internal", `unknown method ${msg.method} for handle ${msg.handle}`);
  return fn(obj, p);
}

// ------------------------------------------------------------------------------ the loop
function answer(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity, terminal: false });
let shuttingDown = false;

rl.on("line", (line) => {
  if (shuttingDown) return;
  if (!line.trim()) return;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch (err) {
    log(`unparsable request line: ${err.message}`);
    const found = /"id"\s*:\s*(\d+)/.exec(line); // answer with its id when one can be read
    answer({ id: found ? Number(found[1]) : null, error: { code: "internal", message: `bad JSON: ${err.message}` } });
    return;
  }
  const id = msg && typeof msg === "object" ? msg.id ?? null : null;
  try {
    const result = dispatch(msg);
    answer({ id, result: result === undefined ? null : result });
  } catch (err) {
    const code = err instanceof EngineError ? err.code : "internal";
    const message = err instanceof EngineError ? err.message : `${err.name}: ${err.message}`;
    if (code === "internal") log(`${msg.method}: ${err.stack || message}`);
    answer({ id, error: { code, message } });
  }
  if (msg && msg.method === "shutdown") {
    shuttingDown = true;
    rl.close();
  }
});

rl.on("close", () => process.exit(0));
process.stdout.on("error", (err) => {
  if (err.code === "EPIPE") process.exit(0);
  throw err;
});
