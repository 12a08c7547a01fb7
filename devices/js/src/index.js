/**
 * A dp-governor device in JavaScript, written from docs/device.md: build the randomizer a use
 * case's published policy prescribes, privatize one value with the platform's CSPRNG, submit it.
 *
 * ```js
 * import { Device } from "dp-governor-device";
 * const device = new Device("http://127.0.0.1:8000", "device-1");
 * const emoji = await device.randomizer("emoji");
 * const answer = await device.submit("emoji", emoji.privatize("😂"));
 * ```
 *
 * @module
 */

export { blake2b } from "./blake2b.js";
export { Device, newIdempotencyKey } from "./client.js";
export { asciiJsonString, canonicalText, familyId, pythonFloat } from "./family.js";
export { ALGORITHM, HashFamily, P, fromHex, itemBytes, toHex } from "./hashing.js";
export { MAX_X, bernoulli, cryptoCoins, flipProbability, threshold, uniformFromBytes } from "./randomness.js";
export { Cms, Hcms, POSITIONS, Sfp, WORD_LENGTH, base64, fromPublished, normalizeWord } from "./randomizers.js";
export {
  NoteError,
  Verifier,
  cosignatureMessage,
  leafHash,
  nodeHash,
  openCheckpoint,
  openNote,
  parseCheckpoint,
  verifyInclusion,
  verifyRecord,
} from "./tlog.js";
