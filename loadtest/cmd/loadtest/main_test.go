package main

import "testing"

// The report's command must reproduce the run when pasted into a shell.
func TestCommandQuotes(t *testing.T) {
	got := command([]string{"--scenario", "basic", "--out", "/tmp/my results", "--kubeconfig", "it's"})
	want := `go run ./loadtest/cmd/loadtest --scenario basic --out '/tmp/my results' --kubeconfig 'it'\''s'`
	if got != want {
		t.Errorf("command = %s\nwant      %s", got, want)
	}
}
