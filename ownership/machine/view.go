package machine

import (
	"cmp"
	"slices"
)

// BuildView decides the View a shell gives SetView from what the shell
// knows of the membership: members are the live members as their metadata,
// last heard, shows them (this node included; Unreachable where the
// shell's reach check says so), in any order; left names the members that
// left gracefully since the last view (see View.Left).
//
// The view holds the members sorted by name. The ring places partitions on
// the members that are not leaving: place is called with their names,
// sorted, and returns the placement over exactly them (a shell keeps the
// one it has when the names are unchanged). With no such member (every
// member is leaving, this node too) the view has no placement and place is
// not called: nothing is placed any more.
//
// The coordinator's loop and the simulator both build their views here,
// so what the simulator checks is the view the coordinator gives its
// machine.
func BuildView(members []ViewMember, left []string, place func(names []string) Placement) View {
	v := View{Members: slices.Clone(members), Left: left}
	slices.SortFunc(v.Members, func(a, b ViewMember) int { return cmp.Compare(a.Name, b.Name) })
	if names := Placed(v.Members); len(names) > 0 {
		v.Placement = place(names)
	}
	return v
}

// Placed returns the names of the members the ring places partitions on:
// those that are not leaving, sorted.
func Placed(members []ViewMember) []string {
	var names []string
	for _, m := range members {
		if !m.Leaving {
			names = append(names, m.Name)
		}
	}
	slices.Sort(names)
	return names
}
