// vLLM 0.33's block pool and KV-cache manager for one full-attention group
// (docs/semantics.md): free queue, cached-block map, allocation, lazy eviction, KV events.
import { BlockHasher, eventExtraKeys } from "./hashing.mjs";

export class EngineError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

const NULL_BLOCK = 0;

const cdiv = (a, b) => Math.floor((a + b - 1) / b);

// Per-request block hashes (vLLM's Request.block_hashes), kept incrementally: a view whose
// hashed prefix (tokens and extra-key context) is unchanged only hashes its new full blocks.
class RequestHashes {
  constructor(view) {
    this.context = contextKey(view);
    this.tokens = [];
    this.hashes = [];
  }
}

function contextKey(view) {
  return JSON.stringify([view.lora ?? null, view.mm_features ?? [], view.cache_salt ?? null]);
}

function viewTokens(view) {
  const out = view.output_token_ids;
  return out && out.length ? view.prompt_token_ids.concat(out) : view.prompt_token_ids;
}

// The free queue: a doubly linked list threaded through the blocks, head = next allocated.
class FreeQueue {
  constructor(numBlocks) {
    this.n = numBlocks;
    this.prev = new Int32Array(numBlocks + 2);
    this.next = new Int32Array(numBlocks + 2);
    this.linked = new Uint8Array(numBlocks);
    this.head = numBlocks; // sentinel
    this.tail = numBlocks + 1; // sentinel
    this.next[this.head] = this.tail;
    this.prev[this.tail] = this.head;
    this.count = 0;
  }
  _insertBefore(b, at) {
    const p = this.prev[at];
    this.next[p] = b;
    this.prev[b] = p;
    this.next[b] = at;
    this.prev[at] = b;
    this.linked[b] = 1;
    this.count++;
  }
  append(b) {
    this._insertBefore(b, this.tail);
  }
  // Splice `blocks` in front of the head, keeping their order (blocks[0] becomes the head).
  prepend(blocks) {
    const first = this.next[this.head];
    for (const b of blocks) this._insertBefore(b, first);
  }
  remove(b) {
    if (!this.linked[b]) throw new EngineError("internal", `block ${b} is not in the free queue`);
    const p = this.prev[b];
    const nx = this.next[b];
    this.next[p] = nx;
    this.prev[nx] = p;
    this.linked[b] = 0;
    this.count--;
  }
  popleft() {
    const b = this.next[this.head];
    if (b === this.tail) throw new EngineError("internal", "No free blocks available");
    this.remove(b);
    return b;
  }
  toArray() {
    const out = [];
    for (let b = this.next[this.head]; b !== this.tail; b = this.next[b]) out.push(b);
    return out;
  }
}

export class BlockPool {
  constructor(spec) {
    this.numBlocks = spec.num_blocks;
    this.blockSize = spec.block_size;
    this.enableCaching = spec.enable_caching !== false;
    this.eventsOn = !!spec.enable_kv_cache_events;
    this.hasher = new BlockHasher(spec.hash_algo ?? "sha256", spec.pythonhashseed ?? null, spec.block_size);
    this.refCnt = new Int32Array(this.numBlocks);
    this.blockKey = new Array(this.numBlocks).fill(null); // hex of the cache key, or null
    this.blockHash = new Array(this.numBlocks).fill(null); // the bare hash (Buffer), or null
    this.cached = new Map(); // key -> [block ids], first inserted first
    this.queue = new FreeQueue(this.numBlocks);
    for (let b = 0; b < this.numBlocks; b++) this.queue.append(b);
    this.queue.popleft(); // the null block: block 0, never queued again
    this.events = [];
    this.requestHashes = new Map(); // request id -> RequestHashes
  }

