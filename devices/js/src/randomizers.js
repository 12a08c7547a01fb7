/**
 * The device randomizers (docs/device.md, section 4): Count Mean Sketch, Hadamard Count Mean
 * Sketch and Sequence Fragment Puzzle, built from the server's published description.
 *
 * @module
 */

import { canonicalText, familyId } from "./family.js";
import { ALGORITHM, HashFamily, itemBytes } from "./hashing.js";
import { MAX_X, bernoulli, cryptoCoins, flipProbability, threshold } from "./randomness.js";

/** @typedef {import("./randomness.js").Coins} Coins */
/** @typedef {import("./family.js").Published} Published */

/** @typedef {{j: number, bits: string}} CmsRow */
/** @typedef {CmsRow & {family: string}} CmsReport */
/** @typedef {{j: number, l: number, bit: -1 | 1, family: string}} HcmsReport */
/** @typedef {{word: CmsRow, fragment: CmsRow, position: number, family: string}} SfpReport */

const BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/**
 * Standard base64 with padding (RFC 4648, section 4).
 *
 * @param {Uint8Array} bytes
 * @returns {string}
 */
export function base64(bytes) {
  let out = "";
  for (let i = 0; i < bytes.length; i += 3) {
    const n = (bytes[i] << 16) | ((bytes[i + 1] ?? 0) << 8) | (bytes[i + 2] ?? 0);
    out += BASE64[(n >> 18) & 63] + BASE64[(n >> 12) & 63];
    out += i + 1 < bytes.length ? BASE64[(n >> 6) & 63] : "=";
    out += i + 2 < bytes.length ? BASE64[n & 63] : "=";
  }
  return out;
}

/** The words of SFP have this many code points after normalization. */
export const WORD_LENGTH = 10;
/** SFP's fragment starts (0-based). */
export const POSITIONS = Object.freeze([0, 2, 4, 6, 8]);

/**
 * The first 10 code points of `word`, padded with spaces to 10.
 *
 * @param {string} word
 * @returns {string}
 */
export function normalizeWord(word) {
  if (typeof word !== "string") throw new TypeError("an SFP word is a string");
  const points = Array.from(word).slice(0, WORD_LENGTH);
  while (points.length < WORD_LENGTH) points.push(" ");
  return points.join("");
}

/** Count Mean Sketch: `m` bits, each flipped with probability 1 / (1 + e^(epsilon/2)). */
export class Cms {
  /**
   * @param {{epsilon: number, k: number, m: number, family: HashFamily, familyId?: string}} params
   */
  constructor({ epsilon, k, m, family, familyId = "" }) {
    checkEpsilon("epsilon", epsilon);
    checkInt("k", k, 1, 2 ** 20);
    checkInt("m", m, 2, 2 ** 16);
    this.epsilon = epsilon;
    this.k = k;
    this.m = m;
    this.family = family;
    this.familyId = familyId;
    /** The Bernoulli threshold of one coordinate's flip. */
    this.flip = threshold(flipProbability(epsilon / 2));
  }

  /**
   * The report row of one item: {j, bits}.
   *
   * @param {string | Uint8Array} item
   * @param {Coins} coins
   * @returns {CmsRow}
   */
  row(item, coins) {
    const fp = this.family.fingerprint(itemBytes(item));
    const j = coins.uniform(this.k);
    const h = HashFamily.row(fp, j, this.m);
    const flips = bernoulli(this.flip, this.m, coins);
    const packed = new Uint8Array(Math.ceil(this.m / 8));
    for (let i = 0; i < this.m; i++) {
      if ((i === h ? 1 : 0) ^ flips[i]) packed[i >> 3] |= 0x80 >> (i & 7);
    }
    return { j, bits: base64(packed) };
  }

  /**
   * Privatize one value (a string, hashed as UTF-8, or bytes).
   *
   * @param {string | Uint8Array} value
   * @param {Coins} [coins] the platform's CSPRNG unless a test replays recorded coins
   * @returns {CmsReport}
   */
  privatize(value, coins = cryptoCoins) {
    return { ...this.row(value, coins), family: this.familyId };
  }
}

/** Hadamard Count Mean Sketch: one Hadamard coefficient, flipped with probability 1 / (1 + e^epsilon). */
export class Hcms {
  /**
   * @param {{epsilon: number, k: number, m: number, family: HashFamily, familyId?: string}} params
   */
  constructor({ epsilon, k, m, family, familyId = "" }) {
    checkEpsilon("epsilon", epsilon);
    checkInt("k", k, 1, 2 ** 20);
    checkInt("m", m, 2, 2 ** 24);
    if ((m & (m - 1)) !== 0) throw new RangeError(`\`m\` must be a power of 2, got ${m}`);
    this.epsilon = epsilon;
    this.k = k;
    this.m = m;
    this.family = family;
    this.familyId = familyId;
    this.flip = threshold(flipProbability(epsilon));
  }

  /**
   * @param {string | Uint8Array} value
   * @param {Coins} [coins]
   * @returns {HcmsReport}
   */
  privatize(value, coins = cryptoCoins) {
    const fp = this.family.fingerprint(itemBytes(value));
    const j = coins.uniform(this.k);
    const h = HashFamily.row(fp, j, this.m);
    const l = coins.uniform(this.m);
    const flip = bernoulli(this.flip, 1, coins)[0];
    const parity = (popcount(l & h) + flip) & 1;
    return { j, l, bit: parity ? -1 : 1, family: this.familyId };
  }
}

