package etcdfence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/internal/chaos"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ring"
	"github.com/tenure-go/tenure/transport/faultnet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestChaos is the chaos suite's etcd run, beside its memory and SQL runs
// (internal/chaos; the etcd client can't enter the main module, so the
// run lives here, on the suite's exported checks). Three coordinators
// with the etcd authority and fence, over a fault network, serve writers
// and readers of a register per partition kept in etcd, while a node is
// cut off and healed, and another crashes and restarts; at the end a
// holder writes under a token long superseded. Every fence, claim, write
// and read is recorded and the history is checked with porcupine against
// the fenced-register model (S1, S2), and the claims for strict issuance
// (S4). A control run with the fence's check left out of the writes must
// be caught by the same check.
func TestChaos(t *testing.T) {
	for _, fenced := range []bool{true, false} {
		name := "etcd"
		if !fenced {
			name = "control"
		}
		t.Run(name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			r := newChaosRun(t, seed, fenced)
			viol := r.run()
			fmt.Printf("figure: chaos.%s.operations %d\n", name, len(r.hist.Records()))
			fmt.Printf("figure: chaos.%s.stale_rejected %d\n", name, r.staleRejected())
			fmt.Printf("figure: chaos.%s.violations %d\n", name, len(viol))
			if fenced {
				for _, v := range viol {
					t.Error(v)
				}
				return
			}
			if !r.illegal {
				t.Errorf("the control run's stale write was not caught by porcupine (violations: %v)", viol)
			}
		})
	}
}

const chaosPartitions = 8

type chaosRun struct {
	t       *testing.T
	ctx     context.Context
	cli     *clientv3.Client
	fence   *etcdfence.Fence
	data    string
	fenced  bool
	net     *faultnet.Network
	hist    *chaos.History
	rng     *rand.Rand
	illegal bool

	mu     sync.Mutex
	nodes  map[string]*coordinator.Coordinator
	claims []claimRec
	tokens []ownership.Token // every token a lease was granted under
}

type claimRec struct {
	tok        ownership.Token
	start, end int64
	unknown    bool // the claim's outcome is unknown
}

func newChaosRun(t *testing.T, seed uint64, fenced bool) *chaosRun {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cli, fence, data := setup(t, etcdfence.Config{})
	return &chaosRun{
		t: t, ctx: ctx, cli: cli, fence: fence, data: data, fenced: fenced,
		net: faultnet.New(faultnet.WithSeed(seed)), hist: chaos.NewHistory(nil),
		rng: rand.New(rand.NewPCG(seed, 13)), nodes: map[string]*coordinator.Coordinator{},
	}
}

// recFence records every fence the coordinators make.
type recFence struct{ r *chaosRun }

func (f recFence) Fence(ctx context.Context, t ownership.Token) (ownership.Token, error) {
	start := chaos.Now()
	mark, err := f.r.fence.Fence(ctx, t)
	f.r.hist.Add(chaos.Record{Node: t.Owner, Kind: chaos.Fence, Token: t, Out: outcome(err), Start: start, End: chaos.Now()})
	return mark, err
}

// recAuthority records every claim: a won claim is a fence.
type recAuthority struct{ r *chaosRun }

func (a recAuthority) Strict() bool { return a.r.fence.Authority().Strict() }

func (a recAuthority) Claim(ctx context.Context, p uint32, n ownership.Node, seen ownership.Token) (ownership.Token, error) {
	start := chaos.Now()
	tok, err := a.r.fence.Authority().Claim(ctx, p, n, seen)
	end := chaos.Now()
	if errors.Is(err, ownership.ErrConflict) {
		return tok, err // nothing changed
	}
	rec := claimRec{tok: tok, start: start, end: end, unknown: err != nil}
	out := chaos.OK
	if err != nil {
		rec.tok = ownership.Token{Partition: p, Epoch: seen.Epoch + 1, Owner: n.Name, Incarnation: n.Incarnation}
		out = chaos.Unknown
	}
	a.r.mu.Lock()
	a.r.claims = append(a.r.claims, rec)
	a.r.mu.Unlock()
	a.r.hist.Add(chaos.Record{Node: n.Name, Kind: chaos.Fence, Token: rec.tok, Value: "claim", Out: out, Start: start, End: end})
	return tok, err
}

func outcome(err error) chaos.Outcome {
	switch {
	case err == nil:
		return chaos.OK
	case errors.Is(err, ownership.ErrStaleToken):
		return chaos.Stale
	case errors.Is(err, ownership.ErrNotFenced):
		return chaos.NotFenced
	}
	return chaos.Unknown
}

