package chaos

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// Negative controls for the suite's checks: each is fed one bad record
// beside good ones and must flag it, and only it. A check that went blind
// (returned nothing) would let the chaos runs pass whatever happened, so
// each has its own control here, fast, apart from the runs.

// The SQL resource's S1 check reads the log of applied writes: a write
// under a token below one applied before it is a violation.
func TestSQLS1CatchesAStaleWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db, err := openSQL(filepath.Join(t.TempDir(), "s1.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r, err := newSQLResource(ctx, db, true, NewHistory(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	log := func(p uint32, epoch int64, owner string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, `INSERT INTO chaos_log (partition_id, epoch, owner, inc, value) VALUES (?, ?, ?, ?, ?)`,
			p, epoch, owner, incText(1), "v"); err != nil {
			t.Fatal(err)
		}
	}
	log(1, 1, "a")
	log(1, 2, "b")
	log(2, 1, "a") // another partition: its own order
	log(1, 2, "b") // the same token again is no violation
	if v, err := r.s1(ctx); err != nil || len(v) != 0 {
		t.Fatalf("S1 on a good log: %v, %v", v, err)
	}
	log(1, 1, "a") // applied after e2: the one bad record
	v, err := r.s1(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 1 || v[0].tok.Epoch != 1 || v[0].above.Epoch != 2 || v[0].tok.Partition != 1 {
		t.Fatalf("S1 on a log with one stale write: %v", s1Strings(v))
	}
}

