// Package configetcd runs an etcd of its own as kshard's config center:
// processes of the etcd binary the control plane is built with, with their
// own data directories and loopback ports, never the API server's etcd.
// Tests, the sandbox and the load tester put it behind
// externalcache/etcdsource, the Source users point at their own etcd, so that
// every external figure is measured against the store users run. A member,
// or all of them, can be stopped and started again on the same data and
// ports, to make an outage or a lost leader; it can serve clients over TLS
// and demand their certificates, as a production etcd does.
package configetcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/controlplane"
)

// Options configure a Server.
type Options struct {
	// Binary is the etcd executable. Defaults to the control plane's:
	// $KUBEBUILDER_ASSETS/etcd, else the bin/k8s/etcd make controlplane
	// builds.
	Binary string
	// Dir holds the members' data directories and logs. Required.
	Dir string
	// Members is the cluster's size. Default 1; 3 can lose a member (its
	// leader, say) and keep a quorum.
	Members int
	// TLS, when set, makes the members serve clients over TLS only and
	// refuse a client without a certificate of TLS.CAFile.
	TLS *TLS
}

// TLS are the files of a Server that serves clients over TLS.
type TLS struct {
	// CAFile verifies the clients' certificates (etcd's --trusted-ca-file),
	// and the members' for the Server's own Client.
	CAFile string
	// CertFile and KeyFile are the members' serving certificate; it must
	// name 127.0.0.1.
	CertFile, KeyFile string
	// ClientCertFile and ClientKeyFile are what the Server's own Client
	// presents.
	ClientCertFile, ClientKeyFile string
}

// Server is one running etcd cluster, until Close.
type Server struct {
	opts    Options
	members []*member
	// procs runs the members: each in its own group, killed with the
	// caller.
	procs *childproc.Supervisor
}

// member is one etcd process slot, kept across restarts.
type member struct {
	name, client, peer string // name and loopback URLs
	dir                string

	mu   sync.Mutex
	proc *childproc.Process // nil while stopped
}

// Start starts etcd's members and waits until the cluster answers.
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
	if opts.Members <= 0 {
		opts.Members = 1
	}
	ports, err := childproc.FreePorts(2 * opts.Members)
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if opts.TLS != nil {
		scheme = "https"
	}
	s := &Server{opts: opts, procs: childproc.NewSupervisor(nil)}
	for i := range opts.Members {
		m := &member{name: "config-center-" + strconv.Itoa(i),
			client: scheme + "://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			peer:   "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1])}
		m.dir = filepath.Join(opts.Dir, m.name)
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			return nil, fmt.Errorf("starting the config center's etcd: %w", err)
		}
		s.members = append(s.members, m)
	}
	if err := s.Restart(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// Endpoint is the first member's client URL, for etcdctl's --endpoints and
// kshard's --etcd-servers.
func (s *Server) Endpoint() string { return s.members[0].client }

// Endpoints are every member's client URL.
func (s *Server) Endpoints() []string {
	out := make([]string, len(s.members))
	for i, m := range s.members {
		out[i] = m.client
	}
	return out
}

// Client is a client of every member; the caller closes it.
func (s *Server) Client() (*clientv3.Client, error) { return s.client(s.Endpoints()) }

func (s *Server) client(endpoints []string) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if t := s.opts.TLS; t != nil {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("the config center's CA: %w", err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		cert, err := tls.LoadX509KeyPair(t.ClientCertFile, t.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("the config center's client certificate: %w", err)
		}
		cfg.TLS = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	return clientv3.New(cfg)
}

// Leader is the index of the member that leads the cluster now, asking
// each running member for two seconds at most.
func (s *Server) Leader(ctx context.Context) (int, error) {
	var errs []error
	for i, m := range s.members {
		if !m.running() {
			continue
		}
		c, err := s.client([]string{m.client})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.Status(sctx, m.client)
		cancel()
		_ = c.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st.Leader == st.Header.MemberId {
			return i, nil
		}
	}
	return -1, fmt.Errorf("no member of the config center's etcd says it leads: %w", errors.Join(errs...))
}

// Restart starts every member that is not running, and waits until the
// cluster answers a read.
func (s *Server) Restart(ctx context.Context) error {
	var peers []string
	for _, m := range s.members {
		peers = append(peers, m.name+"="+m.peer)
	}
	for _, m := range s.members {
		if err := m.start(s.procs, s.opts, strings.Join(peers, ",")); err != nil {
			return err
		}
	}
	return s.waitAnswers(ctx)
}

// RestartMember starts member i again, if it is not running, and waits
// until the cluster answers a read.
func (s *Server) RestartMember(ctx context.Context, i int) error {
	var peers []string
	for _, m := range s.members {
		peers = append(peers, m.name+"="+m.peer)
	}
	if err := s.members[i].start(s.procs, s.opts, strings.Join(peers, ",")); err != nil {
		return err
	}
	return s.waitAnswers(ctx)
}

func (m *member) start(procs *childproc.Supervisor, opts Options, initialCluster string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		return nil
	}
	args := []string{
		"--name", m.name,
		"--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", initialCluster,
		"--log-level", "warn",
	}
	if t := opts.TLS; t != nil {
		args = append(args, "--cert-file", t.CertFile, "--key-file", t.KeyFile,
			"--client-cert-auth", "--trusted-ca-file", t.CAFile)
	}
	p, err := procs.Start("the config center's etcd "+m.name, opts.Binary, m.logPath(), args...)
	if err != nil {
		return err
	}
	m.proc = p
	return nil
}

func (m *member) logPath() string { return filepath.Join(m.dir, "etcd.log") }

// running says the member's process was started and has not ended.
func (m *member) running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc != nil && m.proc.Running()
}

// waitAnswers waits until a read through every running member succeeds.
func (s *Server) waitAnswers(ctx context.Context) error {
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
		for _, m := range s.members {
			m.mu.Lock()
			exited := m.proc != nil && !m.proc.Running()
			m.mu.Unlock()
			if exited {
				return fmt.Errorf("the config center's etcd %s exited at start: %s", m.name, childproc.Tail(m.logPath(), 2000))
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the config center's etcd did not answer within a minute: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops every member (SIGTERM, then SIGKILL after grace) and keeps
// their data, for Restart.
func (s *Server) Stop(grace time.Duration) error {
	for _, m := range s.members {
		m.stop(grace)
	}
	return nil
}

// StopMember stops member i as Stop does.
func (s *Server) StopMember(i int, grace time.Duration) { s.members[i].stop(grace) }

func (m *member) stop(grace time.Duration) {
	m.mu.Lock()
	p := m.proc
	m.proc = nil
	m.mu.Unlock()
	if p != nil {
		_, _ = p.Stop(grace)
	}
}

// Close stops etcd for good.
func (s *Server) Close() error {
	err := s.Stop(5 * time.Second)
	s.procs.StopAll(5 * time.Second)
	return err
}
