package loadtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// cgroupCPURoot is where a cgroup v1 host mounts the cpu controller.
const cgroupCPURoot = "/sys/fs/cgroup/cpu"

// cpuQuotaPeriod is the CFS period of every replica's cgroup: with a
// quota of a few milliseconds per period a throttled replica waits at most
// one period, far below the 1 s objectives the capacity scenario holds.
const cpuQuotaPeriod = 100 * time.Millisecond

// cpuOnly is the cgroup v1 hierarchy of the cpu controller alone: a
// replica's cgroup needs no other.
var cpuOnly = cgroup1.SingleSubsystem(cgroup1.Default, cgroup1.Cpu)

// cpuQuota holds every replica process to the same CPU bandwidth, each in a
// cgroup of its own (the v1 cpu controller's CFS quota), as a container's
// CPU limit would: so that the replicas, not the API server they share
// the machine with, bound what a fleet can do, and a fleet of n replicas
// has n times one replica's CPU. A process enters its cgroup before it
// execs the replica binary, so none of its work runs unbounded.
type cpuQuota struct {
	// root is the run's own cgroup folder, which holds one per process.
	root string
	// quota is the CPU time each process may use per cpuQuotaPeriod.
	quota time.Duration

	mu     sync.Mutex
	seq    int
	groups map[string]cgroup1.Cgroup
}

// newCPUQuota creates the run's cgroup folder under the cpu controller,
// for processes held to millicores thousandths of a CPU each.
func newCPUQuota(millicores int64) (*cpuQuota, error) {
	if _, err := os.Stat(filepath.Join(cgroupCPURoot, "cpu.cfs_quota_us")); err != nil {
		return nil, fmt.Errorf("a replica CPU quota needs cgroup v1's cpu controller at %s (root, a cgroup v1 host): %w", cgroupCPURoot, err)
	}
	quota := time.Duration(millicores) * cpuQuotaPeriod / 1000
	if quota < time.Millisecond {
		return nil, fmt.Errorf("a replica CPU quota of %dm is %s per %s period, below the kernel's 1ms minimum", millicores, quota, cpuQuotaPeriod)
	}
	root := filepath.Join(cgroupCPURoot, fmt.Sprintf("kshard-loadtest-%d", os.Getpid()))
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, fmt.Errorf("creating the run's cgroup: %w", err)
	}
	return &cpuQuota{root: root, quota: quota, groups: map[string]cgroup1.Cgroup{}}, nil
}

// command returns the command line that runs bin with args inside a new
// cgroup of its own, held to the quota, and the cgroup's name (name, made
// unique in the run): a shell that moves itself into the cgroup and then
// execs bin (same process, same pid, so signals and the audit log's
// process identity are bin's).
func (q *cpuQuota) command(name, bin string, args []string) (group, cmd string, cmdArgs []string, err error) {
	q.mu.Lock()
	q.seq++
	group = fmt.Sprintf("%03d.%s", q.seq, name)
	q.mu.Unlock()
	dir := filepath.Join(q.root, group)
	period, quota := uint64(cpuQuotaPeriod.Microseconds()), q.quota.Microseconds()
	cg, err := cgroup1.New(cgroup1.StaticPath(strings.TrimPrefix(dir, cgroupCPURoot)),
		&specs.LinuxResources{CPU: &specs.LinuxCPU{Period: &period, Quota: &quota}}, cgroup1.WithHierarchy(cpuOnly))
	if err != nil {
		return "", "", nil, fmt.Errorf("creating the cgroup of %s: %w", name, err)
	}
	q.mu.Lock()
	q.groups[group] = cg
	q.mu.Unlock()
	const script = `echo $$ > "$1" && shift && exec "$@"`
	return group, "/bin/sh", append([]string{"-c", script, "kshard-cpu-quota", filepath.Join(dir, "cgroup.procs"), bin}, args...), nil
}

// cpuThrottling is what a cgroup's cpu.stat says: of the CFS periods in
// which its processes ran, how many ended with the quota spent.
type cpuThrottling struct {
	Periods, Throttled int64
	// ThrottledTime is how long its processes waited for the next period.
	ThrottledTime time.Duration
}

// throttling reads the cpu.stat of a cgroup command made.
func (q *cpuQuota) throttling(group string) (cpuThrottling, error) {
	q.mu.Lock()
	cg, ok := q.groups[group]
	q.mu.Unlock()
	if !ok {
		return cpuThrottling{}, fmt.Errorf("no cgroup %s", group)
	}
	m, err := cg.Stat()
	if err != nil {
		return cpuThrottling{}, fmt.Errorf("reading cgroup %s: %w", group, err)
	}
	t := m.GetCPU().GetThrottling()
	return cpuThrottling{Periods: int64(t.GetPeriods()), Throttled: int64(t.GetThrottledPeriods()), ThrottledTime: time.Duration(t.GetThrottledTime())}, nil
}

// remove deletes the run's cgroups, once their processes ended (a cgroup
// with a process in it cannot be removed).
func (q *cpuQuota) remove() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var errs []error
	for name, cg := range q.groups {
		if err := cg.Delete(); err != nil {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", name, err))
			continue
		}
		delete(q.groups, name)
	}
	if len(q.groups) == 0 {
		if err := os.Remove(q.root); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("removing the run's cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}
