package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"

	_ "modernc.org/sqlite"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// resource is the protected resource: a register per partition behind a
// fence. Fence is what coordinators call on acquire (Config.Fence); it
// records every fence in the history. Writes and reads are recorded by
// their callers, who alone know whether the answer got back.
type resource interface {
	ownership.Fence
	write(ctx context.Context, t ownership.Token, v string) error
	read(ctx context.Context, t ownership.Token) (ownership.Token, string, error)
	// mark is the partition's current mark.
	mark(ctx context.Context, p uint32) (ownership.Token, error)
	// s1 returns the S1 violations seen: writes applied under a token
	// below one already applied or fenced.
	s1(ctx context.Context) ([]s1Violation, error)
}

// s1Violation is a write applied under a token below one the resource had
// already applied or fenced.
type s1Violation struct {
	tok, above ownership.Token
}

func (v s1Violation) String() string { return fmt.Sprintf("S1: %v applied after %v", v.tok, v.above) }

func s1Strings(vs []s1Violation) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	return out
}

// classify says what a caller learns from a resource error.
func classify(err error) Outcome {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, ownership.ErrStaleToken):
		return Stale
	case errors.Is(err, ownership.ErrNotFenced):
		return NotFenced
	}
	return Unknown
}

// fenceHook is told of every fence that raised a partition's mark.
type fenceHook func(ownership.Token)

// memResource is a register per partition protected by a MemoryFence, or,
// with fencing off (the negative control), by nothing: every write is
// applied whatever its token.
type memResource struct {
	fence   *ownership.MemoryFence
	fencing bool
	hist    *History
	hook    fenceHook
	regs    []memReg
}

type memReg struct {
	mu    sync.Mutex
	tok   ownership.Token
	val   string
	high  ownership.Token // highest token fenced or applied
	marks ownership.Token // fencing off: the mark, kept but not enforced
	viol  []s1Violation
}

func newMemResource(partitions int, fencing bool, h *History, hook fenceHook) (*memResource, error) {
	f, err := ownership.NewMemoryFence(partitions)
	if err != nil {
		return nil, err
	}
	return &memResource{fence: f, fencing: fencing, hist: h, hook: hook, regs: make([]memReg, partitions)}, nil
}

func (r *memResource) Fence(ctx context.Context, t ownership.Token) (ownership.Token, error) {
	rec := Record{Client: 0, Node: t.Owner, Kind: Fence, Token: t, Start: Now()}
	if int(t.Partition) >= len(r.regs) {
		return ownership.Token{}, ownership.ErrPartitionRange
	}
	reg := &r.regs[t.Partition]
	var old, cur ownership.Token
	var err error
	if r.fencing {
		old = r.fence.Current(t.Partition)
		cur, err = r.fence.Fence(ctx, t)
	} else {
		reg.mu.Lock()
		old = reg.marks
		if t.Compare(reg.marks) > 0 {
			reg.marks = t
		}
		cur = t
		reg.mu.Unlock()
	}
	rec.End, rec.Out = Now(), classify(err)
	if err == nil {
		reg.mu.Lock()
		if t.Compare(reg.high) > 0 {
			reg.high = t
		}
		reg.mu.Unlock()
		if t.Compare(old) > 0 && r.hook != nil {
			r.hook(t)
		}
	}
	r.hist.Add(rec)
	return cur, err
}

func (r *memResource) do(ctx context.Context, t ownership.Token, fn func(reg *memReg)) error {
	if int(t.Partition) >= len(r.regs) {
		return ownership.ErrPartitionRange
	}
	reg := &r.regs[t.Partition]
	body := func() error {
		reg.mu.Lock()
		defer reg.mu.Unlock()
		fn(reg)
		return nil
	}
	if !r.fencing {
		return body()
	}
	return r.fence.Do(ctx, t, ownership.Exact, body)
}

func (r *memResource) write(ctx context.Context, t ownership.Token, v string) error {
	return r.do(ctx, t, func(reg *memReg) {
		if t.Less(reg.high) {
			reg.viol = append(reg.viol, s1Violation{tok: t, above: reg.high})
		} else {
			reg.high = t
		}
		reg.tok, reg.val = t, v
	})
}

func (r *memResource) read(ctx context.Context, t ownership.Token) (tok ownership.Token, val string, err error) {
	err = r.do(ctx, t, func(reg *memReg) { tok, val = reg.tok, reg.val })
	return tok, val, err
}

func (r *memResource) mark(_ context.Context, p uint32) (ownership.Token, error) {
	if !r.fencing {
		reg := &r.regs[p]
		reg.mu.Lock()
		defer reg.mu.Unlock()
		return reg.marks, nil
	}
	return r.fence.Current(p), nil
}

