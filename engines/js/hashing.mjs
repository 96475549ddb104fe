// Block hashing as vLLM 0.33 does it (docs/semantics.md#hashing-bytes).
//
// A block hash is hash_fn((parent, tuple(block token ids), extra_keys)); the hashed object is
// serialized with canonical CBOR (sha256_cbor, xxhash_cbor) or with pickle protocol 5
// (sha256, xxhash), then digested with SHA-256 (32 bytes) or XXH3-128 (16 bytes).
//
// Values of the small object model both serializers take:
//   null                 Python None
//   number / bigint      Python int
//   string               Python str
//   Uint8Array (Buffer)  Python bytes
//   Array                Python tuple
import { createHash, randomBytes } from "node:crypto";
import { xxh3_128 } from "./xxh3.mjs";

// ------------------------------------------------------------------------------------ CBOR
// Canonical CBOR (RFC 8949 section 4.2.1, what cbor2.dumps(obj, canonical=True) writes for
// these types): shortest heads, definite lengths. Tuples are arrays.
class Writer {
  constructor() {
    this.buf = Buffer.allocUnsafe(256);
    this.len = 0;
  }
  ensure(n) {
    if (this.len + n > this.buf.length) {
      const bigger = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.len + n));
      this.buf.copy(bigger, 0, 0, this.len);
      this.buf = bigger;
    }
  }
  byte(b) {
    this.ensure(1);
    this.buf[this.len++] = b;
  }
  bytes(src) {
    this.ensure(src.length);
    for (let i = 0; i < src.length; i++) this.buf[this.len + i] = src[i];
    this.len += src.length;
  }
  uintLE(value, width) { // value: number or bigint >= 0, written little-endian
    this.ensure(width);
    let v = BigInt(value);
    for (let i = 0; i < width; i++) {
      this.buf[this.len++] = Number(v & 0xffn);
      v >>= 8n;
    }
  }
  uintBE(value, width) {
    this.ensure(width);
    let v = BigInt(value);
    for (let i = width - 1; i >= 0; i--) {
      this.buf[this.len + i] = Number(v & 0xffn);
      v >>= 8n;
    }
    this.len += width;
  }
  result() {
    return this.buf.subarray(0, this.len);
  }
}

function cborHead(w, major, value) { // value: non-negative number or bigint
  const m = major << 5;
  if (typeof value === "number" && value < 24) {
    w.byte(m | value);
  } else {
    const v = BigInt(value);
    if (v < 24n) w.byte(m | Number(v));
    else if (v < 0x100n) { w.byte(m | 24); w.byte(Number(v)); }
    else if (v < 0x10000n) { w.byte(m | 25); w.uintBE(v, 2); }
    else if (v < 0x100000000n) { w.byte(m | 26); w.uintBE(v, 4); }
    else if (v < 0x10000000000000000n) { w.byte(m | 27); w.uintBE(v, 8); }
    else throw new RangeError(`integer ${value} does not fit CBOR's 64-bit heads`);
  }
}

function cborEncode(w, obj) {
  if (obj === null || obj === undefined) {
    w.byte(0xf6);
  } else if (typeof obj === "number" || typeof obj === "bigint") {
    if (typeof obj === "number" && !Number.isInteger(obj)) throw new TypeError(`not an int: ${obj}`);
    if (obj >= 0) cborHead(w, 0, obj);
    else cborHead(w, 1, -BigInt(obj) - 1n);
  } else if (typeof obj === "string") {
    const b = Buffer.from(obj, "utf8");
    cborHead(w, 3, b.length);
    w.bytes(b);
  } else if (obj instanceof Uint8Array) {
    cborHead(w, 2, obj.length);
    w.bytes(obj);
  } else if (Array.isArray(obj)) {
    cborHead(w, 4, obj.length);
    for (const item of obj) cborEncode(w, item);
  } else {
    throw new TypeError(`cannot CBOR-encode ${typeof obj}`);
  }
}

export function cbor(obj) {
  const w = new Writer();
  cborEncode(w, obj);
  return Buffer.from(w.result());
}

