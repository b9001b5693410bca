package externalcache

// HalfOpens exposes how many times the breaker let probes through, so that tests can bound the
// calls made while it was open.
func (c *Cache) HalfOpens() int64 { return c.guard.halfOpens.Load() }

// StoreForTest caches a fresh value without fetching it, for benchmarks that need a full cache.
func (c *Cache) StoreForTest(shard int32, key Key, value []byte, revision int64) error {
	sh, err := c.shardFor(shard)
	if err != nil {
		return err
	}
	now := c.opts.Clock.Now()
	e := envelope{revision: revision, fetchedAt: now.UnixNano(), value: value,
		softExpiry: now.Add(c.opts.SoftTTL).UnixNano(), hardExpiry: now.Add(c.opts.HardTTL).UnixNano()}
	return sh.set(key.cacheKey(), appendEnvelope(make([]byte, 0, envelopeHeaderSize+len(value)), e))
}

// FlightsOfDroppedShards counts the flights whose shard is no longer held in their tenure: a flight
// of a dropped tenure would block its key in every later tenure of the shard.
func (c *Cache) FlightsOfDroppedShards() int {
	held := *c.shards.Load()
	c.fetcher.mu.Lock()
	defer c.fetcher.mu.Unlock()
	n := 0
	for _, f := range c.fetcher.flights {
		if held[f.fk.shard] != f.sh {
			n++
		}
	}
	return n
}

// WaitingForRoom reports whether a Wait or Warm waits for room in the fetch queue.
func (c *Cache) WaitingForRoom() bool {
	c.fetcher.mu.Lock()
	defer c.fetcher.mu.Unlock()
	return c.fetcher.queue.space != nil
}
