package externalcache_test

import (
	"context"
	"fmt"

	"github.com/kshard/kshard/externalcache"
)

// memorySource stands in for the slow external service.
type memorySource map[string]string

func (m memorySource) Fetch(_ context.Context, k externalcache.Key) (externalcache.Value, error) {
	v, ok := m[k.Domain+"/"+k.Name]
	if !ok {
		return externalcache.Value{}, externalcache.ErrNotFound
	}
	return externalcache.Value{Data: []byte(v), Revision: 1}, nil
}

// A reconciler's view of the cache: Get never waits (a miss enqueues a
// fetch, and OnUpdate says when to look again); a shard's values live from
// AddShard, when the controller starts the shard, to DropShard, when it
// releases it.
func Example() {
	cache, err := externalcache.New(externalcache.Options{
		Source:    memorySource{"payments/fraud-threshold": "0.8"},
		MaxBytes:  64 << 20,
		MaxShards: 1,
		OnUpdate:  func(shard int32, key externalcache.Key) { /* requeue the objects that read key */ },
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = cache.Start(ctx) }()

	if err := cache.AddShard(7); err != nil {
		panic(err)
	}
	key := externalcache.Key{Domain: "payments", Name: "fraud-threshold"}
	fmt.Println("first Get:", cache.Get(7, key).State)
	if _, err := cache.Wait(ctx, 7, key); err != nil { // what OnUpdate would announce
		panic(err)
	}
	l := cache.Get(7, key)
	fmt.Println("after the fetch:", l.State, string(l.Value))
	missing := externalcache.Key{Domain: "payments", Name: "nope"}
	_, _ = cache.Wait(ctx, 7, missing)
	fmt.Println("a key the service does not have:", cache.Get(7, missing).State)

	cache.DropShard(7)
	fmt.Println("after DropShard:", cache.Get(7, key).Err != nil)
	// Output:
	// first Get: Pending
	// after the fetch: Fresh 0.8
	// a key the service does not have: NotFound
	// after DropShard: true
}
