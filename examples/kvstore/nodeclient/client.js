'use strict';
// A Node.js client of the tenure kvstore, written against the protocol
// only: the .proto files, the partition function and the metadata keys.
//
// It watches ownership through a node's Ownership service (Watch),
// computes each key's partition itself (XXH64 of the key's bytes, seed 0,
// mod the partition count), and sends every Put straight to the
// partition's owner with the key in metadata "tenure-key-bin" and a
// request id in "tenure-request-id", so a retry after a failure (a
// handoff, a crash, an unknown outcome) is applied once. A NOT_OWNER
// answer names the owner in trailing metadata ("tenure-owner",
// "tenure-owner-addr", see hint.js): the client sends the call there at
// once, if that address is a member's it knows from the watch, at most 3
// times in a row. When the node it watches goes away it watches the next
// one. On "stop" (a line on stdin,
// or stdin's end, or -max-ms) it stops writing, reads every acknowledged
// key back from its owner, prints a report and exits 0, or 1 if an
// acknowledged write is lost or anything else is wrong.
//
//   node client.js -seeds host:port,host:port,... [-workers 8] [-max-ms 60000]
//                  [-first-to host:port]
//
// -first-to sends the first attempt of every call to that node whatever
// the table says, as a client with a stale view would: the node answers
// NOT_OWNER for the keys it does not own, and the client follows the hint.
//
// stdout: one JSON object a line: {"event":"watching",...} each time a
// watch's snapshot is complete, {"event":"progress",...} every 100 ms,
// and {"event":"report",...} at the end.

const path = require('path');
const readline = require('readline');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { partition } = require('./xxh64');
const { ownerHint } = require('./hint');

const root = path.join(__dirname, '..', '..', '..');
const protos = [
  path.join(root, 'examples', 'kvstore', 'kvpb', 'kv.proto'),
  path.join(root, 'transport', 'ownershippb', 'ownership.proto'),
];
const def = protoLoader.loadSync(protos, { keepCase: true, longs: String, defaults: true });
const pkg = grpc.loadPackageDefinition(def);
const KV = pkg.tenure.examples.kv.v1.KV;
const Ownership = pkg.tenure.ownership.v1.Ownership;

function args() {
  const a = { seeds: [], workers: 8, maxMs: 60000, writeTimeoutMs: 20000, prefix: `nc${process.pid}`, firstTo: '' };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) {
    switch (v[i]) {
      case '-seeds': a.seeds = v[i + 1].split(',').filter(Boolean); break;
      case '-workers': a.workers = Number(v[i + 1]); break;
      case '-max-ms': a.maxMs = Number(v[i + 1]); break;
      case '-write-timeout-ms': a.writeTimeoutMs = Number(v[i + 1]); break;
      case '-prefix': a.prefix = v[i + 1]; break;
      case '-first-to': a.firstTo = v[i + 1]; break;
      default: throw new Error(`unknown flag ${v[i]}`);
    }
  }
  if (a.seeds.length === 0) throw new Error('-seeds is required');
  return a;
}

const opt = args();
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const stats = {
  acked: 0, failed: 0, lost: 0, unverified: 0, retries: 0, not_owner: 0, unavailable: 0,
  unknown_outcome: 0, other_errors: 0, partition_mismatch: 0, owner_mismatch: 0, hints_followed: 0,
  moves: 0, watch_reconnects: 0, snapshots: 0, acks_by_owner: {}, last_error: '',
};

// The ownership table, as the watched node reports it: count partitions,
// owners[p] = {owner, address, epoch}. null until the first snapshot.
let table = null;

const kvClients = new Map();
function kv(addr) {
  let c = kvClients.get(addr);
  if (!c) {
    c = new KV(addr, grpc.credentials.createInsecure());
    kvClients.set(addr, c);
  }
  return c;
}

// watch follows ownership through the Watch stream of one node, and moves
// to the next seed when that stream ends.
let watchCall = null;
let watchIdx = 0;
let closing = false;
function watch() {
  if (closing) return;
  const addr = opt.seeds[watchIdx % opt.seeds.length];
  const client = new Ownership(addr, grpc.credentials.createInsecure());
  const call = client.Watch({});
  watchCall = call;
  let pending = null;
  let filled = 0;
  let ended = false;
  const apply = (p, o) => {
    const prev = table && table.owners[p];
    if (prev && prev.owner !== o.owner) stats.moves++;
  };
  call.on('data', (msg) => {
    const n = msg.partition_count;
    if (msg.snapshot) {
      if (!pending || pending.length !== n) { pending = new Array(n); filled = 0; }
      for (const o of msg.partitions) {
        if (pending[o.partition] === undefined) filled++;
        pending[o.partition] = { owner: o.owner, address: o.address, epoch: o.epoch };
      }
      if (filled === n) {
        if (table && table.count === n) pending.forEach((o, p) => apply(p, o));
        table = { count: n, owners: pending };
        pending = null;
        stats.snapshots++;
        out({ event: 'watching', address: addr, partitions: n, reconnects: stats.watch_reconnects });
      }
      return;
    }
    if (!table || table.count !== n) return; // a change before its snapshot: wait for the snapshot
    for (const o of msg.partitions) {
      apply(o.partition, o);
      table.owners[o.partition] = { owner: o.owner, address: o.address, epoch: o.epoch };
    }
  });
  const restart = () => {
    if (ended) return;
    ended = true;
    client.close();
    if (closing) return;
    stats.watch_reconnects++;
    watchIdx++;
    setTimeout(watch, 100);
  };
  call.on('error', restart);
  call.on('end', restart);
}

