package readme

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// front is the front page, from the repository's root.
const front = "README.md"

// maxFrontLines is the front page's length limit: it says what tenure is,
// the two commands, a first service and what is promised, and links to
// the rest.
const maxFrontLines = 250

// docs returns every Markdown file of the repository, as slash-separated
// paths from its root, front page first. It walks the tree, skipping
// .git and node_modules (an npm ci'd client's dependencies).
func docs(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			if rel = filepath.ToSlash(rel); rel != front {
				out = append(out, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{front}, out...)
}

// read returns the text of the doc at rel, a path from the root.
func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// prose returns text with the lines of its fenced code blocks blanked, so
// that what looks like a heading or a link inside code is not one.
func prose(text string) string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// slugDrop matches what GitHub drops from a heading to make its anchor.
var slugDrop = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)

// anchors returns the anchors of text's headings as GitHub makes them:
// lower case, punctuation dropped, spaces as hyphens, a repeated one
// suffixed -1, -2, ...
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(prose(text), "\n") {
		h := strings.TrimLeft(l, "#")
		if len(h) == len(l) || !strings.HasPrefix(h, " ") {
			continue
		}
		a := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
		for i, b := 1, a; out[a]; i++ {
			a = fmt.Sprintf("%s-%d", b, i)
		}
		out[a] = true
	}
	return out
}

// link matches a Markdown link's target.
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// links returns the targets of the links in text's prose.
func links(text string) []string {
	var out []string
	for _, m := range link.FindAllStringSubmatch(prose(text), -1) {
		out = append(out, m[1])
	}
	return out
}

// resolve returns the path from the root that target, a link in the doc
// at doc, names, and its anchor ("" if none); or an error if it leaves the
// repository.
func resolve(doc, target string) (file, anchor string, err error) {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return "", "", fmt.Errorf("links outside the repository: %s", target)
	}
	file, anchor, _ = strings.Cut(target, "#")
	if file == "" {
		return doc, anchor, nil
	}
	if path.IsAbs(file) {
		return "", "", fmt.Errorf("links outside the repository: %s", target)
	}
	file = path.Clean(path.Join(path.Dir(doc), file))
	if file == ".." || strings.HasPrefix(file, "../") {
		return "", "", fmt.Errorf("links outside the repository: %s", target)
	}
	return file, anchor, nil
}

// brokenLinks returns an error for each link of the doc at doc (a path
// from the root, text its content) that leaves the repository, names a
// file or directory that does not exist, or names an anchor that no
// heading of the Markdown file it names makes. read returns a doc's text.
func brokenLinks(doc, text string, read func(string) (string, error)) []error {
	var out []error
	for _, target := range links(text) {
		file, anchor, err := resolve(doc, target)
		if err != nil {
			out = append(out, err)
			continue
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(file))); err != nil && file != doc {
			out = append(out, fmt.Errorf("links to a missing path: %s", target))
			continue
		}
		if anchor == "" {
			continue
		}
		if !strings.HasSuffix(file, ".md") {
			out = append(out, fmt.Errorf("links to an anchor in a file that is not Markdown: %s", target))
			continue
		}
		body := text
		if file != doc {
			if body, err = read(file); err != nil {
				out = append(out, fmt.Errorf("%s: %v", target, err))
				continue
			}
		}
		if !anchors(body)[anchor] {
			out = append(out, fmt.Errorf("links to an anchor no heading of %s makes: %s", file, target))
		}
	}
	return out
}

// url matches a URL anywhere in a doc, code included.
var url = regexp.MustCompile(`https?://\S+`)

// TestLinksStayInTheRepository checks that no doc links to anything
// outside the repository or has a URL, and that every relative link names
// a file or directory that exists, and an anchor its heading makes.
func TestLinksStayInTheRepository(t *testing.T) {
	reader := func(rel string) (string, error) { return read(t, rel), nil }
	for _, d := range docs(t) {
		text := read(t, d)
		for _, err := range brokenLinks(d, text, reader) {
			t.Errorf("%s %v", d, err)
		}
		for _, u := range url.FindAllString(text, -1) {
			t.Errorf("%s has a URL: %s", d, u)
		}
	}
}

