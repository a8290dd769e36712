// Package kvnode is the kvstore example's node: a key-value store whose
// partitions are owned by tenure coordinators and whose every write is
// fenced in the database the nodes share. Command examples/kvstore runs it
// (Main); a Go program or test starts one with Start.
//
// # What a node does
//
//   - It embeds a coordinator.Coordinator. The database's fence table
//     (ownership/sqlfence) is both the coordinator's Fence, fenced with
//     each new token before the node serves a partition, and its
//     Authority, which mints the epochs: per partition they are dense and
//     each is held by one node.
//   - It serves kvpb.KV over gRPC. A client may call any node: a node
//     forwards a client's call through its transport.Router to the key's
//     owner, which serves it under a transport.OwnerGuard (see server.go
//     for why a call can't loop).
//   - It serves, on the same gRPC port, the Ownership service
//     (transport/ownershippb: Lookup, Watch, Status), so a client in any
//     language can find a key's owner and follow ownership as it moves,
//     and gRPC server reflection (v1 and v1alpha), so tools such as
//     grpcurl list and call the services without the .proto files. A
//     client that sends a call straight to the owner sets the key in
//     metadata "tenure-key-bin": the owner's guard serves it, or answers
//     NOT_OWNER (see transport.ReasonNotOwner) without forwarding it.
//   - The owner writes through a sqlfence.Batcher with the lease's token:
//     the writes to a partition that arrive together commit in one fenced
//     transaction (Stats.Batches, BatchedWrites), each write's upsert into
//     kv and record in kv_log together, and only while the token is the
//     partition's mark. A paused or cut-off former owner's
//     write is refused (counted in Stats.StaleRejected), and the router
//     retries it at the new owner.
//   - On a handoff (a graceful Leave, a join) the old owner's release
//     waits for its writes in flight, so the new owner's fence rejects
//     none of them.
//   - A write may carry a request id (transport.WithRequestID): the fenced
//     transaction records it (sqlfence.Requests, table kv_requests) and a
//     duplicate is answered with the first write's response, so clients
//     and routers may retry a Put whose outcome was unknown.
//   - A graceful Leave fails no call: health answers NOT_SERVING first,
//     the others drop the node from their rings at once and take its
//     partitions over as it hands them off, it goes on serving and
//     forwarding meanwhile, and its gRPC server stops gracefully once
//     the new owners hold them.
//   - A status server (optional) serves the coordinator's status page,
//     Prometheus metrics, the node's counters (/kv/stats) and any
//     Config.StatusHandlers.
//
// # Database
//
// By default a SQLite file (modernc.org/sqlite, WAL mode, busy timeout)
// shared by the nodes of one machine; with a DSN, PostgreSQL (pgx) for
// nodes on several machines. SQLite keeps no queue for its write lock, so
// the nodes' writers take turns, first come first served, in a queue of
// byte-range locks on the file PATH-queue beside the database (Linux; a
// node keeps its turn for a short burst of its own writes): a new owner's
// claim waits for each other node's turn once, not for a gap in their
// commits. The tables are created if missing:
//
//	tenure_partitions  the fence: each partition's highest token
//	kv                 key TEXT PRIMARY KEY, value, partition, epoch
//	kv_log             every write applied: id, its token, key, value, its request
//	                   id, and the partition's mark as its transaction saw it
//	kv_requests        the request ids applied, with the first response
//	                   (sqlfence.Requests)
//
// VerifyLog checks from kv_log that no write under a stale token was ever
// applied: each record's mark must be its own token. CountDuplicates
// counts the writes applied more than once.
//
// # Flags of Main (and of the kvstore command)
//
//	-name NAME            node name, unique in the cluster (required)
//	-gossip HOST:PORT     gossip bind address (default 127.0.0.1:7946; port 0 picks one)
//	-grpc HOST:PORT       KV service address (default 127.0.0.1:7947; port 0 picks one)
//	-status HOST:PORT     status server address (default none)
//	-seeds A,B,...        gossip addresses to join
//	-gossip-key BASE64    AES key for gossip (16, 24 or 32 bytes; default $TENURE_GOSSIP_KEY)
//	-data PATH            SQLite file (default kvstore.db)
//	-dsn DSN              PostgreSQL DSN, used instead of -data
//	-preset local|lan     coordinator timings (default lan)
//	-partitions N         partitions of the key space (default 271)
//
// Once serving, Main writes one line to stdout (see Ready) and nothing
// else; logs go to stderr.
//
// The gRPC traffic is not encrypted: run on a trusted network, or add TLS
// with transport.ServerTLSConfig and transport.ClientTLSConfig.
package kvnode
