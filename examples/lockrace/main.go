package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	goredislib "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/internal/netdelay"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// config is the command line.
type config struct {
	dsn          string
	redis        string
	etcd         []string
	clients      int
	keys, hot    int
	hotShare     float64
	duration     time.Duration
	rounds       int
	partitions   int
	redsyncDelay time.Duration
	pauseBound   time.Duration
	// delay is added to each direction of every round trip to the
	// services, by proxies on loopback: 0 runs them as they are.
	delay time.Duration
	// only, if not empty, names the guards to run (the others are left
	// out of the run and the report).
	only map[string]bool
}

// runs reports whether the guard called name is measured.
func (cfg config) runs(name string) bool { return len(cfg.only) == 0 || cfg.only[name] }

// prefix is the start of the figures' names: "locks" (or "batch"), with
// "_far" behind the delay proxies, "_c<clients>" for a client count and
// "_p<partitions>" for a partition count other than the defaults.
func (cfg config) prefix(what string) string {
	def := defaultConfig()
	if cfg.delay > 0 {
		what += "_far"
	}
	if cfg.clients != def.clients {
		what += fmt.Sprintf("_c%d", cfg.clients)
	}
	if cfg.partitions != def.partitions {
		what += fmt.Sprintf("_p%d", cfg.partitions)
	}
	return what
}

func defaultConfig() config {
	dsn := os.Getenv("TENURE_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	etcd := []string{"127.0.0.1:2379"}
	if s := os.Getenv("TENURE_ETCD_ENDPOINTS"); s != "" {
		etcd = strings.Split(s, ",")
	}
	return config{
		dsn: dsn, redis: "127.0.0.1:6379", etcd: etcd,
		clients: 8, keys: 256, hot: 4, hotShare: 0.25,
		duration: 3 * time.Second, rounds: 2, partitions: 271,
		redsyncDelay: 2 * time.Millisecond, pauseBound: 30 * time.Second,
	}
}

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.dsn, "dsn", cfg.dsn, "PostgreSQL DSN (default: TENURE_POSTGRES_DSN or the local test server)")
	flag.StringVar(&cfg.redis, "redis", cfg.redis, "Redis address")
	etcd := flag.String("etcd", strings.Join(cfg.etcd, ","), "etcd endpoints, comma-separated (default: TENURE_ETCD_ENDPOINTS or 127.0.0.1:2379)")
	flag.IntVar(&cfg.clients, "clients", cfg.clients, "concurrent clients")
	flag.IntVar(&cfg.keys, "keys", cfg.keys, "keys written")
	flag.IntVar(&cfg.hot, "hot", cfg.hot, "hot keys among them")
	flag.Float64Var(&cfg.hotShare, "hot-share", cfg.hotShare, "share of writes to the hot keys")
	flag.DurationVar(&cfg.duration, "duration", cfg.duration, "time each guard runs per round")
	flag.IntVar(&cfg.rounds, "rounds", cfg.rounds, "rounds (each runs every guard, in a rotating order)")
	flag.IntVar(&cfg.partitions, "partitions", cfg.partitions, "tenure's partitions")
	flag.DurationVar(&cfg.delay, "delay", 0, "time added to each direction of every round trip to PostgreSQL, Redis and etcd, by proxies on loopback: the services as if across a network (this machine's timers add about 0.1 ms)")
	flag.DurationVar(&cfg.redsyncDelay, "redsync-delay", cfg.redsyncDelay, "redsync's wait between tries for a taken lock; 0 keeps redsync's own default (50-250 ms at random, 32 tries)")
	only := flag.String("guards", "", "the guards to run, comma-separated (default: all of "+strings.Join(guardNames, ",")+")")
	flag.Parse()
	cfg.etcd = strings.Split(*etcd, ",")
	if *only != "" {
		cfg.only = map[string]bool{}
		for _, g := range strings.Split(*only, ",") {
			if !slices.Contains(guardNames, g) {
				fmt.Fprintf(os.Stderr, "lockrace: no guard %q (the guards: %s)\n", g, strings.Join(guardNames, ","))
				os.Exit(2)
			}
			cfg.only[g] = true
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lockrace:", err)
		os.Exit(1)
	}
}

