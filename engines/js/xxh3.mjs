// XXH3-128 with seed 0 and the default secret (xxhash.h 0.8), as Python's
// xxhash.xxh3_128_digest returns it: the 16 canonical (big-endian) bytes, high half first.
// 64-bit arithmetic on BigInt: slow, but block tuples are a few hundred bytes at most.
const M64 = (1n << 64n) - 1n;
const M32 = (1n << 32n) - 1n;

const PRIME32_1 = 0x9E3779B1n;
const PRIME32_2 = 0x85EBCA77n;
const PRIME32_3 = 0xC2B2AE3Dn;
const PRIME64_1 = 0x9E3779B185EBCA87n;
const PRIME64_2 = 0xC2B2AE3D27D4EB4Fn;
const PRIME64_3 = 0x165667B19E3779F9n;
const PRIME64_4 = 0x85EBCA77C2B2AE63n;
const PRIME64_5 = 0x27D4EB2F165667C5n;
const PRIME_MX1 = 0x165667919E3779F9n;
const PRIME_MX2 = 0x9FB21C651E98DF25n;

const SECRET = Buffer.from(
  "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f" +
  "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c" +
  "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8" +
  "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364" +
  "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e" +
  "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e", "hex");
const SECRET_SIZE = SECRET.length; // 192
const STRIPE_LEN = 64;
const SECRET_CONSUME_RATE = 8;
const ACC_NB = 8;
const MIDSIZE_STARTOFFSET = 3;
const MIDSIZE_LASTOFFSET = 17;
const SECRET_SIZE_MIN = 136;
const SECRET_LASTACC_START = 7;
const SECRET_MERGEACCS_START = 11;

const r64 = (buf, off) => buf.readBigUInt64LE(off);
const r32 = (buf, off) => BigInt(buf.readUInt32LE(off));
const mul = (a, b) => (a * b) & M64;
const add = (a, b) => (a + b) & M64;
const sub = (a, b) => (a - b) & M64;

function swap32(x) {
  return ((x & 0xffn) << 24n) | ((x & 0xff00n) << 8n) | ((x >> 8n) & 0xff00n) | ((x >> 24n) & 0xffn);
}
function swap64(x) {
  let r = 0n;
  for (let i = 0; i < 8; i++) { r = (r << 8n) | (x & 0xffn); x >>= 8n; }
  return r;
}
function rotl32(x, r) {
  return ((x << BigInt(r)) | (x >> BigInt(32 - r))) & M32;
}
function mult128(a, b) {
  const p = a * b;
  return { lo: p & M64, hi: (p >> 64n) & M64 };
}
function mul128fold64(a, b) {
  const p = a * b;
  return (p & M64) ^ ((p >> 64n) & M64);
}
function xxh64Avalanche(h) {
  h ^= h >> 33n; h = mul(h, PRIME64_2);
  h ^= h >> 29n; h = mul(h, PRIME64_3);
  h ^= h >> 32n;
  return h;
}
function xxh3Avalanche(h) {
  h ^= h >> 37n; h = mul(h, PRIME_MX1);
  h ^= h >> 32n;
  return h;
}

function len1to3(input, len, seed) {
  const c1 = BigInt(input[0]);
  const c2 = BigInt(input[len >> 1]);
  const c3 = BigInt(input[len - 1]);
  const combinedl = ((c1 << 16n) | (c2 << 24n) | c3 | (BigInt(len) << 8n)) & M32;
  const combinedh = rotl32(swap32(combinedl), 13);
  const bitflipl = add(r32(SECRET, 0) ^ r32(SECRET, 4), seed);
  const bitfliph = sub(r32(SECRET, 8) ^ r32(SECRET, 12), seed);
  return { lo: xxh64Avalanche(combinedl ^ bitflipl), hi: xxh64Avalanche(combinedh ^ bitfliph) };
}

function len4to8(input, len, seed) {
  seed ^= swap32(seed & M32) << 32n;
  const inputLo = r32(input, 0);
  const inputHi = r32(input, len - 4);
  const input64 = add(inputLo, inputHi << 32n);
  const bitflip = add(r64(SECRET, 16) ^ r64(SECRET, 24), seed);
  const keyed = input64 ^ bitflip;
  const m = mult128(keyed, add(PRIME64_1, BigInt(len << 2)));
  m.hi = add(m.hi, (m.lo << 1n) & M64);
  m.lo ^= m.hi >> 3n;
  m.lo ^= m.lo >> 35n;
  m.lo = mul(m.lo, PRIME_MX2);
  m.lo ^= m.lo >> 28n;
  m.hi = xxh3Avalanche(m.hi);
  return m;
}

function len9to16(input, len, seed) {
  const bitflipl = sub(r64(SECRET, 32) ^ r64(SECRET, 40), seed);
  const bitfliph = add(r64(SECRET, 48) ^ r64(SECRET, 56), seed);
  const inputLo = r64(input, 0);
  let inputHi = r64(input, len - 8);
  const m = mult128(inputLo ^ inputHi ^ bitflipl, PRIME64_1);
  m.lo = add(m.lo, (BigInt(len - 1) << 54n) & M64);
  inputHi ^= bitfliph;
  m.hi = add(m.hi, add(inputHi, (inputHi & M32) * (PRIME32_2 - 1n)));
  m.lo ^= swap64(m.hi);
  const h = mult128(m.lo, PRIME64_2);
  h.hi = add(h.hi, mul(m.hi, PRIME64_2));
  return { lo: xxh3Avalanche(h.lo), hi: xxh3Avalanche(h.hi) };
}

