package readme

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// glossary is the Go file whose doc defines the promises' labels.
const glossary = "ownership/doc.go"

var (
	// promised matches a label the front page defines: **S1 Fencing.**, **L1**.
	promised = regexp.MustCompile(`\*\*([SL][0-9])\b`)
	// defined matches a label the glossary defines: a list item "//   - S1 ...".
	defined = regexp.MustCompile(`(?m)^//\s+- ([SL][0-9]) `)
)

// labels returns the first submatches of re in text, sorted, once each.
func labels(re *regexp.Regexp, text string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// undefined returns the labels the front page defines that the glossary's
// source does not, and those the glossary defines that the front page
// does not.
func undefined(front, src string) (notInGlossary, notOnFront []string) {
	f, g := labels(promised, front), labels(defined, src)
	for _, l := range f {
		if !slices.Contains(g, l) {
			notInGlossary = append(notInGlossary, l)
		}
	}
	for _, l := range g {
		if !slices.Contains(f, l) {
			notOnFront = append(notOnFront, l)
		}
	}
	return notInGlossary, notOnFront
}

// TestLabelsAreDefinedInTheCode checks that the promises' labels (S1-S4,
// L1-L5) the front page states are the ones package ownership's doc
// defines, so that a reader of the code finds them without the README.
func TestLabelsAreDefinedInTheCode(t *testing.T) {
	text, src := read(t, front), read(t, glossary)
	if n := len(labels(promised, text)); n < 9 {
		t.Fatalf("%s defines %d labels, want S1-S4 and L1-L5", front, n)
	}
	a, b := undefined(text, src)
	if len(a) > 0 {
		t.Errorf("%s does not define %v, which %s states", glossary, a, front)
	}
	if len(b) > 0 {
		t.Errorf("%s defines %v, which %s does not state", glossary, b, front)
	}
}

// TestUndefinedLabelsAreCaught is its negative control: the glossary
// without its L3 line, and a front page without S2, are reported.
func TestUndefinedLabelsAreCaught(t *testing.T) {
	text, src := read(t, front), read(t, glossary)
	var kept []string
	for _, l := range strings.Split(src, "\n") {
		if !strings.Contains(l, "- L3 ") {
			kept = append(kept, l)
		}
	}
	if a, _ := undefined(text, strings.Join(kept, "\n")); !slices.Equal(a, []string{"L3"}) {
		t.Errorf("a glossary without L3: undefined says %v, want [L3]", a)
	}
	if _, b := undefined(strings.ReplaceAll(text, "**S2", "**"), src); !slices.Equal(b, []string{"S2"}) {
		t.Errorf("a front page without S2: undefined says %v, want [S2]", b)
	}
}
