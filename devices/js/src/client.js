/**
 * Submitting reports over HTTP (docs/device.md, section 7), with the platform's `fetch`.
 *
 * @module
 */

import { toHex } from "./hashing.js";
import { cryptoCoins } from "./randomness.js";
import { fromPublished } from "./randomizers.js";

/**
 * The outcome of one submission: 202 accepted; 429 with a `reason`, a budget cap (send nothing
 * to that use case before `retryAfter` seconds); anything else an error the body explains.
 *
 * @typedef {object} Submission
 * @property {number} status
 * @property {boolean} accepted
 * @property {any} body the server's JSON answer
 * @property {number | null} retryAfter seconds, from `Retry-After`
 * @property {string} idempotencyKey the key sent (reuse it to retry the same report)
 */

/**
 * A fresh idempotency key: 16 bytes from the CSPRNG, in hex.
 *
 * @returns {string}
 */
export function newIdempotencyKey() {
  return toHex(cryptoCoins.bytes(16));
}

/**
 * @param {number} ms
 * @returns {Promise<void>}
 */
function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** One device talking to a dp-governor server. */
export class Device {
  /**
   * @param {string} baseUrl e.g. `http://127.0.0.1:8000`
   * @param {string} deviceId the device's stable identifier, 1 to 256 characters
   * @param {{fetch?: typeof globalThis.fetch, attempts?: number, backoffMs?: number,
   *   maxRetryAfter?: number}} [options] `attempts` tries for transport errors, 5xx and the
   *   server's rate limit (4), waiting `Retry-After` or `backoffMs * 2^n` (250 ms) in between,
   *   never more than `maxRetryAfter` seconds (60)
   */
  constructor(baseUrl, deviceId, options = {}) {
    if (typeof deviceId !== "string" || deviceId.length < 1 || deviceId.length > 256) {
      throw new RangeError("a device id has 1 to 256 characters");
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.deviceId = deviceId;
    this.fetch = options.fetch ?? globalThis.fetch;
    this.attempts = options.attempts ?? 4;
    this.backoffMs = options.backoffMs ?? 250;
    this.maxRetryAfter = options.maxRetryAfter ?? 60;
  }

  /**
   * The use case's published policy (`GET /v1/use-cases/{name}`).
   *
   * @param {string} useCase
   * @returns {Promise<any>}
   */
  async policy(useCase) {
    const response = await this.fetch(`${this.baseUrl}/v1/use-cases/${encodeURIComponent(useCase)}`);
    if (response.status !== 200) {
      throw new Error(`GET /v1/use-cases/${useCase}: ${response.status} ${await response.text()}`);
    }
    return response.json();
  }

  /**
   * The randomizer the use case's current policy prescribes, its family checked.
   *
   * @param {string} useCase
   */
  async randomizer(useCase) {
    return fromPublished(await this.policy(useCase));
  }

  /**
   * Submit one report body (with its `family`). Retries transport errors, 5xx and the rate
   * limit's 429 with the same idempotency key, so a retry never charges twice.
   *
   * @param {string} useCase
   * @param {object} report
   * @param {{idempotencyKey?: string}} [options]
   * @returns {Promise<Submission>}
   */
  async submit(useCase, report, options = {}) {
    const idempotencyKey = options.idempotencyKey ?? newIdempotencyKey();
    const url = `${this.baseUrl}/v1/use-cases/${encodeURIComponent(useCase)}/reports`;
    const request = {
      method: "POST",
      headers: {
        "Content-Type": "application/json",
        "X-Device-Id": this.deviceId,
        "Idempotency-Key": idempotencyKey,
      },
      body: JSON.stringify(report),
    };
    for (let attempt = 1; ; attempt++) {
      let response;
      try {
        response = await this.fetch(url, request);
      } catch (error) {
        if (attempt >= this.attempts) throw error;
        await sleep(this.backoffMs * 2 ** (attempt - 1));
        continue;
      }
      const text = await response.text();
      const body = text ? JSON.parse(text) : null;
      const header = response.headers.get("Retry-After");
      const retryAfter = header !== null && /^\d+$/.test(header) ? Number(header) : null;
      const rateLimited = response.status === 429 && !(body && typeof body.reason === "string");
      const transient = response.status >= 500 || rateLimited;
      if (transient && attempt < this.attempts && (retryAfter ?? 0) <= this.maxRetryAfter) {
        await sleep(retryAfter !== null ? retryAfter * 1000 : this.backoffMs * 2 ** (attempt - 1));
        continue;
      }
      return { status: response.status, accepted: response.status === 202, body, retryAfter, idempotencyKey };
    }
  }
}
