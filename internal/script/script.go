package script

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Cmd is one command of a script.
type Cmd struct {
	Name string            // the first word
	Pos  []string          // the words without "=" after the first
	Args map[string]string // key=value words
	Line string            // the whole command line
	Pos0 string            // file:line of the command
}

// Arg returns the value of key, or def when it is absent.
func (c Cmd) Arg(key, def string) string {
	if v, ok := c.Args[key]; ok {
		return v
	}
	return def
}

// block is one command and its expected output.
type block struct {
	cmd    Cmd
	want   []string
	before []string // comment and blank lines before the command
}

// Parse reads a script file.
func parse(path string) ([]block, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var (
		blocks  []block
		pending []string
		sc      = bufio.NewScanner(f)
		n       = 0
	)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
	for sc.Scan() {
		n++
		line := sc.Text()
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			pending = append(pending, line)
			continue
		}
		if t == "----" {
			return nil, nil, fmt.Errorf("%s:%d: ---- without a command", path, n)
		}
		b := block{cmd: parseCmd(t), before: pending}
		b.cmd.Pos0 = fmt.Sprintf("%s:%d", path, n)
		pending = nil
		if !sc.Scan() || strings.TrimSpace(sc.Text()) != "----" {
			return nil, nil, fmt.Errorf("%s:%d: command %q is not followed by ----", path, n, t)
		}
		n++
		for sc.Scan() {
			n++
			l := sc.Text()
			if strings.TrimSpace(l) == "" {
				break
			}
			b.want = append(b.want, l)
		}
		blocks = append(blocks, b)
	}
	return blocks, pending, sc.Err()
}

func parseCmd(line string) Cmd {
	f := strings.Fields(line)
	c := Cmd{Name: f[0], Args: map[string]string{}, Line: line}
	for _, w := range f[1:] {
		if k, v, ok := strings.Cut(w, "="); ok {
			c.Args[k] = v
		} else {
			c.Pos = append(c.Pos, w)
		}
	}
	return c
}

// Run runs every file matching glob as a subtest. For each file, newRun
// returns the function that executes one command and returns its output
// (lines, no trailing newline) or an error, which fails the test.
// With rewrite set, each file's expected output is replaced by what the
// code produces now (tests declare a -rewrite flag and pass it).
func Run(t *testing.T, glob string, rewrite bool, newRun func(t *testing.T) func(Cmd) (string, error)) {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts match %s: %v", glob, err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)), func(t *testing.T) {
			RunFile(t, path, rewrite, newRun(t))
		})
	}
}

// RunFile runs one script file.
func RunFile(t *testing.T, path string, rewrite bool, run func(Cmd) (string, error)) {
	t.Helper()
	blocks, tail, err := parse(path)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	failed := false
	for _, b := range blocks {
		got, err := run(b.cmd)
		if err != nil {
			t.Fatalf("%s: %s: %v", b.cmd.Pos0, b.cmd.Line, err)
		}
		got = strings.TrimRight(got, "\n")
		var gotLines []string
		if got != "" {
			gotLines = strings.Split(got, "\n")
		}
		for _, l := range b.before {
			out.WriteString(l + "\n")
		}
		out.WriteString(b.cmd.Line + "\n----\n")
		for _, l := range gotLines {
			out.WriteString(l + "\n")
		}
		out.WriteString("\n")
		if !rewrite && strings.Join(gotLines, "\n") != strings.Join(b.want, "\n") && !failed {
			failed = true
			t.Errorf("%s: %s\n got:\n  %s\nwant:\n  %s\n(run with -rewrite to accept the new output)", b.cmd.Pos0, b.cmd.Line,
				strings.Join(gotLines, "\n  "), strings.Join(b.want, "\n  "))
		}
	}
	for _, l := range tail {
		out.WriteString(l + "\n")
	}
	if rewrite {
		s := strings.TrimRight(out.String(), "\n") + "\n"
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