// The memory resource's S1 check, fed the same way (fencing off).
func TestMemoryS1CatchesAStaleWrite(t *testing.T) {
	ctx := context.Background()
	r, err := newMemResource(4, false, NewHistory(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range []ownership.Token{tok(1, "a"), tok(2, "b"), tok(2, "b")} {
		if err := r.write(ctx, tk, "v"); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := r.s1(ctx); len(v) != 0 {
		t.Fatalf("S1 on good writes: %v", s1Strings(v))
	}
	if err := r.write(ctx, tok(1, "a"), "late"); err != nil {
		t.Fatal(err)
	}
	if v, _ := r.s1(ctx); len(v) != 1 || !v[0].tok.Same(tok(1, "a")) {
		t.Fatalf("S1 after one stale write: %v", s1Strings(v))
	}
}

// S2: a read or write answered under a token must start after a fence
// with that token returned. A claim that fenced doesn't count.
func TestCheckS2CatchesAWriteBeforeItsFence(t *testing.T) {
	a := tok(1, "a")
	signed := a
	signed.MAC[0] = 7 // the same grant, as the MAC'd token a node holds
	good := []Record{
		{Kind: Fence, Token: a, Out: OK, Start: 0, End: 10},
		{Kind: Write, Token: signed, Out: OK, Start: 11, End: 12},
		{Kind: Read, Token: a, Out: OK, Start: 13, End: 14},
		{Kind: Write, Token: tok(2, "b"), Out: Stale, Start: 1, End: 2}, // refused: not a use of the token
	}
	if v := checkS2(good); len(v) != 0 {
		t.Fatalf("S2 on a good history: %v", v)
	}
	for name, bad := range map[string]Record{
		"a write before the fence returned": {Kind: Write, Token: a, Out: OK, Start: 5, End: 6},
		"a read under a token never fenced": {Kind: Read, Token: tok(3, "c"), Out: OK, Start: 20, End: 21},
	} {
		if v := checkS2(append(append([]Record(nil), good...), bad)); len(v) != 1 {
			t.Errorf("S2 with %s: %v, want one violation", name, v)
		}
	}
	claimOnly := []Record{
		{Kind: Fence, Token: tok(4, "d"), Value: claimFence, Out: OK, Start: 0, End: 1},
		{Kind: Write, Token: tok(4, "d"), Out: OK, Start: 2, End: 3},
	}
	if v := checkS2(claimOnly); len(v) != 1 {
		t.Errorf("S2 with a write fenced only by its claim: %v, want one violation", v)
	}
}

// S3: no token granted twice.
func TestCheckS3CatchesATokenGrantedTwice(t *testing.T) {
	grants := map[ownership.Token]int{tok(1, "a"): 1, tok(2, "b"): 1}
	if v := checkS3(grants); len(v) != 0 {
		t.Fatalf("S3 on distinct grants: %v", v)
	}
	grants[tok(2, "b")]++
	if v := checkS3(grants); len(v) != 1 {
		t.Fatalf("S3 with a token granted twice: %v", v)
	}
}

// S4: per partition, a claim that ended before another started has a
// lower epoch, and each epoch is held by one node. Failed claims don't
// count.
func TestCheckS4CatchesClaimsOutOfOrder(t *testing.T) {
	claim := func(p uint32, epoch uint64, owner string, start, end int64) claimRec {
		return claimRec{Start: start, End: end, Token: ownership.Token{Partition: p, Epoch: epoch, Owner: owner, Incarnation: 1}}
	}
	good := []claimRec{
		claim(1, 1, "a", 0, 1),
		claim(1, 2, "b", 2, 3),
		claim(1, 3, "a", 4, 9),
		claim(1, 4, "b", 5, 6), // overlaps the e3 claim: either order is real time
		claim(2, 1, "b", 0, 1), // another partition
		{Start: 10, End: 11, Token: ownership.Token{Partition: 1, Epoch: 1, Owner: "c", Incarnation: 1}, Err: "conflict"},
	}
	if v := checkS4(good); len(v) != 0 {
		t.Fatalf("S4 on good claims: %v", v)
	}
	for name, bad := range map[string]claimRec{
		"an epoch below an earlier claim's":  claim(1, 3, "a", 20, 21), // e4 ended before it started
		"an epoch held by two nodes at once": claim(2, 1, "a", 0, 1),
	} {
		if v := checkS4(append(append([]claimRec(nil), good...), bad)); len(v) == 0 {
			t.Errorf("S4 with %s: no violation", name)
		}
	}
}

// No acknowledged write is lost: the final read of each partition returns
// a value written no earlier than the last acknowledged write started.
func TestCheckAckedCatchesALostWrite(t *testing.T) {
	cl := &cluster{cfg: runConfig{partitions: 1, clients: 1}, keys: map[uint32]string{0: "k"}}
	a := tok(1, "a")
	recs := []Record{
		{Kind: Write, Token: a, Value: "w1", Out: OK, Start: 1, End: 2},
		{Kind: Write, Token: a, Value: "w2", Out: OK, Start: 3, End: 4},
	}
	op := func(client int, write bool, value string, start, end int64, read string) clientOp {
		return clientOp{client: client, key: "k", write: write, value: value, start: start, end: end, rep: reply{Value: read}}
	}
	acked := []clientOp{op(0, true, "w1", 1, 2, ""), op(0, true, "w2", 3, 4, "")}
	if v := cl.checkAcked(append(acked, op(1, false, "", 10, 11, "w2")), recs); len(v) != 0 {
		t.Fatalf("a final read of the last acknowledged write: %v", v)
	}
	if v := cl.checkAcked(append(acked, op(1, false, "", 10, 11, "w1")), recs); len(v) != 1 {
		t.Fatalf("a final read of an overwritten value: %v, want one violation", v)
	}
	if v := cl.checkAcked(acked, recs); len(v) != 1 {
		t.Fatalf("no final read: %v, want one violation", v)
	}
	failed := op(1, false, "", 10, 11, "")
	failed.err = errors.New("unavailable")
	if v := cl.checkAcked(append(acked, failed), recs); len(v) != 1 {
		t.Fatalf("a failed final read: %v, want one violation", v)
	}
}

// The throttled run's duel check counts a partition whose mark goes back
// to an owner it had left, and only that: a handover to a third node
// (the negative control) is a change, not a duel.
func TestThrottleWatchCatchesADuel(t *testing.T) {
	var w throttleWatch
	seen := [][]string{{"a"}, {"a"}}
	for _, marks := range [][]string{{"b", "b"}, {"a", ""}, {"a", "c"}} {
		w.observe(seen, marks)
	}
	if w.duels != 1 || w.changes != 4 {
		t.Errorf("a->b->a and a->b->c: %d duels and %d changes, want 1 and 4", w.duels, w.changes)
	}
	if w.victim() != "duel" {
		t.Errorf("victim = %q, want duel", w.victim())
	}
}
