package sqlfence

// Queued is the number of writes of partition p waiting in b's queue (not
// yet sent), for tests that must know a batch is formed.
func (b *Batcher) Queued(p uint32) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.queues[p]; q != nil {
		return len(q.calls)
	}
	return 0
}