// report is what run measured, per guard in guardNames order.
type report struct {
	results map[string]result
	landed  map[string]bool
	aErr    map[string]error
	why     map[string]string

	// tenure_batched's batches: mean writes, 99th percentile of the
	// longest queue wait in a batch (µs); unguarded_batched's mean.
	batchSize, batchWaitP99, unguardedBatchSize float64
}

var guardNames = []string{"unguarded", "tenure", "advisory", "redsync", "etcd_mutex", "tenure_batched", "unguarded_batched"}

// run measures every guard and prints the report to out. It fails if a
// guard can't run, or if a stale write landed under tenure.
func run(ctx context.Context, cfg config, out io.Writer) error {
	rep, err := measure(ctx, cfg)
	if err != nil {
		return err
	}
	rep.print(out, cfg)
	for _, g := range []string{"tenure", "tenure_batched"} {
		if rep.landed[g] {
			return fmt.Errorf("a paused holder's stale write landed under %s", g)
		}
	}
	return nil
}

// env is what the guards run against, and how to remove what the run
// made.
type env struct {
	db, pausedb *sql.DB
	rdb         *goredislib.Client
	etcd        *clientv3.Client
	id          string
	cleanup     []func(context.Context)
}

func (e *env) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := len(e.cleanup) - 1; i >= 0; i-- {
		e.cleanup[i](ctx)
	}
}

func connect(ctx context.Context, cfg config) (*env, error) {
	var b [4]byte
	rand.Read(b[:])
	e := &env{id: hex.EncodeToString(b[:])}
	redisAddr, etcd := cfg.redis, cfg.etcd
	if cfg.delay > 0 {
		var err error
		if redisAddr, err = e.delayed(cfg.redis, cfg.delay); err != nil {
			e.close()
			return nil, fmt.Errorf("redis: %w", err)
		}
		etcd = nil
		for _, ep := range cfg.etcd {
			addr, err := e.delayed(strings.TrimPrefix(ep, "http://"), cfg.delay)
			if err != nil {
				e.close()
				return nil, fmt.Errorf("etcd: %w", err)
			}
			etcd = append(etcd, addr)
		}
	}
	pc, err := pgx.ParseConfig(cfg.dsn)
	if err != nil { // not err itself: it quotes the DSN, password and all
		e.close()
		return nil, errors.New("the PostgreSQL DSN does not parse")
	}
	pc.Fallbacks = nil
	if cfg.delay > 0 {
		addr, err := e.delayed(net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))), cfg.delay)
		if err != nil {
			e.close()
			return nil, fmt.Errorf("PostgreSQL: %w", err)
		}
		host, port, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(port)
		pc.Host, pc.Port = host, uint16(n)
	}
	if e.db, err = openPostgres(ctx, pc, cfg.clients+4, nil); err != nil {
		e.close()
		return nil, err
	}
	e.cleanup = append(e.cleanup, func(context.Context) { e.db.Close() })
	// The pause scenario's sessions end when idle in a transaction for
	// 1.5 s, as kvstore's do (2 s): the bound any database guard needs for
	// a paused holder of a row or advisory lock.
	if e.pausedb, err = openPostgres(ctx, pc, 4, map[string]string{"idle_in_transaction_session_timeout": "1500"}); err != nil {
		e.close()
		return nil, err
	}
	e.cleanup = append(e.cleanup, func(context.Context) { e.pausedb.Close() })
	e.rdb = goredislib.NewClient(&goredislib.Options{Addr: redisAddr, PoolSize: cfg.clients + 4})
	e.cleanup = append(e.cleanup, func(context.Context) { e.rdb.Close() })
	if err := e.rdb.Ping(ctx).Err(); err != nil {
		e.close()
		return nil, fmt.Errorf("redis at %s is unreachable: %w", cfg.redis, err)
	}
	e.etcd, err = clientv3.New(clientv3.Config{Endpoints: etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		e.close()
		return nil, err
	}
	e.cleanup = append(e.cleanup, func(context.Context) { e.etcd.Close() })
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := e.etcd.Get(pctx, "lockrace/ping"); err != nil {
		e.close()
		return nil, fmt.Errorf("etcd at %v is unreachable: %w", cfg.etcd, err)
	}
	return e, nil
}

