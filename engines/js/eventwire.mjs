// KV events as the payload vLLM 0.33's ZmqEventPublisher sends (capability event_wire,
// docs/events.md): msgspec's msgpack of KVEventBatch = [ts, events, data_parallel_rank], each
// event a tagged map, fields in the struct's order, optional fields left out when None.
// Hashes go in the bytes form (msgpack bin, the raw digest).

class Packer {
  constructor() {
    this.parts = [];
  }
  raw(bytes) {
    this.parts.push(Buffer.from(bytes));
  }
  nil() {
    this.raw([0xc0]);
  }
  int(v) {
    if (!Number.isInteger(v)) throw new TypeError(`not an int: ${v}`);
    const b = [];
    if (v >= 0) {
      if (v < 0x80) b.push(v);
      else if (v < 0x100) b.push(0xcc, v);
      else if (v < 0x10000) b.push(0xcd, v >> 8, v & 0xff);
      else if (v < 0x100000000) { const x = Buffer.alloc(5); x[0] = 0xce; x.writeUInt32BE(v, 1); this.parts.push(x); return; }
      else { const x = Buffer.alloc(9); x[0] = 0xcf; x.writeBigUInt64BE(BigInt(v), 1); this.parts.push(x); return; }
    } else {
      if (v >= -32) b.push(v & 0xff);
      else if (v >= -0x80) b.push(0xd0, v & 0xff);
      else if (v >= -0x8000) { const x = Buffer.alloc(3); x[0] = 0xd1; x.writeInt16BE(v, 1); this.parts.push(x); return; }
      else if (v >= -0x80000000) { const x = Buffer.alloc(5); x[0] = 0xd2; x.writeInt32BE(v, 1); this.parts.push(x); return; }
      else { const x = Buffer.alloc(9); x[0] = 0xd3; x.writeBigInt64BE(BigInt(v), 1); this.parts.push(x); return; }
    }
    this.raw(b);
  }
  float64(v) {
    const x = Buffer.alloc(9);
    x[0] = 0xcb;
    x.writeDoubleBE(v, 1);
    this.parts.push(x);
  }
  str(s) {
    const data = Buffer.from(s, "utf8");
    const n = data.length;
    if (n < 32) this.raw([0xa0 | n]);
    else if (n < 0x100) this.raw([0xd9, n]);
    else if (n < 0x10000) this.raw([0xda, n >> 8, n & 0xff]);
    else { const x = Buffer.alloc(5); x[0] = 0xdb; x.writeUInt32BE(n, 1); this.parts.push(x); }
    this.parts.push(data);
  }
  bin(data) {
    const n = data.length;
    if (n < 0x100) this.raw([0xc4, n]);
    else if (n < 0x10000) this.raw([0xc5, n >> 8, n & 0xff]);
    else { const x = Buffer.alloc(5); x[0] = 0xc6; x.writeUInt32BE(n, 1); this.parts.push(x); }
    this.parts.push(Buffer.from(data));
  }
  header(n, fix, h16, h32) {
    if (n < 16) this.raw([fix | n]);
    else if (n < 0x10000) this.raw([h16, n >> 8, n & 0xff]);
    else { const x = Buffer.alloc(5); x[0] = h32; x.writeUInt32BE(n, 1); this.parts.push(x); }
  }
  array(n) {
    this.header(n, 0x90, 0xdc, 0xdd);
  }
  map(n) {
    this.header(n, 0x80, 0xde, 0xdf);
  }
  // msgspec picks a struct's map header by the most entries the struct can have (its tag and
  // every field), then writes the count actually encoded into it.
  structMap(n, most) {
    if (most < 16) this.raw([0x80 | n]);
    else if (most < 0x10000) this.raw([0xde, n >> 8, n & 0xff]);
    else { const x = Buffer.alloc(5); x[0] = 0xdf; x.writeUInt32BE(n, 1); this.parts.push(x); }
  }
  // A plain value: null, int, str, arrays of those (extra keys, token ids).
  value(v) {
    if (v === null || v === undefined) this.nil();
    else if (typeof v === "number") this.int(v);
    else if (typeof v === "string") this.str(v);
    else if (Array.isArray(v)) { this.array(v.length); for (const x of v) this.value(x); }
    else throw new TypeError(`cannot msgpack ${typeof v}`);
  }
  result() {
    return Buffer.concat(this.parts);
  }
}

const hashBytes = (hex) => Buffer.from(hex, "hex");

// Most map entries of each event struct in 0.33: the tag plus every field, the optional ones
// kvcheck does not model included (locality, ownership, session_id, lookahead_token_ids).
const MOST_ENTRIES = { BlockStored: 1 + 7 + 8, BlockRemoved: 1 + 2 + 3, AllBlocksCleared: 1 };

// Fields of an event in struct order: [name, value, required]. Optional fields (not
// required) are left out when their value is None (msgspec's omit_defaults).
function eventFields(e) {
  switch (e.type) {
    case "BlockStored":
      return [
        ["block_hashes", e.block_hashes.map(hashBytes), true],
        ["parent_block_hash", e.parent_block_hash === null ? null : hashBytes(e.parent_block_hash), true],
        ["token_ids", e.token_ids, true],
        ["block_size", e.block_size, true],
        ["lora_id", e.lora_id, true],
        ["medium", e.medium, true],
        ["lora_name", e.lora_name, true],
        ["extra_keys", e.extra_keys ?? null, false],
        ["group_idx", e.group_idx ?? null, false],
        ["kv_cache_spec_kind", "full_attention", false],
        ["kv_cache_spec_sliding_window", null, false],
      ];
    case "BlockRemoved":
      return [
        ["block_hashes", e.block_hashes.map(hashBytes), true],
        ["medium", e.medium, true],
        ["group_idx", e.group_idx ?? null, false],
      ];
    case "AllBlocksCleared":
      return [];
    default:
      throw new Error(`unknown event type ${e.type}`);
  }
}

function packField(p, value) {
  if (Buffer.isBuffer(value)) p.bin(value);
  else if (Array.isArray(value) && value.length && Buffer.isBuffer(value[0])) {
    p.array(value.length);
    for (const h of value) p.bin(h);
  } else p.value(value);
}

export function encodeBatch(events, ts) {
  const p = new Packer();
  p.array(3);
  p.float64(Number(ts));
  p.array(events.length);
  for (const e of events) {
    const fields = eventFields(e).filter(([, value, required]) => required || value !== null);
    p.structMap(fields.length + 1, MOST_ENTRIES[e.type]);
    p.str("type");
    p.str(e.type);
    for (const [name, value] of fields) {
      p.str(name);
      packField(p, value);
    }
  }
  p.nil(); // data_parallel_rank: None, written although the struct omits defaults
  return p.result();
}
