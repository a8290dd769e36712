// Package script runs data-driven test files, in the style of etcd raft's
// interaction tests: each file is a sequence of commands, each followed by
// the output it must produce.
//
//	# a comment
//	command arg key=value
//	----
//	expected output line
//	expected output line
//
// A block ends at a blank line. A command with no output has nothing after
// its "----". A test that passes rewrite=true writes the output the code
// produces now into the files instead of comparing (tests wire it to a
// -rewrite flag); review the diff.
//
// The package is for tenure's own tests.
package script
