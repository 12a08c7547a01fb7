/**
 * What a device checks of the server's record of its spend, with the log's public key alone
 * (docs/transparency.md): RFC 9162 inclusion proofs, C2SP signed-note checkpoints with Ed25519
 * signatures, C2SP tlog-cosignatures of witnesses, and the device's totals.
 *
 * Uses the platform's WebCrypto only (`globalThis.crypto.subtle`: SHA-256, HMAC and Ed25519),
 * so it runs in Node.js 20 and in current browsers. Every function that hashes is async.
 *
 * ```js
 * import { verifyRecord } from "dp-governor-device";
 * const record = await (await fetch(`${base}/v1/devices/${id}/tlog?day=2026-11-26`)).json();
 * const check = await verifyRecord(record, LOG_KEY, { witnesses: [W1], quorum: 1 });
 * if (!check.ok) report(check.problem);
 * ```
 *
 * @module
 */

import { fromHex, toHex } from "./hashing.js";

const subtle = globalThis.crypto.subtle;
const encoder = new TextEncoder();
const ED25519 = 0x01;
const COSIGNATURE = 0x04;
const DASH = "\u2014 ";
const MAX_SIGNATURES = 64;

/** A note, checkpoint or key that cannot be read or is not signed as required. */
export class NoteError extends Error {}

/**
 * @param {...Uint8Array} parts
 * @returns {Uint8Array}
 */
function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * @param {Uint8Array} data
 * @returns {Promise<Uint8Array>}
 */
async function sha256(data) {
  return new Uint8Array(await subtle.digest("SHA-256", data));
}

/**
 * @param {Uint8Array} a
 * @param {Uint8Array} b
 */