// start starts (or restarts) node name.
func (r *chaosRun) start(name string) {
	t := r.t
	tr, err := r.net.Transport(name, faultnet.TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = name
	cfg.Ring = ring.Config{Partitions: chaosPartitions, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
	cfg.Fence = recFence{r}
	cfg.Authority = recAuthority{r}
	cfg.Rand = rand.New(rand.NewPCG(r.rng.Uint64(), uint64(time.Now().UnixNano())))
	cfg.Handler = coordinator.HandlerFuncs{AcquireFunc: func(_ context.Context, l *ownership.Lease) error {
		r.mu.Lock()
		r.tokens = append(r.tokens, l.Token())
		r.mu.Unlock()
		return nil
	}}
	r.mu.Lock()
	for n, c := range r.nodes {
		if n != name {
			cfg.Seeds = append(cfg.Seeds, c.GossipAddr())
		}
	}
	r.mu.Unlock()
	ml := *cfg.Memberlist
	ml.Transport = tr
	cfg.Memberlist = &ml
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(r.ctx); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	r.mu.Lock()
	r.nodes[name] = c
	r.mu.Unlock()
}

func (r *chaosRun) crash(name string) {
	r.mu.Lock()
	c := r.nodes[name]
	delete(r.nodes, name)
	r.mu.Unlock()
	c.Close()
}

func (r *chaosRun) live() (names []string, cs []*coordinator.Coordinator) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for n, c := range r.nodes {
		names, cs = append(names, n), append(cs, c)
	}
	return names, cs
}

// write stores value in partition p's register under t, with the
// fence's check (or, in the control run, without it).
func (r *chaosRun) write(t ownership.Token, client int, node, value string) chaos.Outcome {
	key := r.data + "p/" + strconv.Itoa(int(t.Partition))
	text, _ := t.MarshalText()
	put := clientv3.OpPut(key, value+"|"+string(text))
	start := chaos.Now()
	var err error
	if r.fenced {
		_, err = r.fence.Do(r.ctx, t, ownership.Exact, put)
	} else {
		_, err = r.cli.Txn(r.ctx).Then(put).Commit()
	}
	r.hist.Add(chaos.Record{Client: client, Node: node, Kind: chaos.Write, Token: t, Value: value, Out: outcome(err), Start: start, End: chaos.Now()})
	return outcome(err)
}

// read reads partition p's register under t.
func (r *chaosRun) read(t ownership.Token, client int, node string) {
	key := r.data + "p/" + strconv.Itoa(int(t.Partition))
	start := chaos.Now()
	resp, err := r.fence.Do(r.ctx, t, ownership.Exact, clientv3.OpGet(key))
	rec := chaos.Record{Client: client, Node: node, Kind: chaos.Read, Token: t, Out: outcome(err), Start: start, End: chaos.Now()}
	if err == nil {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			v, text, _ := strings.Cut(string(kvs[0].Value), "|")
			rec.OutValue = v
			if err := rec.OutToken.UnmarshalText([]byte(text)); err != nil {
				r.t.Errorf("register of p%d holds %q: %v", t.Partition, kvs[0].Value, err)
			}
		}
	}
	r.hist.Add(rec)
}

// run runs the workload and the nemeses, and returns the violations.
func (r *chaosRun) run() []string {
	names := []string{"n1", "n2", "n3"}
	for _, n := range names {
		r.start(n)
	}
	defer func() {
		_, cs := r.live()
		for _, c := range cs {
			c.Close()
		}
	}()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for client := range 4 {
		seed := r.rng.Uint64()
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(client)))
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				ns, cs := r.live()
				i := rng.IntN(len(cs))
				l, err := cs[i].LeaseOfPartition(uint32(rng.IntN(chaosPartitions)))
				if err != nil {
					continue // not the owner
				}
				if rng.IntN(3) == 0 {
					r.read(l.Token(), client, ns[i])
				} else {
					r.write(l.Token(), client, ns[i], fmt.Sprintf("c%d-%d", client, seq))
				}
			}
		})
	}
	// The schedule: settle, cut n3 off and heal, crash n2 and restart it.
	phase := func(d time.Duration) {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-r.ctx.Done():
		}
	}
	phase(2 * time.Second)
	if err := r.net.Partition([]string{"n1", "n2"}, []string{"n3"}); err != nil {
		r.t.Fatal(err)
	}
	phase(3 * time.Second)
	r.net.Heal()
	phase(2 * time.Second)
	r.crash("n2")
	phase(3 * time.Second)
	r.start("n2")
	phase(3 * time.Second)
	close(stop)
	wg.Wait()

	// A holder paused since its grant writes under its old token: the
	// oldest token of a partition whose mark has moved past it.
	r.mu.Lock()
	tokens := append([]ownership.Token(nil), r.tokens...)
	r.mu.Unlock()
	var held chaos.Outcome
	for _, old := range tokens {
		if cur, err := r.fence.Current(r.ctx, old.Partition); err == nil && old.Compare(cur) < 0 {
			held = r.write(old, 9, old.Owner, "held")
			break
		}
	}
	viol := r.check()
	switch {
	case held == 0:
		viol = append(viol, "no partition changed hands: no held write")
	case r.fenced && held != chaos.Stale:
		viol = append(viol, fmt.Sprintf("the held write: %v, want stale", held))
	}
	return viol
}