/** Sequence Fragment Puzzle: a word's CMS report, a fragment's, and the fragment's position. */
export class Sfp {
  /**
   * @param {{epsilonWord: number, epsilonFragment: number, k: number, m: number,
   *   kFragment: number, mFragment: number, family: HashFamily, alphabet: string,
   *   familyId?: string}} params
   */
  constructor({ epsilonWord, epsilonFragment, k, m, kFragment, mFragment, family, alphabet, familyId = "" }) {
    this.word = new Cms({ epsilon: epsilonWord, k, m, family: family.derive("sfp/word") });
    this.fragment = new Cms({
      epsilon: epsilonFragment,
      k: kFragment,
      m: mFragment,
      family: family.derive("sfp/fragment"),
    });
    this.puzzleFamily = family.derive("sfp/puzzle");
    this.family = family;
    this.alphabet = alphabet;
    this.familyId = familyId;
  }

  /**
   * The puzzle piece of a normalized word: row 0 of the puzzle family with 256 buckets.
   *
   * @param {string} normalized
   * @returns {number}
   */
  puzzle(normalized) {
    return HashFamily.row(this.puzzleFamily.fingerprint(normalized), 0, 256);
  }

  /**
   * The fragment item: the puzzle byte, then the UTF-8 of code points [position, position + 2).
   *
   * @param {string} normalized
   * @param {number} position
   * @returns {Uint8Array}
   */
  fragmentOf(normalized, position) {
    const pair = Array.from(normalized).slice(position, position + 2).join("");
    const tail = itemBytes(pair);
    const out = new Uint8Array(1 + tail.length);
    out[0] = this.puzzle(normalized);
    out.set(tail, 1);
    return out;
  }

  /**
   * @param {string} word
   * @param {Coins} [coins]
   * @returns {SfpReport}
   */
  privatize(word, coins = cryptoCoins) {
    const normalized = normalizeWord(word);
    itemBytes(normalized); // refuse a lone surrogate before drawing any coin
    const position = POSITIONS[coins.uniform(POSITIONS.length)];
    const fragment = this.fragmentOf(normalized, position);
    const wordRow = this.word.row(normalized, coins);
    const fragmentRow = this.fragment.row(fragment, coins);
    return { word: wordRow, fragment: fragmentRow, position, family: this.familyId };
  }
}

/**
 * @param {number} x
 * @returns {number}
 */
function popcount(x) {
  let n = 0;
  for (let v = x >>> 0; v; v &= v - 1) n++;
  return n;
}

/**
 * @param {string} name
 * @param {unknown} value
 */
function checkEpsilon(name, value) {
  if (typeof value !== "number" || !(value > 0 && value <= MAX_X)) {
    throw new RangeError(`\`${name}\` must be a number in (0, ${MAX_X}], got ${value}`);
  }
}

/**
 * @param {string} name
 * @param {unknown} value
 * @param {number} low
 * @param {number} high
 */
function checkInt(name, value, low, high) {
  if (!Number.isInteger(value) || /** @type {number} */ (value) < low || /** @type {number} */ (value) > high) {
    throw new RangeError(`\`${name}\` must be an integer in [${low}, ${high}], got ${value}`);
  }
}

/**
 * The randomizer a published description prescribes: the `randomizer` object of
 * `GET /v1/use-cases/{name}`, or the whole policy holding it. Checks every field and that the
 * family identifier computed from them is the published one.
 *
 * @param {Published | {randomizer: Published}} published
 * @returns {Promise<Cms | Hcms | Sfp>}
 */
export async function fromPublished(published) {
  const r = "randomizer" in published ? published.randomizer : published;
  if (r === null || typeof r !== "object") throw new TypeError("`randomizer` must be an object");
  const hf = r.hash_family;
  if (hf === null || typeof hf !== "object") throw new TypeError("`hash_family` is missing");
  if (hf.algorithm !== ALGORITHM) {
    throw new TypeError(`\`hash_family.algorithm\` must be ${ALGORITHM}, got ${JSON.stringify(hf.algorithm)}`);
  }
  const family = HashFamily.fromSeed(hf.seed);
  const id = await familyId(r);
  if (typeof r.family_id !== "string" || r.family_id !== id) {
    throw new TypeError(
      `\`family_id\` is ${JSON.stringify(r.family_id)} but the fields give ${id} (${canonicalText(r)})`,
    );
  }
  switch (r.mechanism) {
    case "cms":
      return new Cms({ epsilon: num(r.epsilon), k: r.k, m: r.m, family, familyId: id });
    case "hcms":
      return new Hcms({ epsilon: num(r.epsilon), k: r.k, m: r.m, family, familyId: id });
    case "sfp":
      checkInt("m", r.m, 2, 2 ** 16);
      checkInt("m_fragment", r.m_fragment, 2, 2 ** 16);
      if (typeof r.alphabet !== "string") throw new TypeError("`alphabet` must be a string");
      return new Sfp({
        epsilonWord: num(r.epsilon_word),
        epsilonFragment: num(r.epsilon_fragment),
        k: r.k,
        m: r.m,
        kFragment: num(r.k_fragment),
        mFragment: num(r.m_fragment),
        family,
        alphabet: r.alphabet,
        familyId: id,
      });
    default:
      throw new TypeError(`\`mechanism\` must be cms, hcms or sfp, got ${JSON.stringify(r.mechanism)}`);
  }
}

/**
 * @param {number | null | undefined} value
 * @returns {number}
 */
function num(value) {
  return /** @type {number} */ (value);
}
