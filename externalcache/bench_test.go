package externalcache_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
)

// blockingSource never answers until released, so that missed keys stay pending.
type blockingSource struct{ release chan struct{} }

func (s blockingSource) Fetch(ctx context.Context, _ externalcache.Key) (externalcache.Value, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return externalcache.Value{}, externalcache.ErrNotFound
}

func benchCache(b *testing.B, opts externalcache.Options) *externalcache.Cache {
	b.Helper()
	c, err := externalcache.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.AddShard(0); err != nil {
		b.Fatal(err)
	}
	return c
}

func benchKeys(n int) []externalcache.Key {
	keys := make([]externalcache.Key, n)
	for i := range keys {
		keys[i] = externalcache.Key{Domain: "bench", Name: fmt.Sprintf("key-%07d", i)}
	}
	return keys
}

// BenchmarkGetHit measures Get of fresh values from parallel goroutines.
func BenchmarkGetHit(b *testing.B) {
	src := blockingSource{release: make(chan struct{})}
	defer close(src.release)
	c := benchCache(b, externalcache.Options{Source: src, MaxShards: 1, MaxBytes: 256 << 20, SoftTTL: time.Hour, HardTTL: 2 * time.Hour})
	keys := benchKeys(100_000)
	value := make([]byte, 200)
	for _, k := range keys {
		if err := c.StoreForTest(0, k, value, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			if l := c.Get(0, keys[r.IntN(len(keys))]); l.State != externalcache.StateFresh {
				b.Fatalf("Get = %v, want Fresh", l.State)
			}
		}
	})
}

// BenchmarkMapGetHit is the baseline for BenchmarkGetHit: the same keys and values in a
// map[string]*entry behind a RWMutex, which returns the value without copying it.
func BenchmarkMapGetHit(b *testing.B) {
	keys := benchKeys(100_000)
	m := &mapCache{m: make(map[string]*mapEntry, len(keys))}
	flat := make([]string, len(keys))
	now := time.Now().UnixNano()
	for i, k := range keys {
		flat[i] = k.Domain + "\x00" + k.Name
		m.m[flat[i]] = &mapEntry{value: make([]byte, 200), revision: 1, fetchedAt: now, hardExpiry: now + int64(time.Hour)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			if _, ok := m.get(flat[r.IntN(len(flat))]); !ok {
				b.Fatal("miss")
			}
		}
	})
}

// BenchmarkGetMiss measures Get of keys whose fetch is pending: the path a stampede takes.
func BenchmarkGetMiss(b *testing.B) {
	src := blockingSource{release: make(chan struct{})}
	defer close(src.release)
	c := benchCache(b, externalcache.Options{Source: src, MaxShards: 1, MaxBytes: 64 << 20})
	keys := benchKeys(1024)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			if l := c.Get(0, keys[r.IntN(len(keys))]); l.State != externalcache.StatePending {
				b.Fatalf("Get = %v, want Pending", l.State)
			}
		}
	})
}

// mapEntry is what a straightforward heap cache would keep per key.
type mapEntry struct {
	value                             []byte
	revision                          int64
	fetchedAt, softExpiry, hardExpiry int64
	negative                          bool
}

// mapCache is the baseline: a map of pointers behind a lock, every entry scanned by the GC.
type mapCache struct {
	mu sync.RWMutex
	m  map[string]*mapEntry
}

func (m *mapCache) get(key string) ([]byte, bool) {
	m.mu.RLock()
	e := m.m[key]
	m.mu.RUnlock()
	if e == nil || time.Now().UnixNano() >= e.hardExpiry {
		return nil, false
	}
	return e.value, true
}

// gcReport is what BenchmarkGCImpact measures for one implementation.
type gcReport struct {
	heapObjects float64
	// gcCPUPerCycle and pausePerCycle: forced collections with nothing else running.
	gcCPUPerCycle, pausePerCycle float64
	// gcCPUFraction: GC CPU over all CPU in a fixed window with Gets running and one forced
	// collection every period.
	gcCPUFraction float64
	// Get latency of Gets that started during a collection, and of those that did not.
	p50, p99, quietP50, quietP99 time.Duration
	duringGC, quiet, forced      int
}

