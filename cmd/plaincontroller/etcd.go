package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdReader reads keys from an etcd v3 key space laid out as kshard's
// etcd source reads it: <prefix>/<domain>/<name>, the value raw, its
// revision the key's ModRevision. One Get per key, on every reconcile.
type etcdReader struct {
	client  *clientv3.Client
	prefix  string
	timeout time.Duration
}

func newEtcdReader(servers, prefix string, timeout time.Duration) (*etcdReader, error) {
	if servers == "" {
		return nil, errors.New("--config-center=etcd needs --etcd-servers")
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(servers, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd at %s: %w", servers, err)
	}
	return &etcdReader{client: c, prefix: strings.TrimSuffix(prefix, "/"), timeout: timeout}, nil
}

// get reads one key; an error wraps errKeyNotFound when it does not exist.
func (e *etcdReader) get(ctx context.Context, domain, key string) (centerValue, error) {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	resp, err := e.client.Get(ctx, e.prefix+"/"+domain+"/"+key)
	if err != nil {
		return centerValue{}, fmt.Errorf("getting %s/%s from etcd: %w", domain, key, err)
	}
	if len(resp.Kvs) == 0 {
		return centerValue{}, fmt.Errorf("getting %s/%s: %w", domain, key, errKeyNotFound)
	}
	return centerValue{Value: string(resp.Kvs[0].Value), Revision: resp.Kvs[0].ModRevision}, nil
}

func (e *etcdReader) close() { _ = e.client.Close() }