  // ---------------------------------------------------------------- request hashes
  hashesOf(view) {
    const rid = view.request_id;
    let state = this.requestHashes.get(rid);
    const tokens = viewTokens(view);
    const bs = this.blockSize;
    if (state) {
      const done = state.hashes.length * bs;
      let same = state.context === contextKey(view) && tokens.length >= done;
      for (let i = 0; same && i < done; i++) if (tokens[i] !== state.tokens[i]) same = false;
      if (!same) state = null;
    }
    if (!state) {
      state = new RequestHashes(view);
      this.requestHashes.set(rid, state);
    }
    const full = Math.floor(tokens.length / bs);
    for (let i = state.hashes.length; i < full; i++) {
      const parent = i ? state.hashes[i - 1] : null;
      state.hashes.push(this.hasher.hashBlock(parent, view, tokens, i));
    }
    state.tokens = tokens.slice(0, full * bs);
    return state.hashes;
  }

  // ------------------------------------------------------------------- the pool
  numFreeBlocks() {
    return this.queue.count;
  }

  getCachedBlock(key) {
    const blocks = this.cached.get(key);
    return blocks && blocks.length ? blocks[0] : null;
  }

  _evict(b) {
    const key = this.blockKey[b];
    if (key === null) return;
    const blocks = this.cached.get(key);
    if (blocks) {
      const i = blocks.indexOf(b);
      if (i >= 0) blocks.splice(i, 1);
      if (!blocks.length) this.cached.delete(key);
    }
    const bare = this.blockHash[b];
    this.blockKey[b] = null;
    this.blockHash[b] = null;
    if (this.eventsOn) {
      this.events.push({ type: "BlockRemoved", block_hashes: [bare.toString("hex")], medium: "GPU", group_idx: 0 });
    }
  }

  getNewBlocks(n) {
    if (n > this.queue.count) {
      throw new EngineError("invalid_argument", `Cannot get ${n} free blocks from the pool`);
    }
    const out = [];
    for (let i = 0; i < n; i++) {
      const b = this.queue.popleft();
      if (this.enableCaching) this._evict(b);
      this.refCnt[b] += 1;
      out.push(b);
    }
    return out;
  }

  touch(blocks) {
    for (const b of blocks) {
      if (b === NULL_BLOCK) continue; // 0.33: the null block is skipped
      if (this.refCnt[b] === 0) this.queue.remove(b);
      this.refCnt[b] += 1;
    }
  }

  // 0.33 free order: the blocks reaching ref_cnt 0, unhashed ones to the head (keeping their
  // order), hashed ones to the tail (docs/semantics.md#free-order).
  freeBlocks(ordered) {
    const freed = [];
    for (const b of ordered) {
      if (b === NULL_BLOCK) continue;
      this.refCnt[b] -= 1;
      if (this.refCnt[b] === 0) freed.push(b);
    }
    const unhashed = [];
    for (const b of freed) {
      if (this.blockKey[b] === null) unhashed.push(b);
      else this.queue.append(b);
    }
    this.queue.prepend(unhashed);
  }

  // Cache blocks[numCached:numFull] of a request under its hashes; one BlockStored.
  cacheFullBlocks(view, blocks, numCached, numFull) {
    if (numCached >= numFull) return;
    const hashes = this.hashesOf(view);
    if (hashes.length < numFull) {
      throw new EngineError("internal", `request ${view.request_id} has ${hashes.length} block hashes, ` +
        `fewer than the ${numFull} full blocks to cache`);
    }
    const newFull = blocks.slice(numCached, numFull);
    const stored = [];
    const extra = [];
    const bs = this.blockSize;
    for (let i = 0; i < newFull.length; i++) {
      const b = newFull[i];
      if (b === NULL_BLOCK) continue;
      const index = numCached + i;
      const hash = hashes[index];
      if (this.blockKey[b] !== null) continue; // already cached: its key is never overwritten
      const key = hash.toString("hex");
      this.blockKey[b] = key;
      this.blockHash[b] = hash;
      const list = this.cached.get(key);
      if (list) list.push(b);
      else this.cached.set(key, [b]);
      stored.push(key);
      extra.push(eventExtraKeys(view, index * bs, (index + 1) * bs));
    }
    if (this.eventsOn) {
      const tokens = viewTokens(view);
      this.events.push({
        type: "BlockStored",
        block_hashes: stored,
        parent_block_hash: numCached === 0 ? null : hashes[numCached - 1].toString("hex"),
        token_ids: tokens.slice(numCached * bs, numFull * bs),
        block_size: bs,
        lora_id: view.lora ? view.lora[1] : null,
        medium: "GPU",
        lora_name: view.lora ? view.lora[0] : null,
        extra_keys: extra,
        group_idx: 0,
      });
    }
  }

