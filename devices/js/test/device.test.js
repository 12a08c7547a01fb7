// The parts of docs/device.md the vectors do not pin: layouts, validation, the CSPRNG, HTTP.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  Cms,
  Device,
  HashFamily,
  Hcms,
  POSITIONS,
  base64,
  bernoulli,
  cryptoCoins,
  flipProbability,
  fromPublished,
  itemBytes,
  normalizeWord,
  pythonFloat,
  threshold,
  uniformFromBytes,
} from "../src/index.js";

const Z = 5; // tolerance of the statistical checks, in standard deviations
const VECTORS = new URL("../../../docs/vectors/", import.meta.url);
const published = () =>
  JSON.parse(readFileSync(new URL("families.json", VECTORS), "utf8")).cases.map((c) => c.randomizer);

test("epsilons are written as Python's repr", () => {
  const cases = {
    "4.0": 4,
    "0.5": 0.5,
    "20.0": 20,
    "0.0001": 1e-4,
    "1e-05": 1e-5,
    "2.3e-05": 2.3e-5,
    "0.000123": 0.000123,
    "123.456": 123.456,
    "1000000000000000.0": 1e15,
    "1e+16": 1e16,
    "1.2345678901234568e+16": 12345678901234567,
    "0.1": 0.1,
    "5e-324": 5e-324,
  };
  for (const [text, x] of Object.entries(cases)) assert.equal(pythonFloat(x), text);
});

test("base64 is standard with padding", () => {
  for (let n = 0; n < 40; n++) {
    const bytes = cryptoCoins.bytes(n);
    assert.equal(base64(bytes), Buffer.from(bytes).toString("base64"));
  }
});

test("uniform draws: rejection sampling on the low bits", () => {
  const script = (...chunks) => {
    const queue = chunks.map((c) => Uint8Array.from(c));
    return (count) => {
      const next = queue.shift();
      assert.equal(next.length, count);
      return next;
    };
  };
  // n = 5: 3 bits of one byte; 0xff -> 7 and 0x0d -> 5 are rejected, 0x02 -> 2
  assert.equal(uniformFromBytes(5, script([0xff], [0x0d], [0x02])), 2);
  assert.equal(uniformFromBytes(1, script()), 0); // nothing drawn
  // n = 2^20: 20 bits of three bytes
  assert.equal(uniformFromBytes(2 ** 20, script([0xff, 0x00, 0x01])), 0xf0001);
  const counts = new Array(5).fill(0);
  const n = 50_000;
  for (let i = 0; i < n; i++) counts[cryptoCoins.uniform(5)]++;
  for (const c of counts) assert.ok(Math.abs(c - n / 5) < Z * Math.sqrt((n * 4) / 25), String(counts));
});

test("the CSPRNG serves requests larger than one getRandomValues call", () => {
  assert.equal(cryptoCoins.bytes(200_000).length, 200_000);
});

test("Bernoulli draws from the CSPRNG have the flip probability", () => {
  const p = flipProbability(2);
  const n = 200_000;
  const draws = bernoulli(threshold(p), n, cryptoCoins);
  const ones = draws.reduce((s, d) => s + d, 0);
  assert.ok(Math.abs(ones / n - p) < Z * Math.sqrt((p * (1 - p)) / n), `${ones / n} vs ${p}`);
});

test("epsilons the device cannot draw exactly are refused", () => {
  for (const x of [0, -1, 701, Number.NaN, Number.POSITIVE_INFINITY, "4"]) {
    assert.throws(() => flipProbability(/** @type {number} */ (x)), RangeError);
  }
});

test("descriptions are checked: seed, algorithm, family", async () => {
  const [cms] = published();
  await fromPublished(cms);
  await fromPublished({ randomizer: cms }); // the whole policy holds it
  const short = { ...cms, hash_family: { ...cms.hash_family, seed: cms.hash_family.seed.slice(1) } };
  await assert.rejects(fromPublished(short), /64 lowercase hex digits/);
  const upper = { ...cms, hash_family: { ...cms.hash_family, seed: cms.hash_family.seed.toUpperCase() } };
  await assert.rejects(fromPublished(upper), /64 lowercase hex digits/);
  const other = { ...cms, hash_family: { ...cms.hash_family, algorithm: "blake2b-poly31-v2" } };
  await assert.rejects(fromPublished(other), /algorithm/);
  await assert.rejects(fromPublished({ ...cms, k: cms.k + 1 }), /family_id/);
  await assert.rejects(fromPublished({ ...cms, family_id: undefined }), /family_id/);
  const family = HashFamily.fromSeed("0".repeat(64));
  assert.throws(() => new Hcms({ epsilon: 4, k: 4, m: 100, family }), /power of 2/);
  assert.throws(() => new Cms({ epsilon: 4, k: 0, m: 16, family }), /`k`/);
});