// BenchmarkGCImpact fills this cache and a map[string]*entry with 1,000,000 entries of about 200
// bytes, one after the other in the same process, and measures what the garbage collector costs
// with each: live heap objects; GC CPU and pause per forced collection of an otherwise idle
// process; the GC's share of CPU over a 3s window in which every core runs Gets, each followed by
// 512 bytes of garbage (the rest of a reconcile) so that both heaps collect naturally at the same
// allocation rate, while up to five collections are forced 300ms apart, after 2s of the same
// workload to reach a steady heap; and the latency of the
// Gets that started during those forced collections, and of the others. It reports cache/map
// ratios. It takes under a minute and about 1.5 GB, so it runs only with -bench (not -short).
func BenchmarkGCImpact(b *testing.B) {
	if testing.Short() {
		b.Skip("fills 1,000,000 entries twice")
	}
	const (
		entries   = 1_000_000
		valueSize = 200
	)
	keys := benchKeys(entries)
	flat := make([]string, entries)
	for i, k := range keys {
		flat[i] = k.Domain + "\x00" + k.Name
	}
	value := make([]byte, valueSize)

	for range b.N {
		runtime.GC()
		base := heapObjects()
		// This cache.
		src := blockingSource{release: make(chan struct{})}
		c := benchCache(b, externalcache.Options{Source: src, MaxShards: 1, MaxBytes: 1 << 30, InternalShards: 64,
			ExpectedEntries: entries, ExpectedEntryBytes: 256, SoftTTL: time.Hour, HardTTL: 2 * time.Hour})
		for _, k := range keys {
			if err := c.StoreForTest(0, k, value, 1); err != nil {
				b.Fatal(err)
			}
		}
		if s := c.Stats(); s.Entries != entries {
			b.Fatalf("cache holds %d entries, want %d", s.Entries, entries)
		}
		cache := measureGC(base, func(r *rand.Rand) {
			if l := c.Get(0, keys[r.IntN(entries)]); l.State != externalcache.StateFresh {
				panic("cache miss")
			}
		})
		runtime.KeepAlive(c)
		close(src.release)
		c = nil
		runtime.GC()

		// The map.
		base = heapObjects()
		m := &mapCache{m: make(map[string]*mapEntry, entries)}
		now := time.Now().UnixNano()
		for _, k := range flat {
			m.m[k] = &mapEntry{value: slices.Clone(value), revision: 1, fetchedAt: now,
				softExpiry: now + int64(time.Hour), hardExpiry: now + int64(2*time.Hour)}
		}
		mp := measureGC(base, func(r *rand.Rand) {
			if _, ok := m.get(flat[r.IntN(entries)]); !ok {
				panic("map miss")
			}
		})
		runtime.KeepAlive(m)
		m = nil
		runtime.GC()

		row := func(name string, a, b float64, format func(float64) string) {
			bLogf("%-34s %14s %14s %8.4f", name, format(a), format(b), a/b)
		}
		bLogf = b.Logf
		num := func(v float64) string { return fmt.Sprintf("%.0f", v) }
		frac := func(v float64) string { return fmt.Sprintf("%.4f", v) }
		secs := func(v float64) string {
			return time.Duration(v * float64(time.Second)).Round(time.Microsecond).String()
		}
		lat := func(v float64) string { return time.Duration(v).String() }
		b.Logf("%-34s %14s %14s %8s", "", "externalcache", "map+RWMutex", "ratio")
		row("live heap objects", cache.heapObjects, mp.heapObjects, num)
		row("GC CPU per forced GC", cache.gcCPUPerCycle, mp.gcCPUPerCycle, secs)
		row("GC pause per forced GC", cache.pausePerCycle, mp.pausePerCycle, secs)
		row("GC CPU fraction, 3s of Gets", cache.gcCPUFraction, mp.gcCPUFraction, frac)
		row("Get p50 during GC", float64(cache.p50), float64(mp.p50), lat)
		row("Get p99 during GC", float64(cache.p99), float64(mp.p99), lat)
		row("Get p50 outside GC", float64(cache.quietP50), float64(mp.quietP50), lat)
		row("Get p99 outside GC", float64(cache.quietP99), float64(mp.quietP99), lat)
		b.Logf("%-34s %14s %14s", "Gets during GC / outside / GCs", fmt.Sprintf("%d/%d/%d", cache.duringGC, cache.quiet, cache.forced),
			fmt.Sprintf("%d/%d/%d", mp.duringGC, mp.quiet, mp.forced))
		b.ReportMetric(cache.heapObjects/mp.heapObjects, "heap-objects-ratio")
		b.ReportMetric(cache.gcCPUPerCycle/mp.gcCPUPerCycle, "gc-cpu-per-cycle-ratio")
		b.ReportMetric(cache.pausePerCycle/mp.pausePerCycle, "gc-pause-ratio")
		b.ReportMetric(cache.gcCPUFraction/mp.gcCPUFraction, "gc-cpu-fraction-ratio")
		b.ReportMetric(float64(cache.p50)/float64(mp.p50), "p50-during-gc-ratio")
		b.ReportMetric(float64(cache.p99)/float64(mp.p99), "p99-during-gc-ratio")
	}
}

var bLogf func(string, ...any)