func (r *memResource) s1(context.Context) ([]s1Violation, error) {
	var out []s1Violation
	for i := range r.regs {
		r.regs[i].mu.Lock()
		out = append(out, r.regs[i].viol...)
		r.regs[i].mu.Unlock()
	}
	return out, nil
}

// sqlResource is a register per partition in SQL (SQLite, or PostgreSQL
// with a Concurrent fence), protected by the SQL fence: the register row
// and a log of every applied write change in the fenced transaction.
type sqlResource struct {
	db   *sql.DB
	f    *sqlfence.Fence
	hist *History
	hook fenceHook
}

// openSQL opens the SQLite file at path for the resource.
func openSQL(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(8)
	return db, nil
}

// openPlaceSQL opens PostgreSQL at dsn, or the SQLite file at path if
// dsn is empty.
func openPlaceSQL(path, dsn string) (*sql.DB, error) {
	if dsn == "" {
		return openSQL(path)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(8)
	return db, nil
}

// newPlaceResource opens the resource on db, PostgreSQL (writes to the
// partitions side by side) if dsn is set, else SQLite.
func newPlaceResource(ctx context.Context, db *sql.DB, dsn string, create bool, h *History) (*sqlResource, error) {
	if dsn == "" {
		return newSQLResource(ctx, db, create, h, nil)
	}
	return newSQLResourceOn(ctx, db, sqlfence.Postgres(), sqlfence.Config{Concurrent: true}, create, h, nil)
}

// sqlSchema is the register and the log in dialect d. The log's ids are
// in commit order per partition on both: SQLite has one writer, and on
// PostgreSQL a write under an older token took its id before the fence
// that let a newer one in.
func sqlSchema(d sqlfence.Dialect) string {
	id := "INTEGER PRIMARY KEY AUTOINCREMENT"
	if d.String() == "postgres" {
		id = "BIGSERIAL PRIMARY KEY"
	}
	return `
CREATE TABLE IF NOT EXISTS chaos_reg (partition_id BIGINT PRIMARY KEY, epoch BIGINT, owner TEXT, inc TEXT, value TEXT);
CREATE TABLE IF NOT EXISTS chaos_log (id ` + id + `, partition_id BIGINT, epoch BIGINT, owner TEXT, inc TEXT, value TEXT);`
}

// newSQLResource opens the resource on the SQLite database db; create
// makes the schema (once, by the first process).
func newSQLResource(ctx context.Context, db *sql.DB, create bool, h *History, hook fenceHook) (*sqlResource, error) {
	return newSQLResourceOn(ctx, db, sqlfence.SQLite(), sqlfence.Config{}, create, h, hook)
}

// newSQLResourceOn opens the resource on db in dialect d with a fence
// configured by cfg (whose Table it sets).
func newSQLResourceOn(ctx context.Context, db *sql.DB, d sqlfence.Dialect, cfg sqlfence.Config, create bool, h *History, hook fenceHook) (*sqlResource, error) {
	cfg.Table = "chaos_partitions"
	f, err := sqlfence.New(db, d, cfg)
	if err != nil {
		return nil, err
	}
	if create {
		if err := f.CreateSchema(ctx); err != nil {
			f.Close()
			return nil, err
		}
		if _, err := db.ExecContext(ctx, sqlSchema(d)); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &sqlResource{db: db, f: f, hist: h, hook: hook}, nil
}

func (r *sqlResource) close() { _ = r.f.Close() }

func (r *sqlResource) Fence(ctx context.Context, t ownership.Token) (ownership.Token, error) {
	rec := Record{Node: t.Owner, Kind: Fence, Token: t, Start: Now()}
	old, _ := r.f.Current(ctx, t.Partition)
	cur, err := r.f.Fence(ctx, t)
	rec.End, rec.Out = Now(), classify(err)
	r.hist.Add(rec)
	if err == nil && t.Compare(old) > 0 && r.hook != nil {
		r.hook(t)
	}
	return cur, err
}

func incText(inc uint64) string { return fmt.Sprintf("%016x", inc) }

func (r *sqlResource) write(ctx context.Context, t ownership.Token, v string) error {
	return r.f.Do(ctx, t, ownership.Exact, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO chaos_reg VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (partition_id) DO UPDATE SET epoch = excluded.epoch, owner = excluded.owner, inc = excluded.inc, value = excluded.value`,
			t.Partition, int64(t.Epoch), t.Owner, incText(t.Incarnation), v); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO chaos_log (partition_id, epoch, owner, inc, value) VALUES ($1, $2, $3, $4, $5)`,
			t.Partition, int64(t.Epoch), t.Owner, incText(t.Incarnation), v)
		return err
	})
}

