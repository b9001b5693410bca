package loadtest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

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
			if peak, ok := in.proc.peakRSS(); ok {
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
			f.mu.Lock()
			if in := s.current(); in != nil && in.proc.running() {
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
// the load tester started, in bytes (0: not read).
type controlPlaneSample struct {
	At              time.Time
	APIServer, Etcd float64
}

// sampleControlPlane reads the control plane's resident memory (VmRSS);
// false on a cluster the load tester did not start, or when neither
// process could be read.
func (r *run) sampleControlPlane(now time.Time) (controlPlaneSample, bool) {
	if r.controlPlanePIDs == nil {
		return controlPlaneSample{}, false
	}
	pids := r.controlPlanePIDs()
	s := controlPlaneSample{At: now}
	s.APIServer, _ = readStatusBytes(pids["kube-apiserver"], "VmRSS:")
	s.Etcd, _ = readStatusBytes(pids["etcd"], "VmRSS:")
	return s, s.APIServer > 0 || s.Etcd > 0
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

// readPeakRSS reads a process's resident-memory high-water mark (VmHWM) on
// Linux; false elsewhere, or once the process is gone.
func readPeakRSS(pid int) (float64, bool) { return readStatusBytes(pid, "VmHWM:") }

// readStatusBytes reads one memory field of /proc/<pid>/status, in bytes;
// false elsewhere than Linux, for pid 0, or once the process is gone.
func readStatusBytes(pid int, field string) (float64, bool) {
	if pid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	return parseStatusBytes(string(b), field)
}

// parseStatusBytes finds a field given in kB ("VmHWM:", "VmRSS:") in a
// /proc/<pid>/status, in bytes.
func parseStatusBytes(status, field string) (float64, bool) {
	for _, line := range strings.Split(status, "\n") {
		v, ok := strings.CutPrefix(line, field)
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}
