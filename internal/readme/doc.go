// Package readme holds only tests, of the repository's Markdown files:
// README.md, the front page, and the documents beside the code it links
// to (every *.md file of the tree, found by walking it; .git and
// node_modules are skipped).
//
//   - Every ```go block is quoted verbatim from a function of a *_test.go
//     file (an Example or a test) that a comment right before it names by
//     its path from the root, so that a compiler checks it; every code
//     block is closed.
//   - Every link stays in the repository: no URL, and a relative link
//     (relative to the file it is in) names a file or directory that
//     exists, and an anchor that a heading of the Markdown file it names
//     makes.
//   - The front page links to every other Markdown file directly, so each
//     deep topic is one click away, and stays under 250 lines.
//
// Each check has a negative control.
package readme
