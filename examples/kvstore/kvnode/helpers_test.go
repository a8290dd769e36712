package kvnode_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/ring"
)

func TestMain(m *testing.M) { tenuretest.VerifyTestMain(m) }

// testPartitions keeps the tests' rings small.
const testPartitions = 16

// testConfig is a node on loopback with the local preset, free ports and
// the given database.
func testConfig(name string, db database) kvnode.Config {
	cc := coordinator.LocalConfig()
	cc.Ring = ring.Config{Partitions: testPartitions, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
	return kvnode.Config{
		Name:        name,
		GossipAddr:  "127.0.0.1:0",
		GRPCAddr:    "127.0.0.1:0",
		StatusAddr:  "127.0.0.1:0",
		DataPath:    db.path,
		DSN:         db.dsn,
		Coordinator: cc,
	}
}

// database is where a test's nodes keep their data: a SQLite file, or a
// PostgreSQL schema of its own.
type database struct {
	path, dsn string
}

func (d database) open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := kvnode.OpenDB(d.path, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// fenceAbove fences old's partition in the SQLite database db with the
// token of an owner unknown to the cluster, one epoch above old, as a new
// owner would while old's holder is paused. It returns db, open until the
// test ends.
func fenceAbove(ctx context.Context, t *testing.T, db database, old ownership.Token) *sql.DB {
	t.Helper()
	sqldb := db.open(t)
	fence, err := sqlfence.New(sqldb, sqlfence.SQLite(), sqlfence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer fence.Close()
	newer := ownership.Token{Partition: old.Partition, Epoch: old.Epoch + 1, Owner: "intruder", Incarnation: 1}
	if _, err := fence.Fence(ctx, newer); err != nil {
		t.Fatal(err)
	}
	return sqldb
}

func sqliteDatabase(t *testing.T) database {
	return database{path: filepath.Join(t.TempDir(), "kv.db")}
}

// postgresDatabase is a schema of the test's own on the PostgreSQL test
// server, dropped when the test ends; the nodes reach it through a DSN
// whose search_path is that schema. It fails the test if the server can't
// be reached.
func postgresDatabase(t *testing.T) database {
	t.Helper()
	return database{dsn: testdb.PostgresSchemaDSN(t)}
}

// startCluster starts the nodes of cfgs, each joining the first, closes
// them when the test ends, and waits until they agree on the members and
// every partition is owned.
func startCluster(t *testing.T, cfgs ...kvnode.Config) []*kvnode.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var nodes []*kvnode.Node
	for i, cfg := range cfgs {
		if i > 0 {
			cfg.Seeds = []string{nodes[0].GossipAddr()}
		}
		n, err := kvnode.Start(ctx, cfg)
		if err != nil {
			t.Fatalf("start %s: %v", cfg.Name, err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	waitConverged(t, nodes, 20*time.Second)
	return nodes
}

// waitConverged waits until every node sees all of nodes as members and
// every partition has exactly one owner, holding a live lease.
func waitConverged(t *testing.T, nodes []*kvnode.Node, timeout time.Duration) {
	t.Helper()
	wctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tenuretest.WaitFor(wctx, t, "the cluster to converge", func() bool {
		for _, n := range nodes {
			if len(n.Coordinator().Members()) != len(nodes) {
				return false
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			err := n.Coordinator().WaitConverged(ctx)
			cancel()
			if err != nil {
				return false
			}
		}
		for p := range uint32(testPartitions) {
			owners := 0
			for _, n := range nodes {
				if _, err := n.Coordinator().LeaseOfPartition(p); err == nil {
					owners++
				}
			}
			if owners != 1 {
				return false
			}
		}
		return true
	})
}

// client dials one node's KV service directly, as an outside client does.
func client(t *testing.T, addr string) kvpb.KVClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return kvpb.NewKVClient(cc)
}

// ownerOf returns the index of the node that owns key, as nodes[0] sees it.
func ownerOf(t *testing.T, nodes []*kvnode.Node, key string) int {
	t.Helper()
	o, err := nodes[0].Coordinator().Owner([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		if n.Coordinator().Self().Name == o.Node {
			return i
		}
	}
	t.Fatalf("key %q: owner %q is not a node of the test", key, o.Node)
	return -1
}

func names(nodes []*kvnode.Node) string {
	var s []string
	for _, n := range nodes {
		s = append(s, n.Coordinator().Self().Name)
	}
	return fmt.Sprint(s)
}
