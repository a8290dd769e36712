package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/tenure-go/tenure/coordinator/worker"
)

// Report is what Verify found. A run is correct when every count below
// Applications is zero.
type Report struct {
	Events       int // events in the log
	Applications int // rows of the applied log
	// Missing counts events never applied, DoubleApplied applications of
	// an event already applied, Phantoms applications of events not in
	// the log, OutOfOrder applications of an event after a later one of
	// its partition: worker.Check's Gaps, Duplicates, Unknown and
	// OutOfOrder.
	Missing, DoubleApplied, Phantoms, OutOfOrder int
	// BadBalances counts keys whose total is not the sum of their events'
	// amounts; BadOffsets partitions whose committed offset is not the end
	// of their log.
	BadBalances, BadOffsets int
}

// Err describes the violations, or returns nil if there are none.
func (r Report) Err() error {
	var v []string
	add := func(n int, what string) {
		if n != 0 {
			v = append(v, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(r.Missing, "events never applied")
	add(r.DoubleApplied, "events applied more than once")
	add(r.Phantoms, "applications of unknown events")
	add(r.OutOfOrder, "applications out of order")
	add(r.BadBalances, "wrong balances")
	add(r.BadOffsets, "offsets not at the end of the log")
	if len(v) == 0 {
		return nil
	}
	return fmt.Errorf("consumer: %s", strings.Join(v, ", "))
}

// Verify checks the store after a run: every event of the log applied
// exactly once and in order per partition (worker.Check of the log and
// the applied log), every balance the sum of its key's events, every
// committed offset at the end of its partition. Run it when no consumer
// is running and Lag is 0; before that, Missing and BadOffsets count the
// backlog.
func (s *Store) Verify(ctx context.Context) (Report, error) {
	var (
		produced []worker.Record
		ends     = map[uint32]int64{} // per partition: the offset after its last event
		sums     = map[string]int64{} // per key: the sum of its events' amounts
	)
	err := s.scan(ctx, s.q.allEvents, func(rows *sql.Rows) error {
		var (
			e Event
			p int64
		)
		if err := rows.Scan(&p, &e.Offset, &e.Key, &e.Amount); err != nil {
			return err
		}
		produced = append(produced, worker.Record{Partition: uint32(p), ID: fmt.Sprint(e.Offset)})
		ends[uint32(p)] = max(ends[uint32(p)], e.Offset+1)
		sums[e.Key] += e.Amount
		return nil
	})
	var applied []worker.Record
	if err == nil {
		applied, err = worker.Query(ctx, s.db, s.q.allApplied)
	}
	totals := map[string]int64{}
	if err == nil {
		err = s.scan(ctx, s.q.allBalances, func(rows *sql.Rows) error {
			var (
				key   string
				total int64
			)
			if err := rows.Scan(&key, &total); err != nil {
				return err
			}
			totals[key] = total
			return nil
		})
	}
	offsets := map[uint32]int64{}
	if err == nil {
		err = s.scan(ctx, s.q.allOffsets, func(rows *sql.Rows) error {
			var p, next int64
			if err := rows.Scan(&p, &next); err != nil {
				return err
			}
			offsets[uint32(p)] = next
			return nil
		})
	}
	if err != nil {
		return Report{}, fmt.Errorf("consumer: verify: %w", err)
	}

	c := worker.Check(produced, applied)
	r := Report{Events: c.Produced, Applications: c.Applied, Missing: c.Gaps, DoubleApplied: c.Duplicates, Phantoms: c.Unknown, OutOfOrder: c.OutOfOrder}
	for key, sum := range sums {
		if t, ok := totals[key]; !ok || t != sum {
			r.BadBalances++
		}
	}
	for key := range totals {
		if _, ok := sums[key]; !ok {
			r.BadBalances++
		}
	}
	for p, end := range ends {
		if offsets[p] != end {
			r.BadOffsets++
		}
	}
	for p, next := range offsets {
		if _, ok := ends[p]; !ok && next != 0 {
			r.BadOffsets++
		}
	}
	return r, nil
}

// scan runs query and calls row for each row.
func (s *Store) scan(ctx context.Context, query string, row func(*sql.Rows) error) error {
	rows, err := s.db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
