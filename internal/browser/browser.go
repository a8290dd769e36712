package browser

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// ExecPath returns the Chromium binary: $TENURE_CHROMIUM if set, else
// Debian's binary behind its launcher script, else chromium on PATH.
func ExecPath() (string, error) {
	if p := os.Getenv("TENURE_CHROMIUM"); p != "" {
		return p, nil
	}
	if _, err := os.Stat("/usr/lib/chromium/chromium"); err == nil {
		return "/usr/lib/chromium/chromium", nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("browser: no Chromium found (install Debian's chromium package, as .ci/run does, or set TENURE_CHROMIUM)")
}

// Width and Height are the window's size in CSS pixels.
const (
	Width  = 1440
	Height = 1000
)

// New starts a headless Chromium for t and returns a chromedp context of
// one tab, bounded by timeout. The browser and its profile are removed
// when the test ends. A missing or broken browser fails t.
func New(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	path, err := ExecPath()
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(Width, Height),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	// Start the browser now, outside the test's deadline, so its failure
	// reads as what it is.
	if err := chromedp.Do(bctx, onNewDocument(catchErrors)); err != nil {
		cancelBrowser()
		cancelAlloc()
		t.Fatalf("browser: start %s: %v", path, err)
	}
	ctx, cancel := context.WithTimeout(bctx, timeout)
	t.Cleanup(func() {
		cancel()
		cancelBrowser() // closes the tab and the browser, and waits for it
		cancelAlloc()
	})
	return ctx
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Screenshot saves the whole page the tab shows as name.png in t's
// artifact directory and returns the path, which it logs.
func Screenshot(t testing.TB, ctx context.Context, name string) string {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	path := filepath.Join(t.ArtifactDir(), unsafeName.ReplaceAllString(name, "_")+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	return path
}

// catchErrors keeps every uncaught error and rejected promise of a page
// in window.__pageErrors, for Errors.
const catchErrors = `window.__pageErrors = [];
addEventListener('error', e => window.__pageErrors.push(String(e.message || e)));
addEventListener('unhandledrejection', e => window.__pageErrors.push('unhandled rejection: ' + String(e.reason)));`

// onNewDocument runs script in every document the tab opens, before the
// document's own scripts.
func onNewDocument(script string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: script})
		return err
	})
}

// Errors returns the uncaught errors of the page the tab shows.
func Errors(t testing.TB, ctx context.Context) []string {
	t.Helper()
	errs, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.__pageErrors || ["the error catcher did not run"]`))
	if err != nil {
		t.Fatalf("browser: reading the page's errors: %v", err)
	}
	return errs
}
