package loadtest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/configcenter"
)

// sample scrapes, every SampleInterval until ctx ends, the running replicas
// of the current fleet, the config center's request counts and the
// objects' Ready reasons, and refreshes the progress line.
func (r *run) sample(ctx context.Context) {
	hc := r.metricsClient()
	t := time.NewTicker(r.opts.SampleInterval)
	defer t.Stop()
	for {
		r.sampleOnce(ctx, hc)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *run) sampleOnce(ctx context.Context, hc *http.Client) {
	now := time.Now()
	extra := ""
	if r.sc.metric != nil {
		extra = r.sc.metric(r)
	}
	size := 0
	if f := r.currentFleet(); f != nil {
		for _, s := range f.runningSlots() {
			size++
			f.mu.Lock()
			in := s.current()
			paused := in.paused
			f.mu.Unlock()
			if peak, ok := in.proc.PeakRSS(); ok {
				f.mu.Lock()
				in.peakRSS = max(in.peakRSS, peak)
				f.mu.Unlock()
			}
			if paused {
				continue // a stopped process answers no scrape
			}
			smp, err := scrapeReplica(ctx, hc, in.metricsURL, extra)
			if err != nil {
				continue // starting or stopping: no sample this time
			}
			if in.cgroup != "" {
				if t, err := r.cpuQuota.throttling(in.cgroup); err == nil {
					smp.CFSPeriods, smp.CFSThrottled = float64(t.Periods), float64(t.Throttled)
				}
			}
			f.mu.Lock()
			if in := s.current(); in != nil && in.proc.Running() {
				in.samples = append(in.samples, smp)
			}
			f.mu.Unlock()
		}
	}
	var cs centerSample
	if st, err := r.cc.Stats(ctx); err == nil {
		cs = centerSample{At: now}
		for _, x := range st.Series {
			if x.Caller == loadtestCaller {
				continue
			}
			switch x.Route {
			case configcenter.RouteGetKey:
				cs.Gets += float64(x.Count)
			case configcenter.RouteChanges:
				cs.Polls += float64(x.Count)
			}
		}
	}
	cpm, cpOK := r.sampleControlPlane(now)
	reasons := r.tracker.reasons()
	r.mu.Lock()
	if cpOK {
		r.controlPlane = append(r.controlPlane, cpm)
	}
	if !cs.At.IsZero() {
		r.center = append(r.center, cs)
	}
	r.reasons = append(r.reasons, reasonSample{At: now, Reasons: reasons})
	r.sizes = append(r.sizes, sizeSample{At: now, Replicas: size})
	if l, ok := loadAverage(); ok {
		r.loads = append(r.loads, loadSample{At: now, Load: l})
	}
	phase, f := r.phase, r.fleet
	r.mu.Unlock()
	label := ""
	if f != nil {
		label = f.label()
	}
	r.progress.update(r.status(label, phase, size, reasons))
}

// status is the progress line.
func (r *run) status(fleet, phase string, size int, reasons map[string]int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.elapsed(), r.opts.Scenario)
	if fleet != "" {
		fmt.Fprintf(&b, " | %s (%d running)", fleet, size)
	}
	if phase != "" {
		fmt.Fprintf(&b, " | %s", phase)
	}
	st := &r.gen.stats
	fmt.Fprintf(&b, " | objects %d, Ready %d | writes: %d creates, %d updates, %d errors | waiting for Ready: %d",
		r.tracker.count(), reasons["Synced"], st.creates.Load(), st.updates.Load(), st.errors.Load(), r.tracker.pendingCount())
	return b.String()
}

// at returns the instance's last sample at or before t, and whether there
// is one.
func (in *instance) at(t time.Time) (replicaSample, bool) {
	var last replicaSample
	ok := false
	for _, s := range in.samples {
		if s.At.After(t) {
			break
		}
		last, ok = s, true
	}
	return last, ok
}

// delta is what a counter of the instance grew by within [from, to]: a
// process started within the window counts from zero.
func (in *instance) delta(from, to time.Time, get func(replicaSample) float64) float64 {
	end, ok := in.at(to)
	if !ok {
		return 0
	}
	start, ok := in.at(from)
	if !ok {
		return get(end)
	}
	return get(end) - get(start)
}

