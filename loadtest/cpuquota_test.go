package loadtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A process started through the quota's command runs inside its own
// cgroup from its first instruction and is throttled: a busy loop held to
// 100m spends most CFS periods out of quota.
func TestCPUQuotaHoldsAProcess(t *testing.T) {
	q, err := newCPUQuota(100)
	if err != nil {
		t.Skipf("no CPU quota on this machine: %v", err)
	}
	group, bin, args, err := q.command("busy", "/bin/sh", []string{"-c", "while :; do :; done"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(func() {
		stop()
		if err := q.remove(); err != nil {
			t.Error(err)
		}
	})

	rel := strings.TrimPrefix(filepath.Join(q.root, group), cgroupCPURoot)
	var th cpuThrottling
	for deadline := time.Now().Add(time.Minute); ; {
		if th, err = q.throttling(group); err != nil {
			t.Fatal(err)
		}
		if th.Throttled >= 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	cg, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cg), ":"+rel+"\n") {
		t.Errorf("process %d is not in %s: /proc/%d/cgroup says\n%s", cmd.Process.Pid, rel, cmd.Process.Pid, cg)
	}
	if th.Throttled < 5 {
		t.Errorf("a busy loop held to 100m was throttled in %d of %d CFS periods within a minute; want at least 5", th.Throttled, th.Periods)
	}
	// The cgroup goes with its process.
	stop()
	if err := q.remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(q.root); !os.IsNotExist(err) {
		t.Errorf("the run's cgroup %s is still there after remove: %v", q.root, err)
	}
}
