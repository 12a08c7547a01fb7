/**
 * BLAKE2b (RFC 7693) with a key, a salt and a personalization (the parameter block of
 * Aumasson et al., "BLAKE2: simpler, smaller, fast as MD5", 2013, section 2.8).
 *
 * 64-bit words are BigInts: slower than 32-bit halves, but short and easy to check against the
 * RFC; a device hashes a few short items per report. Sequential mode only (fanout 1, depth 1).
 *
 * @module
 */

const MASK64 = (1n << 64n) - 1n;

/** The initialization vector: SHA-512's (RFC 7693, section 2.6). */
const IV = [
  0x6a09e667f3bcc908n, 0xbb67ae8584caa73bn, 0x3c6ef372fe94f82bn, 0xa54ff53a5f1d36f1n,
  0x510e527fade682d1n, 0x9b05688c2b3e6c1fn, 0x1f83d9abfb41bd6bn, 0x5be0cd19137e2179n,
];

/** The message schedule (RFC 7693, section 2.7); round r uses row r mod 10. */
const SIGMA = [
  [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
  [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
  [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
  [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
  [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
  [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
  [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
  [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
  [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
  [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
];

const BLOCK = 128;

/**
 * @param {bigint} x
 * @param {bigint} n
 * @returns {bigint}
 */
function rotr(x, n) {
  return ((x >> n) | (x << (64n - n))) & MASK64;
}

/**
 * The mixing function G (RFC 7693, section 3.1), in place on the work vector.
 *
 * @param {bigint[]} v
 * @param {number} a
 * @param {number} b
 * @param {number} c
 * @param {number} d
 * @param {bigint} x
 * @param {bigint} y
 */
function mix(v, a, b, c, d, x, y) {
  v[a] = (v[a] + v[b] + x) & MASK64;
  v[d] = rotr(v[d] ^ v[a], 32n);
  v[c] = (v[c] + v[d]) & MASK64;
  v[b] = rotr(v[b] ^ v[c], 24n);
  v[a] = (v[a] + v[b] + y) & MASK64;
  v[d] = rotr(v[d] ^ v[a], 16n);
  v[c] = (v[c] + v[d]) & MASK64;
  v[b] = rotr(v[b] ^ v[c], 63n);
}

/**
 * The little-endian 64-bit word at `offset` of `bytes` (zero beyond its end).
 *
 * @param {Uint8Array} bytes
 * @param {number} offset
 * @returns {bigint}
 */
function le64(bytes, offset) {
  let w = 0n;
  for (let i = 7; i >= 0; i--) {
    w = (w << 8n) | BigInt(bytes[offset + i] ?? 0);
  }
  return w;
}

/**
 * The compression function F (RFC 7693, section 3.2), in place on the state `h`.
 *
 * @param {bigint[]} h
 * @param {Uint8Array} block 128 bytes
 * @param {bigint} counter bytes hashed so far, this block included
 * @param {boolean} last
 */
function compress(h, block, counter, last) {
  const v = [...h, ...IV];
  v[12] ^= counter & MASK64;
  v[13] ^= counter >> 64n;
  if (last) v[14] ^= MASK64;
  const m = [];
  for (let i = 0; i < 16; i++) m.push(le64(block, 8 * i));
  for (let r = 0; r < 12; r++) {
    const s = SIGMA[r % 10];
    mix(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
    mix(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
    mix(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
    mix(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
    mix(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
    mix(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
    mix(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
    mix(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (let i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/**
 * @typedef {object} Blake2bOptions
 * @property {Uint8Array} [key] 0 to 64 bytes (default: none, unkeyed)
 * @property {Uint8Array} [salt] at most 16 bytes, zero-padded to 16
 * @property {Uint8Array} [personalization] at most 16 bytes, zero-padded to 16
 * @property {number} [outLength] the digest length in bytes, 1 to 64 (default 64)
 */

/**
 * The BLAKE2b digest of `message`.
 *
 * @param {Uint8Array} message
 * @param {Blake2bOptions} [options]
 * @returns {Uint8Array} `outLength` bytes
 */
export function blake2b(message, options = {}) {
  const key = options.key ?? new Uint8Array(0);
  const salt = options.salt ?? new Uint8Array(0);
  const person = options.personalization ?? new Uint8Array(0);
  const outLength = options.outLength ?? 64;
  if (!Number.isInteger(outLength) || outLength < 1 || outLength > 64) {
    throw new RangeError(`outLength must be 1 to 64, got ${outLength}`);
  }
  if (key.length > 64) throw new RangeError(`a key has at most 64 bytes, got ${key.length}`);
  if (salt.length > 16) throw new RangeError(`a salt has at most 16 bytes, got ${salt.length}`);
  if (person.length > 16) {
    throw new RangeError(`a personalization has at most 16 bytes, got ${person.length}`);
  }
  const h = IV.slice();
  h[0] ^= 0x01010000n ^ (BigInt(key.length) << 8n) ^ BigInt(outLength);
  h[4] ^= le64(salt, 0);
  h[5] ^= le64(salt, 8);
  h[6] ^= le64(person, 0);
  h[7] ^= le64(person, 8);

  let data = message;
  if (key.length > 0) {
    data = new Uint8Array(BLOCK + message.length);
    data.set(key, 0);
    data.set(message, BLOCK);
  }
  if (data.length === 0) {
    compress(h, new Uint8Array(BLOCK), 0n, true);
  }
  for (let offset = 0; offset < data.length; offset += BLOCK) {
    const end = Math.min(offset + BLOCK, data.length);
    const block = new Uint8Array(BLOCK);
    block.set(data.subarray(offset, end));
    compress(h, block, BigInt(end), end === data.length);
  }

  const out = new Uint8Array(outLength);
  for (let i = 0; i < outLength; i++) {
    out[i] = Number((h[i >> 3] >> BigInt(8 * (i & 7))) & 0xffn);
  }
  return out;
}
