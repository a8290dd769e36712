package netns

// Prefix begins the name of every namespace a Net makes, followed by the
// making process's pid, so that Sweep can tell a crashed run's leftovers
// (their process is gone) from a running test's.
const Prefix = "tnr-"
