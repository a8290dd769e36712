package worker

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// Record names one event of a partition: produced (in the log, in order),
// or applied (one application of it, in the order they committed).
type Record struct {
	Partition uint32
	ID        string // unique within its partition: its offset, a message id
}

// Report is what Check found. A run is exactly-once when Err is nil.
type Report struct {
	Produced, Applied int
	// Duplicates counts applications of an event already applied; Gaps
	// produced events never applied; OutOfOrder applications of an event
	// produced before one already applied of its partition; Unknown
	// applications of events never produced.
	Duplicates, Gaps, OutOfOrder, Unknown int
	// Examples describes up to 10 of the violations.
	Examples []string
}

// Err describes the violations, or returns nil if there are none.
func (r Report) Err() error {
	var v []string
	add := func(n int, what string) {
		if n != 0 {
			v = append(v, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(r.Duplicates, "duplicate applications")
	add(r.Gaps, "events never applied")
	add(r.OutOfOrder, "applications out of order")
	add(r.Unknown, "applications of unknown events")
	if len(v) == 0 {
		return nil
	}
	return fmt.Errorf("worker: not exactly once: %s (%s)", strings.Join(v, ", "), strings.Join(r.Examples, "; "))
}

// Check verifies that every produced event was applied exactly once, and
// per partition in the order produced: produced lists each partition's
// events in log order, applied every application in commit order (the
// partitions interleaved as they like). Run it when the consumers are
// done: before that, the backlog counts as gaps.
func Check(produced, applied []Record) Report {
	r := Report{Produced: len(produced), Applied: len(applied)}
	example := func(format string, args ...any) {
		if len(r.Examples) < 10 {
			r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
		}
	}
	type pos struct {
		p  uint32
		id string
	}
	index := make(map[pos]int, len(produced)) // its place in its partition
	next := map[uint32]int{}
	for _, e := range produced {
		index[pos{e.Partition, e.ID}] = next[e.Partition]
		next[e.Partition]++
	}
	seen := make(map[pos]bool, len(applied))
	last := map[uint32]int{} // per partition: the place of the last applied, +1
	for _, a := range applied {
		k := pos{a.Partition, a.ID}
		i, ok := index[k]
		switch {
		case !ok:
			r.Unknown++
			example("p%d %q applied, never produced", a.Partition, a.ID)
		case seen[k]:
			r.Duplicates++
			example("p%d %q applied twice", a.Partition, a.ID)
		default:
			seen[k] = true
			if i+1 < last[a.Partition] {
				r.OutOfOrder++
				example("p%d %q applied after a later event", a.Partition, a.ID)
			}
			last[a.Partition] = max(last[a.Partition], i+1)
		}
	}
	for _, e := range produced {
		if !seen[pos{e.Partition, e.ID}] {
			r.Gaps++
			example("p%d %q never applied", e.Partition, e.ID)
		}
	}
	return r
}

// Query runs query on db and returns its rows as records: each row two
// columns, the partition (an integer) and the id (any type database/sql
// converts to a string). Order the rows: the log's order for the produced
// events, the commit order for the applied ones.
func Query(ctx context.Context, db *sql.DB, query string, args ...any) ([]Record, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("worker: query records: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var (
			p  int64
			id string
		)
		if err := rows.Scan(&p, &id); err != nil {
			return nil, fmt.Errorf("worker: query records: %w", err)
		}
		out = append(out, Record{Partition: uint32(p), ID: id})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("worker: query records: %w", err)
	}
	return out, nil
}
