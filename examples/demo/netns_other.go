//go:build unix && !linux

package main

import (
	"errors"
	"os/exec"
)

// nsNet is Linux's: network namespaces.
type nsNet struct {
	relay interface{ Addr() string }
	dsn   string
}

func openNet([]string, string) (*nsNet, error) {
	return nil, errors.New("-netns needs Linux network namespaces")
}

func (*nsNet) host(string) string                          { return "" }
func (*nsNet) command(string, string, ...string) *exec.Cmd { return nil }
func (*nsNet) cut(_, _ []*proc) error                      { return nil }
func (*nsNet) verifyCut(_, _ []*proc) error                { return nil }
func (*nsNet) lossy(_, _, _ string) error                  { return nil }
func (*nsNet) close() error                                { return nil }