// delayed starts a proxy to addr that adds delay to each direction, closed
// with e, and returns the proxy's address.
func (e *env) delayed(addr string, delay time.Duration) (string, error) {
	p, err := netdelay.Start(addr, delay)
	if err != nil {
		return "", err
	}
	// Cleanups run last to first: the proxies close after the clients.
	e.cleanup = append([]func(context.Context){func(context.Context) { p.Close() }}, e.cleanup...)
	return p.Addr(), nil
}

// openPostgres opens a pool of conns connections configured by pc, with
// the given run-time parameters added, and checks that the server answers.
func openPostgres(ctx context.Context, pc *pgx.ConnConfig, conns int, params map[string]string) (*sql.DB, error) {
	pc = pc.Copy()
	for k, v := range params {
		pc.RuntimeParams[k] = v
	}
	db := stdlib.OpenDB(*pc)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("PostgreSQL is unreachable: %w", err)
	}
	return db, nil
}

// guards builds the guards on db, in guardNames order.
func (e *env) guards(ctx context.Context, cfg config, db *sql.DB, expiry time.Duration) ([]guard, error) {
	fence, err := sqlfence.New(db, sqlfence.Postgres(), sqlfence.Config{Table: "lockrace_fence_" + e.id, Concurrent: true})
	if err != nil {
		return nil, err
	}
	if err := fence.CreateSchema(ctx); err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, func(ctx context.Context) {
		fence.Close()
		e.db.ExecContext(ctx, `DROP TABLE IF EXISTS lockrace_fence_`+e.id)
	})
	ropts := []redsync.Option{redsync.WithExpiry(expiry)}
	if d := cfg.redsyncDelay; d > 0 {
		ropts = append(ropts, redsync.WithRetryDelay(d), redsync.WithTries(max(32, int(cfg.pauseBound/d))))
	}
	ttl := max(2, int(expiry/time.Second)) // etcd's shortest lease is about 2 s
	// The batched tenure guard claims on a fence table of its own, so that
	// its claims don't fence out the per-write guard's.
	bfence, err := sqlfence.New(db, sqlfence.Postgres(), sqlfence.Config{Table: "lockrace_fenceb_" + e.id})
	if err != nil {
		return nil, err
	}
	if err := bfence.CreateSchema(ctx); err != nil {
		return nil, err
	}
	parts := uint32(cfg.partitions)
	tb, err := newBatchedGuard("tenure_batched", &tenureGuard{fence: bfence, partitions: parts, nodes: map[string]*tenureNode{}}, parts, db)
	if err != nil {
		return nil, err
	}
	ub, err := newBatchedGuard("unguarded_batched", nil, parts, db)
	if err != nil {
		tb.closeBatcher()
		return nil, err
	}
	e.cleanup = append(e.cleanup, func(ctx context.Context) {
		tb.closeBatcher()
		ub.closeBatcher()
		bfence.Close()
		e.db.ExecContext(ctx, `DROP TABLE IF EXISTS lockrace_fenceb_`+e.id)
	})
	return []guard{
		unguarded{db: db},
		&tenureGuard{fence: fence, partitions: uint32(cfg.partitions), nodes: map[string]*tenureNode{}},
		advisory{db: db},
		&redsyncGuard{db: db, rs: redsync.New(goredis.NewPool(e.rdb)), ns: "lockrace:" + e.id + ":",
			opts: ropts},
		&etcdMutex{db: db, cli: e.etcd, ttl: ttl, prefix: "lockrace/" + e.id + "/"},
		tb, ub,
	}, nil
}

