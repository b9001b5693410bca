package loadtest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/controlplane"
)

// TestReportNamesTheCommit: the header's machine line says which commit the
// run measured, whether the tree had uncommitted changes, and "commit:
// unknown" rather than nothing; the JSON carries the full hash.
func TestReportNamesTheCommit(t *testing.T) {
	const hash = "0123456789abcdef0123456789abcdef01234567"
	machineLine := func(md string) string {
		for _, line := range strings.Split(md, "\n") {
			if strings.HasPrefix(line, "Machine: ") {
				return line
			}
		}
		t.Fatalf("no machine line in\n%s", md)
		return ""
	}
	for _, c := range []struct {
		src       Source
		want, not string
	}{
		{Source{Commit: hash, From: sourceFromGit}, "Run on 2026-01-02 03:04 UTC, commit 0123456789ab, wall time", "uncommitted"},
		{Source{Commit: hash, Modified: true, From: sourceFromBuild}, ", commit 0123456789ab (with uncommitted changes), wall time", hash},
		{Source{}, ", commit: unknown, wall time", "commit 0"},
	} {
		rep := &Report{Scenario: "basic", Source: c.src, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
		line := machineLine(renderMarkdown(rep))
		if !strings.Contains(line, c.want) || strings.Contains(line, c.not) {
			t.Errorf("%+v: machine line %q, want %q and not %q", c.src, line, c.want, c.not)
		}
	}

	js, err := json.Marshal(&Report{Source: Source{Commit: hash, Modified: true, From: sourceFromGit}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `"Source":{"Commit":"` + hash + `","Modified":true,"From":"git"}`; !strings.Contains(string(js), want) {
		t.Errorf("JSON %s lacks %s", js, want)
	}
}

// TestSourceOfBuild: the VCS stamp of go build gives the commit and the
// dirty flag; a binary without one (go run, go test) gives nothing, so the
// run asks git.
func TestSourceOfBuild(t *testing.T) {
	s, ok := sourceOfBuild([]debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}})
	if !ok || s != (Source{Commit: "abc123", Modified: true, From: sourceFromBuild}) {
		t.Errorf("stamped: %+v, %v", s, ok)
	}
	if s, ok := sourceOfBuild([]debug.BuildSetting{{Key: "-compiler", Value: "gc"}}); ok {
		t.Errorf("unstamped: %+v, want none", s)
	}
}

// TestSourceOfGit: git answers with the checked-out commit in the
// repository, and with an error naming the command elsewhere.
func TestSourceOfGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	s, err := sourceOfGit(ctx, root)
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{40,64}$`).MatchString(s.Commit) || s.From != sourceFromGit {
		t.Errorf("in the repository: %+v, want a full hash from git", s)
	}
	if _, err := sourceOfGit(ctx, t.TempDir()); err == nil || !strings.Contains(err.Error(), "git rev-parse HEAD") {
		t.Errorf("outside a repository: %v, want an error naming git rev-parse HEAD", err)
	}
}

// TestUncommittedReportsAreNoChange: a report written into the results
// folder and not yet committed leaves the source unmodified; any other
// change, an untracked file included, marks it.
func TestUncommittedReportsAreNoChange(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	ctx, dir := context.Background(), t.TempDir()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	write := func(path, text string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run("init", "-q")
	write("loadtest/results/basic.md", "old")
	write("loadtest/run.go", "package loadtest")
	run("add", ".")
	run("commit", "-q", "-m", "x")
	write("loadtest/results/basic.md", "new")
	write("loadtest/results/node/chaos.md", "new")
	if s, err := sourceOfGit(ctx, dir); err != nil || s.Modified {
		t.Errorf("with only reports changed: %+v, %v; want unmodified", s, err)
	}
	write("loadtest/new.go", "package loadtest")
	if s, err := sourceOfGit(ctx, dir); err != nil || !s.Modified {
		t.Errorf("with an untracked source file: %+v, %v; want modified", s, err)
	}
}
