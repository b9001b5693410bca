package childproc

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// Build builds commands of the repository at root (cmd/<name>) into dir with
// one go build, so their links run at once, and returns their paths in the
// order named.
//
// Give it a folder that outlives the run: go build finds a binary whose
// sources did not change up to date where it is and does not link it again,
// which is seconds of CPU per binary on every run after the first. The
// binaries have no DWARF (-ldflags=-w): stack traces, race reports and
// pprof read the symbol table, and writing DWARF is a third of a link.
func Build(ctx context.Context, root, dir string, names ...string) ([]string, error) {
	args := []string{"build", "-ldflags=-w", "-o", dir + string(filepath.Separator)}
	bins := make([]string, len(names))
	for i, n := range names {
		args = append(args, "./cmd/"+n)
		bins[i] = filepath.Join(dir, n)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building %s: %w\n%s", strings.Join(names, ", "), err, out)
	}
	return bins, nil
}
