package coordinator

import "sync/atomic"

// traffic counts what this node sends over gossip, by channel: bytes
// written to streams (joins and push/pulls, both the side that dialed and
// the side that accepted) and to packets (probes, acks and gossip with
// their piggybacked broadcasts), and the push/pull states it encoded. The
// bytes a cluster transfers are the sum of what its nodes send.
type traffic struct {
	streamBytes atomic.Uint64
	packetBytes atomic.Uint64
	states      atomic.Uint64 // push/pull states sent (LocalState)
	stateBytes  atomic.Uint64 // their bytes, within streamBytes
	syncs       atomic.Uint64 // asks of a member with a newer stable membership for it (stable asks or push/pulls)
	stateSyncs  atomic.Uint64 // those that were push/pulls of whole states
	metaUpdates atomic.Uint64 // metadata updates gossiped (memberlist UpdateNode)
	queued      atomic.Uint64 // broadcasts of claims and stable memberships queued
	sentBcast   atomic.Uint64 // bytes of those handed to memberlist (each transmission), within packetBytes

	wholeStates     atomic.Uint64 // push/pull states that carried the whole register (joins), within states
	wholeStateBytes atomic.Uint64 // their bytes, within stateBytes
	sections        atomic.Uint64 // digest exchange: sections sent (asking and answering; SendReliable)
	sectionBytes    atomic.Uint64 // their bytes, within streamBytes
	exchangeDropped atomic.Uint64 // digest exchange sends dropped: queue full or peer unknown
	asksRefused     atomic.Uint64 // asking sections not answered: not due (exchange.go)
	stableAnswers   atomic.Uint64 // stable memberships sent to members that asked for them (exchange.go)
	stableRefused   atomic.Uint64 // stable asks not answered: no newer stable membership, not due, or the answers' queue full
	unverified      atomic.Uint64 // claims dropped from states and sections: tokens that did not verify
}
