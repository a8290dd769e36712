'use strict';
// XXH64 (64-bit xxHash, https://github.com/Cyan4973/xxHash) in plain
// JavaScript with BigInt, and tenure's partition function:
//
//   partition = XXH64(key bytes, seed 0) mod partitionCount
//
// (see transport/ownershippb/ownership.proto). Checked against
// ring/testdata/partition_vectors.txt by vectors_test.js.

const MASK = (1n << 64n) - 1n;
const P1 = 11400714785074694791n;
const P2 = 14029467366897019727n;
const P3 = 1609587929392839161n;
const P4 = 9650029242287828579n;
const P5 = 2870177450012600261n;

const rotl = (x, r) => ((x << r) | (x >> (64n - r))) & MASK;
const mul = (a, b) => (a * b) & MASK;
const add = (a, b) => (a + b) & MASK;

function round(acc, input) {
  acc = add(acc, mul(input, P2));
  return mul(rotl(acc, 31n), P1);
}

function mergeRound(acc, val) {
  acc ^= round(0n, val);
  return add(mul(acc, P1), P4);
}

// xxh64 returns the 64-bit hash of buf (a Buffer or Uint8Array) as a BigInt.
function xxh64(buf, seed = 0n) {
  const b = Buffer.isBuffer(buf) ? buf : Buffer.from(buf);
  const len = b.length;
  let i = 0;
  let h;
  if (len >= 32) {
    let v1 = add(add(seed, P1), P2);
    let v2 = add(seed, P2);
    let v3 = seed & MASK;
    let v4 = (seed - P1) & MASK;
    for (; i + 32 <= len; i += 32) {
      v1 = round(v1, b.readBigUInt64LE(i));
      v2 = round(v2, b.readBigUInt64LE(i + 8));
      v3 = round(v3, b.readBigUInt64LE(i + 16));
      v4 = round(v4, b.readBigUInt64LE(i + 24));
    }
    h = add(add(rotl(v1, 1n), rotl(v2, 7n)), add(rotl(v3, 12n), rotl(v4, 18n)));
    h = mergeRound(h, v1);
    h = mergeRound(h, v2);
    h = mergeRound(h, v3);
    h = mergeRound(h, v4);
  } else {
    h = add(seed, P5);
  }
  h = add(h, BigInt(len));
  for (; i + 8 <= len; i += 8) {
    h ^= round(0n, b.readBigUInt64LE(i));
    h = add(mul(rotl(h, 27n), P1), P4);
  }
  if (i + 4 <= len) {
    h ^= mul(BigInt(b.readUInt32LE(i)), P1);
    h = add(mul(rotl(h, 23n), P2), P3);
    i += 4;
  }
  for (; i < len; i++) {
    h ^= mul(BigInt(b[i]), P5);
    h = mul(rotl(h, 11n), P1);
  }
  h ^= h >> 33n;
  h = mul(h, P2);
  h ^= h >> 29n;
  h = mul(h, P3);
  h ^= h >> 32n;
  return h;
}

// partition returns key's partition of partitionCount (a Number), key
// being a Buffer or a string (hashed as its UTF-8 bytes).
function partition(key, partitionCount) {
  const b = typeof key === 'string' ? Buffer.from(key, 'utf8') : key;
  return Number(xxh64(b) % BigInt(partitionCount));
}

module.exports = { xxh64, partition };