function unary(client, method, req, md, ms) {
  return new Promise((resolve, reject) => {
    client[method](req, md, { deadline: Date.now() + ms }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
}

function routed(key) {
  if (!table) return null;
  const p = partition(key, table.count);
  const e = table.owners[p];
  return e && e.address ? { p, e } : { p, e: null };
}

function classify(err) {
  switch (err.code) {
    case grpc.status.FAILED_PRECONDITION: stats.not_owner++; break; // NOT_OWNER, STALE_TOKEN: the watch catches up
    case grpc.status.UNAVAILABLE: case grpc.status.DEADLINE_EXCEEDED: stats.unavailable++; break;
    case grpc.status.UNKNOWN: stats.unknown_outcome++; break; // may be applied: the retry carries the same request id
    default: stats.other_errors++;
  }
  stats.last_error = `${err.code} ${err.details || err.message}`;
}

// isMember reports whether addr is the service address of a node the
// watch knows: a hint is followed only there (an answer names an address,
// it does not vouch for it).
function isMember(addr) {
  return opt.seeds.includes(addr) || (table !== null && table.owners.some((o) => o && o.address === addr));
}

// maxHints bounds the hints one attempt follows in a row.
const maxHints = 3;

// call sends one request straight to the owner of key's partition,
// follows NOT_OWNER hints to members, and retries it, with the same
// metadata, until it succeeds or timeoutMs pass.
async function call(method, key, req, requestId, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 0; ; attempt++) {
    const r = routed(key);
    if (r && r.e) {
      const md = new grpc.Metadata();
      md.set('tenure-key-bin', Buffer.from(key, 'utf8'));
      if (requestId) md.set('tenure-request-id', requestId);
      let to = { owner: r.e.owner, address: attempt === 0 && opt.firstTo ? opt.firstTo : r.e.address };
      const tried = [];
      for (;;) {
        try {
          const resp = await unary(kv(to.address), method, req, md, Math.min(2000, Math.max(1, deadline - Date.now())));
          if (resp.partition !== r.p) stats.partition_mismatch++;
          // A retry whose request id an earlier owner applied already is
          // answered with that first response, naming the earlier owner:
          // only a first attempt must name the owner it was sent to.
          if (attempt === 0 && to.address !== opt.firstTo && resp.owner !== to.owner) stats.owner_mismatch++;
          return resp;
        } catch (err) {
          classify(err);
          tried.push(to.address);
          const h = ownerHint(err);
          if (!h || tried.length > maxHints || tried.includes(h.address) || !isMember(h.address) || Date.now() >= deadline) break;
          stats.hints_followed++;
          to = h;
        }
      }
    }
    if (Date.now() >= deadline) return null;
    stats.retries++;
    await sleep(Math.min(400, 25 * 2 ** Math.min(attempt, 4)));
  }
}

let stopping = false;
const acked = []; // [key, value] of every acknowledged write

async function worker(w) {
  for (let seq = 0; !stopping; seq++) {
    const key = `${opt.prefix}-${w}-${seq}`;
    const value = Buffer.from(`v${seq}`);
    const id = `${opt.prefix}.${w}.${seq}`;
    const resp = await call('Put', key, { key, value }, id, opt.writeTimeoutMs);
    if (resp) {
      acked.push([key, value]);
      stats.acked++;
      stats.acks_by_owner[resp.owner] = (stats.acks_by_owner[resp.owner] || 0) + 1;
    } else {
      stats.failed++;
    }
  }
}

async function readBack() {
  let next = 0;
  const one = async () => {
    while (next < acked.length) {
      const [key, value] = acked[next++];
      const resp = await call('Get', key, { key }, '', opt.writeTimeoutMs);
      if (!resp) stats.unverified++;
      else if (!resp.found || !Buffer.from(resp.value).equals(value)) stats.lost++;
    }
  };
  await Promise.all(Array.from({ length: 16 }, one));
}

async function main() {
  watch();
  const start = Date.now();
  while (!table) {
    if (Date.now() - start > 15000) throw new Error('no ownership snapshot within 15 s');
    await sleep(20);
  }
  const progress = setInterval(() => out({ event: 'progress', acked: stats.acked, retries: stats.retries, moves: stats.moves }), 100);
  const stop = () => { stopping = true; };
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', (l) => { if (l.trim() === 'stop') stop(); });
  rl.on('close', stop);
  const max = setTimeout(stop, opt.maxMs);
  await Promise.all(Array.from({ length: opt.workers }, (_, w) => worker(w)));
  clearInterval(progress);
  clearTimeout(max);
  rl.close();
  await readBack();
  closing = true;
  if (watchCall) watchCall.cancel();
  for (const c of kvClients.values()) c.close();
  const ok = stats.acked > 0 && stats.lost === 0 && stats.unverified === 0 && stats.failed === 0 &&
    stats.partition_mismatch === 0 && stats.owner_mismatch === 0;
  out({ event: 'report', ok, ...stats });
  return ok ? 0 : 1;
}

main().then((code) => process.exit(code), (err) => {
  out({ event: 'report', ok: false, error: String(err && err.stack || err), ...stats });
  process.exit(2);
});
