// Package readme holds only a test: every Go snippet in the repository's
// README.md is quoted verbatim from a function of a *_test.go file (an
// Example or a test), so that a compiler checks it.
package readme
