package loadtest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cgroupCPURoot is where a cgroup v1 host mounts the cpu controller.
const cgroupCPURoot = "/sys/fs/cgroup/cpu"

// cpuQuotaPeriod is the CFS period of every replica's cgroup: with a
// quota of a few milliseconds per period a throttled replica waits at most
// one period, far below the 1 s objectives the capacity scenario holds.
const cpuQuotaPeriod = 100 * time.Millisecond

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
	groups map[string]string // cgroup name → its folder
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
	return &cpuQuota{root: root, quota: quota, groups: map[string]string{}}, nil
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
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", "", nil, fmt.Errorf("creating the cgroup of %s: %w", name, err)
	}
	for file, v := range map[string]time.Duration{"cpu.cfs_period_us": cpuQuotaPeriod, "cpu.cfs_quota_us": q.quota} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(v.Microseconds(), 10)), 0o644); err != nil {
			return "", "", nil, fmt.Errorf("setting %s of %s's cgroup: %w", file, name, err)
		}
	}
	q.mu.Lock()
	q.groups[group] = dir
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
	dir, ok := q.groups[group]
	q.mu.Unlock()
	if !ok {
		return cpuThrottling{}, fmt.Errorf("no cgroup %s", group)
	}
	f, err := os.Open(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return cpuThrottling{}, fmt.Errorf("reading cgroup %s: %w", group, err)
	}
	defer f.Close()
	return parseCPUStat(f)
}

// parseCPUStat reads cgroup v1's cpu.stat.
func parseCPUStat(f *os.File) (cpuThrottling, error) {
	var t cpuThrottling
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return t, fmt.Errorf("cpu.stat: %q: %w", sc.Text(), err)
		}
		switch k {
		case "nr_periods":
			t.Periods = n
		case "nr_throttled":
			t.Throttled = n
		case "throttled_time":
			t.ThrottledTime = time.Duration(n)
		}
	}
	return t, sc.Err()
}

// remove deletes the run's cgroups, once their processes ended (a cgroup
// with a process in it cannot be removed).
func (q *cpuQuota) remove() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var errs []error
	for name, dir := range q.groups {
		if err := os.Remove(dir); err != nil {
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
