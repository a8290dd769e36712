package coordinator

import (
	"errors"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
)

// errUnbelievedCurrent: a resource refused a token as stale, but the
// current token it named is not believed. The lease ends as a failure
// (the partition is claimed again after a backoff); the machine does not
// learn the current token as the partition's mark.
var errUnbelievedCurrent = errors.New("coordinator: a resource answered stale with a current token that is not believed")

// currentError says why cur, the current token a resource named when it
// refused t as stale, is not believed, or returns nil. A resource is
// input from the network, like gossip: a current token is believed only
// if it is of t's partition and above t, authentic (a valid MAC, when
// Config.TokenKeys is set), and no more than gossip.MaxEpochJump above
// what this node knows. So no resource can make a partition unclaimable
// ("epoch exhausted") by naming a current token of epoch 2^64-1.
func (c *Coordinator) currentError(t, cur ownership.Token) error {
	if cur.Partition != t.Partition || cur.Compare(t) <= 0 {
		return fmt.Errorf("current token %v is no rival of %v", cur, t)
	}
	if k := c.cfg.TokenKeys; k != nil {
		if err := k.Verify(cur); err != nil {
			return err
		}
	}
	if known := max(c.reg.Get(cur.Partition).Epoch, t.Epoch); cur.Epoch-known > gossip.MaxEpochJump {
		return fmt.Errorf("current token %v jumps %d epochs above %d", cur, cur.Epoch-known, known)
	}
	return nil
}

// vetStale returns err, the answer of a fence or of the handler's Acquire
// under t, unchanged unless it holds a *ownership.StaleTokenError whose
// current token is not believed (currentError): that becomes an error
// wrapping errUnbelievedCurrent and no StaleTokenError.
func (c *Coordinator) vetStale(t ownership.Token, err error) error {
	var st *ownership.StaleTokenError
	if !errors.As(err, &st) {
		return err
	}
	if verr := c.currentError(t, st.Current); verr != nil {
		c.log.Warn("stale answer with a current token that is not believed", "token", t, "current", st.Current, "err", verr)
		return fmt.Errorf("%w: %v (%s)", errUnbelievedCurrent, verr, err.Error())
	}
	return err
}
