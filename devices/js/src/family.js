/**
 * The family identifier (docs/device.md, section 6): `f1-` and 16 hex digits of SHA-256 over a
 * canonical JSON text of the mechanism, its parameters and its hash family.
 *
 * @module
 */

import { webcrypto } from "./randomness.js";

/**
 * A double as Python's `repr` writes it: the shortest round-trip digits, positional for
 * decimal exponents in [-4, 16) with at least one digit after the point, else `d.ddde-XX`.
 *
 * @param {number} x a finite number
 * @returns {string}
 */
export function pythonFloat(x) {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite number: ${x}`);
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  // Number.prototype.toString gives the shortest digits that read back as x (the closest of
  // them); only its layout differs from Python's.
  const [mantissa, exp = "0"] = String(Math.abs(x)).split("e");
  const [whole, fraction = ""] = mantissa.split(".");
  const all = whole + fraction;
  const zeros = all.length - all.replace(/^0+/, "").length;
  const digits = all.slice(zeros).replace(/0+$/, "");
  const e = whole.length - zeros - 1 + Number(exp); // x = d.ddd * 10^e
  if (e >= -4 && e < 16) {
    if (e >= 0) {
      const head = digits.slice(0, e + 1).padEnd(e + 1, "0");
      return `${sign}${head}.${digits.slice(e + 1) || "0"}`;
    }
    return `${sign}0.${"0".repeat(-e - 1)}${digits}`;
  }
  const head = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${head}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
}

/**
 * A string as Python's `json.dumps` (ensure_ascii) writes it: every character outside
 * U+0020..U+007E escaped, `\uXXXX` in lowercase hex per UTF-16 unit.
 *
 * @param {string} s
 * @returns {string}
 */
export function asciiJsonString(s) {
  return JSON.stringify(s).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/**
 * @typedef {object} PublishedHashFamily
 * @property {string} algorithm
 * @property {string} seed 64 lowercase hex digits
 */

/**
 * The published `randomizer` object (docs/device.md, section 1); fields that do not apply to
 * the mechanism are null or absent.
 *
 * @typedef {object} Published
 * @property {"cms" | "hcms" | "sfp"} mechanism
 * @property {number} [epsilon]
 * @property {number} [epsilon_word]
 * @property {number} [epsilon_fragment]
 * @property {number} k
 * @property {number} m
 * @property {number} [k_fragment]
 * @property {number} [m_fragment]
 * @property {string} [alphabet]
 * @property {PublishedHashFamily} hash_family
 * @property {string} [family_id]
 */

const FLOATS = new Set(["epsilon", "epsilon_word", "epsilon_fragment"]);
const INTEGERS = new Set(["k", "m", "k_fragment", "m_fragment"]);

/**
 * The canonical JSON text `family_id` hashes.
 *
 * @param {Published} r
 * @returns {string}
 */
export function canonicalText(r) {
  const names =
    r.mechanism === "sfp"
      ? ["alphabet", "epsilon_fragment", "epsilon_word", "hash_family", "k", "k_fragment", "m", "m_fragment", "mechanism"]
      : ["epsilon", "hash_family", "k", "m", "mechanism"];
  const members = names.map((name) => {
    const value = /** @type {Record<string, unknown>} */ (r)[name];
    let text;
    if (name === "hash_family") {
      const family = /** @type {PublishedHashFamily} */ (value);
      // The seed without its leading zeros, as seeds were first published (all zero: "0").
      const seed = family.seed.replace(/^0+/, "") || "0";
      text = `{"algorithm":${asciiJsonString(family.algorithm)},"seed":${asciiJsonString(seed)}}`;
    } else if (FLOATS.has(name)) {
      text = pythonFloat(/** @type {number} */ (value));
    } else if (INTEGERS.has(name)) {
      if (!Number.isSafeInteger(value)) throw new TypeError(`\`${name}\` must be an integer`);
      text = String(value);
    } else {
      if (typeof value !== "string") throw new TypeError(`\`${name}\` must be a string`);
      text = asciiJsonString(value);
    }
    return `${JSON.stringify(name)}:${text}`;
  });
  return `{${members.join(",")}}`;
}

/**
 * `f1-` and the first 16 hex digits of SHA-256(canonical text), by the platform's WebCrypto.
 *
 * @param {Published} r
 * @returns {Promise<string>}
 */
export async function familyId(r) {
  const text = new TextEncoder().encode(canonicalText(r));
  const digest = new Uint8Array(await webcrypto.subtle.digest("SHA-256", text));
  const hex = Array.from(digest.subarray(0, 8), (b) => b.toString(16).padStart(2, "0")).join("");
  return `f1-${hex}`;
}
