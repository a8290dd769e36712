'use strict';
// Checks xxh64.js against the protocol's test vectors (the file ring's Go
// test checks too). Usage: node vectors_test.js [vectors-file]. Exits 1 on
// any mismatch, printing each.
const fs = require('fs');
const path = require('path');
const { xxh64, partition } = require('./xxh64');

const file = process.argv[2] ||
  path.join(__dirname, '..', '..', '..', 'ring', 'testdata', 'partition_vectors.txt');
let checked = 0;
const bad = [];
fs.readFileSync(file, 'utf8').split('\n').forEach((raw, i) => {
  const line = raw.split('#')[0].trim();
  if (line === '') return;
  const [keyHex, n, p, h] = line.split(/\s+/);
  const key = keyHex === '-' ? Buffer.alloc(0) : Buffer.from(keyHex, 'hex');
  const gotH = xxh64(key).toString(16).padStart(16, '0');
  const gotP = partition(key, Number(n));
  if (gotH !== h) bad.push(`line ${i + 1}: XXH64 = ${gotH}, the file says ${h}`);
  if (gotP !== Number(p)) bad.push(`line ${i + 1}: partition ${gotP} of ${n}, the file says ${p}`);
  checked++;
});
for (const b of bad) console.error(b);
console.log(JSON.stringify({ event: 'vectors', checked, failed: bad.length }));
process.exit(bad.length === 0 && checked > 0 ? 0 : 1);