test("items are UTF-8 without normalization; lone surrogates are refused", () => {
  assert.deepEqual(itemBytes("é"), Uint8Array.of(0xc3, 0xa9));
  assert.deepEqual(itemBytes("e\u0301"), Uint8Array.of(0x65, 0xcc, 0x81));
  assert.throws(() => itemBytes("a\ud83d"), TypeError);
  assert.throws(() => itemBytes("\ude02b"), TypeError);
  assert.equal(normalizeWord("😂".repeat(12)), "😂".repeat(10));
  assert.equal(normalizeWord("bae"), "bae       ");
});

test("reports from the CSPRNG have the published shapes", async () => {
  for (const r of published()) {
    const mech = await fromPublished(r);
    for (const value of ["bae", "", "ünïcødé😂"]) {
      const report = mech.privatize(value);
      assert.equal(report.family, r.family_id);
      if (r.mechanism === "hcms") {
        assert.ok([-1, 1].includes(report.bit) && report.l >= 0 && report.l < r.m);
        assert.ok(report.j >= 0 && report.j < r.k);
        continue;
      }
      const rows =
        r.mechanism === "cms"
          ? [[report, r.k, r.m]]
          : [
              [report.word, r.k, r.m],
              [report.fragment, r.k_fragment, r.m_fragment],
            ];
      if (r.mechanism === "sfp") assert.ok(POSITIONS.includes(report.position));
      for (const [row, k, m] of rows) {
        assert.ok(row.j >= 0 && row.j < k);
        const bytes = Buffer.from(row.bits, "base64");
        assert.equal(bytes.length, Math.ceil(m / 8));
        if (m % 8) assert.equal(bytes.at(-1) & ((1 << (8 - (m % 8))) - 1), 0, "padding bits");
      }
    }
  }
});

/**
 * A server answering with `answers` in turn, recording the requests.
 *
 * @param {Array<{status: number, body: object, headers?: object}>} answers
 */
async function fakeServer(answers) {
  const requests = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (chunk) => (body += chunk));
    req.on("end", () => {
      requests.push({ method: req.method, url: req.url, headers: req.headers, body });
      const answer = answers.shift();
      res.writeHead(answer.status, { "content-type": "application/json", ...(answer.headers ?? {}) });
      res.end(JSON.stringify(answer.body));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = /** @type {import("node:net").AddressInfo} */ (server.address());
  return { url: `http://127.0.0.1:${port}`, requests, close: () => server.close() };
}

test("submission: headers, body, and retries with the same idempotency key", async () => {
  const receipt = { receipt: "r", use_case: "emoji", replayed: false };
  const server = await fakeServer([
    { status: 503, body: { detail: "busy" } },
    { status: 429, body: { detail: "too many requests" }, headers: { "Retry-After": "0" } },
    { status: 202, body: receipt },
    { status: 429, body: { detail: "cap", reason: "daily_cap" }, headers: { "Retry-After": "3600" } },
  ]);
  try {
    const device = new Device(`${server.url}/`, "device-7", { backoffMs: 1 });
    const report = { j: 1, bits: "AA==", family: "f1-0000000000000000" };
    const first = await device.submit("emoji", report);
    assert.equal(first.status, 202);
    assert.ok(first.accepted);
    assert.deepEqual(first.body, receipt);
    assert.equal(server.requests.length, 3);
    const keys = new Set(server.requests.map((r) => r.headers["idempotency-key"]));
    assert.equal(keys.size, 1, "a retry reuses the key");
    assert.match([...keys][0], /^[0-9a-f]{32}$/);
    for (const r of server.requests) {
      assert.equal(r.method, "POST");
      assert.equal(r.url, "/v1/use-cases/emoji/reports");
      assert.equal(r.headers["x-device-id"], "device-7");
      assert.equal(r.headers["content-type"], "application/json");
      assert.deepEqual(JSON.parse(r.body), report);
    }
    const capped = await device.submit("emoji", report, { idempotencyKey: "k-1" });
    assert.equal(capped.status, 429);
    assert.equal(capped.retryAfter, 3600);
    assert.equal(capped.body.reason, "daily_cap");
    assert.equal(server.requests.length, 4, "a budget cap is an answer, not retried");
    assert.equal(server.requests[3].headers["idempotency-key"], "k-1");
  } finally {
    server.close();
  }
});