  resetPrefixCache() {
    if (this.queue.count !== this.numBlocks - 1) return false;
    this.cached = new Map();
    this.blockKey.fill(null);
    this.blockHash.fill(null);
    if (this.eventsOn) this.events.push({ type: "AllBlocksCleared" });
    return true;
  }

  takeEvents() {
    const out = this.events;
    this.events = [];
    return out;
  }

  freeBlockIds() {
    return this.queue.toArray();
  }

  // Broken laws as a list of messages (docs/semantics.md#invariants).
  problems(tables) {
    const out = [];
    const q = this.queue.toArray();
    if (q.length !== this.queue.count) out.push(`free count ${this.queue.count} != queue length ${q.length}`);
    const inQueue = new Uint8Array(this.numBlocks);
    for (const b of q) {
      if (b < 0 || b >= this.numBlocks) { out.push(`queue holds ${b}, not a block id`); continue; }
      if (inQueue[b]) out.push(`block ${b} is queued twice`);
      inQueue[b] = 1;
    }
    if (inQueue[NULL_BLOCK]) out.push("the null block is in the free queue");
    if (this.blockKey[NULL_BLOCK] !== null) out.push("the null block is cached");
    for (let b = 1; b < this.numBlocks; b++) {
      if (this.refCnt[b] < 0) out.push(`block ${b} has ref_cnt ${this.refCnt[b]}`);
      if ((this.refCnt[b] === 0) !== (inQueue[b] === 1)) {
        out.push(`block ${b}: ref_cnt ${this.refCnt[b]} but ${inQueue[b] ? "" : "not "}in the free queue`);
      }
      const key = this.blockKey[b];
      if (key !== null && !(this.cached.get(key) || []).includes(b)) {
        out.push(`block ${b} carries key ${key.slice(0, 16)}... but is not in the map under it`);
      }
    }
    for (const [key, blocks] of this.cached) {
      if (!blocks.length) out.push(`key ${key.slice(0, 16)}... maps to no block`);
      for (const b of blocks) {
        if (this.blockKey[b] !== key) out.push(`map key ${key.slice(0, 16)}... holds block ${b}, which carries another key`);
      }
    }
    if (tables) {
      const holders = new Int32Array(this.numBlocks);
      for (const [rid, table] of tables) {
        const seen = new Set();
        for (const b of table) {
          if (seen.has(b)) out.push(`request ${rid} holds block ${b} twice`);
          seen.add(b);
          holders[b]++;
        }
      }
      for (let b = 1; b < this.numBlocks; b++) {
        if (holders[b] !== this.refCnt[b]) out.push(`block ${b}: ref_cnt ${this.refCnt[b]}, held by ${holders[b]} block tables`);
      }
    }
    return out;
  }
}

export class KVCacheManager {
  constructor(spec) {
    this.spec = spec;
    this.pool = new BlockPool(spec);
    this.blockSize = spec.block_size;
    this.enableCaching = this.pool.enableCaching;
    this.maxModelLen = spec.max_model_len ?? null;
    this.tables = new Map(); // request id -> block ids in logical order
    this.numCached = new Map(); // request id -> blocks cached so far
  }