const (
	forcedGCs    = 5
	gcPeriod     = 300 * time.Millisecond
	window       = 3 * time.Second
	warmup       = 2 * time.Second
	garbagePerOp = 512
)

// sample is one Get: when it started (since the window began) and how long it took.
type sample struct{ start, took time.Duration }

// sink keeps the background garbage from being optimised away.
var sink atomic.Pointer[[]byte]

// measureGC measures the collector's cost with the heap as it is, using get as the workload.
func measureGC(baseObjects float64, get func(*rand.Rand)) gcReport {
	runtime.GC()
	var rep gcReport
	rep.heapObjects = heapObjects() - baseObjects

	// Forced collections with nothing else running: what one cycle costs with this heap.
	before := readGCMetrics()
	for range forcedGCs {
		runtime.GC()
	}
	after := readGCMetrics()
	rep.gcCPUPerCycle = (after.gcCPU - before.gcCPU) / forcedGCs
	rep.pausePerCycle = (after.pauseSeconds - before.pauseSeconds) / forcedGCs

	// A fixed window: Gets on every core, each followed by the same background garbage (the
	// rest of a reconcile), so both heaps see natural collections at the same allocation rate;
	// and a forced collection every gcPeriod, during which Get latency is sampled.
	var stop atomic.Bool
	var wg sync.WaitGroup
	samples := make([][]sample, runtime.GOMAXPROCS(0))
	for w := range samples {
		samples[w] = make([]sample, 1<<23)
		clear(samples[w]) // touch the pages now, not while measuring
		samples[w] = samples[w][:0]
	}
	// Warm up: run the same workload unmeasured until the heap has grown to its working size, so
	// that what follows is the steady state of a long-running controller, not its first minute.
	var warm atomic.Bool
	for w := range samples {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for !warm.Load() {
				get(r)
				g := make([]byte, garbagePerOp)
				sink.Store(&g)
			}
		})
	}
	time.Sleep(warmup)
	warm.Store(true)
	wg.Wait()

	var mu sync.Mutex
	var cycles [][2]time.Duration
	origin := time.Now()
	before = readGCMetrics()
	for w := range samples {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for !stop.Load() && len(samples[w]) < cap(samples[w]) {
				t := time.Now()
				get(r)
				samples[w] = append(samples[w], sample{start: t.Sub(origin), took: time.Since(t)})
				g := make([]byte, garbagePerOp)
				sink.Store(&g)
			}
		})
	}
	forced := make(chan struct{})
	go func() {
		defer close(forced)
		for i := 1; i <= forcedGCs && !stop.Load(); i++ {
			time.Sleep(time.Until(origin.Add(time.Duration(i) * gcPeriod)))
			s := time.Since(origin)
			runtime.GC()
			mu.Lock()
			cycles = append(cycles, [2]time.Duration{s, time.Since(origin)})
			mu.Unlock()
		}
	}()
	time.Sleep(window)
	stop.Store(true)
	wg.Wait()
	<-forced
	after = readGCMetrics()
	if cpu := after.totalCPU - before.totalCPU; cpu > 0 {
		rep.gcCPUFraction = (after.gcCPU - before.gcCPU) / cpu
	}

	var during, quiet []time.Duration
	for _, ws := range samples {
		for _, x := range ws {
			inGC := false
			for _, c := range cycles {
				inGC = inGC || (x.start >= c[0] && x.start < c[1])
			}
			if inGC {
				during = append(during, x.took)
			} else {
				quiet = append(quiet, x.took)
			}
		}
	}
	rep.duringGC, rep.quiet = len(during), len(quiet)
	rep.p50, rep.p99 = percentiles(during)
	rep.quietP50, rep.quietP99 = percentiles(quiet)
	rep.forced = len(cycles)
	return rep
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}

type gcMetrics struct{ pauseSeconds, gcCPU, totalCPU float64 }

func readGCMetrics() gcMetrics {
	s := []metrics.Sample{
		{Name: "/sched/pauses/total/gc:seconds"},
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"},
	}
	metrics.Read(s)
	return gcMetrics{pauseSeconds: histogramSum(s[0].Value.Float64Histogram()), gcCPU: s[1].Value.Float64(), totalCPU: s[2].Value.Float64()}
}

// histogramSum estimates the total of a runtime histogram from its bucket midpoints.
func histogramSum(h *metrics.Float64Histogram) float64 {
	var sum float64
	for i, n := range h.Counts {
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		switch {
		case lo < -1e300:
			lo = hi
		case hi > 1e300:
			hi = lo
		}
		sum += float64(n) * (lo + hi) / 2
	}
	return sum
}

func heapObjects() float64 {
	s := []metrics.Sample{{Name: "/gc/heap/objects:objects"}}
	metrics.Read(s)
	return float64(s[0].Value.Uint64())
}
