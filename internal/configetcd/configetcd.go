// Package configetcd runs an etcd of its own as kshard's config center: a
// process of the etcd binary the control plane is built with, with its own
// data directory and loopback ports, never the API server's etcd. Tests, the
// sandbox and the load tester put it behind externalcache/etcdsource, the
// Source users point at their own etcd, so that every external figure is
// measured against the store users run. It can be stopped and started again
// on the same data and ports, to make an outage.
package configetcd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/controlplane"
)

// Options configure a Server.
type Options struct {
	// Binary is the etcd executable. Defaults to the control plane's:
	// $KUBEBUILDER_ASSETS/etcd, else the bin/k8s/etcd make controlplane
	// builds.
	Binary string
	// Dir holds the data directory and the log. Required.
	Dir string
}

// Server is one running etcd, until Close.
type Server struct {
	opts         Options
	client, peer string // loopback URLs, kept across restarts
	mu           sync.Mutex
	cmd          *exec.Cmd // nil while stopped
	exited       chan struct{}
}

// Start starts etcd and waits until it answers.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("starting the config center's etcd: a Dir is required")
	}
	if opts.Binary == "" {
		dir, err := controlplane.Assets()
		if err != nil {
			return nil, fmt.Errorf("finding the config center's etcd binary: %w", err)
		}
		opts.Binary = filepath.Join(dir, "etcd")
	}
	ports, err := childproc.FreePorts(2)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts,
		client: "http://127.0.0.1:" + strconv.Itoa(ports[0]),
		peer:   "http://127.0.0.1:" + strconv.Itoa(ports[1])}
	if err := s.Restart(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Endpoint is the client URL, for etcdctl's --endpoints and kshard's
// --etcd-servers.
func (s *Server) Endpoint() string { return s.client }

// Client is a client of it; the caller closes it.
func (s *Server) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{s.client}, DialTimeout: 5 * time.Second})
}

// Restart starts etcd on its data directory and ports, if it is not
// running, and waits until it answers a read.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		return nil
	}
	logFile, err := os.OpenFile(filepath.Join(s.opts.Dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("starting the config center's etcd: %w", err)
	}
	cmd := exec.Command(s.opts.Binary,
		"--name", "config-center",
		"--data-dir", filepath.Join(s.opts.Dir, "data"),
		"--listen-client-urls", s.client, "--advertise-client-urls", s.client,
		"--listen-peer-urls", s.peer, "--initial-advertise-peer-urls", s.peer,
		"--initial-cluster", "config-center="+s.peer,
		"--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = childproc.SysProcAttr()
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		_ = logFile.Close()
		return fmt.Errorf("starting the config center's etcd %s: %w", s.opts.Binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	c, err := s.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.Get(rctx, "health")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("the config center's etcd exited at start: %s", childproc.Tail(filepath.Join(s.opts.Dir, "etcd.log"), 2000))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the config center's etcd did not answer within a minute: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops etcd (SIGTERM, then SIGKILL after grace) and keeps its data,
// for Restart.
func (s *Server) Stop(grace time.Duration) error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = childproc.SignalGroup(cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = childproc.SignalGroup(cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	return nil
}

// Close stops etcd for good.
func (s *Server) Close() error { return s.Stop(5 * time.Second) }
