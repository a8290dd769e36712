// Package consumertest is the cluster of consumers that the worker's
// tests and natssource's run through faults: a tenuretest cluster whose
// nodes run a worker.Runtime each, and a Hold per node that freezes its
// batches between the read and the commit, as a paused process would.
package consumertest
