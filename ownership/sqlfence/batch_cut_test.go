package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tenure-go/tenure/internal/netdelay"
	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// throughProxy opens be's test server again, through a proxy that adds
// delay to each direction of a round trip: closing the proxy cuts every
// connection of the handle, with the answers it holds still undelivered.
func throughProxy(t *testing.T, be backend, delay time.Duration) (*sql.DB, *netdelay.Proxy) {
	t.Helper()
	var target string
	var open func(addr string) (*sql.DB, error)
	switch be.name {
	case "postgres":
		dsn, _ := testdb.PostgresDSN()
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		target = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
		open = func(addr string) (*sql.DB, error) {
			host, port, _ := net.SplitHostPort(addr)
			n, _ := strconv.Atoi(port)
			cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(n), nil
			return stdlib.OpenDB(*cfg), nil
		}
	case "mariadb":
		cfg, err := mysql.ParseDSN(mysqlDSN())
		if err != nil {
			t.Fatal(err)
		}
		target = cfg.Addr
		open = func(addr string) (*sql.DB, error) {
			cfg.Addr = addr
			dsn, sep := cfg.FormatDSN(), "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			return sql.Open("mysql", dsn+sep+"sql_mode="+url.QueryEscape("'STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION,ANSI_QUOTES'"))
		}
	default:
		t.Fatalf("no proxy for %s", be.name)
	}
	proxy, err := netdelay.Start(target, delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	db, err := open(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, proxy
}

// A batch whose commit landed but whose answer was lost (the connection
// cut while the answer was on its way): every caller of the batch gets
// ErrOutcomeUnknown, no context error, no refusal; the batch is not run
// again; and a retry of each write by its request id, at the next batch,
// finds it applied once.
func TestBatcherLostCommitAnswerIsUnknownForAll(t *testing.T) {
	for _, be := range []backend{backends()[1], mariadb} {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
			direct := be.open(t)
			reqs := newRequests(t, direct, be.dialect, nil)
			f, fenceT := newFenceTable(t, direct, be.dialect, sqlfence.Config{})
			r := &batchRig{db: direct, mysql: be.name == "mariadb", f: f, table: uniqueName(t, direct, "data")}
			if _, err := direct.ExecContext(ctx, `CREATE TABLE "`+r.table+`" (id BIGINT PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			// The batcher commits through the proxy, on the same tables.
			slow, proxy := throughProxy(t, be, 300*time.Millisecond)
			slowFence, err := sqlfence.New(slow, be.dialect, sqlfence.Config{Table: fenceT})
			if err != nil {
				t.Fatal(err)
			}
			defer slowFence.Close()
			r.b, err = sqlfence.NewBatcher(slowFence, sqlfence.BatchConfig{Requests: reqs, Observe: func(i sqlfence.BatchInfo) {
				r.mu.Lock()
				r.batches = append(r.batches, i)
				r.mu.Unlock()
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer r.b.Close()
			retry, err := sqlfence.NewBatcher(f, sqlfence.BatchConfig{Requests: reqs}) // direct: for the retries
			if err != nil {
				t.Fatal(err)
			}
			defer retry.Close()
			tk := fencetest.Tok(1, 1, "a", 1)
			fenced(t, r.f, tk)

			release, first := r.hold(t, ctx, tk, 0)
			ids := []string{"a", "b", "c"}
			var chs []<-chan outcome
			for i, id := range ids {
				chs = append(chs, r.async(ctx, tk, id, r.insert(i+1)))
				r.queued(t, 1, i+1)
			}
			// Cut the proxy's connections as soon as the batch's rows are
			// visible directly: its commit's answer is still in the proxy.
			cut := closeWhen(ctx, proxy, func() bool { return len(r.rowsOrNil(ctx)) >= 4 })
			release()
			if o := get(t, first); o.err != nil {
				t.Fatal(o.err)
			}
			if err := <-cut; err != nil {
				t.Fatalf("the batch never committed: %v", err)
			}
			for i, ch := range chs {
				o := get(t, ch)
				if !errors.Is(o.err, ownership.ErrOutcomeUnknown) || isAny(o.err, context.Canceled, context.DeadlineExceeded, ownership.ErrStaleToken, ownership.ErrLeaseEnded) {
					t.Fatalf("write %d of a batch whose commit's answer was lost: %v; want ErrOutcomeUnknown alone", i, o.err)
				}
			}
			infos := r.infos()
			if last := infos[len(infos)-1]; last.Writes != 3 || last.Runs != 1 || !errors.Is(last.Err, ownership.ErrOutcomeUnknown) {
				t.Fatalf("the cut batch: %+v; want 3 writes, run once, outcome unknown", last)
			}
			// The callers retry, by request id: applied once, each.
			for i, id := range ids {
				res, dup, err := retry.Do(ctx, tk, id, r.insert(i+10))
				if err != nil || !dup || string(res) != fmt.Sprint(i+1) {
					t.Fatalf("retry of %s: %q, dup %v, %v; want the first write's result", id, res, dup, err)
				}
			}
			if got := fmt.Sprint(r.rows(t)); got != "[0 1 2 3]" {
				t.Fatalf("rows %s; want [0 1 2 3]", got)
			}
		})
	}
}

// rowsOrNil is rows, nil on an error (for a poller, off the test's
// goroutine).
func (r *batchRig) rowsOrNil(ctx context.Context) []int {
	rs, err := r.db.QueryContext(ctx, `SELECT id FROM "`+r.table+`"`)
	if err != nil {
		return nil
	}
	defer rs.Close()
	var ids []int
	for rs.Next() {
		var id int
		if rs.Scan(&id) != nil {
			return nil
		}
		ids = append(ids, id)
	}
	return ids
}
