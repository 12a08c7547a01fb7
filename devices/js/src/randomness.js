/**
 * Coins (docs/device.md, section 3): uniform integers and random bytes from the platform's
 * CSPRNG, the flip probability as an exact rational rounded once, and Bernoulli draws that
 * compare random bytes with the probability's binary expansion.
 *
 * @module
 */

/**
 * Where a randomizer's coins come from. `cryptoCoins` in use; tests replay recorded draws.
 *
 * @typedef {object} Coins
 * @property {(n: number) => number} uniform a uniform integer in [0, n)
 * @property {(count: number) => Uint8Array} bytes `count` random bytes, one request
 */

const MAX_REQUEST = 65536; // crypto.getRandomValues fills at most this many bytes a call

/**
 * The platform's Web Crypto: `globalThis.crypto` in browsers and Node.js >= 19; Node.js 18
 * (Debian 12's) has it only as `node:crypto`'s `webcrypto`.
 *
 * @type {Crypto}
 */
export const webcrypto =
  globalThis.crypto ?? /** @type {Crypto} */ ((await import("node:crypto")).webcrypto);

/**
 * `count` bytes from the platform's CSPRNG (`crypto.getRandomValues`).
 *
 * @param {number} count
 * @returns {Uint8Array}
 */
function cryptoBytes(count) {
  const out = new Uint8Array(count);
  for (let offset = 0; offset < count; offset += MAX_REQUEST) {
    webcrypto.getRandomValues(out.subarray(offset, Math.min(count, offset + MAX_REQUEST)));
  }
  return out;
}

/**
 * A uniform integer in [0, n) by rejection sampling: the low b bits of ceil(b/8) random bytes
 * (b the bit length of n - 1), drawn again while they are n or more.
 *
 * @param {number} n an integer in [1, 2^32]
 * @param {(count: number) => Uint8Array} bytes the byte source
 * @returns {number}
 */
export function uniformFromBytes(n, bytes) {
  if (!Number.isInteger(n) || n < 1 || n > 2 ** 32) throw new RangeError(`bad bound ${n}`);
  if (n === 1) return 0;
  const bits = (n - 1).toString(2).length;
  const count = Math.ceil(bits / 8);
  const mask = 2 ** bits;
  for (;;) {
    const raw = bytes(count);
    let x = 0;
    for (const byte of raw) x = x * 256 + byte;
    x %= mask;
    if (x < n) return x;
  }
}

/** @type {Coins} The platform's CSPRNG. */
export const cryptoCoins = Object.freeze({
  uniform: (n) => uniformFromBytes(n, cryptoBytes),
  bytes: cryptoBytes,
});

const view = new DataView(new ArrayBuffer(8));

/**
 * A finite double as mantissa * 2^exponent, the mantissa a BigInt (53 bits when normal).
 *
 * @param {number} x
 * @returns {[bigint, number]}
 */
function decompose(x) {
  view.setFloat64(0, x);
  const hi = view.getUint32(0);
  const lo = view.getUint32(4);
  const biased = (hi >>> 20) & 0x7ff;
  let mantissa = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  if (biased === 0) return [mantissa, -1074];
  mantissa |= 1n << 52n;
  return [mantissa, biased - 1075];
}

/**
 * 2^e as a double, exactly, for e in [-1022, 1023].
 *
 * @param {number} e
 * @returns {number}
 */
function pow2(e) {
  view.setUint32(0, (e + 1023) << 20);
  view.setUint32(4, 0);
  return view.getFloat64(0);
}

/**
 * @param {bigint} n a positive integer
 * @returns {number} its bit length
 */
function bitLength(n) {
  return n.toString(2).length;
}

/**
 * The double nearest a / b (ties to even), for integers 0 < a < b whose ratio is a normal double.
 *
 * @param {bigint} a
 * @param {bigint} b
 * @returns {number}
 */
