// The shared test vectors of docs/device.md, reproduced from the specification alone.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  HashFamily,
  canonicalText,
  familyId,
  flipProbability,
  fromHex,
  fromPublished,
  normalizeWord,
  threshold,
  toHex,
} from "../src/index.js";

const VECTORS = new URL("../../../docs/vectors/", import.meta.url);
const load = (name) => JSON.parse(readFileSync(new URL(`${name}.json`, VECTORS), "utf8"));

/**
 * Coins that replay a vector's recorded draws and fail on any other request.
 *
 * @param {Array<{below?: number, value?: number, bytes?: string}>} draws
 */
function replay(draws) {
  let next = 0;
  const take = (kind) => {
    const draw = draws[next];
    assert.ok(draw !== undefined && kind in draw, `draw ${next}: the device asked for ${kind}`);
    next += 1;
    return draw;
  };
  return {
    uniform(n) {
      const draw = take("below");
      assert.equal(draw.below, n, `draw ${next - 1}: bound`);
      return draw.value;
    },
    bytes(count) {
      const raw = fromHex(take("bytes").bytes);
      assert.equal(raw.length, count, `draw ${next - 1}: byte count`);
      return raw;
    },
    get exhausted() {
      return next === draws.length;
    },
  };
}

test("hashing: keys, derived keys, digests, fingerprints and rows", () => {
  const data = load("hashing");
  assert.equal(data.p, 2 ** 31 - 1);
  for (const seedCase of data.seeds) {
    const family = HashFamily.fromSeed(seedCase.seed);
    assert.equal(family.seed, seedCase.seed);
    for (const [label, derived] of Object.entries(seedCase.derived)) {
      assert.equal(family.derive(label).seed, derived, label);
    }
    for (const item of seedCase.items) {
      const value = "text" in item ? item.text : fromHex(item.utf8);
      if ("text" in item) assert.equal(toHex(new TextEncoder().encode(item.text)), item.utf8);
      assert.equal(toHex(family.digest(value)), item.digest);
      const fp = family.fingerprint(value);
      assert.deepEqual([fp.a, fp.b, fp.c].map(Number), item.fingerprint);
      for (const row of item.rows) {
        assert.deepEqual(
          row.j.map((j) => HashFamily.row(fp, j, row.m)),
          row.h,
          `m=${row.m} item=${item.utf8}`,
        );
      }
    }
  }
});

test("flip probabilities and Bernoulli thresholds, bit for bit", () => {
  for (const c of load("flip").cases) {
    const p = flipProbability(c.epsilon);
    assert.equal(p, c.p, `epsilon ${c.epsilon}`);
    const t = threshold(p);
    assert.equal(t.exponent, c.frexp_exponent);
    assert.equal(t.size, c.bytes);
    assert.equal(toHex(t.bytes), c.threshold);
  }
});

test("family identifiers and their canonical texts", async () => {
  for (const c of load("families").cases) {
    assert.equal(canonicalText(c.randomizer), c.canonical);
    assert.equal(await familyId(c.randomizer), c.family_id);
  }
});

test("reports for recorded coins", async (t) => {
  for (const [i, c] of load("reports").cases.entries()) {
    await t.test(`case ${i}: ${c.randomizer.mechanism} ${JSON.stringify(c.value)}`, async () => {
      const mech = await fromPublished(c.randomizer);
      const coins = replay(c.coins);
      const report = mech.privatize(c.value, coins);
      assert.ok(coins.exhausted, "every recorded draw is consumed");
      assert.deepEqual(report, c.report);
      if (c.randomizer.mechanism === "sfp") {
        const normalized = normalizeWord(c.value);
        assert.equal(normalized, c.trace.normalized);
        assert.equal(mech.puzzle(normalized), c.trace.puzzle);
        const fragment = mech.fragmentOf(normalized, report.position);
        assert.equal(toHex(fragment), c.trace.fragment);
        assert.equal(mech.word.family.hash(normalized, report.word.j, mech.word.m), c.trace.word_h);
        assert.equal(
          mech.fragment.family.hash(fragment, report.fragment.j, mech.fragment.m),
          c.trace.fragment_h,
        );
      } else {
        assert.equal(mech.family.hash(c.value, report.j, mech.m), c.trace.h);
      }
    });
  }
});
