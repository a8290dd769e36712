package ring

// Move is a change of owner of one partition between two Tables. From is ""
// when the partition had no owner (it did not exist in the old Table, or the
// old Table is nil); To is "" when it has none in the new one.
type Move struct {
	Partition uint32
	From, To  string
}

// Diff returns every partition whose owner differs between old and new, in
// ascending partition order, or nil if none does. Either Table may be nil
// (treated as empty): Diff(nil, t) moves every partition of t from "". If the
// Tables have different partition counts, partitions missing from one side
// have owner "" there; such a diff is well defined, but keys map to different
// partitions under the two Tables, so it says little about where keys went.
func Diff(old, new *Table) []Move {
	n := max(old.Partitions(), new.Partitions())
	var moves []Move
	for p := range uint32(n) {
		if from, to := old.Owner(p), new.Owner(p); from != to {
			moves = append(moves, Move{Partition: p, From: from, To: to})
		}
	}
	return moves
}