function nearestDouble(a, b) {
  const shift = bitLength(b) - bitLength(a) + 55; // a * 2^shift / b lies in (2^54, 2^56)
  const scaled = a << BigInt(shift);
  const quotient = scaled / b;
  const sticky = scaled % b === 0n ? 0n : 1n;
  // Number(BigInt) rounds to nearest, ties to even; the sticky bit keeps a remainder from
  // looking like a tie. Scaling by powers of two is then exact.
  const q = Number((quotient << 1n) | sticky);
  let e = shift + 1;
  let out = q;
  while (e > 0) {
    const step = Math.min(e, 1000);
    out *= pow2(-step);
    e -= step;
  }
  return out;
}

/** The largest x a device accepts: beyond it 1 / (1 + e^x) leaves the normal doubles. */
export const MAX_X = 700;

const TAIL = 1n << 100n;

/**
 * p = 1 / (1 + e^x) as the double nearest 1 / (1 + S), S the exponential series of x (an exact
 * rational) up to the first term K >= 2x that is below 2^-100 (docs/device.md, section 3.2).
 *
 * @param {number} x a double in (0, 700]
 * @returns {number}
 */
export function flipProbability(x) {
  if (typeof x !== "number" || !(x > 0 && x <= MAX_X)) {
    throw new RangeError(`epsilon must be a number in (0, ${MAX_X}], got ${x}`);
  }
  let [num, exponent] = decompose(x);
  let den = 1n;
  if (exponent >= 0) num <<= BigInt(exponent);
  else den <<= BigInt(-exponent);
  let power = 1n; // num^i
  let total = 1n; // S_i = total / scale, scale = den^i * i!
  let scale = 1n;
  for (let i = 1n; ; i++) {
    power *= num;
    total = total * den * i + power;
    scale *= den * i;
    if (i * den >= 2n * num && power * TAIL < scale) break;
  }
  return nearestDouble(scale, scale + total);
}

/**
 * @typedef {object} Threshold
 * @property {number} p the probability
 * @property {number} exponent e with 2^(e-1) <= p < 2^e
 * @property {number} size B, the bytes per draw
 * @property {Uint8Array} bytes T = floor(p * 2^(8B)), big-endian, B bytes
 */

/**
 * The threshold of Bernoulli(p) draws (docs/device.md, section 3.3).
 *
 * @param {number} p a normal double in (0, 1)
 * @returns {Threshold}
 */
export function threshold(p) {
  if (!(p > 0 && p < 1)) throw new RangeError(`p must be in (0, 1), got ${p}`);
  const [mantissa, e2] = decompose(p);
  const exponent = bitLength(mantissa) + e2;
  const size = Math.max(7, Math.ceil((55 - exponent) / 8));
  const shift = e2 + 8 * size; // >= 2: T = mantissa * 2^shift exactly
  let t = mantissa << BigInt(shift);
  const bytes = new Uint8Array(size);
  for (let i = size - 1; i >= 0; i--) {
    bytes[i] = Number(t & 0xffn);
    t >>= 8n;
  }
  return { p, exponent, size, bytes };
}

/**
 * `count` Bernoulli draws (1 with probability T / 2^(8B)) from one request of count * B bytes:
 * draw i is 1 when bytes [iB, (i+1)B) are below T, read big-endian.
 *
 * @param {Threshold} thr
 * @param {number} count
 * @param {Coins} coins
 * @returns {Uint8Array} 0 or 1 per draw
 */
export function bernoulli(thr, count, coins) {
  const size = thr.size;
  const raw = coins.bytes(count * size);
  if (raw.length !== count * size) throw new RangeError("the coins returned too few bytes");
  const out = new Uint8Array(count);
  for (let i = 0; i < count; i++) {
    const base = i * size;
    for (let b = 0; b < size; b++) {
      const u = raw[base + b];
      const t = thr.bytes[b];
      if (u !== t) {
        out[i] = u < t ? 1 : 0;
        break;
      }
    }
  }
  return out;
}