// ---------------------------------------------------------------------------------- pickle
// pickle.dumps(obj, protocol=5) as CPython's C pickler writes it for these types: PROTO 5,
// one FRAME, the object, STOP. Ints are never memoized; str, bytes and non-empty tuples are
// (MEMOIZE), and a second occurrence of the same object becomes BINGET. Python shares equal
// str objects where vLLM passes the same object (its tag literals "mm", "lora"...; interned
// identifiers); this encoder shares equal strings by value, which is what those cases give.
const TUPLE_OPS = [0x29 /* EMPTY_TUPLE */, 0x85, 0x86, 0x87];

function pickleLong(w, value) {
  // encode_long: (bit_length >> 3) + 1 bytes, little-endian two's complement, trimmed for
  // negatives whose top byte is redundant.
  let v = BigInt(value);
  let bitLength = 0;
  for (let a = v < 0n ? -v : v; a > 0n; a >>= 1n) bitLength++;
  let nbytes = (bitLength >> 3) + 1;
  const mod = 1n << BigInt(8 * nbytes);
  let u = v < 0n ? v + mod : v;
  const bytes = [];
  for (let i = 0; i < nbytes; i++) { bytes.push(Number(u & 0xffn)); u >>= 8n; }
  if (v < 0n && nbytes > 1 && bytes[nbytes - 1] === 0xff && (bytes[nbytes - 2] & 0x80) !== 0) {
    bytes.pop();
    nbytes--;
  }
  if (nbytes < 256) { w.byte(0x8a); w.byte(nbytes); } // LONG1
  else { w.byte(0x8b); w.uintLE(nbytes, 4); } // LONG4
  w.bytes(bytes);
}

class Pickler {
  constructor() {
    this.w = new Writer();
    this.memoCount = 0;
    this.strMemo = new Map();
  }
  memoize() {
    this.w.byte(0x94); // MEMOIZE
    return this.memoCount++;
  }
  get(idx) {
    if (idx < 256) { this.w.byte(0x68); this.w.byte(idx); } // BINGET
    else { this.w.byte(0x6a); this.w.uintLE(idx, 4); } // LONG_BINGET
  }
  save(obj) {
    const w = this.w;
    if (obj === null || obj === undefined) {
      w.byte(0x4e); // NONE
    } else if (typeof obj === "number" || typeof obj === "bigint") {
      if (typeof obj === "number" && !Number.isInteger(obj)) throw new TypeError(`not an int: ${obj}`);
      if (obj >= 0 && obj <= 0xff) { w.byte(0x4b); w.byte(Number(obj)); } // BININT1
      else if (obj >= 0 && obj <= 0xffff) { w.byte(0x4d); w.uintLE(obj, 2); } // BININT2
      else if (obj >= -0x80000000 && obj <= 0x7fffffff) { // BININT, signed 32 bits
        w.byte(0x4a);
        const v = Number(obj);
        w.uintLE(v < 0 ? v + 0x100000000 : v, 4);
      } else pickleLong(w, obj);
    } else if (typeof obj === "string") {
      const known = this.strMemo.get(obj);
      if (known !== undefined) { this.get(known); return; }
      const b = Buffer.from(obj, "utf8");
      if (b.length <= 0xff) { w.byte(0x8c); w.byte(b.length); } // SHORT_BINUNICODE
      else if (b.length <= 0xffffffff) { w.byte(0x58); w.uintLE(b.length, 4); } // BINUNICODE
      else { w.byte(0x8d); w.uintLE(b.length, 8); } // BINUNICODE8
      w.bytes(b);
      this.strMemo.set(obj, this.memoize());
    } else if (obj instanceof Uint8Array) {
      if (obj.length <= 0xff) { w.byte(0x43); w.byte(obj.length); } // SHORT_BINBYTES
      else { w.byte(0x42); w.uintLE(obj.length, 4); } // BINBYTES
      w.bytes(obj);
      this.memoize();
    } else if (Array.isArray(obj)) {
      const n = obj.length;
      if (n === 0) { w.byte(TUPLE_OPS[0]); return; } // the empty tuple is not memoized
      if (n <= 3) {
        for (const item of obj) this.save(item);
        w.byte(TUPLE_OPS[n]);
      } else {
        w.byte(0x28); // MARK
        for (const item of obj) this.save(item);
        w.byte(0x74); // TUPLE
      }
      this.memoize();
    } else {
      throw new TypeError(`cannot pickle ${typeof obj}`);
    }
  }
}

