package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// TestContract runs the fence contract suite against every engine, both
// ways of running a fenced transaction (Do, DoConn), and, on PostgreSQL,
// both modes (Config.Concurrent false and true), with the SQL authority.
func TestContract(t *testing.T) {
	for b, via := range everyPath() {
		for _, conc := range []bool{false, true} {
			if conc && b.name == "sqlite" {
				continue // SQLite ignores Concurrent
			}
			name := b.name + "/" + via.name
			if conc {
				name += "/concurrent"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				subject := func(t testing.TB, cfg sqlfence.Config) fencetest.Subject {
					cfg.Concurrent = conc
					return sqlSubject(t, b, via, cfg)
				}
				fencetest.Run(t, fencetest.Config{
					New: func(t testing.TB) fencetest.Subject { return subject(t, sqlfence.Config{}) },
					NewKeyed: func(t testing.TB, keys *ownership.Keyring) fencetest.Subject {
						return subject(t, sqlfence.Config{Verifier: keys, Signer: keys})
					},
					Strict: true,
				})
			})
		}
	}
}

// sqlSubject is a fence of its own on a fresh database of b, writing to
// a key/value table through via.
func sqlSubject(t testing.TB, b backend, via path, cfg sqlfence.Config) fencetest.Subject {
	db := b.open(t)
	f, _ := newFenceTable(t, db, b.dialect, cfg)
	kv := newKV(t, db, via)
	return fencetest.Subject{
		Fence:   f,
		Current: f.Current,
		Write: func(ctx context.Context, tk ownership.Token, m ownership.Mode, k, v string) error {
			return kv.put(ctx, f, tk, m, k, v)
		},
		Read: func(ctx context.Context, k string) (string, error) {
			var v string
			err := db.QueryRowContext(ctx, `SELECT v FROM "`+kv.table+`" WHERE k = $1`, k).Scan(&v)
			if errors.Is(err, sql.ErrNoRows) {
				return "", nil
			}
			return v, err
		},
		Authority: f.Authority(),
	}
}
