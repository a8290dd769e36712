package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/go-redsync/redsync/v4"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// A guard protects critical sections on keys. Each client of it (a
// goroutine of the workload, or a holder of the pause scenario) gets a
// worker of its own.
type guard interface {
	name() string
	// worker returns a handle for the client called who. Workers of the
	// same name act for the same node (tenure's owner).
	worker(ctx context.Context, who string) (worker, error)
	// why says in one line why a paused holder's late write lands, or
	// does not, under this guard.
	why() string
}

// A worker takes the guard on a key.
type worker interface {
	lock(ctx context.Context, key string) (held, error)
	close()
}

// held is a guard taken on one key: tx runs one transaction of the
// critical section under it; unlock gives the guard up.
type held interface {
	tx(ctx context.Context, fn func(q sqlfence.Tx) error) error
	unlock(ctx context.Context) error
}

// do runs fn as a whole critical section: take the guard, one
// transaction, give it up.
func do(ctx context.Context, w worker, key string, fn func(q sqlfence.Tx) error) error {
	h, err := w.lock(ctx, key)
	if err != nil {
		return fmt.Errorf("lock %s: %w", key, err)
	}
	err = h.tx(ctx, fn)
	if uerr := h.unlock(ctx); err == nil && uerr != nil {
		err = fmt.Errorf("unlock %s: %w", key, uerr)
	}
	return err
}

// plainTx is a held whose transactions are plain database transactions.
type plainTx struct {
	db      *sql.DB
	release func(ctx context.Context) error
}

func (h plainTx) tx(ctx context.Context, fn func(q sqlfence.Tx) error) error {
	return inTx(ctx, h.db, func(tx *sql.Tx) error { return fn(tx) })
}

func (h plainTx) unlock(ctx context.Context) error { return h.release(ctx) }

func noRelease(context.Context) error { return nil }

// unguarded: the transaction alone.
type unguarded struct{ db *sql.DB }

func (g unguarded) name() string { return "unguarded" }
func (g unguarded) why() string {
	return "nothing guards the key: the late write lands on top of B's (the control)"
}
func (g unguarded) worker(context.Context, string) (worker, error) { return g, nil }
func (g unguarded) close()                                         {}
func (g unguarded) lock(context.Context, string) (held, error) {
	return plainTx{db: g.db, release: noRelease}, nil
}

// tenureGuard: each key's partition has an owner node holding a fencing
// token, and every transaction of the critical section is the owner's
// fenced transaction (DoConn, Exact, on a Concurrent fence: the
// partition's transactions share its row lock). Taking the guard is
// holding the partition's lease, and the owner's own lock on the key: a
// node that does not hold the lease claims it from the authority, which
// fences out the previous holder; the owner's clients, all in its
// process, take turns on a key under a mutex in its memory. Nothing
// outside the owner's process is asked for a lock: the fence keeps other
// nodes out, the mutex orders the owner's own writes.
type tenureGuard struct {
	fence      *sqlfence.Fence
	partitions uint32

	mu    sync.Mutex
	nodes map[string]*tenureNode
}

type tenureNode struct {
	g    *tenureGuard
	node ownership.Node
	keys sync.Map // key -> *sync.Mutex, the owner's lock per key
	mu   sync.Mutex
	toks map[uint32]*partitionToken
}

// partitionToken is a node's token for one partition, claimed once: mu
// is held while it is claimed, so that two clients of the node never
// claim it twice (the second claim would fence the first).
type partitionToken struct {
	mu sync.Mutex
	t  ownership.Token // zero until claimed
}

func (g *tenureGuard) name() string { return "tenure" }
func (g *tenureGuard) why() string {
	return "B's claim fenced the partition: the database refuses A's late write under its old token"
}

func (g *tenureGuard) worker(_ context.Context, who string) (worker, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n, ok := g.nodes[who]
	if !ok {
		h := fnv.New64a()
		h.Write([]byte(who))
		n = &tenureNode{g: g, node: ownership.Node{Name: who, Incarnation: h.Sum64()}, toks: map[uint32]*partitionToken{}}
		g.nodes[who] = n
	}
	return n, nil
}

func (g *tenureGuard) partition(key string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32() % g.partitions
}

func (n *tenureNode) close() {}

// lock takes the node's lock on key and returns it with the node's token
// for key's partition, claiming the partition first if the node does not
// hold it.
func (n *tenureNode) lock(ctx context.Context, key string) (held, error) {
	m, _ := n.keys.LoadOrStore(key, new(sync.Mutex))
	km := m.(*sync.Mutex)
	km.Lock()
	t, err := n.token(ctx, n.g.partition(key))
	if err != nil {
		km.Unlock()
		return nil, err
	}
	return tenureHeld{f: n.g.fence, t: t, key: km}, nil
}

