package etcdsource_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/time/rate"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/promtext"
)

// TestMeasureWatchDesigns measures the two ways a replica can follow its
// domains' changes in etcd, as etcd itself counts them: a watch per poll
// of each domain's folder, and one watch of the whole prefix shared by
// every domain's polls (the default; Options.WatchPerPoll is the other). Four replicas (each an
// externalcache.Cache on an etcdsource.Source, with a client of its own)
// follow 250 of 1,000 domains each, while a writer changes random keys at
// a steady rate; each design runs on an etcd of its own, in the same
// process, one after the other. Counted from etcd's /metrics: its
// watchers and watch streams at the end, the watch requests it received
// (creations, cancellations, progress requests), the watch responses it
// sent, its Range calls, and its CPU seconds; and, on the replicas, each
// write's latency from its start to the cache's OnUpdate with its revision
// or a later one of the key. Run with the change rates to measure:
//
//	KSHARD_MEASURE_WATCH=100,1000 go test -run TestMeasureWatchDesigns -v -timeout 30m ./externalcache/etcdsource/
func TestMeasureWatchDesigns(t *testing.T) {
	var rates []int
	for _, f := range strings.Split(os.Getenv("KSHARD_MEASURE_WATCH"), ",") {
		if r, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && r > 0 {
			rates = append(rates, r)
		}
	}
	if len(rates) == 0 {
		t.Skip("set KSHARD_MEASURE_WATCH to change rates per second to measure, e.g. 100,1000")
	}
	const (
		domains  = 1000
		keys     = 4
		replicas = 4
		duration = 20 * time.Second
	)
	t.Logf("%d domains × %d keys, %d replicas of %d domains each, %s of changes per run", domains, keys, replicas, domains/replicas, duration)
	t.Logf("| design | changes/s | changes made | seen | p50 | p99 | etcd watchers | watch streams | watch requests | watch responses | Range calls | etcd CPU s |")
	t.Logf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, rate := range rates {
		for _, shared := range []bool{false, true} {
			m := measureWatch(t, shared, rate, domains, keys, replicas, duration)
			design := "watch per poll"
			if shared {
				design = "shared watch"
			}
			t.Logf("| %s | %d | %d | %d | %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f |", design, rate, m.made, m.seen,
				m.p50.Round(time.Millisecond), m.p99.Round(time.Millisecond), m.watchers, m.streams, m.watchRequests, m.watchResponses, m.ranges, m.cpu)
		}
	}
}

type watchMeasure struct {
	made, seen                                                    int
	p50, p99                                                      time.Duration
	watchers, streams, watchRequests, watchResponses, ranges, cpu float64
}

