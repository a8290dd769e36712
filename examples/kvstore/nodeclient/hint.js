'use strict';
// Reading a NOT_OWNER answer's hint without decoding
// grpc-status-details-bin: the owner's name and address ride in plain
// trailing metadata, "tenure-owner" and "tenure-owner-addr",
// percent-encoded as grpc-message is (see ownership.proto, "Following a
// NOT_OWNER answer").

const FAILED_PRECONDITION = 9;

// pctDecode decodes a %XX-encoded value to its bytes, then to text; it
// never throws (a malformed escape stays as it is).
function pctDecode(s) {
  const out = [];
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x25 && i + 2 < s.length && /^[0-9A-Fa-f]{2}$/.test(s.slice(i + 1, i + 3))) {
      out.push(parseInt(s.slice(i + 1, i + 3), 16));
      i += 2;
    } else {
      out.push(...Buffer.from(s[i], 'utf8'));
    }
  }
  return Buffer.from(out).toString('utf8');
}

// ownerHint returns {owner, address} from a failed call's error (grpc-js
// puts the trailers in err.metadata) when it is a NOT_OWNER answer naming
// an owner with an address, else null.
function ownerHint(err) {
  if (!err || err.code !== FAILED_PRECONDITION || !err.metadata || typeof err.metadata.get !== 'function') return null;
  const owner = err.metadata.get('tenure-owner');
  const addr = err.metadata.get('tenure-owner-addr');
  if (owner.length !== 1 || addr.length !== 1) return null;
  const h = { owner: pctDecode(String(owner[0])), address: pctDecode(String(addr[0])) };
  return h.owner && h.address ? h : null;
}

module.exports = { ownerHint, pctDecode };
