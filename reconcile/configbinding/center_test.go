package configbinding_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configcenter/standin"
	"github.com/kshard/kshard/internal/configetcd"
)

// center is how a test changes its env's config center: a value put or
// deleted, and the revision it made.
type center interface {
	Put(domain, key, value string) (int64, error)
	Delete(domain, key string) (int64, error)
}

// etcdCenter changes values in the package's etcd as a user would, under
// an env's prefix: <prefix>/<domain>/<key>.
type etcdCenter struct {
	c      *clientv3.Client
	prefix string
}

func newEtcdCenter(t *testing.T, prefix string, seed configcenter.SeedOptions) etcdCenter {
	t.Helper()
	c, err := configCenter.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := configetcd.Seed(context.Background(), c, prefix, seed); err != nil {
		t.Fatal(err)
	}
	return etcdCenter{c: c, prefix: prefix}
}

func (ec etcdCenter) Put(domain, key, value string) (int64, error) {
	resp, err := ec.c.Put(context.Background(), ec.prefix+"/"+domain+"/"+key, value)
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

func (ec etcdCenter) Delete(domain, key string) (int64, error) {
	resp, err := ec.c.Delete(context.Background(), ec.prefix+"/"+domain+"/"+key)
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// standinCenter is the stand-in as a center.
type standinCenter struct{ s *standin.Server }

func (sc standinCenter) Put(domain, key, value string) (int64, error) {
	v, err := sc.s.Put(domain, key, value)
	return v.Revision, err
}

func (sc standinCenter) Delete(domain, key string) (int64, error) { return sc.s.Delete(domain, key) }
