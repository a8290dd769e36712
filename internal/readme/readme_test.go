package readme

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// A snippet is one ```go block of a Markdown file and the function it says
// it is quoted from (a path from the repository's root, whichever folder
// the Markdown file is in).
type snippet struct {
	line int      // the line of its opening fence, 1-based
	file string   // the quoting file, relative to the root
	fn   string   // the function's name ("Recv.Name" for a method)
	body []string // the block's lines, between the fences
}

// quoted matches the comment that must come right before a ```go block.
var quoted = regexp.MustCompile(`^<!-- quoted from (\S+_test\.go) (\S+) -->$`)

// snippets returns the ```go blocks of a Markdown file's text, or an error
// naming the first block that has no "quoted from" comment right before
// it (blank lines between are allowed) or is not closed.
func snippets(text string) ([]snippet, error) {
	lines := strings.Split(text, "\n")
	var out []snippet
	for i := 0; i < len(lines); i++ {
		open := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(open, "```") {
			continue
		}
		lang := strings.TrimSpace(strings.TrimPrefix(open, "```"))
		end := i + 1
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("line %d: a code block is not closed", i+1)
		}
		if lang == "go" {
			prev := i - 1
			for prev >= 0 && strings.TrimSpace(lines[prev]) == "" {
				prev--
			}
			var m []string
			if prev >= 0 {
				m = quoted.FindStringSubmatch(strings.TrimSpace(lines[prev]))
			}
			if m == nil {
				return nil, fmt.Errorf("line %d: a ```go block without a <!-- quoted from FILE_test.go FUNC --> comment right before it", i+1)
			}
			out = append(out, snippet{line: i + 1, file: m[1], fn: m[2], body: lines[i+1 : end]})
		}
		i = end
	}
	return out, nil
}

// normalize drops blank lines and reduces every run of white space to
// one space, trimming each line: indentation and gofmt's alignment of
// comments don't count.
func normalize(lines []string) []string {
	var out []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return out
}

// funcSource returns the source of the function fn (from its func keyword
// to its closing brace) in the Go file at path.
func funcSource(path, fn string) ([]string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) == 1 {
			t := fd.Recv.List[0].Type
			if s, ok := t.(*ast.StarExpr); ok {
				t = s.X
			}
			if id, ok := t.(*ast.Ident); ok {
				name = id.Name + "." + name
			}
		}
		if name == fn {
			from, to := fset.Position(fd.Pos()).Offset, fset.Position(fd.End()).Offset
			return strings.Split(string(src[from:to]), "\n"), nil
		}
	}
	return nil, fmt.Errorf("%s: no function %s", path, fn)
}

// contains reports whether want is a contiguous run of have's lines.
func contains(have, want []string) bool {
	for i := 0; i+len(want) <= len(have); i++ {
		match := true
		for j := range want {
			if have[i+j] != want[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// check returns nil if s's block, normalized, is a contiguous run of the
// lines of the function it names, normalized.
func check(s snippet) error {
	want := normalize(s.body)
	if len(want) == 0 {
		return errors.New("an empty block")
	}
	clean := filepath.Clean(s.file)
	if filepath.IsAbs(clean) || strings.HasPrefix(clean, "..") {
		return fmt.Errorf("%s is outside the repository", s.file)
	}
	have, err := funcSource(filepath.Join(root, clean), s.fn)
	if err != nil {
		return err
	}
	if !contains(normalize(have), want) {
		return fmt.Errorf("the block is not quoted verbatim from %s %s", s.file, s.fn)
	}
	return nil
}

// TestSnippetsAreQuoted checks every ```go block of every Markdown file of
// the repository (docs) against the function it names.
func TestSnippetsAreQuoted(t *testing.T) {
	n := 0
	for _, d := range docs(t) {
		ss, err := snippets(read(t, d))
		if err != nil {
			t.Errorf("%s: %v", d, err)
			continue
		}
		for _, s := range ss {
			n++
			if err := check(s); err != nil {
				t.Errorf("%s line %d: %v", d, s.line, err)
			}
		}
	}
	if n < 10 {
		t.Fatalf("the docs have %d ```go blocks: the walk missed some, and the test would check little", n)
	}
}

// TestCheckCatchesChanges is the negative control: a copy of each block
// of each doc with one line changed, a block naming another function or a
// file that does not exist, and a block without its comment must all
// fail.
func TestCheckCatchesChanges(t *testing.T) {
	for _, d := range docs(t) {
		ss, err := snippets(read(t, d))
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		for _, s := range ss {
			body := append([]string(nil), s.body...)
			for i := len(body) / 2; i < len(body); i++ { // the middle line, or the next non-blank one
				if strings.TrimSpace(body[i]) != "" {
					body[i] = strings.Replace(body[i], strings.TrimSpace(body[i]), strings.TrimSpace(body[i])+" + 1", 1)
					break
				}
			}
			changed := s
			changed.body = body
			if check(changed) == nil {
				t.Errorf("%s line %d: a changed copy of the block passes the check", d, s.line)
			}
			other := s
			other.fn = s.fn + "Missing"
			if check(other) == nil {
				t.Errorf("%s line %d: the block passes naming a function that does not exist", d, s.line)
			}
			gone := s
			gone.file = "no/such_test.go"
			if check(gone) == nil {
				t.Errorf("%s line %d: the block passes naming a file that does not exist", d, s.line)
			}
			outside := s
			outside.file = "../" + s.file
			if check(outside) == nil {
				t.Errorf("%s line %d: the block passes naming a file outside the repository", d, s.line)
			}
		}
	}
	if _, err := snippets("text\n\n```go\nx := 1\n```\n"); err == nil {
		t.Error("a ```go block without a quoted-from comment passes")
	}
	if _, err := snippets("<!-- quoted from a_test.go F -->\n```go\nx := 1\n"); err == nil {
		t.Error("an unclosed block passes")
	}
	if _, err := snippets("```sh\ngo test ./...\n"); err == nil {
		t.Error("an unclosed block of another language passes")
	}
}
