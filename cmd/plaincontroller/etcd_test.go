package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/configetcd"
)

// TestEtcdReader reads a real etcd laid out as kshard's etcd source reads
// it: a key's raw value and its ModRevision, and errKeyNotFound for a key
// that does not exist (a person must act), not an unavailable center.
func TestEtcdReader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	ctx := context.Background()
	srv, err := configetcd.Start(ctx, configetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	put, err := c.Put(ctx, "/kshard/config/payments/fraud-threshold", "0.7")
	if err != nil {
		t.Fatal(err)
	}
	r, err := newEtcdReader(srv.Endpoint(), "/kshard/config/", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	v, err := r.get(ctx, "payments", "fraud-threshold")
	if err != nil || v.Value != "0.7" || v.Revision != put.Header.Revision {
		t.Errorf("get = %+v, %v; want 0.7 at revision %d", v, err, put.Header.Revision)
	}
	if _, err := r.get(ctx, "payments", "nope"); !errors.Is(err, errKeyNotFound) {
		t.Errorf("a missing key gave %v, want errKeyNotFound", err)
	}
	if _, err := newEtcdReader("", "/kshard/config", time.Second); err == nil {
		t.Error("no --etcd-servers was accepted")
	}
}