// token returns the node's token for partition p, claiming it first if
// the node does not hold it.
func (n *tenureNode) token(ctx context.Context, p uint32) (ownership.Token, error) {
	n.mu.Lock()
	pt, ok := n.toks[p]
	if !ok {
		pt = &partitionToken{}
		n.toks[p] = pt
	}
	n.mu.Unlock()
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if !pt.t.IsZero() {
		return pt.t, nil
	}
	seen, err := n.g.fence.Current(ctx, p)
	if err != nil {
		return ownership.Token{}, err
	}
	for range 10 {
		t, err := n.g.fence.Authority().Claim(ctx, p, n.node, seen)
		if ce, ok := errors.AsType[*ownership.ConflictError](err); ok {
			seen = ce.Current
			continue
		}
		if err != nil {
			return ownership.Token{}, err
		}
		pt.t = t
		return t, nil
	}
	return ownership.Token{}, fmt.Errorf("claim of p%d kept losing", p)
}

type tenureHeld struct {
	f   *sqlfence.Fence
	t   ownership.Token
	key *sync.Mutex // the owner's lock on the key, held
}

func (h tenureHeld) tx(ctx context.Context, fn func(q sqlfence.Tx) error) error {
	return h.f.DoConn(ctx, h.t, ownership.Exact, fn)
}

// unlock gives up the owner's lock on the key; the lease stays.
func (h tenureHeld) unlock(context.Context) error {
	h.key.Unlock()
	return nil
}

// advisory: pg_advisory_xact_lock on the key, in the transaction that
// runs the critical section: the lock and the writes share one
// transaction, so the whole critical section is one transaction.
type advisory struct{ db *sql.DB }

func (g advisory) name() string { return "advisory" }
func (g advisory) why() string {
	return "the lock lives in A's transaction: when the server ends A's idle session, the lock and A's write go with it (with no such timeout, B waits for A however long)"
}
func (g advisory) worker(context.Context, string) (worker, error) { return g, nil }
func (g advisory) close()                                         {}

func (g advisory) lock(ctx context.Context, key string) (held, error) {
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(h.Sum64())); err != nil {
		tx.Rollback()
		return nil, err
	}
	return advisoryHeld{tx}, nil
}

type advisoryHeld struct{ t *sql.Tx }

func (h advisoryHeld) tx(_ context.Context, fn func(q sqlfence.Tx) error) error {
	if err := fn(h.t); err != nil {
		h.t.Rollback()
		return err
	}
	return nil
}

func (h advisoryHeld) unlock(context.Context) error { return h.t.Commit() }

// redsyncGuard: a Redis lock per key (redsync), held around the
// transaction.
type redsyncGuard struct {
	db   *sql.DB
	rs   *redsync.Redsync
	opts []redsync.Option
	ns   string // key namespace of this run
}

func (g *redsyncGuard) name() string { return "redsync" }
func (g *redsyncGuard) why() string {
	return "A's lock expired in Redis while A was paused and B took it; nothing at the store checks A's write, so it lands on top of B's"
}
func (g *redsyncGuard) worker(context.Context, string) (worker, error) { return g, nil }
func (g *redsyncGuard) close()                                         {}

func (g *redsyncGuard) lock(ctx context.Context, key string) (held, error) {
	m := g.rs.NewMutex(g.ns+key, g.opts...)
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return plainTx{db: g.db, release: func(ctx context.Context) error {
		if ok, err := m.UnlockContext(ctx); err != nil || !ok {
			return fmt.Errorf("redsync unlock: %v (held %v)", err, ok)
		}
		return nil
	}}, nil
}

// etcdMutex: an etcd concurrency.Mutex per key, held around the
// transaction; each worker has its own session (lease).
type etcdMutex struct {
	db     *sql.DB
	cli    *clientv3.Client
	ttl    int // seconds
	prefix string
}

func (g *etcdMutex) name() string { return "etcd_mutex" }
func (g *etcdMutex) why() string {
	return "A's session lease expired while A was paused (no keepalives) and B took the mutex; nothing at the store checks A's write, so it lands on top of B's"
}

func (g *etcdMutex) worker(ctx context.Context, _ string) (worker, error) {
	s, err := concurrency.NewSession(g.cli, concurrency.WithTTL(g.ttl), concurrency.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	return &etcdWorker{g: g, s: s}, nil
}

type etcdWorker struct {
	g *etcdMutex
	s *concurrency.Session
}

func (w *etcdWorker) close() { w.s.Close() }

func (w *etcdWorker) lock(ctx context.Context, key string) (held, error) {
	m := concurrency.NewMutex(w.s, w.g.prefix+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return plainTx{db: w.g.db, release: m.Unlock}, nil
}

// pause stops a worker's keepalives, as a stopped process's would stop:
// its locks expire after their TTL. Only the etcd worker has any.
func pause(w worker) {
	if e, ok := w.(*etcdWorker); ok {
		e.s.Orphan()
	}
}
