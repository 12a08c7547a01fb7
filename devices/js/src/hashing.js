/**
 * The hash family `blake2b-poly31-v1` (docs/device.md, section 2).
 *
 * @module
 */

import { blake2b } from "./blake2b.js";

/** The only algorithm this implementation knows. */
export const ALGORITHM = "blake2b-poly31-v1";

/** The Mersenne prime 2^31 - 1 of the fingerprints and rows. */
export const P = 2147483647n;

const encoder = new TextEncoder();
const FINGERPRINT_PERSON = encoder.encode("dpgov.fp.v1");
const DERIVE_PERSON = encoder.encode("dpgov.derive.v1");

/**
 * @typedef {object} Fingerprint
 * @property {bigint} a
 * @property {bigint} b
 * @property {bigint} c
 */

/**
 * The bytes of a hex string of even length (lowercase or uppercase digits).
 *
 * @param {string} hex
 * @returns {Uint8Array}
 */
export function fromHex(hex) {
  if (!/^(?:[0-9a-fA-F]{2})*$/.test(hex)) throw new TypeError(`not hex bytes: ${hex}`);
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/**
 * The lowercase hex of `bytes`.
 *
 * @param {Uint8Array} bytes
 * @returns {string}
 */
export function toHex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * An item's bytes: a string's UTF-8 (no normalization), or the bytes themselves.
 *
 * @param {string | Uint8Array} value
 * @returns {Uint8Array}
 */
export function itemBytes(value) {
  if (value instanceof Uint8Array) return value;
  if (typeof value !== "string") throw new TypeError(`an item is a string or bytes, got ${typeof value}`);
  if (!isWellFormed(value)) throw new TypeError("an item must be valid Unicode (a lone surrogate)");
  return encoder.encode(value);
}

/**
 * Whether `s` has no lone surrogate (UTF-8 would have to replace it).
 *
 * @param {string} s
 * @returns {boolean}
 */
function isWellFormed(s) {
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?:^|[^\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

/**
 * @param {Uint8Array} bytes
 * @param {number} offset
 * @returns {bigint}
 */
function le64(bytes, offset) {
  let w = 0n;
  for (let i = 7; i >= 0; i--) w = (w << 8n) | BigInt(bytes[offset + i]);
  return w;
}

/** A keyed family of hash functions h_j: items -> [m]. */
export class HashFamily {
  /**
   * @param {Uint8Array} key the 32-byte key
   */
  constructor(key) {
    if (!(key instanceof Uint8Array) || key.length !== 32) {
      throw new TypeError("a hash family's key is 32 bytes");
    }
    /** @readonly */
    this.key = key;
  }

  /**
   * The family of a published seed: exactly 64 lowercase hex digits, the key's 32 bytes.
   *
   * @param {string} seed
   * @returns {HashFamily}
   */
  static fromSeed(seed) {
    if (typeof seed !== "string" || !/^[0-9a-f]{64}$/.test(seed)) {
      throw new TypeError(`a seed is exactly 64 lowercase hex digits, got ${JSON.stringify(seed)}`);
    }
    return new HashFamily(fromHex(seed));
  }

  /** The seed as published: 64 lowercase hex digits. */
  get seed() {
    return toHex(this.key);
  }

  /**
   * The independent family for a named use (SFP: `sfp/word`, `sfp/fragment`, `sfp/puzzle`).
   *
   * @param {string} label
   * @returns {HashFamily}
   */
  derive(label) {
    const key = blake2b(encoder.encode(label), {
      key: this.key,
      personalization: DERIVE_PERSON,
      outLength: 32,
    });
    return new HashFamily(key);
  }

  /**
   * The 24-byte keyed digest of an item.
   *
   * @param {string | Uint8Array} item
   * @returns {Uint8Array}
   */
  digest(item) {
    return blake2b(itemBytes(item), {
      key: this.key,
      personalization: FINGERPRINT_PERSON,
      outLength: 24,
    });
  }

  /**
   * The item's fingerprint (a, b, c): the digest's three little-endian words, each mod p.
   *
   * @param {string | Uint8Array} item
   * @returns {Fingerprint}
   */
  fingerprint(item) {
    const d = this.digest(item);
    return { a: le64(d, 0) % P, b: le64(d, 8) % P, c: le64(d, 16) % P };
  }

  /**
   * Row j of the family: ((a + b j + c j^2) mod p) mod m, in exact integers.
   *
   * @param {Fingerprint} fp
   * @param {number} j
   * @param {number} m
   * @returns {number}
   */
  static row(fp, j, m) {
    const J = BigInt(j);
    return Number(((fp.a + fp.b * J + fp.c * J * J) % P) % BigInt(m));
  }

  /**
   * h_j(item) with m buckets.
   *
   * @param {string | Uint8Array} item
   * @param {number} j
   * @param {number} m
   * @returns {number}
   */
  hash(item, j, m) {
    return HashFamily.row(this.fingerprint(item), j, m);
  }
}
