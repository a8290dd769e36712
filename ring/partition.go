package ring

import "github.com/cespare/xxhash/v2"

// Partition returns key's partition among partitions, the documented
// partition function (see the package doc): XXH64(key, seed 0) mod
// partitions. It needs no Table, for a producer that is not a member of
// the cluster; use the cluster's Config.Partitions. Partitions below 1 or
// above 2^32 (invalid counts: a partition is a uint32) give partition 0.
// It does not allocate.
func Partition(key []byte, partitions int) uint32 {
	if !validCount(partitions) {
		return 0
	}
	return reduce(xxhash.Sum64(key), uint64(partitions))
}

// PartitionString is Partition for a string key. It does not allocate.
func PartitionString(key string, partitions int) uint32 {
	if !validCount(partitions) {
		return 0
	}
	return reduce(xxhash.Sum64String(key), uint64(partitions))
}

// validCount reports whether partitions is a count whose partitions all
// fit a uint32.
func validCount(partitions int) bool {
	return partitions >= 1 && uint64(partitions) <= 1<<32
}

// reduce maps a key's hash to its partition: the one reduction every
// partition lookup of the package uses.
func reduce(h, partitions uint64) uint32 { return uint32(h % partitions) }
