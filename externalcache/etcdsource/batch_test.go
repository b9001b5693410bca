package etcdsource_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/promtext"
)

// TestWarmReadsADomainInBatches: a new owner's warm-up of 200 keys of one
// domain (and one key etcd does not have) costs etcd a few transactions, by
// etcd's own count, where one Get per key cost 201 Range calls; every
// value and ModRevision is what etcd holds, and the missing key is not
// found. Batching off (MaxBatch 1) is the old path, measured in the same
// test.
func TestWarmReadsADomainInBatches(t *testing.T) {
	srv, c := startEtcd(t)
	ctx := context.Background()
	const n = 200
	revs := map[string]int64{}
	var keys []externalcache.Key
	for i := range n {
		name := fmt.Sprintf("k%03d", i)
		revs[name] = put(t, c, "warm/"+name, "value-"+name)
		keys = append(keys, externalcache.Key{Domain: "warm", Name: name})
	}
	keys = append(keys, externalcache.Key{Domain: "warm", Name: "absent"})
	for _, maxBatch := range []int{0, 1} {
		before := etcdMetrics(t, srv.Endpoint())
		cache, err := externalcache.New(externalcache.Options{Source: newSource(t, c, time.Second), MaxBytes: 64 << 20, MaxShards: 1,
			MaxBatch: maxBatch, RateLimit: 1e6, RateBurst: 1e6})
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		go func() { _ = cache.Start(cctx) }()
		if err := cache.AddShard(0); err != nil {
			t.Fatal(err)
		}
		if err := cache.Warm(cctx, 0, keys...); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			l, err := cache.Wait(cctx, 0, k)
			switch {
			case err != nil:
				t.Fatalf("MaxBatch %d: %s: %v", maxBatch, k, err)
			case k.Name == "absent":
				if l.State != externalcache.StateNotFound {
					t.Errorf("MaxBatch %d: %s is %v, want not found", maxBatch, k, l.State)
				}
			case string(l.Value) != "value-"+k.Name || l.Revision != revs[k.Name]:
				t.Errorf("MaxBatch %d: %s = %q at %d, want %q at %d", maxBatch, k, l.Value, l.Revision, "value-"+k.Name, revs[k.Name])
			}
		}
		cancel()
		after := etcdMetrics(t, srv.Endpoint())
		calls := func(method string) float64 {
			match := func(m *dto.Metric) bool { return promtext.Label(m, "grpc_method") == method }
			return sumOf(t, after, "grpc_server_handled_total", match) - sumOf(t, before, "grpc_server_handled_total", match)
		}
		ranges, txns := calls("Range"), calls("Txn")
		t.Logf("MaxBatch %d: %d keys read with %.0f Range and %.0f Txn calls (etcd's count)", maxBatch, len(keys), ranges, txns)
		if maxBatch == 1 {
			if ranges < float64(len(keys)) || txns != 0 {
				t.Errorf("batching off: %.0f Range and %.0f Txn calls, want a Range per key", ranges, txns)
			}
			continue
		}
		// The first key is read alone while the rest are queued behind it;
		// the others go 64 at a time.
		if txns < 1 || ranges+txns > float64(len(keys)+63)/64+2 {
			t.Errorf("batched: %.0f Range and %.0f Txn calls for %d keys, want about %d", ranges, txns, len(keys), (len(keys)+63)/64)
		}
	}
}

// TestFetchBatchTooLargeForOneMessage: an answer larger than the client's
// message limit is read key by key, so that the keys that fit are read
// and only the one larger than a message fails; so is a batch of more keys
// than etcd allows operations in a transaction (128 by default).
func TestFetchBatchTooLargeForOneMessage(t *testing.T) {
	srv, c := startEtcd(t)
	ctx := context.Background()
	small, err := etcdsource.NewClient(etcdsource.ClientOptions{Servers: []string{srv.Endpoint()}, MaxMessageBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	s := newSource(t, small, time.Second)
	names := []string{"a", "b", "c", "huge"}
	for _, name := range names[:3] {
		put(t, c, "big/"+name, strings.Repeat(name, 600<<10))
	}
	put(t, c, "big/huge", strings.Repeat("h", 1100<<10))
	got, err := s.FetchBatch(ctx, "big", names)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range names[:3] {
		if got[i].Err != nil || len(got[i].Value.Data) != 600<<10 {
			t.Errorf("%s: %d bytes, %v; want 600 KiB", name, len(got[i].Value.Data), got[i].Err)
		}
	}
	if got[3].Err == nil {
		t.Errorf("huge: %d bytes read through a 1 MiB message limit", len(got[3].Value.Data))
	}

	var many []string
	for i := range 200 {
		many = append(many, fmt.Sprintf("k%03d", i))
		put(t, c, "many/"+many[i], many[i])
	}
	got, err = s.FetchBatch(ctx, "many", many)
	if err != nil {
		t.Fatalf("a batch of %d keys: %v", len(many), err)
	}
	for i, name := range many {
		if got[i].Err != nil || string(got[i].Value.Data) != name {
			t.Errorf("%s in a batch of %d: %q, %v", name, len(many), got[i].Value.Data, got[i].Err)
		}
	}
}
