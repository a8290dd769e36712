// Package apisize holds only tests: TestFigures measures the size of every
// package's API and the longest functions of the tree, so that a split or a
// rename can state its before and after with one command:
//
//	go test -count=1 -run TestFigures -v ./internal/apisize | grep figure:
//
// A package's exported identifiers are its exported top-level functions,
// types, constants and variables and the exported methods of its exported
// types (struct fields are not counted); "current" leaves out the ones whose
// doc comment says "Deprecated:", which a package keeps only for old callers.
// Lines are those of the package's non-test .go files. Functions are measured
// from their func keyword to their closing brace, tests included.
package apisize
