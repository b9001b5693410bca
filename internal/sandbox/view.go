package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/sharding/ring"
)

// viewer is the live view: every ViewInterval it scrapes each replica's
// metrics and readiness and reads the ring and the objects from the API
// server, and shows one table. It shows what an operator's dashboard would,
// per replica, so a newcomer sees load and cache follow the shards.
type viewer struct {
	s       *sandbox
	c       client.Reader
	scraper *scraper

	// Per replica, keyed by id: the last sample of its current process, for
	// rates, and whether that process was ever ready, to tell starting from
	// unready.
	prev      map[string]processSample
	everReady map[string]int // id -> pid that was ready once
}

type processSample struct {
	pid int
	sample
}

// replicaRow is one line of the view.
type replicaRow struct {
	id      string
	state   string
	pid     int
	scraped bool
	sample
	rate    float64
	hasRate bool
}

func newViewer(s *sandbox, c client.Reader) *viewer {
	return &viewer{s: s, c: c, scraper: newScraper(),
		prev: map[string]processSample{}, everReady: map[string]int{}}
}

func (v *viewer) run(ctx context.Context) {
	t := time.NewTicker(v.s.opts.ViewInterval)
	defer t.Stop()
	defer v.s.out.freeze()
	for {
		lines := v.collect(ctx)
		if ctx.Err() != nil {
			return
		}
		v.s.out.show(lines)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// collect reads everything the view shows and renders it.
func (v *viewer) collect(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, v.s.opts.ViewInterval+2*time.Second)
	defer cancel()

	replicas := v.s.replicas.all()
	rows := make([]replicaRow, len(replicas))
	var wg sync.WaitGroup
	for i, r := range replicas {
		wg.Go(func() { rows[i] = v.row(ctx, r) })
	}
	var (
		st              *ring.Status
		ringErr, objErr error
		ready, total    int
	)
	wg.Go(func() { st, ringErr = readRing(ctx, v.c) })
	wg.Go(func() {
		bindings, err := listBindings(ctx, v.c)
		objErr = err
		total = len(bindings)
		for i := range bindings {
			if isReady(&bindings[i]) {
				ready++
			}
		}
	})
	wg.Wait()

	// Rates and "ever ready" are bookkeeping across ticks: done here, on
	// the view's goroutine only.
	for i := range rows {
		row := &rows[i]
		if row.scraped {
			if p, ok := v.prev[row.id]; ok && p.pid == row.pid {
				row.rate, row.hasRate = reconcileRate(p.sample, row.sample)
			}
			v.prev[row.id] = processSample{pid: row.pid, sample: row.sample}
		}
		switch {
		case row.state == "ready":
			v.everReady[row.id] = row.pid
		case row.state == "starting" && v.everReady[row.id] == row.pid:
			row.state = "unready"
		}
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "-- kshard sandbox, up %s, %s --\n", time.Since(v.s.begin).Round(time.Second), time.Now().Format(time.TimeOnly))
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tSTATE\tPID\tSHARDS\tOBJECTS\tRECONCILES/S\tCACHE HIT\tEXT CALLS")
	for _, r := range rows {
		pid, shards, objects, rate, hit, calls := "-", "-", "-", "-", "-", "-"
		if r.pid != 0 {
			pid = fmt.Sprint(r.pid)
		}
		if r.scraped {
			shards = fmt.Sprintf("%.0f", r.shards)
			objects = fmt.Sprintf("%.0f", r.objects)
			calls = fmt.Sprintf("%.0f", r.externalCalls)
			if r.hasRate {
				rate = fmt.Sprintf("%.1f", r.rate)
			}
			if ratio, ok := r.cacheHitRatio(); ok {
				hit = fmt.Sprintf("%.1f%%", 100*ratio)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.id, r.state, pid, shards, objects, rate, hit, calls)
	}
	_ = tw.Flush()
	switch {
	case ringErr != nil:
		fmt.Fprintf(&b, "ring: %v\n", ringErr)
	case st.ShardCount == 0:
		fmt.Fprintf(&b, "ring %s: no live member yet\n", Ring)
	default:
		live := 0
		for _, m := range st.Members {
			if m.Live {
				live++
			}
		}
		fmt.Fprintf(&b, "ring %s: %d shards, %d unowned, %d live members", Ring, st.ShardCount, len(st.Unowned), live)
		if st.Unlabeled > 0 {
			fmt.Fprintf(&b, ", %d objects not labeled yet", st.Unlabeled)
		}
		b.WriteString("\n")
	}
	if objErr != nil {
		fmt.Fprintf(&b, "ConfigBindings: %v", objErr)
	} else {
		fmt.Fprintf(&b, "ConfigBindings Ready: %d/%d", ready, total)
	}
	return strings.Split(b.String(), "\n")
}

// row reads one replica: its process state, readiness and metrics.
func (v *viewer) row(ctx context.Context, r *replica) replicaRow {
	state, pid := r.status()
	row := replicaRow{id: r.id, state: string(state)}
	if state != stateRunning && state != stateStopping {
		return row
	}
	row.pid = pid
	if state == stateRunning {
		row.state = "starting"
		if v.scraper.ready(ctx, r.healthAddr) {
			row.state = "ready"
		}
	}
	if smp, err := v.scraper.scrape(ctx, r.metricsAddr); err == nil {
		row.sample, row.scraped = smp, true
	}
	return row
}
