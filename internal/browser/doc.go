// Package browser drives a real headless Chromium from Go tests, for the
// checks a person would make of tenure's pages: the coordinator's status
// page and the demo's report.
//
// New starts the browser (Debian's chromium package; .ci/run installs it)
// with a fresh profile and the flags a machine without internet needs, and
// fails the test when there is no browser: a missing browser never skips.
// Screenshot saves what the tab shows as a PNG in the test's artifact
// directory (t.ArtifactDir: kept with go test -artifacts) and logs its path.
//
// Only tests import this package, so chromedp stays out of the import
// graph of every package users build; TestImportGraph holds that.
package browser
