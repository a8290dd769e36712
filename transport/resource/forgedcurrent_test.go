package resource

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/transport"
)

// Issue 11, defect 2 (current tokens): a handler's Acquire writes to a
// downstream gRPC server, which answers ReasonStaleToken with a current
// token of epoch 2^64-1. Decoded with transport.StaleFromStatus and
// returned, it became the partition's mark, and every later claim failed
// with "epoch exhausted": the partition was unclaimable until the whole
// cluster restarted. In a keyed cluster a current token is believed only
// with a valid MAC and within gossip.MaxEpochJump; here the server
// forges unsigned, wrongly signed and correctly signed but huge current
// tokens, then behaves: every partition must be owned again, at a sane
// epoch.
func TestForgedCurrentCannotMakeAPartitionUnclaimable(t *testing.T) {
	t.Parallel()
	ctx := testkit.Ctx(t, 60*time.Second)
	keys, err := ownership.NewKeyring(ownership.Key("tenure test token key, 32 bytes"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := ownership.NewKeyring(ownership.Key("another cluster's token key...."))
	if err != nil {
		t.Fatal(err)
	}
	forge := func(tok ownership.Token) []ownership.Token {
		huge := ownership.Token{Partition: tok.Partition, Epoch: math.MaxUint64, Owner: "evil", Incarnation: 1}
		return []ownership.Token{
			huge,             // unsigned
			other.Sign(huge), // under another key
			keys.Sign(huge),  // authentic, but jumps 2^64 epochs
		}
	}
	// The downstream server: the first three writes under each partition's
	// first token are answered stale with a forged current token.
	var mu sync.Mutex
	forged := map[uint32]int{}
	net := newBufNet(t)
	net.serve("downstream", TokenGuardConfig{}, func(ctx context.Context) (string, error) {
		tok, _ := TokenFrom(ctx)
		mu.Lock()
		n := forged[tok.Partition]
		if n < 3 {
			forged[tok.Partition] = n + 1
		}
		mu.Unlock()
		if n < 3 {
			return "", transport.StaleStatus(&ownership.StaleTokenError{Token: tok, Current: forge(tok)[n]})
		}
		return "ok", nil
	})
	cc := net.conn("downstream")
	const partitions = 8
	cl, err := tenuretest.Start(ctx, tenuretest.Config{
		Nodes:      3,
		Partitions: partitions,
		Tweak:      func(c *coordinator.Config) { c.TokenKeys = keys },
		Handler: func(string) coordinator.Handler {
			return coordinator.HandlerFuncs{AcquireFunc: func(ctx context.Context, l *ownership.Lease) error {
				_, err := put(transport.WithToken(ctx, l.Token()), cc)
				if st, ok := transport.StaleFromStatus(err); ok {
					return st
				}
				return err
			}}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for p := range uint32(partitions) {
		if forged[p] != 3 {
			t.Errorf("p%d saw %d forged answers, want 3", p, forged[p])
		}
	}
	mu.Unlock()
	for _, name := range cl.Live() {
		for p := range uint32(partitions) {
			if l, err := cl.Node(name).LeaseOfPartition(p); err == nil && l.Token().Epoch > 100 {
				t.Errorf("p%d held by %s at %v", p, name, l.Token())
			}
		}
	}
}

// Issue 11, defect 2: a keyed coordinator believes a stale answer's
// current token only with a valid MAC, and a fence such as sqlfence keeps
// marks without theirs. With Signer set, the guard signs the current token
// of the stale answers it gives (here a Checker's, unsigned); without it
// the token is passed on as the Checker gave it.
func TestTokenGuardSignerSignsStaleAnswers(t *testing.T) {
	t.Parallel()
	ctx := testkit.Ctx(t, 10*time.Second)
	keys, err := ownership.NewKeyring(ownership.Key("tenure test token key, 32 bytes"))
	if err != nil {
		t.Fatal(err)
	}
	mark := fencetest.Tok(1, 9, "b", 1)
	checker := CheckerFunc(func(_ context.Context, t ownership.Token) error { return ownership.Stale(t, mark) })
	net := newBufNet(t)
	net.serve("signed", TokenGuardConfig{Keyring: keys, Checker: checker, Signer: keys}, admitted)
	net.serve("unsigned", TokenGuardConfig{Keyring: keys, Checker: checker}, admitted)
	call := keys.Sign(fencetest.Tok(1, 3, "a", 1))
	for addr, signed := range map[string]bool{"signed": true, "unsigned": false} {
		_, err := put(transport.WithToken(ctx, call), net.conn(addr))
		st, ok := transport.StaleFromStatus(err)
		if !ok {
			t.Fatalf("%s: %v, want a stale answer", addr, err)
		}
		if st.Current.Compare(mark) != 0 || (keys.Verify(st.Current) == nil) != signed {
			t.Fatalf("%s: current token %v (verify: %v), signed want %v", addr, st.Current, keys.Verify(st.Current), signed)
		}
	}
}