function equal(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/**
 * Standard base64 (with padding), strictly: anything else is `null`.
 *
 * @param {string} text
 * @returns {Uint8Array | null}
 */
function fromBase64(text) {
  if (!/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(text)) return null;
  const raw = atob(text);
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

/**
 * `SHA-256(0x00 || data)`: the hash of one leaf (RFC 9162, 2.1.1).
 *
 * @param {Uint8Array} data
 */
export function leafHash(data) {
  return sha256(concat(Uint8Array.of(0), data));
}

/**
 * `SHA-256(0x01 || left || right)`: the hash of an interior node (RFC 9162, 2.1.1).
 *
 * @param {Uint8Array} left
 * @param {Uint8Array} right
 */
export function nodeHash(left, right) {
  return sha256(concat(Uint8Array.of(1), left, right));
}

/**
 * Whether `proof` shows the leaf hash `leaf` at `index` of the tree `(size, root)`: RFC 9162,
 * section 2.1.3.2, step by step (indexes as BigInt-safe numbers below 2^53).
 *
 * @param {Uint8Array} leaf
 * @param {number} index
 * @param {number} size
 * @param {Uint8Array[]} proof
 * @param {Uint8Array} root
 * @returns {Promise<boolean>}
 */
export async function verifyInclusion(leaf, index, size, proof, root) {
  if (!(Number.isSafeInteger(index) && Number.isSafeInteger(size) && index >= 0 && index < size)) {
    return false;
  }
  let fn = BigInt(index);
  let sn = BigInt(size - 1);
  let r = leaf;
  for (const p of proof) {
    if (sn === 0n) return false;
    if (fn & 1n || fn === sn) {
      r = await nodeHash(p, r);
      if (!(fn & 1n)) {
        while ((fn & 1n) === 0n && fn !== 0n) {
          fn >>= 1n;
          sn >>= 1n;
        }
      }
    } else {
      r = await nodeHash(r, p);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return sn === 0n && equal(r, root);
}

/**
 * @param {string} name
 * @param {number} kind
 * @param {Uint8Array} key
 */
async function keyId(name, kind, key) {
  const digest = await sha256(concat(encoder.encode(`${name}\n`), Uint8Array.of(kind), key));
  return ((digest[0] << 24) | (digest[1] << 16) | (digest[2] << 8) | digest[3]) >>> 0;
}

/**
 * A public key a note may be signed with (C2SP signed-note): name, type and Ed25519 key.
 */
export class Verifier {
  /**
   * @param {string} name
   * @param {number} kind 0x01 (Ed25519 note signature) or 0x04 (Ed25519 cosignature)
   * @param {Uint8Array} key the 32-byte public key
   * @param {number} id `SHA-256(name || 0x0A || kind || key)[:4]`
   */
  constructor(name, kind, key, id) {
    this.name = name;
    this.kind = kind;
    this.key = key;
    this.id = id;
  }

  /**
   * Read a verifier key text `<name>+<hex key ID>+base64(type || public key)`, checking its ID.
   *
   * @param {string} vkey
   * @returns {Promise<Verifier>}
   */
  static async parse(vkey) {
    const text = vkey.trim();
    const first = text.indexOf("+");
    const second = first < 0 ? -1 : text.indexOf("+", first + 1);
    if (second < 0) throw new NoteError(`a verifier key is <name>+<id>+<key>, got ${vkey}`);
    const name = text.slice(0, first);
    const idHex = text.slice(first + 1, second);
    const raw = fromBase64(text.slice(second + 1));
    if (!name || /[\s+]/.test(name)) throw new NoteError(`a key name is malformed: ${name}`);
    if (!/^[0-9a-fA-F]{8}$/.test(idHex) || raw === null || raw.length !== 33) {
      throw new NoteError(`the verifier key ${name} has a malformed ID or key`);
    }
    const kind = raw[0];
    if (kind !== ED25519 && kind !== COSIGNATURE) {
      throw new NoteError(`unsupported signature type ${kind}`);
    }
    const key = raw.slice(1);
    const id = await keyId(name, kind, key);
    if (id !== Number.parseInt(idHex, 16)) {
      throw new NoteError(`the verifier key ${name} has the wrong key ID`);
    }
    return new Verifier(name, kind, key, id);
  }

  /**
   * @param {Uint8Array} signature
   * @param {Uint8Array} message
   */
  async check(signature, message) {
    const key = await subtle.importKey("raw", this.key, { name: "Ed25519" }, false, ["verify"]);
    return subtle.verify({ name: "Ed25519" }, key, signature, message);
  }
}

/**
 * What an Ed25519 cosignature signs: the header, the time line and the checkpoint text.
 *
 * @param {string} text
 * @param {bigint} when
 */
export function cosignatureMessage(text, when) {
  return encoder.encode(`cosignature/v1\ntime ${when}\n${text}`);
}

/**
 * Split a signed note into its text and signature lines (unverified).
 *
 * @param {string} note
 * @returns {{text: string, signatures: {name: string, id: number, blob: Uint8Array}[]}}
 */
export function openNote(note) {
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u0009\u000b-\u001f]/.test(note)) {
    throw new NoteError("a note must not contain control characters other than newline");
  }
  const cut = note.lastIndexOf("\n\n");
  if (cut < 0 || !note.endsWith("\n")) {
    throw new NoteError("a note is its text, a blank line and its signature lines");
  }
  const text = note.slice(0, cut + 1);
  const signatures = [];
  for (const line of note.slice(cut + 2).split("\n").slice(0, -1)) {
    if (!line.startsWith(DASH)) throw new NoteError(`not a signature line: ${line.slice(0, 60)}`);
    const rest = line.slice(DASH.length);
    const space = rest.lastIndexOf(" ");
    const name = space < 0 ? "" : rest.slice(0, space);
    const blob = fromBase64(rest.slice(space + 1));
    if (blob === null) throw new NoteError(`the signature of ${name} is not base64`);
    if (blob.length < 5 || !name) throw new NoteError(`the signature line of ${name} is too short`);
    const id = ((blob[0] << 24) | (blob[1] << 16) | (blob[2] << 8) | blob[3]) >>> 0;
    signatures.push({ name, id, blob: blob.slice(4) });
  }
  if (signatures.length < 1 || signatures.length > MAX_SIGNATURES) {
    throw new NoteError(
      `a note needs 1 to ${MAX_SIGNATURES} signatures, got ${signatures.length}`,
    );
  }
  return { text, signatures };
}

/**
 * Python's `repr` of a string, as the server's answers quote names.
 *
 * @param {string} s
 */
function pyRepr(s) {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  const body = s.replaceAll("\\", "\\\\").replaceAll(quote, `\\${quote}`);
  return `${quote}${body}${quote}`;
}

/**
 * A tlog checkpoint's text: origin, size and root hash, each on its line.
 *
 * @param {string} text
 * @returns {{origin: string, size: number, root: Uint8Array}}
 */
export function parseCheckpoint(text) {
  const lines = text.split("\n");
  if (lines.length !== 4 || lines[3] !== "") {
    throw new NoteError("a checkpoint is three lines: origin, size, root hash");
  }
  const [origin, size, rootText] = lines;
  if (!origin || !/^(0|[1-9][0-9]*)$/.test(size)) {
    throw new NoteError(`a checkpoint's origin and size are malformed: ${pyRepr(size)}`);
  }
  const root = fromBase64(rootText);
  if (root === null) throw new NoteError("a checkpoint's root hash is not base64");
  if (root.length !== 32) {
    throw new NoteError(`a checkpoint's root hash is 32 bytes, got ${root.length}`);
  }
  return { origin, size: Number(size), root };
}

/**
 * A quorum a checkpoint can meet under `witnesses` configured keys: 0 with none, else 1 to
 * their number. Throws a RangeError (a TypeError for no integer) naming `quorum`, word for word
 * as the Python client's (docs/vectors/tlog.json, `bad_quorums`).
 *
 * @param {number} quorum
 * @param {number} witnesses
 * @returns {number}
 */
export function checkQuorum(quorum, witnesses) {
  if (!Number.isInteger(quorum)) {
    throw new TypeError(`\`quorum\` must be an integer, got ${typeof quorum}`);
  }
  if (witnesses === 0 && quorum !== 0) {
    throw new RangeError(`\`quorum\` is ${quorum} but no witness is configured: it must be 0`);
  }
  if (witnesses > 0 && !(quorum >= 1 && quorum <= witnesses)) {
    throw new RangeError(
      `\`quorum\` must be 1 to ${witnesses} (the witnesses configured), got ${quorum}`,
    );
  }
  return quorum;
}

/**
 * Verify a signed checkpoint: the log's signature and `quorum` witnesses' cosignatures.
 * Unknown signatures are ignored; a known key's bad signature rejects the note.
 *
 * @param {string} note
 * @param {Verifier} log
 * @param {Verifier[]} witnesses
 * @param {number} quorum
 * @returns {Promise<{point: {origin: string, size: number, root: Uint8Array},
 *   cosigned: Map<string, bigint>}>}
 */
export async function openCheckpoint(note, log, witnesses = [], quorum = 0) {
  if (quorum !== 0) checkQuorum(quorum, witnesses.length);
  const { text, signatures } = openNote(note);
  const point = parseCheckpoint(text);
  if (point.origin !== log.name) {
    throw new NoteError(
      `the checkpoint is of log ${pyRepr(point.origin)}, not ${pyRepr(log.name)}`,
    );
  }
  let signed = false;
  const cosigned = new Map();
  for (const sig of signatures) {
    if (sig.name === log.name && sig.id === log.id) {
      if (log.kind !== ED25519 || !(await log.check(sig.blob, encoder.encode(text)))) {
        throw new NoteError("the log's signature on the checkpoint does not verify");
      }
      signed = true;
    }
    for (const w of witnesses) {
      if (sig.name !== w.name || sig.id !== w.id) continue;
      let ok = w.kind === COSIGNATURE && sig.blob.length === 72;
      let when = 0n;
      if (ok) {
        when = new DataView(sig.blob.buffer, sig.blob.byteOffset, 8).getBigUint64(0);
        ok = await w.check(sig.blob.slice(8), cosignatureMessage(text, when));
      }
      if (!ok) throw new NoteError(`the cosignature of witness ${pyRepr(w.name)} is bad`);
      cosigned.set(w.name, when);
    }
  }
  if (!signed) {
    throw new NoteError(`the checkpoint carries no signature of log ${pyRepr(log.name)}`);
  }
  if (cosigned.size < quorum) {
    throw new NoteError(
      `the checkpoint is cosigned by ${cosigned.size} of the configured witnesses,` +
        ` the quorum is ${quorum}`,
    );
  }
  return { point, cosigned };
}

/**
 * @param {[number, number]} pair
 */
const tuple = (pair) => `(${pair[0]}, ${pair[1]})`;

/**
 * The first use case (sorted) whose totals differ between two maps, or `undefined`.
 *
 * @param {Map<string, [number, number]>} a
 * @param {Map<string, [number, number]>} b
 */
function firstDifference(a, b) {
  const names = [...new Set([...a.keys(), ...b.keys()])].sort();
  return names.find((n) => {
    const x = a.get(n);
    const y = b.get(n);
    return x === undefined || y === undefined || x[0] !== y[0] || x[1] !== y[1];
  });
}

/**
 * Check a device's record of one day (`GET /v1/devices/{id}/tlog`): the checkpoint's
 * signatures, every leaf's inclusion proof, its label (a version 2 leaf's from its place among
 * the device's leaves of its use case) and running total, the gate's totals and (when the
 * device kept its own count) what it sent. `log` and `witnesses` are verifier key texts the
 * device was configured with, never ones the server sent. The answer's `problem` is the same,
 * word for word, as the Python client's (docs/vectors/tlog.json).
 *
 * @param {any} record
 * @param {string} log
 * @param {{witnesses?: string[], quorum?: number,
 *   sent?: Record<string, [number, number]> | null}} [options]
 * @returns {Promise<{ok: boolean, totals: Record<string, [number, number]>,
 *   cosigned: string[], problem: string | null}>}
 */
export async function verifyRecord(record, log, options = {}) {
  checkQuorum(options.quorum ?? 0, (options.witnesses ?? []).length); // configuration, not record
  const logKey = await Verifier.parse(log);
  const keys = await Promise.all((options.witnesses ?? []).map((w) => Verifier.parse(w)));
  /** @type {Map<string, [number, number]>} */
  const totals = new Map();
  let names = [];
  const answer = (problem) => ({
    ok: problem === null,
    totals: Object.fromEntries([...totals.entries()].sort(([a], [b]) => (a < b ? -1 : 1))),
    cosigned: names,
    problem,
  });
  if (record.checkpoint === null || record.checkpoint === undefined) {
    if (record.leaves.length || record.gate.length) {
      return answer("the server shows charges but no signed checkpoint");
    }
    return answer(sentProblem(options.sent, new Map())); // nothing shown: what it sent is missing
  }
  let point;
  try {
    const opened = await openCheckpoint(record.checkpoint, logKey, keys, options.quorum ?? 0);
    point = opened.point;
    names = [...opened.cosigned.keys()].sort();
  } catch (error) {
    if (error instanceof NoteError) {
      return answer(`the checkpoint is not acceptable: ${error.message}`);
    }
    throw error;
  }
  if (point.size !== record.size) {
    return answer(`the checkpoint signs ${point.size} leaves, the record says ${record.size}`);
  }
  const labelKey = await subtle.importKey(
    "raw",
    fromHex(record.label_key),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  /** `HMAC-SHA256(label key, message)[:16]`, hex. @param {string} message */
  const labelOf = async (message) => {
    const mac = await subtle.sign("HMAC", labelKey, encoder.encode(message));
    return toHex(new Uint8Array(mac).slice(0, 16));
  };
  const dayLabel = await labelOf(`day:${record.day}`);
  for (const item of record.leaves) {
    const data = encoder.encode(item.leaf);
    const proof = item.proof.map((p) => fromBase64(p));
    if (proof.some((p) => p === null || p.length !== 32)) {
      return answer(`leaf ${item.index}'s proof is not base64 SHA-256 hashes`);
    }
    if (!(await verifyInclusion(await leafHash(data), item.index, point.size, proof, point.root))) {
      return answer(`leaf ${item.index} is not in the signed tree (its proof fails)`);
    }
    const leaf = JSON.parse(item.leaf);
    const missing = leaf.use_case === undefined || leaf.use_case === null;
    const useCase = missing ? "None" : String(leaf.use_case); // as Python's str()
    const [count, spent] = totals.get(useCase) ?? [0, 0];
    // a version 2 leaf carries the label of the device's next charge of its use case
    const label =
      leaf.v === 2 ? await labelOf(`charge:${record.day}:${useCase}:${count + 1}`) : dayLabel;
    if (leaf.label !== label || leaf.day !== record.day) {
      return answer(`leaf ${item.index} is not this device's on day ${record.day}`);
    }
    if (leaf.kind !== "charge") return answer(`leaf ${item.index} is not a charge`);
    const now = [count + 1, spent + Number(leaf.epsilon_micro)];
    if (leaf.v === 2 && leaf.spent !== now[1]) {
      return answer(
        `leaf ${item.index} says ${pyRepr(useCase)} had spent ${leaf.spent} micro-epsilon` +
          ` that day, the device's leaves up to it make ${now[1]}`,
      );
    }
    totals.set(useCase, now);
  }
  const gate = new Map(record.gate.map((g) => [g.use_case, [g.reports, g.epsilon_micro]]));
  const where = firstDifference(gate, totals);
  if (where !== undefined) {
    const pending = record.covered ? "" : " (charges made since the checkpoint may explain it)";
    return answer(
      `the gate's totals for ${pyRepr(where)} are ${tuple(gate.get(where) ?? [0, 0])}, the log` +
        ` proves ${tuple(totals.get(where) ?? [0, 0])} (reports, micro-epsilon)${pending}`,
    );
  }
  return answer(sentProblem(options.sent, totals));
}

/**
 * The first use case where the device's own count differs from what the log proves, or null.
 *
 * @param {Record<string, [number, number]> | null | undefined} sent
 * @param {Map<string, [number, number]>} proven
 * @returns {string | null}
 */
function sentProblem(sent, proven) {
  if (!sent) return null;
  const mine = new Map(
    Object.entries(sent)
      .filter(([, v]) => v[0])
      .map(([k, v]) => [k, [Number(v[0]), Number(v[1])]]),
  );
  const differs = firstDifference(mine, proven);
  if (differs === undefined) return null;
  return (
    `for ${pyRepr(differs)} the device sent ${tuple(mine.get(differs) ?? [0, 0])} but the` +
    ` log records ${tuple(proven.get(differs) ?? [0, 0])} (reports, micro-epsilon)`
  );
}
