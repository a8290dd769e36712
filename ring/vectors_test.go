package ring_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/tenure-go/tenure/ring"
)

// vectorsFile holds the partition function's test vectors, part of the
// protocol: clients in other languages check their own hash against it.
const vectorsFile = "testdata/partition_vectors.txt"

// vector is one line of vectorsFile.
type vector struct {
	line       int
	key        []byte
	partitions int
	partition  uint32
	hash       uint64
}

func readVectors(t *testing.T) []vector {
	t.Helper()
	b, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 4 {
			t.Fatalf("%s:%d: %d fields, want 4", vectorsFile, n, len(f))
		}
		v := vector{line: n}
		if f[0] != "-" {
			if v.key, err = hex.DecodeString(f[0]); err != nil {
				t.Fatalf("%s:%d: key: %v", vectorsFile, n, err)
			}
		}
		if v.partitions, err = strconv.Atoi(f[1]); err != nil {
			t.Fatalf("%s:%d: partitions: %v", vectorsFile, n, err)
		}
		p, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			t.Fatalf("%s:%d: partition: %v", vectorsFile, n, err)
		}
		v.partition = uint32(p)
		if len(f[3]) != 16 {
			t.Fatalf("%s:%d: hash %q: want 16 hex digits", vectorsFile, n, f[3])
		}
		if v.hash, err = strconv.ParseUint(f[3], 16, 64); err != nil {
			t.Fatalf("%s:%d: hash: %v", vectorsFile, n, err)
		}
		vs = append(vs, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return vs
}

// vectorTables caches a one-member Table per partition count across the
// tests: a table of 2^20 partitions takes seconds to build under -race.
var vectorTables = map[int]*ring.Table{}

// checkVectors returns a line for each vector that ring and xxhash
// disagree with.
func checkVectors(t *testing.T, vs []vector) []string {
	t.Helper()
	tables := vectorTables
	var bad []string
	for _, v := range vs {
		tb := tables[v.partitions]
		if tb == nil {
			var err error
			if tb, err = ring.New([]string{"m"}, ring.Config{Partitions: v.partitions, VirtualNodes: 1, Load: 1.25}); err != nil {
				t.Fatalf("%s:%d: %v", vectorsFile, v.line, err)
			}
			tables[v.partitions] = tb
		}
		if h := xxhash.Sum64(v.key); h != v.hash {
			bad = append(bad, fmt.Sprintf("line %d: XXH64 = %016x, the file says %016x", v.line, h, v.hash))
		}
		p := tb.Partition(v.key)
		if ps := tb.PartitionString(string(v.key)); ps != p {
			bad = append(bad, fmt.Sprintf("line %d: Partition = %d but PartitionString = %d", v.line, p, ps))
		}
		if sp := ring.Partition(v.key, v.partitions); sp != p {
			bad = append(bad, fmt.Sprintf("line %d: Table.Partition = %d but Partition = %d", v.line, p, sp))
		}
		if sp := ring.PartitionString(string(v.key), v.partitions); sp != p {
			bad = append(bad, fmt.Sprintf("line %d: Table.Partition = %d but PartitionString = %d", v.line, p, sp))
		}
		if lp, _ := tb.Lookup(v.key); lp != p {
			bad = append(bad, fmt.Sprintf("line %d: Partition = %d but Lookup = %d", v.line, p, lp))
		}
		if p != v.partition {
			bad = append(bad, fmt.Sprintf("line %d: Partition = %d at %d partitions, the file says %d", v.line, p, v.partitions, v.partition))
		}
	}
	return bad
}

// ring's partition function is the one the protocol documents, on every
// vector of the file: XXH64 with seed 0 of the key bytes, mod partitions.
func TestPartitionVectors(t *testing.T) {
	vs := readVectors(t)
	for _, b := range checkVectors(t, vs) {
		t.Error(b)
	}
	// The file covers what a reimplementation gets wrong: the empty key,
	// binary bytes, every length class of XXH64 (under 4, 4 to 7, 8 to 31,
	// a 32-byte stripe and more), the longest key a call may carry, and
	// several partition counts, the default 271 among them.
	lengths, counts := map[int]bool{}, map[int]bool{}
	for _, v := range vs {
		lengths[len(v.key)] = true
		counts[v.partitions] = true
	}
	for _, n := range []int{0, 1, 4, 8, 31, 32, 33, 4096} {
		if !lengths[n] {
			t.Errorf("no vector with a %d-byte key", n)
		}
	}
	for _, n := range []int{1, 16, 271, 1 << 20} {
		if !counts[n] {
			t.Errorf("no vector at %d partitions", n)
		}
	}
	if len(vs) < 30 {
		t.Errorf("%d vectors, want at least 30", len(vs))
	}
}

// The check catches a wrong vector: a copy of the file's vectors with one
// partition and one hash changed fails on exactly those two.
func TestPartitionVectorsNegativeControl(t *testing.T) {
	vs := readVectors(t)
	wrong := append([]vector(nil), vs...)
	wrong[2].partition = (wrong[2].partition + 1) % uint32(wrong[2].partitions)
	if wrong[2].partitions == 1 {
		t.Fatal("pick a vector with more than one partition")
	}
	wrong[5].hash ^= 1 << 63
	bad := checkVectors(t, wrong)
	if len(bad) != 2 || !strings.Contains(bad[0], fmt.Sprintf("line %d:", vs[2].line)) || !strings.Contains(bad[1], fmt.Sprintf("line %d:", vs[5].line)) {
		t.Errorf("the check of two wrong vectors reported %q", bad)
	}
}

// An invalid partition count gives partition 0, not a panic.
func TestPartitionInvalidCount(t *testing.T) {
	for _, n := range []int{0, -1} {
		if p := ring.Partition([]byte("k"), n); p != 0 {
			t.Errorf("Partition at %d partitions = %d, want 0", n, p)
		}
		if p := ring.PartitionString("k", n); p != 0 {
			t.Errorf("PartitionString at %d partitions = %d, want 0", n, p)
		}
	}
}

// A count above 2^32 is invalid too: a partition is a uint32, so the
// partition of key among such a count (XXH64 mod the count) may not fit;
// it gives partition 0 rather than the value cut to 32 bits, which is
// no partition of the documented function.
func TestPartitionCountAboveUint32(t *testing.T) {
	if strconv.IntSize < 64 {
		return // no int holds such a count
	}
	var big uint64 = 1<<32 + 1
	for _, c := range []uint64{big, 1 << 33, 1<<63 - 1} {
		n := int(c)
		for i := range 32 {
			k := fmt.Sprintf("key-%d", i)
			if p := ring.PartitionString(k, n); p != 0 {
				t.Fatalf("PartitionString(%q, %d) = %d, want 0 (an invalid count)", k, n, p)
			}
			if p := ring.Partition([]byte(k), n); p != 0 {
				t.Fatalf("Partition(%q, %d) = %d, want 0 (an invalid count)", k, n, p)
			}
		}
	}
}
