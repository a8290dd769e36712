package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// store is the counters table every guard writes, one row per key:
// value, and the name of the last writer.
type store struct {
	db    *sql.DB
	table string
}

func newStore(ctx context.Context, db *sql.DB, table string, keys []string) (*store, error) {
	s := &store{db: db, table: table}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (k TEXT PRIMARY KEY, v BIGINT NOT NULL, writer TEXT NOT NULL)`); err != nil {
		return nil, fmt.Errorf("create %s: %w", table, err)
	}
	return s, s.reset(ctx, keys)
}

// reset sets every key's counter to 0.
func (s *store) reset(ctx context.Context, keys []string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM `+s.table); err != nil {
		return err
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO `+s.table+` (k, v, writer) SELECT unnest($1::text[]), 0, ''`, keys)
	return err
}

func (s *store) drop(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+s.table)
	return err
}

// read returns key's counter.
func (s *store) read(ctx context.Context, q sqlfence.Tx, key string) (int64, error) {
	var v int64
	err := q.QueryRowContext(ctx, `SELECT v FROM `+s.table+` WHERE k = $1`, key).Scan(&v)
	return v, err
}

// write sets key's counter to v, naming the writer.
func (s *store) write(ctx context.Context, q sqlfence.Tx, key string, v int64, writer string) error {
	_, err := q.ExecContext(ctx, `UPDATE `+s.table+` SET v = $2, writer = $3 WHERE k = $1`, key, v, writer)
	return err
}

// increment is the read-modify-write every guard protects: read the
// counter, write it plus one, as two statements.
func (s *store) increment(ctx context.Context, q sqlfence.Tx, key, writer string) error {
	v, err := s.read(ctx, q, key)
	if err != nil {
		return err
	}
	return s.write(ctx, q, key, v+1, writer)
}

// sum returns the sum of all counters.
func (s *store) sum(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(v), 0) FROM `+s.table).Scan(&n)
	return n, err
}

// last returns key's counter and its last writer.
func (s *store) last(ctx context.Context, key string) (v int64, writer string, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT v, writer FROM `+s.table+` WHERE k = $1`, key).Scan(&v, &writer)
	return v, writer, err
}

// inTx runs fn in a transaction of db.
func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
