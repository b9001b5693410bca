package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/kshard/kshard/loadtest"
)

// The report's command must reproduce the run when pasted into a shell.
func TestCommandQuotes(t *testing.T) {
	got := command([]string{"--scenario", "basic", "--out", "/tmp/my results", "--kubeconfig", "it's"})
	want := `go run ./loadtest/cmd/loadtest --scenario basic --out '/tmp/my results' --kubeconfig 'it'\''s'`
	if got != want {
		t.Errorf("command = %s\nwant      %s", got, want)
	}
}

// TestFlagHelpOneLine: every flag's help is one line, short enough to read
// in a terminal; loadtest/README.md holds the rest.
func TestFlagHelpOneLine(t *testing.T) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	bindFlags(fs, &loadtest.Options{}, &flags{})
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "zap-") {
			return // controller-runtime's
		}
		if strings.Contains(f.Usage, "\n") || len(f.Usage) > 160 {
			t.Errorf("--%s: help of %d characters or several lines: %q", f.Name, len(f.Usage), f.Usage)
		}
	})
}
