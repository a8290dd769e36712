// Package testkit is the test code every package's tests share: a
// context bounded for the test and a poll for a condition, both with
// their deadlines scaled by internal/slowtest to how busy the machine is.
//
// It imports nothing of tenure but slowtest, so that any package's
// in-package tests can use it without an import cycle. Helpers that need
// ownership's types (a token, a check of a stale answer) live in
// ownership/fencetest (Tok, WantStale), which tests outside package
// ownership import.
package testkit