function len0to16(input, len, seed) {
  if (len > 8) return len9to16(input, len, seed);
  if (len >= 4) return len4to8(input, len, seed);
  if (len) return len1to3(input, len, seed);
  return {
    lo: xxh64Avalanche(seed ^ r64(SECRET, 64) ^ r64(SECRET, 72)),
    hi: xxh64Avalanche(seed ^ r64(SECRET, 80) ^ r64(SECRET, 88)),
  };
}

function mix16B(input, off, secretOff, seed) {
  const lo = r64(input, off);
  const hi = r64(input, off + 8);
  return mul128fold64(lo ^ add(r64(SECRET, secretOff), seed), hi ^ sub(r64(SECRET, secretOff + 8), seed));
}

function mix32B(acc, input, off1, off2, secretOff, seed) {
  acc.lo = add(acc.lo, mix16B(input, off1, secretOff, seed));
  acc.lo ^= add(r64(input, off2), r64(input, off2 + 8));
  acc.hi = add(acc.hi, mix16B(input, off2, secretOff + 16, seed));
  acc.hi ^= add(r64(input, off1), r64(input, off1 + 8));
  return acc;
}

function finish(acc, len, seed) {
  const lo = add(acc.lo, acc.hi);
  const hi = add(add(mul(acc.lo, PRIME64_1), mul(acc.hi, PRIME64_4)), mul(sub(BigInt(len), seed), PRIME64_2));
  return { lo: xxh3Avalanche(lo), hi: sub(0n, xxh3Avalanche(hi)) };
}

function len17to128(input, len, seed) {
  const acc = { lo: mul(BigInt(len), PRIME64_1), hi: 0n };
  if (len > 32) {
    if (len > 64) {
      if (len > 96) mix32B(acc, input, 48, len - 64, 96, seed);
      mix32B(acc, input, 32, len - 48, 64, seed);
    }
    mix32B(acc, input, 16, len - 32, 32, seed);
  }
  mix32B(acc, input, 0, len - 16, 0, seed);
  return finish(acc, len, seed);
}

function len129to240(input, len, seed) {
  const acc = { lo: mul(BigInt(len), PRIME64_1), hi: 0n };
  for (let i = 32; i < 160; i += 32) mix32B(acc, input, i - 32, i - 16, i - 32, seed);
  acc.lo = xxh3Avalanche(acc.lo);
  acc.hi = xxh3Avalanche(acc.hi);
  for (let i = 160; i <= len; i += 32) {
    mix32B(acc, input, i - 32, i - 16, MIDSIZE_STARTOFFSET + i - 160, seed);
  }
  mix32B(acc, input, len - 16, len - 32, SECRET_SIZE_MIN - MIDSIZE_LASTOFFSET - 16, sub(0n, seed));
  return finish(acc, len, seed);
}

function accumulate512(acc, input, off, secretOff) {
  for (let i = 0; i < ACC_NB; i++) {
    const dataVal = r64(input, off + 8 * i);
    const dataKey = dataVal ^ r64(SECRET, secretOff + 8 * i);
    acc[i ^ 1] = add(acc[i ^ 1], dataVal);
    acc[i] = add(acc[i], (dataKey & M32) * (dataKey >> 32n));
  }
}

function scrambleAcc(acc, secretOff) {
  for (let i = 0; i < ACC_NB; i++) {
    let a = acc[i];
    a ^= a >> 47n;
    a ^= r64(SECRET, secretOff + 8 * i);
    acc[i] = mul(a, PRIME32_1);
  }
}

function mergeAccs(acc, secretOff, start) {
  let result = start;
  for (let i = 0; i < 4; i++) {
    result = add(result, mul128fold64(acc[2 * i] ^ r64(SECRET, secretOff + 16 * i),
      acc[2 * i + 1] ^ r64(SECRET, secretOff + 16 * i + 8)));
  }
  return xxh3Avalanche(result);
}

function hashLong(input, len) {
  const acc = [PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1];
  const stripesPerBlock = (SECRET_SIZE - STRIPE_LEN) / SECRET_CONSUME_RATE;
  const blockLen = STRIPE_LEN * stripesPerBlock;
  const nbBlocks = Math.floor((len - 1) / blockLen);
  for (let n = 0; n < nbBlocks; n++) {
    for (let s = 0; s < stripesPerBlock; s++) {
      accumulate512(acc, input, n * blockLen + s * STRIPE_LEN, s * SECRET_CONSUME_RATE);
    }
    scrambleAcc(acc, SECRET_SIZE - STRIPE_LEN);
  }
  const nbStripes = Math.floor(((len - 1) - blockLen * nbBlocks) / STRIPE_LEN);
  for (let s = 0; s < nbStripes; s++) {
    accumulate512(acc, input, nbBlocks * blockLen + s * STRIPE_LEN, s * SECRET_CONSUME_RATE);
  }
  accumulate512(acc, input, len - STRIPE_LEN, SECRET_SIZE - STRIPE_LEN - SECRET_LASTACC_START);
  return {
    lo: mergeAccs(acc, SECRET_MERGEACCS_START, mul(BigInt(len), PRIME64_1)),
    hi: mergeAccs(acc, SECRET_SIZE - 64 - SECRET_MERGEACCS_START, (~mul(BigInt(len), PRIME64_2)) & M64),
  };
}

export function xxh3_128(data) {
  const input = Buffer.isBuffer(data) ? data : Buffer.from(data);
  const len = input.length;
  const seed = 0n;
  let h;
  if (len <= 16) h = len0to16(input, len, seed);
  else if (len <= 128) h = len17to128(input, len, seed);
  else if (len <= 240) h = len129to240(input, len, seed);
  else h = hashLong(input, len);
  const out = Buffer.alloc(16);
  out.writeBigUInt64BE(h.hi, 0);
  out.writeBigUInt64BE(h.lo, 8);
  return out;
}
