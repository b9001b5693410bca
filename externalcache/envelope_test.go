package externalcache

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestEnvelopeRoundTripAndServing(t *testing.T) {
	now := time.Unix(1000, 0)
	e := envelope{revision: 42, fetchedAt: now.UnixNano(), softExpiry: now.Add(time.Minute).UnixNano(),
		hardExpiry: now.Add(time.Hour).UnixNano(), value: []byte("hello")}
	got, err := decodeEnvelope(appendEnvelope(nil, e))
	if err != nil || got.revision != 42 || got.negative || !bytes.Equal(got.value, e.value) ||
		got.fetchedAt != e.fetchedAt || got.softExpiry != e.softExpiry || got.hardExpiry != e.hardExpiry {
		t.Fatalf("round trip = %+v, %v; want %+v", got, err, e)
	}
	for _, tc := range []struct {
		at    time.Duration
		state State
		ok    bool
	}{
		{0, StateFresh, true},
		{time.Minute, StateStale, true},
		{time.Hour - 1, StateStale, true},
		{time.Hour, StatePending, false},
	} {
		l, ok := got.lookup(now.Add(tc.at))
		if ok != tc.ok || l.State != tc.state {
			t.Errorf("lookup at +%s = %s, %v; want %s, %v", tc.at, l.State, ok, tc.state, tc.ok)
		}
		if ok && (string(l.Value) != "hello" || l.Revision != 42 || !l.FetchedAt.Equal(now)) {
			t.Errorf("lookup at +%s = %+v", tc.at, l)
		}
	}
	neg := envelope{negative: true, fetchedAt: now.UnixNano(), softExpiry: now.Add(time.Second).UnixNano(), hardExpiry: now.Add(time.Second).UnixNano()}
	d, err := decodeEnvelope(appendEnvelope(nil, neg))
	if err != nil || !d.negative {
		t.Fatalf("negative round trip = %+v, %v", d, err)
	}
	if l, ok := d.lookup(now); !ok || l.State != StateNotFound || l.Value != nil {
		t.Errorf("negative lookup = %+v, %v; want NotFound without a value", l, ok)
	}
}

func TestDecodeEnvelopeRejectsGarbage(t *testing.T) {
	for _, b := range [][]byte{nil, {1}, bytes.Repeat([]byte{0}, envelopeHeaderSize), append([]byte{1, 0x80}, make([]byte, 40)...)} {
		if _, err := decodeEnvelope(b); !errors.Is(err, errBadEnvelope) {
			t.Errorf("decodeEnvelope(%x) = %v, want errBadEnvelope", b, err)
		}
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add(appendEnvelope(nil, envelope{revision: 1, value: []byte("v")}))
	f.Add(appendEnvelope(nil, envelope{negative: true}))
	f.Add([]byte{1, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEnvelope(b)
		if err != nil {
			return
		}
		if !bytes.Equal(appendEnvelope(nil, e), b) {
			t.Fatalf("decoded %x to %+v, which encodes differently", b, e)
		}
		_, _ = e.lookup(time.Unix(0, 0))
	})
}

func TestOptionsRefuseEntriesThatCannotFit(t *testing.T) {
	o := Options{Source: nopSource{}, MaxBytes: 1 << 20, MaxShards: 4, InternalShards: 16, MaxEntryBytes: 64 << 10}
	_, err := New(o)
	if err == nil || !strings.Contains(err.Error(), "MaxEntryBytes 65536 does not fit") {
		t.Fatalf("New with 64 KiB entries in 64 KiB internal shards: %v, want a clear error", err)
	}
	o.InternalShards = 2
	if _, err := New(o); err != nil {
		t.Errorf("New with 512 KiB internal shards: %v", err)
	}
	// The shards held share MaxBytes: however many MaxShards allows, an internal shard holds
	// MaxBytes/InternalShards.
	o.MaxShards = 1024
	if _, err := New(o); err != nil {
		t.Errorf("New with 1,024 shards sharing 1 MiB: %v", err)
	}
	for name, bad := range map[string]Options{
		"no source":       {},
		"shards not pow2": {Source: nopSource{}, InternalShards: 3},
		"below 1 MiB":     {Source: nopSource{}, MaxBytes: 1 << 19},
		"hard below soft": {Source: nopSource{}, SoftTTL: time.Hour, HardTTL: time.Minute},
		"jitter of 100%":  {Source: nopSource{}, TTLJitter: 1},
	} {
		if _, err := New(bad); err == nil {
			t.Errorf("New accepted %s", name)
		}
	}
}
