// Package gate forwards to package ownership/gate, where the per-partition
// gate a handler's writes pass now lives, beside the Lease it gates.
//
// Deprecated: import github.com/tenure-go/tenure/ownership/gate.
package gate

import "github.com/tenure-go/tenure/ownership/gate"

// Gate is gate.Gate.
//
// Deprecated: use ownership/gate.Gate.
type Gate = gate.Gate

// New is gate.New.
//
// Deprecated: use ownership/gate.New.
func New(partitions int) *Gate { return gate.New(partitions) }
