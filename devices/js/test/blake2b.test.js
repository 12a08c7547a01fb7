import assert from "node:assert/strict";
import { test } from "node:test";

import { blake2b, fromHex, toHex } from "../src/index.js";

const ascii = (s) => new TextEncoder().encode(s);
const range = (n) => Uint8Array.from({ length: n }, (_, i) => i);

test("RFC 7693, Appendix A: BLAKE2b-512 of 'abc'", () => {
  assert.equal(
    toHex(blake2b(ascii("abc"))),
    "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1" +
      "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923",
  );
});

test("the reference keyed test vectors (blake2b-kat.txt: key 00..3f, input 00..n-1)", () => {
  const kat = {
    0: "10ebb67700b1868efb4417987acf4690ae9d972fb7a590c2f02871799aaa4786b5e996e8f0f4eb981fc214b005f42d2ff4233499391653df7aefcbc13fc51568",
    1: "961f6dd1e4dd30f63901690c512e78e4b45e4742ed197c3c5e45c549fd25f2e4187b0bc9fe30492b16b0d0bc4ef9b0f34c7003fac09a5ef1532e69430234cebd",
    127: "76d2d819c92bce55fa8e092ab1bf9b9eab237a25267986cacf2b8ee14d214d730dc9a5aa2d7b596e86a1fd8fa0804c77402d2fcd45083688b218b1cdfa0dcbcb",
    128: "72065ee4dd91c2d8509fa1fc28a37c7fc9fa7d5b3f8ad3d0d7a25626b57b1b44788d4caf806290425f9890a3a2a35a905ab4b37acfd0da6e4517b2525c9651e4",
    129: "64475dfe7600d7171bea0b394e27c9b00d8e74dd1e416a79473682ad3dfdbb706631558055cfc8a40e07bd015a4540dcdea15883cbbf31412df1de1cd4152b91",
    255: "142709d62e28fcccd0af97fad0f8465b971e82201dc51070faa0372aa43e92484be1c1e73ba10906d5d1853db6a4106e0a7bf9800d373d6dee2d46d62ef2a461",
  };
  for (const [n, digest] of Object.entries(kat)) {
    assert.equal(toHex(blake2b(range(Number(n)), { key: range(64) })), digest, `input of ${n} bytes`);
  }
});

test("the parameter block: digest length, salt and personalization", () => {
  // Python: hashlib.blake2b(b"abc", digest_size=24, salt=b"salt", person=b"person")
  const digest = blake2b(ascii("abc"), { outLength: 24, salt: ascii("salt"), personalization: ascii("person") });
  assert.equal(toHex(digest), "ac75cc948523ad9c724fdac50ea5236d709c2a1e4272650d");
  // hashlib.blake2b(bytes(range(200)), digest_size=32): two blocks, unkeyed
  assert.equal(
    toHex(blake2b(range(200), { outLength: 32 })),
    "63c3d97a9f8894d5e043a707b0fee7f7ec4c049a23bbf1079df20b4165f9e22d",
  );
});

test("out-of-range parameters are refused", () => {
  assert.throws(() => blake2b(ascii(""), { outLength: 0 }), RangeError);
  assert.throws(() => blake2b(ascii(""), { outLength: 65 }), RangeError);
  assert.throws(() => blake2b(ascii(""), { key: new Uint8Array(65) }), RangeError);
  assert.throws(() => blake2b(ascii(""), { personalization: new Uint8Array(17) }), RangeError);
  assert.deepEqual(fromHex("00ff"), Uint8Array.of(0, 255));
});
