package sqlfence

import (
	"context"
	"errors"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
)

// ErrSessionEnded is wrapped by the error of Do and DoConn when the
// database ended the transaction's session before its commit was sent:
// PostgreSQL's idle_in_transaction_session_timeout, pg_terminate_backend,
// a server restart, a connection cut. Nothing was committed: a server
// rolls back a transaction whose session ends before COMMIT, and releases
// its locks. The error is a *SessionEndedError; it also wraps the error
// that showed it (fn's, unchanged, or the check's), and, if the partition's
// mark had moved past the token by then, a *ownership.StaleTokenError:
// the lease is over (a paused owner's session, ended by the timeout while
// a new owner fenced). Without a stale token the lease may still be live:
// read the state again and retry.
//
// A session that ends during the COMMIT is not this error: the commit
// may have landed, and the error wraps ownership.ErrOutcomeUnknown.
var ErrSessionEnded = errors.New("sqlfence: the database ended the session before the commit; nothing was committed")

// SessionEndedError is the error of a fenced transaction whose session
// the database ended before the commit. errors.Is(err, ErrSessionEnded)
// holds, and so does errors.Is for Err and, if set, Stale.
type SessionEndedError struct {
	Token ownership.Token // the transaction's token
	Err   error           // what showed it: fn's error, or the check's
	// Stale is the *ownership.StaleTokenError found when the mark was
	// read after the session ended; nil if the token was still the mark,
	// or the mark could not be read.
	Stale error
}

func (e *SessionEndedError) Error() string {
	s := fmt.Sprintf("%v (under %v): %v", ErrSessionEnded, e.Token, e.Err)
	if e.Stale != nil {
		s += "; and " + e.Stale.Error()
	}
	return s
}

// Unwrap returns ErrSessionEnded, Err and Stale (if set).
func (e *SessionEndedError) Unwrap() []error {
	errs := []error{ErrSessionEnded, e.Err}
	if e.Stale != nil {
		errs = append(errs, e.Stale)
	}
	return errs
}

// sessionEnded returns the error of t's transaction whose session ended
// before its commit, err being what showed it: the mark is read on
// another connection, under a context that outlives ctx, to tell a lease
// that is over.
func (f *Fence) sessionEnded(ctx context.Context, t ownership.Token, err error) error {
	e := &SessionEndedError{Token: t, Err: err}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if mark, _, rerr := f.read(rctx, f.db, f.sql.current, t.Partition); rerr == nil && t.Compare(mark) < 0 {
		e.Stale = ownership.Stale(t, f.signed(mark))
	}
	return e
}
