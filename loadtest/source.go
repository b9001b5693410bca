package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime/debug"
	"strings"

	"github.com/kshard/kshard/internal/controlplane"
)

// Source is the commit of kshard's source tree a run measured: a report's
// numbers are of that code, and without it two reports cannot be told to
// measure the same thing or not.
type Source struct {
	// Commit is the git commit's full hash; "" when neither the build nor
	// git could tell, and the report says "commit: unknown".
	Commit string
	// Modified says the tree had uncommitted changes (untracked files
	// included, as Go's own stamp counts them): no commit holds the code
	// measured. Read from git, the reports' folder (loadtest/results) is
	// left out: a report written and not yet committed is the load
	// tester's output, not code it measured.
	Modified bool
	// From says where Commit was read: sourceFromBuild or sourceFromGit;
	// "" when unknown.
	From string `json:",omitempty"`
}

// Where a Source was read.
const (
	// sourceFromBuild is the load tester binary's VCS stamp (go build of
	// loadtest/cmd/loadtest in the repository).
	sourceFromBuild = "build info"
	// sourceFromGit is git in the module root at run time: go run and go
	// test stamp nothing, and the replicas are built from that tree then.
	sourceFromGit = "git"
)

// String writes the commit for the report's header: its first 12 hex
// digits, with "(with uncommitted changes)" for a dirty tree, or "commit:
// unknown", never nothing.
func (s Source) String() string {
	if s.Commit == "" {
		return "commit: unknown"
	}
	c := "commit " + s.Commit[:min(12, len(s.Commit))]
	if s.Modified {
		c += " (with uncommitted changes)"
	}
	return c
}

// readSource finds the commit a run measures: the binary's VCS stamp when
// it has one, else git in the module root. The error says why neither
// answered; the Source is then unknown.
func readSource(ctx context.Context) (Source, error) {
	if bi, ok := debug.ReadBuildInfo(); ok {
		if s, ok := sourceOfBuild(bi.Settings); ok {
			return s, nil
		}
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return Source{}, fmt.Errorf("no VCS stamp in the binary, and %w", err)
	}
	s, err := sourceOfGit(ctx, root)
	if err != nil {
		return Source{}, fmt.Errorf("no VCS stamp in the binary, and %w", err)
	}
	return s, nil
}

// sourceOfBuild reads the commit from a binary's build settings (vcs.revision,
// vcs.modified); false without a revision.
func sourceOfBuild(settings []debug.BuildSetting) (Source, bool) {
	s := Source{From: sourceFromBuild}
	for _, kv := range settings {
		switch kv.Key {
		case "vcs.revision":
			s.Commit = kv.Value
		case "vcs.modified":
			s.Modified = kv.Value == "true"
		}
	}
	return s, s.Commit != ""
}

// resultsFolder is where the reports are committed, from the repository
// root.
const resultsFolder = "loadtest/results"

// sourceOfGit asks git for the commit checked out in dir and whether the
// tree differs from it.
func sourceOfGit(ctx context.Context, dir string) (Source, error) {
	head, err := git(ctx, dir, "rev-parse", "HEAD")
	if err != nil {
		return Source{}, err
	}
	status, err := git(ctx, dir, "status", "--porcelain", "--", ".", ":(exclude)"+resultsFolder)
	if err != nil {
		return Source{}, err
	}
	return Source{Commit: head, Modified: status != "", From: sourceFromGit}, nil
}

// git runs a git command in dir and returns its trimmed output.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git %s in %s: %w", strings.Join(args, " "), dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}