// TestBrokenLinksAreCaught is the negative control of
// TestLinksStayInTheRepository: each kind of broken link, written in a doc
// of a subfolder, is reported, and the good ones are not.
func TestBrokenLinksAreCaught(t *testing.T) {
	files := map[string]string{"coordinator/TIMING.md": "# Timing\n\n## Choosing Grace, and the reach check\n"}
	reader := func(rel string) (string, error) {
		if s, ok := files[rel]; ok {
			return s, nil
		}
		return "", fmt.Errorf("%s: not a test doc", rel)
	}
	const doc = "ownership/X.md"
	good := []string{"[a](../coordinator/TIMING.md)", "[b](../coordinator/TIMING.md#choosing-grace-and-the-reach-check)",
		"[c](../README.md)", "[d](fencetest)", "[e](#here)"}
	for _, l := range good {
		if errs := brokenLinks(doc, "# Here\n\n"+l+"\n", reader); len(errs) != 0 {
			t.Errorf("a good link %s is reported: %v", l, errs)
		}
	}
	bad := []string{"[a](coordinator/TIMING.md)", "[b](../coordinator/NOPE.md)", "[c](../../outside.md)",
		"[d](/etc/passwd)", "[e](https://example.com/x)", "[f](../coordinator/TIMING.md#no-such-heading)",
		"[g](#nowhere)", "[h](../go.mod#x)"}
	for _, l := range bad {
		if errs := brokenLinks(doc, "# Here\n\n"+l+"\n", reader); len(errs) != 1 {
			t.Errorf("a broken link %s: %d errors, want 1 (%v)", l, len(errs), errs)
		}
	}
	if errs := brokenLinks(doc, "```sh\n[x](nope.md)\n```\n", reader); len(errs) != 0 {
		t.Errorf("a link inside a code block is checked as a link: %v", errs)
	}
	if a := anchors("# Why not a lock?\n## A, b\n## A, b\n```sh\n# comment\n```\n"); !a["why-not-a-lock"] || !a["a-b"] || !a["a-b-1"] || a["comment"] {
		t.Errorf("anchors: %v", a)
	}
}

// unlinked returns the docs (paths from the root, the front page's own
// excluded) that the front page's text does not link to directly: a
// newcomer finds each deep topic one click away.
func unlinked(text string, docs []string) []string {
	linked := map[string]bool{}
	for _, target := range links(text) {
		if file, _, err := resolve(front, target); err == nil {
			linked[file] = true
		}
	}
	var out []string
	for _, d := range docs {
		if d != front && !linked[d] {
			out = append(out, d)
		}
	}
	return out
}

// TestEveryDocIsOneClickAway checks that the front page links to every
// other Markdown file of the repository, and is a front page: under
// maxFrontLines lines.
func TestEveryDocIsOneClickAway(t *testing.T) {
	ds := docs(t)
	if len(ds) < 2 {
		t.Fatalf("docs found: %v; the walk would check nothing", ds)
	}
	text := read(t, front)
	for _, d := range unlinked(text, ds) {
		t.Errorf("%s does not link to %s", front, d)
	}
	if err := tooLong(text); err != nil {
		t.Errorf("%s %v", front, err)
	}
}

// tooLong returns an error if text, the front page, has maxFrontLines
// lines or more.
func tooLong(text string) error {
	if n := strings.Count(text, "\n"); n >= maxFrontLines {
		return fmt.Errorf("has %d lines, want under %d: move a topic into a document beside its code", n, maxFrontLines)
	}
	return nil
}

// TestUnlinkedDocsAreCaught is the negative control of
// TestEveryDocIsOneClickAway: a doc the front page does not link to (or
// names only inside a code block) is reported, and so is a front page of
// maxFrontLines lines.
func TestUnlinkedDocsAreCaught(t *testing.T) {
	ds := []string{front, "coordinator/TIMING.md", "ownership/FENCES.md"}
	text := "[t](coordinator/TIMING.md#x)\n```sh\n[f](ownership/FENCES.md)\n```\n"
	if got := unlinked(text, ds); len(got) != 1 || got[0] != "ownership/FENCES.md" {
		t.Errorf("unlinked: %v, want [ownership/FENCES.md]", got)
	}
	if tooLong(strings.Repeat("line\n", maxFrontLines-1)) != nil || tooLong(strings.Repeat("line\n", maxFrontLines)) == nil {
		t.Errorf("tooLong does not draw the line at %d lines", maxFrontLines)
	}
	const missing = "examples/NOT_LINKED_FROM_THE_FRONT_PAGE.md"
	if got := unlinked(read(t, front), append(docs(t), missing)); !slices.Contains(got, missing) {
		t.Errorf("a doc the front page does not link to: unlinked says %v", got)
	}
}
