package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	_ "modernc.org/sqlite"             // driver "sqlite"

	"github.com/tenure-go/tenure/examples/consumer/consumer"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

func main() {
	dsn := flag.String("dsn", "", `database: "" for SQLite in a temporary file, or a postgres:// URL (the example's tables, prefixed "consumer_", are dropped before and after)`)
	events := flag.Int("events", 2000, "events to produce")
	nodes := flag.Int("nodes", 3, "consumer nodes (at least 3)")
	partitions := flag.Int("partitions", 16, "partitions of the log")
	batch := flag.Int("batch", 32, "most events per batch")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := run(ctx, *dsn, Scenario{
		Events:     *events,
		Nodes:      *nodes,
		Partitions: *partitions,
		BatchSize:  *batch,
		Progress:   os.Stdout,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nreport: %d events, %d applications, %d stale commits rejected, %d applied twice, %d missed\n",
		res.Events, res.Applications, res.Rejected, res.DoubleApplied, res.Missing)
	res.WriteFigures(os.Stdout)
	if err := res.Err(); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

// run opens the database named by dsn and runs sc on it.
func run(ctx context.Context, dsn string, sc Scenario) (Result, error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		if dsn != "" {
			return Result{}, fmt.Errorf("consumer: -dsn %q: want a postgres:// URL, or nothing for SQLite", dsn)
		}
		dir, err := os.MkdirTemp("", "tenure-consumer")
		if err != nil {
			return Result{}, err
		}
		defer os.RemoveAll(dir)
		// WAL and a busy timeout: the nodes and the producer write
		// concurrently, and SQLite has one writer at a time.
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "consumer.db")+
			"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
		if err != nil {
			return Result{}, err
		}
		defer db.Close()
		sizePool(db, sc)
		sc.DB, sc.Dialect = db, sqlfence.SQLite()
		return sc.Run(ctx)
	}

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return Result{}, err
	}
	defer db.Close()
	sizePool(db, sc)
	sc.DB, sc.Dialect = db, sqlfence.Postgres()
	// Start from empty tables, and leave none behind.
	store, err := consumer.NewStore(db, sc.Dialect, consumer.DefaultPrefix)
	if err != nil {
		return Result{}, err
	}
	defer store.Close()
	if err := store.DropSchema(ctx); err != nil {
		return Result{}, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := store.DropSchema(ctx); err != nil {
			log.Printf("consumer: %v", err)
		}
	}()
	return sc.Run(ctx)
}

// sizePool sizes db's pool for a goroutine per partition. Each node's
// worker.Runtime runs up to MaxConcurrent batches at once (8, its
// default), each holding a connection for its read and its fenced
// commit, and the nodes of this program share db, with the producer.
// database/sql keeps only 2 idle connections by default: every
// connection past those is closed when it is put back and opened again
// for the next batch, a new PostgreSQL backend each time. A consumer with
// a goroutine per partition on that default opened 15-21 connections a
// second, and its tests took over 5.5 minutes instead of 27 s with the
// idle pool raised. So: as many idle connections as open ones, enough for
// every batch in progress plus the producer.
func sizePool(db *sql.DB, sc Scenario) {
	const maxConcurrent = 8 // worker.Config.MaxConcurrent's default, per node
	n := max(sc.Nodes, 3)*min(max(sc.Partitions, 1), maxConcurrent) + 2
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
}
