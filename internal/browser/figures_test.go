package browser

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestFigures prints the status page's figures: the time Chromium takes
// to draw a real node's page of 4096 partitions (building the page from
// its JSON, layout included; target <= 200 ms), a refresh's, and the
// bytes an idle refresh (a delta) brings. TestMain adds how many
// browser checks passed in the run:
//
//	go test ./internal/browser -count=1 -v | grep figure:
func TestFigures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := startCluster(t, ctx, 1, 4096, nil)
	srv := httptest.NewServer(nodes[0].StatusHandler())
	defer srv.Close()
	b := New(t, time.Minute)
	// The first draw of a fresh page builds every cell; the machine is
	// shared, so the figure is the best of five loads (and the median).
	var firsts []float64
	var s pageState
	for range 5 {
		if err := chromedp.Do(b, chromedp.EmulateViewport(Width, Height), chromedp.Navigate(srv.URL+"/")); err != nil {
			t.Fatal(err)
		}
		s = waitPage(t, b, "a first refresh", func(s pageState) bool { return s.Refreshes >= 1 })
		check(t, len(s.Cells) == 4096, "%d cells", len(s.Cells))
		firsts = append(firsts, s.RenderMs)
	}
	s = waitPage(t, b, "a third refresh", func(s pageState) bool { return s.Refreshes >= 3 })
	Screenshot(t, b, "status-page-4096")
	slices.Sort(firsts)
	fmt.Printf("figure: ui.status_page_ms %.1f (median %.1f)\n", firsts[0], firsts[len(firsts)/2])
	fmt.Printf("figure: ui.status_page_refresh_ms %.1f\n", s.RenderMs)
	// A refresh after the first load is a delta: its body's size, with
	// nothing moved (coordinator's TestFigures has one with a move).
	check(t, s.Deltas >= 2, "%d of %d refreshes were deltas", s.Deltas, s.Refreshes)
	fmt.Printf("figure: ui.status_page_refresh_bytes_idle %d\n", s.Bytes)
}

// chromedp stays out of what users build: no package outside tests and
// internal/browser imports it. The negative control: internal/browser
// itself does.
func TestImportGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "github.com/tenure-go/tenure/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs, err := exec.Command("go", "list", "github.com/tenure-go/tenure/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(pkgs)) {
		if p == "github.com/tenure-go/tenure/internal/browser" {
			continue
		}
		deps, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", p).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", p, err)
		}
		if strings.Contains(string(deps), "github.com/chromedp/") {
			t.Errorf("%s imports chromedp", p)
		}
	}
	if !strings.Contains(string(out), "github.com/chromedp/chromedp") {
		t.Fatal("the check sees no chromedp at all: internal/browser should import it")
	}
}
