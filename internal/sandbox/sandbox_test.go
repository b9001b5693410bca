//go:build unix

package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"

	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/sandbox"
)

// TestSandboxScript runs what `make run` runs, end to end, with the real
// kshard binary as the replicas: control plane, config center (an etcd),
// SpiceDB, objects, a value changed in etcd, a binding SpiceDB forbids and
// a grant revoked and given back, three replica processes, the handover
// tour (leave, join, crash, join), a few seconds of live view, and the
// cleanup. It checks that the run succeeds,
// that every handover was reported, and that no replica process (or process
// group) outlived the sandbox.
func TestSandboxScript(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole sandbox: make test runs it")
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The replicas must be kshard itself; the test binary is not. Built into
	// bin/test/children/sandbox (childproc.Build says why a folder that
	// stays).
	bins, err := childproc.Build(context.Background(), root, filepath.Join(root, "bin", "test", "children", "sandbox"), "kshard")
	if err != nil {
		t.Fatal(err)
	}
	kshard := bins[0]

	var (
		mu   sync.Mutex
		pids = map[int]string{}
	)
	var out syncBuffer
	dir := t.TempDir()
	// Generous: the script's own steps are bounded, this only stops a hang.
	ctx, cancel := context.WithTimeout(logr.NewContext(context.Background(), testr.New(t)), 20*time.Minute)
	defer cancel()
	err = sandbox.Run(ctx, sandbox.Options{
		Dir:      dir,
		Duration: 4 * time.Second,
		// A quarter of the default: the tour's handovers are the same, and
		// the replicas renew a quarter of the Leases while the test waits.
		Shards:     16,
		Out:        &out,
		Executable: kshard,
		OnReplicaStarted: func(replica string, pid int) {
			mu.Lock()
			defer mu.Unlock()
			pids[pid] = replica
		},
	})
	t.Logf("sandbox output:\n%s", out.String())
	if err != nil {
		t.Fatalf("sandbox.Run: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	// Three replicas, then the two restarts of the tour.
	if len(pids) != 5 {
		t.Errorf("replica processes started: %d (%v), want 5", len(pids), pids)
	}
	for pid, replica := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("replica %s (pid %d) is still there after Run returned: kill(pid, 0) = %v", replica, pid, err)
		}
		if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process group of replica %s (pid %d) is still there after Run returned: kill(-pid, 0) = %v", replica, pid, err)
		}
	}

	text := out.String()
	for _, want := range []string{
		`all 3 replicas ready and all 120 ConfigBindings Ready after `,
		`the new value of /kshard/config/domain-0/key-0 in all \d+ ConfigMaps that bind it after \d`,
		`intruder/copied, a binding of domain-0 in a namespace SpiceDB grants nothing: Forbidden: namespace intruder may not read domain domain-0`,
		`all \d+ bindings of domain-1 say Forbidden and their ConfigMaps hold none of its values after \d`,
		`the grant given back: all \d+ Ready with their values again after \d`,
		`graceful leave of kshard-2: every shard held by its desired owner after \d`,
		`graceful leave of kshard-2: every new holder running its shards and every ConfigBinding Ready after \d`,
		`join of kshard-2: every shard held by its desired owner after \d`,
		`crash of kshard-1: every shard held by its desired owner after \d`,
		`join of kshard-1: every shard held by its desired owner after \d`,
		`no object changed its shard label`,
		`kubectl get configbindings -A -o wide`,
		`replicas stopped in `,
	} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if regexp.MustCompile(`WARNING`).MatchString(text) {
		t.Errorf("the output has a warning")
	}
}

// syncBuffer is a bytes.Buffer safe for the sandbox's writers and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