func measureWatch(t *testing.T, shared bool, r, domains, keys, replicas int, duration time.Duration) watchMeasure {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := configetcd.Start(ctx, configetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	admin, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := configetcd.Seed(ctx, admin, etcdsource.DefaultPrefix, configcenter.SeedOptions{Domains: domains, KeysPerDomain: keys, ValueBytes: 64}); err != nil {
		t.Fatal(err)
	}

	// pending: each key's writes not yet seen, in revision order. A
	// replica's cache seeing a revision sees every earlier write of the
	// key too (a newer value supersedes it): each one's latency ends then.
	type write struct {
		rev int64
		at  time.Time
	}
	var (
		mu      sync.Mutex
		pending = map[externalcache.Key][]write{}
		seen    = map[externalcache.Key]write{} // the last revision a replica saw, and when
		latency []time.Duration
	)
	var caches []*externalcache.Cache
	for i := range replicas {
		c, err := etcdsource.NewClient(etcdsource.ClientOptions{Servers: []string{srv.Endpoint()}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		src, err := etcdsource.New(etcdsource.Options{Client: c, WatchPerPoll: !shared})
		if err != nil {
			t.Fatal(err)
		}
		var cache *externalcache.Cache
		cache, err = externalcache.New(externalcache.Options{
			Source: src, Feed: src, MetricsPrefix: fmt.Sprintf("measure_%d_%v_%d", r, shared, i),
			SoftTTL: time.Hour, HardTTL: 2 * time.Hour,
			OnUpdate: func(shard int32, key externalcache.Key) {
				l := cache.Get(shard, key)
				now := time.Now()
				mu.Lock()
				defer mu.Unlock()
				seen[key] = write{l.Revision, now}
				ws := pending[key]
				for len(ws) > 0 && ws[0].rev <= l.Revision {
					latency = append(latency, now.Sub(ws[0].at))
					ws = ws[1:]
				}
				pending[key] = ws
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = cache.Start(ctx) }()
		if err := cache.AddShard(0); err != nil {
			t.Fatal(err)
		}
		var held []externalcache.Key
		for d := i; d < domains; d += replicas {
			for k := range keys {
				held = append(held, externalcache.Key{Domain: configcenter.SeedDomain(d), Name: configcenter.SeedKey(k)})
			}
		}
		warm, done := context.WithTimeout(ctx, 5*time.Minute)
		if err := cache.Warm(warm, 0, held...); err != nil {
			t.Fatal(err)
		}
		done()
		caches = append(caches, cache)
	}
	// Every domain's feed has listed its domain and waits on a watch.
	time.Sleep(5 * time.Second)
	before := etcdMetrics(t, srv.Endpoint())

	// Writers enough to keep the rate while a write waits for etcd.
	limit := rate.NewLimiter(rate.Limit(r), 1)
	wctx, wcancel := context.WithTimeout(ctx, duration)
	var (
		wg   sync.WaitGroup
		made atomic.Int64
	)
	for range 16 {
		wg.Go(func() {
			for limit.Wait(wctx) == nil {
				key := externalcache.Key{Domain: configcenter.SeedDomain(rand.IntN(domains)), Name: configcenter.SeedKey(rand.IntN(keys))}
				at := time.Now()
				resp, err := admin.Put(ctx, etcdsource.DefaultPrefix+"/"+key.Domain+"/"+key.Name, strconv.FormatInt(made.Add(1), 10))
				if err != nil {
					t.Error(err)
					return
				}
				w := write{resp.Header.Revision, at}
				mu.Lock()
				if s, ok := seen[key]; ok && s.rev >= w.rev {
					latency = append(latency, s.at.Sub(at)) // seen before the write returned
				} else {
					ws := append(pending[key], w)
					for i := len(ws) - 1; i > 0 && ws[i].rev < ws[i-1].rev; i-- {
						ws[i], ws[i-1] = ws[i-1], ws[i]
					}
					pending[key] = ws
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	wcancel()
	// Late arrivals count: wait until no write is outstanding, or a
	// minute.
	outstanding := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, ws := range pending {
			n += len(ws)
		}
		return n
	}
	for deadline := time.Now().Add(time.Minute); outstanding() > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	after := etcdMetrics(t, srv.Endpoint())
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(latency)
	q := func(p float64) time.Duration {
		if len(latency) == 0 {
			return 0
		}
		return latency[min(len(latency)-1, int(p*float64(len(latency))))]
	}
	delta := func(name string, match func(*dto.Metric) bool) float64 {
		return sumOf(t, after, name, match) - sumOf(t, before, name, match)
	}
	method := func(m string) func(*dto.Metric) bool {
		return func(x *dto.Metric) bool { return promtext.Label(x, "grpc_method") == m }
	}
	all := func(*dto.Metric) bool { return true }
	return watchMeasure{
		made: int(made.Load()), seen: len(latency), p50: q(0.5), p99: q(0.99),
		watchers:       sumOf(t, after, "etcd_debugging_mvcc_watcher_total", all),
		streams:        sumOf(t, after, "etcd_debugging_mvcc_watch_stream_total", all),
		watchRequests:  delta("grpc_server_msg_received_total", method("Watch")),
		watchResponses: delta("grpc_server_msg_sent_total", method("Watch")),
		ranges:         delta("grpc_server_handled_total", method("Range")),
		cpu:            delta("process_cpu_seconds_total", all),
	}
}

// etcdMetrics reads etcd's /metrics.
func etcdMetrics(t *testing.T, endpoint string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(endpoint + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	fams, err := promtext.Parse(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// sumOf sums a family's matching series; a family etcd does not export
// fails the measurement rather than reading as zero.
func sumOf(t *testing.T, fams map[string]*dto.MetricFamily, name string, match func(*dto.Metric) bool) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("etcd's /metrics has no %s", name)
	}
	var sum float64
	for _, m := range f.GetMetric() {
		if match(m) {
			sum += promtext.Value(m)
		}
	}
	return sum
}