export function pickle(obj) {
  const p = new Pickler();
  p.save(obj);
  p.w.byte(0x2e); // STOP
  const body = p.w.result();
  // One frame holds everything after PROTO (CPython commits a frame of at least 4 bytes;
  // frames only split past 64 KiB, far beyond a block's tuple at any block size used here).
  const head = Buffer.alloc(body.length >= 4 ? 11 : 2);
  head[0] = 0x80; head[1] = 5; // PROTO 5
  if (body.length >= 4) {
    head[2] = 0x95; // FRAME
    head.writeBigUInt64LE(BigInt(body.length), 3);
  }
  return Buffer.concat([head, body]);
}

// ------------------------------------------------------------------------------ hash_fn's
function sha256(data) {
  return createHash("sha256").update(data).digest();
}

export const HASH_FUNCTIONS = {
  sha256: (obj) => sha256(pickle(obj)),
  sha256_cbor: (obj) => sha256(cbor(obj)),
  xxhash: (obj) => xxh3_128(pickle(obj)),
  xxhash_cbor: (obj) => xxh3_128(cbor(obj)),
};

// NONE_HASH (docs/semantics.md#none-hash), vLLM 0.29+: hash_fn(PYTHONHASHSEED) when the seed
// is set (any string, "" included); unset: hash_fn("vllm-none-hash") for the sha256 pair, and
// hash_fn of a random hex string for the xxhash pair (random per process).
export function noneHash(algo, seed) {
  const fn = HASH_FUNCTIONS[algo];
  if (seed !== null && seed !== undefined) return fn(String(seed));
  if (algo === "xxhash" || algo === "xxhash_cbor") return fn(randomBytes(32).toString("hex"));
  return fn("vllm-none-hash");
}

// ------------------------------------------------------------------------- request hashes
// Extra keys of the block [start, end) (vllm-0.33, tagged): LoRA, then every multimodal item
// overlapping the block (half-open ranges, scanned from the first item for every block), then
// the cache salt on the block starting at token 0. null when there are none.
export function extraKeys(view, start, end) {
  const keys = [];
  if (view.lora) keys.push(["lora", view.lora[0], view.lora[2]]);
  for (const [identifier, offset, length] of view.mm_features || []) {
    if (offset < end && offset + length > start) keys.push(["mm", identifier, offset - start]);
  }
  if (start === 0 && view.cache_salt) keys.push(["cache_salt", view.cache_salt]);
  return keys.length ? keys : null;
}

// The same keys as KV events publish them (untagged): the LoRA name, [identifier, offset] per
// item, the bare salt.
export function eventExtraKeys(view, start, end) {
  const keys = [];
  if (view.lora) keys.push(view.lora[0]);
  for (const [identifier, offset, length] of view.mm_features || []) {
    if (offset < end && offset + length > start) keys.push([identifier, offset - start]);
  }
  if (start === 0 && view.cache_salt) keys.push(view.cache_salt);
  return keys.length ? keys : null;
}

export class BlockHasher {
  constructor(algo, seed, blockSize) {
    if (!(algo in HASH_FUNCTIONS)) throw new Error(`unknown hash algorithm ${algo}`);
    this.fn = HASH_FUNCTIONS[algo];
    this.blockSize = blockSize;
    this.root = noneHash(algo, seed);
  }

  // Hash of block `index` of `tokens` after `parent` (falsy parent: NONE_HASH).
  hashBlock(parent, view, tokens, index) {
    const bs = this.blockSize;
    const start = index * bs;
    const blockTokens = tokens.slice(start, start + bs);
    return this.fn([parent && parent.length ? parent : this.root, blockTokens,
      extraKeys(view, start, start + bs)]);
  }
}