// setup connects, creates the counters and the guards for the
// throughput run; close the env when done.
func setup(ctx context.Context, cfg config) (*env, *store, []guard, error) {
	if cfg.clients < 1 || cfg.keys <= cfg.hot || cfg.hot < 0 || cfg.rounds < 1 || cfg.partitions < 1 {
		return nil, nil, nil, errors.New("need at least one client, round and partition, and more keys than hot keys")
	}
	e, err := connect(ctx, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	e.cleanup = append(e.cleanup, func(ctx context.Context) {
		if keys := e.rdb.Keys(ctx, "lockrace:"+e.id+":*").Val(); len(keys) > 0 {
			e.rdb.Del(ctx, keys...)
		}
		e.etcd.Delete(ctx, "lockrace/"+e.id+"/", clientv3.WithPrefix())
	})
	st, err := newStore(ctx, e.db, "lockrace_kv_"+e.id, cfg.keyNames())
	if err != nil {
		e.close()
		return nil, nil, nil, err
	}
	e.cleanup = append(e.cleanup, func(ctx context.Context) { st.drop(ctx) })
	gs, err := e.guards(ctx, cfg, e.db, 8*time.Second)
	if err != nil {
		e.close()
		return nil, nil, nil, err
	}
	return e, st, gs, nil
}

func (cfg config) keyNames() []string {
	keys := make([]string, cfg.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%04d", i)
	}
	return keys
}

func measure(ctx context.Context, cfg config) (*report, error) {
	e, st, gs, err := setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.close()
	keys := cfg.keyNames()
	rep := &report{results: map[string]result{}, landed: map[string]bool{}, aErr: map[string]error{}, why: map[string]string{}}
	defer func() {
		if b, ok := gs[len(gs)-2].(*batchedGuard); ok {
			rep.batchSize, rep.batchWaitP99 = b.batchFigures()
		}
		if b, ok := gs[len(gs)-1].(*batchedGuard); ok {
			rep.unguardedBatchSize, _ = b.batchFigures()
		}
	}()
	w := workload{clients: cfg.clients, keys: keys, hot: cfg.hot, hotShare: cfg.hotShare, duration: cfg.duration, seed: 1}
	for round := range cfg.rounds {
		for j := range gs {
			g := gs[(round+j)%len(gs)]
			if !cfg.runs(g.name()) {
				continue
			}
			r, err := w.run(ctx, st, g, round)
			if err != nil {
				return nil, err
			}
			total := rep.results[g.name()]
			total.add(r)
			rep.results[g.name()] = total
		}
	}

	// The pause scenario: locks that expire fast, sessions that end when
	// idle in a transaction.
	pst := &store{db: e.pausedb, table: st.table}
	pgs, err := e.guards(ctx, cfg, e.pausedb, time.Second)
	if err != nil {
		return nil, err
	}
	for _, g := range pgs {
		if !cfg.runs(g.name()) {
			continue
		}
		landed, aErr, err := staleWrite(ctx, pst, g, "paused-"+g.name(), cfg.pauseBound)
		if err != nil {
			return nil, fmt.Errorf("%s: pause scenario: %w", g.name(), err)
		}
		rep.landed[g.name()], rep.aErr[g.name()], rep.why[g.name()] = landed, aErr, g.why()
	}
	return rep, nil
}

func (r *report) print(out io.Writer, cfg config) {
	prefix := cfg.prefix("locks")
	base := r.results["unguarded"].opsPerSecond()
	for _, n := range guardNames {
		if !cfg.runs(n) {
			continue
		}
		res := r.results[n]
		fmt.Fprintf(out, "figure: %s.%s.ops_per_second %.0f\n", prefix, n, res.opsPerSecond())
		fmt.Fprintf(out, "figure: %s.%s.p50_ms %.2f\n", prefix, n, res.quantile(0.5))
		fmt.Fprintf(out, "figure: %s.%s.p99_ms %.2f\n", prefix, n, res.quantile(0.99))
		fmt.Fprintf(out, "figure: %s.%s.over_unguarded %.2f\n", prefix, n, res.opsPerSecond()/base)
		fmt.Fprintf(out, "figure: %s.%s.lost_updates %d\n", prefix, n, res.lost)
		fmt.Fprintf(out, "figure: %s.%s.failed %d\n", prefix, n, res.failed)
		fmt.Fprintf(out, "figure: %s.%s.stale_writes_landed %d\n", prefix, n, btoi(r.landed[n]))
	}
	r.printRatios(out, cfg, prefix)
	bprefix := cfg.prefix("batch")
	if cfg.runs("tenure_batched") {
		fmt.Fprintf(out, "figure: %s.size_mean %.1f\n", bprefix, r.batchSize)
		fmt.Fprintf(out, "figure: %s.wait_us_p99 %.0f\n", bprefix, r.batchWaitP99)
	}
	if cfg.runs("unguarded_batched") {
		fmt.Fprintf(out, "figure: %s.unguarded_size_mean %.1f\n", bprefix, r.unguardedBatchSize)
	}
	r.printTable(out, cfg)
}

// printRatios prints the ratios the guards are compared by, of the guards
// that ran.
func (r *report) printRatios(out io.Writer, cfg config, prefix string) {
	for _, x := range []struct{ a, b, name string }{
		{"tenure", "redsync", "over_redsync"},
		{"tenure", "etcd_mutex", "over_etcd_mutex"},
		{"tenure_batched", "redsync", "over_redsync"},
		{"tenure_batched", "etcd_mutex", "over_etcd_mutex"},
		{"tenure_batched", "tenure", "over_tenure"},
		// What the fence costs once amortized: fenced over unfenced,
		// with the same batching.
		{"tenure_batched", "unguarded_batched", "over_unguarded_batched"},
	} {
		if cfg.runs(x.a) && cfg.runs(x.b) {
			fmt.Fprintf(out, "figure: %s.%s.%s %.2f\n", prefix, x.a, x.name, r.results[x.a].opsPerSecond()/r.results[x.b].opsPerSecond())
		}
	}
	if cfg.runs("tenure_batched") && cfg.runs("unguarded") {
		fmt.Fprintf(out, "figure: %s.tenure_batched.p99_over_unguarded_p99 %.2f\n", prefix, r.results["tenure_batched"].quantile(0.99)/r.results["unguarded"].quantile(0.99))
	}
}

// printTable prints the figures as a table, and the pause scenario's
// verdicts.
func (r *report) printTable(out io.Writer, cfg config) {
	base := r.results["unguarded"].opsPerSecond()
	fmt.Fprintf(out, "\n%d clients, %d keys (%d hot, %.0f%% of writes), %v per guard x %d rounds; each write reads a counter and writes it plus one\n",
		cfg.clients, cfg.keys, cfg.hot, 100*cfg.hotShare, cfg.duration, cfg.rounds)
	if cfg.delay > 0 {
		fmt.Fprintf(out, "PostgreSQL, Redis and etcd behind proxies adding %v to each direction of a round trip\n", cfg.delay)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "guard\tops/s\tp50 ms\tp99 ms\tx unguarded\tlost updates\tstale write landed\t")
	for _, n := range guardNames {
		if !cfg.runs(n) {
			continue
		}
		res := r.results[n]
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t%.2f\t%d\t%v\t\n", n, res.opsPerSecond(), res.quantile(0.5), res.quantile(0.99), res.opsPerSecond()/base, res.lost, r.landed[n])
	}
	tw.Flush()
	fmt.Fprintln(out, "\nA paused holder (A read, paused until B took over and wrote, then wrote what it had computed):")
	for _, n := range guardNames {
		if !cfg.runs(n) {
			continue
		}
		verdict := "kept out"
		if r.landed[n] {
			verdict = "LANDED"
		}
		line := fmt.Sprintf("  %-10s %-8s %s", n, verdict, r.why[n])
		if !r.landed[n] && r.aErr[n] != nil {
			line += fmt.Sprintf(" (A got: %v)", r.aErr[n])
		}
		fmt.Fprintln(out, line)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
