#!/usr/bin/env node
/**
 * A simulated fleet: each device privatizes its value with the platform's CSPRNG and submits
 * it to a real server. Reads a JSON job on standard input, writes a JSON summary on standard
 * output:
 *
 *   {"url": "http://127.0.0.1:8000", "use_case": "emoji", "prefix": "js-",
 *    "values": [["😂", 1200], ["❤️", 800]], "concurrency": 16}
 *
 * Device i is `prefix + i`; `values` gives each value and how many devices hold it. The
 * randomizer is built once from the published policy (every device would read the same one).
 */

import { Device } from "../src/index.js";

/**
 * @returns {Promise<string>}
 */
async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

async function main() {
  const job = JSON.parse(await readStdin());
  const values = /** @type {[string, number][]} */ (job.values).flatMap(([value, count]) =>
    Array.from({ length: count }, () => value),
  );
  const prefix = job.prefix ?? "device-";
  const started = performance.now();
  const randomizer = await new Device(job.url, `${prefix}0`).randomizer(job.use_case);
  const statuses = /** @type {Record<string, number>} */ ({});
  let next = 0;
  let firstError = null;
  async function worker() {
    while (next < values.length) {
      const i = next++;
      const device = new Device(job.url, `${prefix}${i}`);
      const result = await device.submit(job.use_case, randomizer.privatize(values[i]));
      statuses[result.status] = (statuses[result.status] ?? 0) + 1;
      if (!result.accepted && firstError === null) firstError = result.body;
    }
  }
  await Promise.all(Array.from({ length: job.concurrency ?? 16 }, worker));
  const summary = {
    use_case: job.use_case,
    family: randomizer.familyId,
    devices: values.length,
    statuses,
    first_error: firstError,
    seconds: (performance.now() - started) / 1000,
  };
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  if ((statuses["202"] ?? 0) !== values.length) process.exitCode = 1;
}

await main();
