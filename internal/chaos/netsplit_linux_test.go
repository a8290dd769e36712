package chaos

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-go/tenure/internal/netns"
	"github.com/tenure-go/tenure/internal/testdb"
)

// TestChaosNetSplit runs the SIGSTOP cluster on a real network
// (internal/netns): the child in a network namespace of its own, this
// process's two nodes on the host's address, the data in PostgreSQL, which
// the child reaches through a relay that is a node of the network. Then
// the child's cable is pulled (Isolate: its gossip and its database are
// cut alike, by the hub's bridge) until the others have fenced every
// partition it held, and put back; the child must write again, the nodes
// converge, and the history passes every run's checks. It needs root and
// fails without it.
func TestChaosNetSplit(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -run TestChaosNetSplit -v ./internal/chaos/ -chaos.seed=%d)", seed, seed)
	r := runNetSplit(t, seed)
	r.print("violations")
	r.fail(t)
}

func runNetSplit(t *testing.T, seed uint64) result {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	n, err := netns.New(childName, "db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	dsn := testdb.PostgresSchemaDSN(t)
	pg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	relay, err := n.Relay("db", fmt.Sprintf("%s:%d", pg.Host, pg.Port), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = relay.Addr()
	// A node cut off inside a transaction leaves the server holding its
	// row locks (the server's end of the connection, at the relay, is
	// alive), and the new owner's claim of the partition can wait on
	// them: one of this run's first six runs without the setting failed
	// so ("claim of p7 above epoch 2: timeout", again and again). The
	// server ends such a session after 2 s (PostgreSQL's
	// idle_in_transaction_session_timeout, sent as a startup parameter).
	q := u.Query()
	q.Set("idle_in_transaction_session_timeout", "2000")
	u.RawQuery = q.Encode()
	s := startSigClusterAt(ctx, t, seed, sigPlace{
		bind: n.HostAddr().String(), childBind: n.Addr(childName).String(),
		dsn: dsn, childDSN: u.String(),
		command: func(name string, args ...string) *exec.Cmd { return n.Command(childName, name, args...) },
	})
	owned := s.childOwned(ctx)
	if err := n.Isolate(childName); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	taken := s.takenOver(ctx, owned)
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	if !taken {
		t.Fatalf("the others did not take over the child's partitions %v within 30 s:\n%s", owned, sigDiagnosis(ctx, s.res, s.auth, s.nodes, owned))
	}
	t.Logf("netsplit: child %s isolated %v, its %d partitions fenced by others, reconnected",
		childName, time.Since(cut).Round(time.Millisecond), len(owned))
	after := s.childStats(OK)
	if !waitFor(ctx, 30*time.Second, func() bool { return s.childStats(OK) > after }) {
		t.Errorf("the child made no write after the heal (%d before); stderr:\n%s", after, s.stderr.String())
	}
	return s.finish(ctx, "netsplit", 1)
}