  getComputedBlocks(view) {
    const hashes = this.pool.hashesOf(view); // computed for every request, as vLLM does
    if (!this.enableCaching || view.skip_reading_prefix_cache) return [[], 0];
    const numTokens = view.prompt_token_ids.length + (view.output_token_ids?.length ?? 0);
    const maxHit = numTokens - 1;
    const limit = Math.min(Math.floor(maxHit / this.blockSize), hashes.length);
    const hits = [];
    for (let i = 0; i < limit; i++) {
      const b = this.pool.getCachedBlock(hashes[i].toString("hex"));
      if (b === null) break;
      hits.push(b);
    }
    return [hits, hits.length * this.blockSize];
  }

  allocateSlots(view, numNewTokens, numNewComputedTokens, hits, numLookahead) {
    hits = hits || [];
    numNewComputedTokens = numNewComputedTokens || 0;
    numLookahead = numLookahead || 0;
    if (numNewTokens === 0 && hits.length === 0 && numNewComputedTokens === 0) {
      throw new EngineError("invalid_argument", "num_new_tokens must be greater than 0");
    }
    const rid = view.request_id;
    const hashes = this.pool.hashesOf(view);
    const numTokens = view.prompt_token_ids.length + (view.output_token_ids?.length ?? 0);
    const numComputed = view.num_computed_tokens + numNewComputedTokens;
    let needSlots = numComputed + numNewTokens + numLookahead;
    if (this.maxModelLen !== null) needSlots = Math.min(needSlots, this.maxModelLen);
    const table = this.tables.get(rid) || [];
    const required = cdiv(needSlots, this.blockSize);
    const numNew = Math.max(required - hits.length - table.length, 0);
    let evictableHits = 0;
    for (const b of hits) if (b !== NULL_BLOCK && this.pool.refCnt[b] === 0) evictableHits++;
    if (numNew + evictableHits > this.pool.numFreeBlocks()) return null;

    if (this.enableCaching) this.pool.touch(hits);
    else if (hits.length) throw new EngineError("internal", "prefix hits passed with caching off");
    if (!this.numCached.has(rid)) {
      // A new request: its hits start the block table.
      this.tables.set(rid, hits.slice());
      this.numCached.set(rid, hits.length);
    } else if (hits.length) {
      throw new EngineError("internal", `running request ${rid} passed new prefix hits`);
    }
    const blocks = this.tables.get(rid);
    const toPop = required - blocks.length;
    const newBlocks = toPop > 0 ? this.pool.getNewBlocks(toPop) : [];
    for (const b of newBlocks) blocks.push(b);

    if (this.enableCaching) {
      const toCache = Math.min(numComputed + numNewTokens, numTokens, hashes.length * this.blockSize);
      const numFull = Math.floor(toCache / this.blockSize);
      const done = this.numCached.get(rid);
      if (done < numFull) {
        this.pool.cacheFullBlocks(view, blocks, done, numFull);
        this.numCached.set(rid, numFull);
      }
    }
    return newBlocks;
  }

  free(rid) {
    const blocks = this.tables.get(rid) || [];
    this.tables.delete(rid);
    this.numCached.delete(rid);
    this.pool.requestHashes.delete(rid); // a finished request is forgotten (block_hashes: [])
    this.pool.freeBlocks(blocks.slice().reverse());
  }

  getBlockIds(rid) {
    return (this.tables.get(rid) || []).slice();
  }

  blockHashes(rid) {
    const state = this.pool.requestHashes.get(rid);
    return state ? state.hashes.map((h) => h.toString("hex")) : [];
  }

  slotMapping(rid, start, end) {
    const table = this.tables.get(rid) || [];
    const bs = this.blockSize;
    const out = [];
    for (let pos = start; pos < end; pos++) {
      const i = Math.floor(pos / bs);
      if (i >= table.length) {
        throw new EngineError("internal", `position ${pos} of ${rid} is past its ${table.length} blocks`);
      }
      out.push(table[i] * bs + (pos % bs));
    }
    return out;
  }

  checkInvariants() {
    const problems = this.pool.problems(this.tables);
    if (problems.length) throw new EngineError("violation", problems.join("; "));
    return null;
  }
}
