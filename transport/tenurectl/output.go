package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode"
)

// printJSON writes v as one line of JSON.
func printJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = printable(c)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// printable quotes a name a node sent if it holds anything that would
// garble a terminal (control characters, escapes, tabs), or is empty.
func printable(s string) string {
	if s == "" {
		return "-"
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Sprintf("%q", s)
		}
	}
	return s
}

// ranges writes sorted partition numbers compactly: 0-3,7,9-12.
func ranges(ps []uint32) string {
	var b strings.Builder
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ps[i], ps[j])
		} else {
			fmt.Fprintf(&b, "%d", ps[i])
		}
		i = j + 1
	}
	return b.String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
