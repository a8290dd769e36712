package main

import (
	"context"
	"fmt"
	"strings"

	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

// statusJSON is the node's status as -json prints it: the names of the
// status page's JSON.
type statusJSON struct {
	Node            string       `json:"node"`
	Cluster         string       `json:"cluster"`
	Incarnation     string       `json:"incarnation"`
	Started         bool         `json:"started"`
	Converged       bool         `json:"converged"`
	Quorum          bool         `json:"quorum"`
	NoQuorum        string       `json:"no_quorum"`
	Stable          []string     `json:"stable"`
	StableVersion   uint64       `json:"stable_version"`
	Leaving         bool         `json:"leaving"`
	StaleRejections uint64       `json:"stale_rejections"`
	PartitionCount  uint32       `json:"partition_count"`
	Owned           uint32       `json:"owned"`
	Moving          uint32       `json:"moving"`
	Elsewhere       uint32       `json:"elsewhere"`
	Unowned         uint32       `json:"unowned"`
	Members         []memberJSON `json:"members"`
}

type memberJSON struct {
	Name        string  `json:"name"`
	GossipAddr  string  `json:"gossip_addr"`
	ServiceAddr string  `json:"service_addr"`
	Self        bool    `json:"self"`
	Held        uint32  `json:"held"`
	RingShare   uint32  `json:"ring_share"`
	FairShare   float64 `json:"fair_share"`
}

// status prints the node's health and members.
func (c *cli) status(ctx context.Context, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: status takes no arguments", errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	r, err := c.client.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return c.callError("status", err)
	}
	s := statusJSON{Node: r.GetNode(), Cluster: r.GetCluster(), Incarnation: r.GetIncarnation(), Started: r.GetStarted(),
		Converged: r.GetConverged(), Quorum: r.GetQuorum(), NoQuorum: r.GetNoQuorum(), Stable: append([]string{}, r.GetStable()...),
		StableVersion: r.GetStableVersion(), Leaving: r.GetLeaving(),
		StaleRejections: r.GetStaleRejections(), PartitionCount: r.GetPartitionCount(), Owned: r.GetOwned(),
		Moving: r.GetMoving(), Elsewhere: r.GetElsewhere(), Unowned: r.GetUnowned(), Members: []memberJSON{}}
	for _, m := range r.GetMembers() {
		s.Members = append(s.Members, memberJSON{Name: m.GetName(), GossipAddr: m.GetGossipAddr(), ServiceAddr: m.GetServiceAddr(),
			Self: m.GetSelf(), Held: m.GetHeld(), RingShare: m.GetRingShare(), FairShare: m.GetFairShare()})
	}
	if c.json {
		return printJSON(c.out, s)
	}
	quorum := quorumText(s)
	fmt.Fprintf(c.out, "node        %s  (cluster %s, incarnation %s)\n", printable(s.Node), printable(s.Cluster), printable(s.Incarnation))
	if !s.Started {
		fmt.Fprintln(c.out, "health      no partition table yet: the node has not started or joined")
		return nil
	}
	health := []string{"converged " + yesNo(s.Converged), "quorum " + quorum, fmt.Sprintf("stale writes rejected %d", s.StaleRejections)}
	if s.Leaving {
		health = append(health, "LEAVING")
	}
	fmt.Fprintf(c.out, "health      %s\n", strings.Join(health, ", "))
	fmt.Fprintf(c.out, "partitions  %d, %d held here; moving %d, held elsewhere %d, unowned %d\n\n",
		s.PartitionCount, s.Owned, s.Moving, s.Elsewhere, s.Unowned)
	t := newTable(c.out, "MEMBER", "GOSSIP", "SERVICE", "HELD", "RING", "FAIR SHARE")
	for _, m := range s.Members {
		name := m.Name
		if m.Self {
			name += " (this node)"
		}
		t.row(name, m.GossipAddr, m.ServiceAddr, fmt.Sprint(m.Held), fmt.Sprint(m.RingShare), fmt.Sprintf("%.1f", m.FairShare))
	}
	return t.flush()
}

// quorumText is the status line's quorum: yes or no, the stable set it is
// counted against, and why there is none. A node of an older version
// sends neither the reason nor the version; without a stable set either,
// it reports nothing.
func quorumText(s statusJSON) string {
	set := ""
	switch {
	case len(s.Stable) > 0 && s.StableVersion > 0:
		set = fmt.Sprintf(" (stable set of %d, v%d)", len(s.Stable), s.StableVersion)
	case len(s.Stable) > 0: // a node of an older version sends no version
		set = fmt.Sprintf(" (stable set of %d)", len(s.Stable))
	}
	switch {
	case s.Quorum:
		return "yes" + set
	case s.NoQuorum != "":
		return "NO" + set + ": " + printable(s.NoQuorum)
	case set != "":
		return "NO" + set
	default:
		return "not reported"
	}
}
