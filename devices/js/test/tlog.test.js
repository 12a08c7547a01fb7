// The transparency log's vectors (docs/vectors/tlog.json): every case answered word for word as
// the Python client answers it.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { leafHash, nodeHash, verifyInclusion, verifyRecord } from "../src/index.js";

const VECTORS = JSON.parse(
  readFileSync(new URL("../../../docs/vectors/tlog.json", import.meta.url), "utf8"),
);

for (const c of VECTORS.cases) {
  test(`tlog: ${c.name}`, async () => {
    const check = await verifyRecord(c.record, VECTORS.log_key, {
      witnesses: c.witnesses,
      quorum: c.quorum,
      sent: c.sent,
    });
    assert.equal(check.problem, c.problem);
    assert.equal(check.ok, c.ok);
    assert.deepEqual(check.totals, c.totals);
    assert.deepEqual(check.cosigned, c.cosigned);
  });
}

for (const c of VECTORS.bad_quorums) {
  const name = `tlog: a quorum of ${c.quorum} under ${c.witnesses.length} witness(es) is refused`;
  test(name, async () => {
    const record = VECTORS.cases[0].record;
    await assert.rejects(
      verifyRecord(record, VECTORS.log_key, { witnesses: c.witnesses, quorum: c.quorum }),
      (error) => error instanceof RangeError && error.message === c.error,
    );
  });
}

test("tlog: a proof for another index, a size that cannot hold it or a short path fails", async () => {
  const record = VECTORS.cases[0].record;
  const item = record.leaves[0];
  const point = record.checkpoint.split("\n");
  const bytes = (b64) => Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
  const root = bytes(point[2]);
  const leaf = await leafHash(new TextEncoder().encode(item.leaf));
  const proof = item.proof.map(bytes);
  assert.equal(await verifyInclusion(leaf, item.index, record.size, proof, root), true);
  assert.equal(await verifyInclusion(leaf, item.index + 1, record.size, proof, root), false);
  assert.equal(await verifyInclusion(leaf, item.index, item.index, proof, root), false);
  assert.equal(await verifyInclusion(leaf, item.index, record.size, proof.slice(1), root), false);
  assert.equal(await verifyInclusion(leaf, -1, record.size, proof, root), false);
});

test("tlog: RFC 9162 hashes of the empty leaf and node", async () => {
  const empty = await leafHash(new Uint8Array());
  assert.equal(
    Buffer.from(empty).toString("hex"),
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
  );
  const node = await nodeHash(empty, empty);
  assert.equal(node.length, 32);
});
