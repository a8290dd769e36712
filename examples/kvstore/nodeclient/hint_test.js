'use strict';
// Checks hint.js: percent-decoding, and reading a NOT_OWNER answer's
// trailers from a real grpc-js call to a server that answers as a tenure
// node does (FAILED_PRECONDITION, tenure-owner, tenure-owner-addr), with
// negative controls. Usage: node hint_test.js. Exits 1 on any failure,
// printing each.
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { ownerHint, pctDecode } = require('./hint');

const bad = [];
const expect = (what, got, want) => {
  if (JSON.stringify(got) !== JSON.stringify(want)) bad.push(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
};

expect('plain', pctDecode('node-a'), 'node-a');
expect('encoded', pctDecode('n%C3%B6de b%25'), 'nöde b%');
expect('malformed escape', pctDecode('100%zz%4'), '100%zz%4');

const root = path.join(__dirname, '..', '..', '..');
const def = protoLoader.loadSync([path.join(root, 'examples', 'kvstore', 'kvpb', 'kv.proto')], { keepCase: true, defaults: true });
const KV = grpc.loadPackageDefinition(def).tenure.examples.kv.v1.KV;

// The server answers each Put as its key says.
const answers = {
  notowner: { code: grpc.status.FAILED_PRECONDITION, trailers: { 'tenure-owner': 'n%C3%B6de-b', 'tenure-owner-addr': '127.0.0.1:7001' } },
  'no-address': { code: grpc.status.FAILED_PRECONDITION, trailers: { 'tenure-owner': 'node-b' } },
  unavailable: { code: grpc.status.UNAVAILABLE, trailers: { 'tenure-owner': 'node-b', 'tenure-owner-addr': '127.0.0.1:7001' } },
  bare: { code: grpc.status.FAILED_PRECONDITION, trailers: {} },
};
const server = new grpc.Server();
server.addService(KV.service, {
  Put(call, cb) {
    const a = answers[call.request.key];
    const md = new grpc.Metadata();
    for (const [k, v] of Object.entries(a.trailers)) md.set(k, v);
    cb({ code: a.code, details: 'tenure: not the owner', metadata: md });
  },
  Get(call, cb) { cb({ code: grpc.status.UNIMPLEMENTED }); },
});

function put(client, key) {
  return new Promise((resolve) => client.Put({ key, value: Buffer.alloc(0) }, { deadline: Date.now() + 5000 }, (err) => resolve(err)));
}

server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), async (err, port) => {
  if (err) throw err;
  const client = new KV(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  expect('not owner', ownerHint(await put(client, 'notowner')), { owner: 'nöde-b', address: '127.0.0.1:7001' });
  expect('no address', ownerHint(await put(client, 'no-address')), null);
  expect('another code', ownerHint(await put(client, 'unavailable')), null);
  expect('no trailers', ownerHint(await put(client, 'bare')), null);
  expect('no error', ownerHint(null), null);
  client.close();
  server.forceShutdown();
  for (const b of bad) console.error(b);
  console.log(JSON.stringify({ event: 'hints', checked: 8, failed: bad.length }));
  process.exit(bad.length === 0 ? 0 : 1);
});