func (r *chaosRun) staleRejected() int {
	n := 0
	for _, rec := range r.hist.Records() {
		if rec.Kind == chaos.Write && rec.Out == chaos.Stale {
			n++
		}
	}
	return n
}

// check runs porcupine over the history and the S4 check over the claims.
func (r *chaosRun) check() []string {
	var viol []string
	recs := r.hist.Records()
	res, err := chaos.Check(recs, 30*time.Second, r.t.TempDir())
	if err != nil {
		viol = append(viol, fmt.Sprintf("porcupine: %v", err))
	}
	for _, p := range res.Illegal {
		r.illegal = true
		viol = append(viol, fmt.Sprintf("partition %d is not linearizable (see %s)", p, res.Visualization))
	}
	for _, p := range res.Undecided {
		viol = append(viol, fmt.Sprintf("partition %d: porcupine gave up", p))
	}
	r.mu.Lock()
	claims := append([]claimRec(nil), r.claims...)
	r.mu.Unlock()
	viol = append(viol, checkS4(claims)...)
	writes := 0
	for _, rec := range recs {
		if rec.Kind == chaos.Write && rec.Out == chaos.OK {
			writes++
		}
	}
	if writes == 0 || len(claims) < chaosPartitions {
		viol = append(viol, fmt.Sprintf("run too tame: %d writes applied, %d claims", writes, len(claims)))
	}
	r.t.Logf("%d records, %d writes applied, %d claims, %d stale writes refused", len(recs), writes, len(claims), r.staleRejected())
	return viol
}

// checkS4 checks strict issuance: per partition, each epoch won by one
// node, won claims in real-time order, and epochs dense (every epoch up
// to the highest won, or claimed with an unknown outcome).
func checkS4(claims []claimRec) []string {
	var out []string
	by := map[uint32][]claimRec{}
	for _, c := range claims {
		by[c.tok.Partition] = append(by[c.tok.Partition], c)
	}
	for p, cs := range by {
		seen := map[uint64]bool{}
		var top uint64
		for _, a := range cs {
			seen[a.tok.Epoch] = true
			if a.unknown {
				continue
			}
			top = max(top, a.tok.Epoch)
			for _, b := range cs {
				if b.unknown || a == b {
					continue
				}
				if a.tok.Epoch == b.tok.Epoch {
					out = append(out, fmt.Sprintf("S4: p%d epoch %d won by %v and %v", p, a.tok.Epoch, a.tok, b.tok))
				}
				if a.end < b.start && a.tok.Epoch >= b.tok.Epoch {
					out = append(out, fmt.Sprintf("S4: p%d: claim %v ended before claim %v began", p, a.tok, b.tok))
				}
			}
		}
		for e := uint64(1); e <= top; e++ {
			if !seen[e] {
				out = append(out, fmt.Sprintf("S4: p%d: epoch %d never claimed, though %d was", p, e, top))
			}
		}
	}
	return out
}

// TestCheckS4Fires: the S4 check flags an epoch won twice, claims out of
// real-time order, and a gap.
func TestCheckS4Fires(t *testing.T) {
	c := func(epoch uint64, owner string, start, end int64) claimRec {
		return claimRec{tok: fencetest.Tok(1, epoch, owner, 1), start: start, end: end}
	}
	if v := checkS4([]claimRec{c(1, "a", 0, 1), c(2, "b", 2, 3), {tok: fencetest.Tok(1, 3, "c", 1), start: 4, end: 5, unknown: true}}); len(v) != 0 {
		t.Fatalf("a good history flagged: %v", v)
	}
	for _, bad := range [][]claimRec{
		{c(1, "a", 0, 1), c(1, "b", 2, 3)},
		{c(2, "a", 0, 1), c(1, "b", 2, 3)},
		{c(1, "a", 0, 1), c(3, "b", 2, 3)},
	} {
		if v := checkS4(bad); len(v) == 0 {
			t.Errorf("checkS4(%v) found nothing", bad)
		}
	}
}