// controlPlaneSample is the resident memory of the kube-apiserver and etcd
// the load tester started, in bytes (0: not read), and the CPU time each
// has used since it started, in seconds (-1: not read).
type controlPlaneSample struct {
	At                    time.Time
	APIServer, Etcd       float64
	APIServerCPU, EtcdCPU float64
	// APIServerPID says which process APIServerCPU is of: a restart starts
	// its count over.
	APIServerPID int
}

// sampleControlPlane reads the control plane's resident memory (VmRSS) and
// CPU time; false on a cluster the load tester did not start, or when
// neither process could be read. It runs on the sampler's goroutine only,
// which alone uses r.cpPIDs: the processes are looked up (a walk of /proc)
// only when one of them cannot be read, as after an API server restart.
func (r *run) sampleControlPlane(now time.Time) (controlPlaneSample, bool) {
	if r.controlPlanePIDs == nil {
		return controlPlaneSample{}, false
	}
	s, complete := readControlPlane(now, r.cpPIDs)
	if !complete {
		r.cpPIDs = r.controlPlanePIDs()
		s, _ = readControlPlane(now, r.cpPIDs)
	}
	return s, s.APIServer > 0 || s.Etcd > 0
}

// readControlPlane reads the processes of pids; complete says both were
// read.
func readControlPlane(now time.Time, pids map[string]int) (controlPlaneSample, bool) {
	s := controlPlaneSample{At: now, APIServerPID: pids["kube-apiserver"]}
	s.APIServer, _ = childproc.StatusBytes(pids["kube-apiserver"], "VmRSS:")
	s.Etcd, _ = childproc.StatusBytes(pids["etcd"], "VmRSS:")
	s.APIServerCPU = readCPUSeconds(pids["kube-apiserver"])
	s.EtcdCPU = readCPUSeconds(pids["etcd"])
	return s, s.APIServer > 0 && s.Etcd > 0 && s.APIServerCPU >= 0 && s.EtcdCPU >= 0
}

// controlPlaneCores is the CPU the kube-apiserver and etcd used from from
// to to, in cores (CPU-seconds per second), between the samples nearest
// inside those bounds; false without two samples of the same processes
// there.
func (r *run) controlPlaneCores(from, to time.Time) (apiServer, etcd float64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first, last *controlPlaneSample
	for i := range r.controlPlane {
		s := &r.controlPlane[i]
		if s.At.Before(from) || s.At.After(to) || s.APIServerCPU < 0 || s.EtcdCPU < 0 {
			continue
		}
		if first == nil {
			first = s
		}
		last = s
	}
	if first == nil || !last.At.After(first.At) || first.APIServerPID != last.APIServerPID {
		return 0, 0, false
	}
	secs := last.At.Sub(first.At).Seconds()
	return (last.APIServerCPU - first.APIServerCPU) / secs, (last.EtcdCPU - first.EtcdCPU) / secs, true
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times: 100 on every Linux Go supports.
const clockTicks = 100

// readCPUSeconds reads the user and system CPU time a process has used
// (/proc/<pid>/stat utime + stime), in seconds; -1 elsewhere than Linux,
// for pid 0, or once the process is gone.
func readCPUSeconds(pid int) float64 {
	if pid <= 0 {
		return -1
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	return parseCPUSeconds(string(b))
}

// parseCPUSeconds finds utime and stime in a /proc/<pid>/stat; -1 when it
// cannot. The command name, in parentheses, may hold spaces: the fields
// are counted after its closing parenthesis.
func parseCPUSeconds(stat string) float64 {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return -1
	}
	// After ")": state (field 3), …, utime (14), stime (15).
	f := strings.Fields(stat[end+1:])
	if len(f) < 13 {
		return -1
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return (utime + stime) / clockTicks
}

// controlPlanePeak is the largest resident memory of the kube-apiserver and
// of etcd sampled from from to to; -1 for a process without a sample.
func (r *run) controlPlanePeak(from, to time.Time) (apiServer, etcd float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	apiServer, etcd = -1, -1
	for _, s := range r.controlPlane {
		if s.At.Before(from) || s.At.After(to) {
			continue
		}
		if s.APIServer > 0 {
			apiServer = max(apiServer, s.APIServer)
		}
		if s.Etcd > 0 {
			etcd = max(etcd, s.Etcd)
		}
	}
	return apiServer, etcd
}