func (r *sqlResource) read(ctx context.Context, t ownership.Token) (tok ownership.Token, val string, err error) {
	err = r.f.Do(ctx, t, ownership.Exact, func(tx *sql.Tx) error {
		var epoch int64
		var owner, inc string
		err := tx.QueryRowContext(ctx, `SELECT epoch, owner, inc, value FROM chaos_reg WHERE partition_id = $1`, t.Partition).
			Scan(&epoch, &owner, &inc, &val)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		tok, err = decodeTok(t.Partition, epoch, owner, inc)
		return err
	})
	return tok, val, err
}

func decodeTok(p uint32, epoch int64, owner, inc string) (ownership.Token, error) {
	n, err := strconv.ParseUint(inc, 16, 64)
	if err != nil {
		return ownership.Token{}, err
	}
	return ownership.Token{Partition: p, Epoch: uint64(epoch), Owner: owner, Incarnation: n}, nil
}

func (r *sqlResource) mark(ctx context.Context, p uint32) (ownership.Token, error) {
	return r.f.Current(ctx, p)
}

// s1 reads the log of applied writes in commit order: per partition, the
// tokens must never go down.
func (r *sqlResource) s1(ctx context.Context) ([]s1Violation, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT partition_id, epoch, owner, inc FROM chaos_log ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	high := map[uint32]ownership.Token{}
	var out []s1Violation
	for rows.Next() {
		var p uint32
		var epoch int64
		var owner, inc string
		if err := rows.Scan(&p, &epoch, &owner, &inc); err != nil {
			return nil, err
		}
		t, err := decodeTok(p, epoch, owner, inc)
		if err != nil {
			return nil, err
		}
		if t.Less(high[p]) {
			out = append(out, s1Violation{tok: t, above: high[p]})
		} else {
			high[p] = t
		}
	}
	return out, rows.Err()
}

// claimRec is one Claim on the authority.
type claimRec struct {
	Start int64
	End   int64
	Token ownership.Token
	Err   string
}

// claimFence is the Value of a Fence record made by a claim.
const claimFence = "claim"

// recAuthority records the claims made on an authority (for S4). The SQL
// authority's claim is a conditional update of the fence's own mark: a
// claim fences the partition at once, before the new owner's Fence call.
// So each claim that did (or may have) raise the mark is also recorded in
// hist as a Fence (Value claimFence), applied or, when the claim failed
// other than by a conflict, Unknown.
type recAuthority struct {
	a    ownership.Authority
	hist *History
	sink func(claimRec)
	mu   sync.Mutex
	recs []claimRec
}

// Strict is the wrapped authority's.
func (a *recAuthority) Strict() bool { return a.a.Strict() }

func (a *recAuthority) Claim(ctx context.Context, p uint32, n ownership.Node, seen ownership.Token) (ownership.Token, error) {
	rec := claimRec{Start: Now()}
	t, err := a.a.Claim(ctx, p, n, seen)
	rec.End, rec.Token = Now(), t
	if err != nil {
		rec.Err = err.Error()
	}
	fence := Record{Node: n.Name, Kind: Fence, Token: t, Value: claimFence, Out: OK, Start: rec.Start, End: rec.End}
	if err != nil {
		fence.Token = ownership.Token{Partition: p, Epoch: seen.Epoch + 1, Owner: n.Name, Incarnation: n.Incarnation}
		fence.Out = Unknown
	}
	if a.hist != nil && !errors.Is(err, ownership.ErrConflict) {
		a.hist.Add(fence)
	}
	a.add(rec)
	return t, err
}

func (a *recAuthority) add(rec claimRec) {
	a.mu.Lock()
	a.recs = append(a.recs, rec)
	a.mu.Unlock()
	if a.sink != nil {
		a.sink(rec)
	}
}

func (a *recAuthority) claims() []claimRec {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]claimRec(nil), a.recs...)
}

// checkS4 checks strict issuance on successful claims: per partition, a
// claim that ended before another started has a lower epoch, and each
// epoch is held by one node.
func checkS4(claims []claimRec) []string {
	var out []string
	by := map[uint32][]claimRec{}
	for _, c := range claims {
		if c.Err == "" {
			by[c.Token.Partition] = append(by[c.Token.Partition], c)
		}
	}
	for p, cs := range by {
		holder := map[uint64]ownership.Node{}
		for i, a := range cs {
			if h, ok := holder[a.Token.Epoch]; ok && h != a.Token.Node() {
				out = append(out, fmt.Sprintf("S4: partition %d epoch %d held by %v and %v", p, a.Token.Epoch, h, a.Token.Node()))
			}
			holder[a.Token.Epoch] = a.Token.Node()
			for _, b := range cs[i+1:] {
				first, second := a, b
				if b.End < a.Start {
					first, second = b, a
				} else if !(a.End < b.Start) {
					continue
				}
				if first.Token.Epoch >= second.Token.Epoch {
					out = append(out, fmt.Sprintf("S4: partition %d: claim %v ended before claim %v started", p, first.Token, second.Token))
				}
			}
		}
	}
	return out
}
