//go:build !race

package coordinator

import (
	"fmt"
	"testing"
	"time"
)

// TestScaleDigest prints, behind -scale, what a quiet push/pull state,
// idle gossip and a join cost at 10 nodes as partitions grow (issue 22:
// gossip must stay flat when partitions double, a join under 200 KB at
// 4096 partitions):
//
//	go test ./coordinator -run TestScaleDigest -scale -v -count=1  (no -race)
//
// It prints scale.10x<P>.pushpull_bytes, .gossip_bytes_per_node_per_second
// and .join_bytes among scaleRun's figures.
func TestScaleDigest(t *testing.T) {
	if !*scaleFlag {
		t.Log("-scale not set")
		return
	}
	for _, p := range []int{271, 4096, 8192} {
		t.Run(fmt.Sprint(p), func(t *testing.T) { scaleRun(t, 10, p, 3*time.Minute) })
	}
}
