// Package spicedbserver runs a SpiceDB of its own as kshard's authorization
// system: a process of the SpiceDB make spicedb builds from its pinned
// module, serving gRPC on loopback with a preshared key, on its in-memory
// datastore, with its telemetry and release check off (nothing leaves the
// machine). Tests, the sandbox and the load tester put it behind
// authzcache/spicedbsource, what users point at their own SpiceDB, and
// write its schema and grants with Grants, as a user's zed would (to this
// SpiceDB or a cluster's). Stopped and started again it has lost every
// relationship and revision but its bootstrap files', as an in-memory
// SpiceDB does: the fault a cache of its decisions must survive.
package spicedbserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kshard/kshard/authzcache/spicedbsource"
	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/controlplane"
)

// BinaryEnv names a SpiceDB binary to run instead of the repository's
// bin/spicedb/spicedb (make test exports it).
const BinaryEnv = "SPICEDB"

// Options configure a Server.
type Options struct {
	// Binary is the SpiceDB executable. Defaults to $SPICEDB, else
	// <repository>/bin/spicedb/spicedb.
	Binary string
	// Dir holds the log and the token file clients read. Required.
	Dir string
	// Token is the preshared key clients present. Default "kshard-test".
	Token string
	// BootstrapFiles are SpiceDB validation files (a schema, relationships)
	// loaded at every start, as deploy/spicedb's Deployment loads its
	// ConfigMap: what a restart does not lose.
	BootstrapFiles []string
}

// Server is one running SpiceDB, until Close.
type Server struct {
	opts    Options
	grpc    string // host:port, kept across restarts
	metrics string
	// tokenFile holds the preshared key, for clients.
	tokenFile string
	// procs runs the process: in its own group, killed with the caller.
	procs *childproc.Supervisor

	mu   sync.Mutex
	proc *childproc.Process // nil while stopped
}

// Start starts SpiceDB and waits until it serves gRPC.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("starting SpiceDB: a Dir is required")
	}
	if opts.Binary == "" {
		opts.Binary = os.Getenv(BinaryEnv)
	}
	if opts.Binary == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return nil, fmt.Errorf("finding the SpiceDB binary: %w", err)
		}
		opts.Binary = filepath.Join(root, "bin", "spicedb", "spicedb")
	}
	if _, err := os.Stat(opts.Binary); err != nil {
		return nil, fmt.Errorf("SpiceDB binary: %w (run `make spicedb`, or set %s)", err, BinaryEnv)
	}
	if opts.Token == "" {
		opts.Token = "kshard-test"
	}
	ports, err := childproc.FreePorts(2)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, grpc: "127.0.0.1:" + strconv.Itoa(ports[0]), metrics: "127.0.0.1:" + strconv.Itoa(ports[1]),
		tokenFile: filepath.Join(opts.Dir, "token"), procs: childproc.NewSupervisor(nil)}
	// Clients read the key from a file, as from a mounted Secret, with the
	// trailing newline a Secret made from a file often has.
	if err := os.WriteFile(s.tokenFile, []byte(opts.Token+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("writing SpiceDB's token file: %w", err)
	}
	if err := s.Restart(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// Endpoint is the gRPC address, host:port (plaintext).
func (s *Server) Endpoint() string { return s.grpc }

// Metrics is the address of SpiceDB's /metrics (plain HTTP), host:port:
// its gRPC server's counts by method are what a measurement of its calls
// reads.
func (s *Server) Metrics() string { return s.metrics }

// ClientOptions are how a client reaches this SpiceDB: its endpoint and
// the file holding its preshared key.
func (s *Server) ClientOptions() spicedbsource.ClientOptions {
	return spicedbsource.ClientOptions{Endpoint: s.grpc, TokenFile: s.tokenFile}
}

// Restart starts SpiceDB, empty, if it is not running, and waits until it
// accepts connections.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	if s.proc != nil {
		s.mu.Unlock()
		return nil
	}
	logPath := filepath.Join(s.opts.Dir, "spicedb.log")
	args := []string{"serve",
		"--grpc-preshared-key", s.opts.Token,
		"--grpc-addr", s.grpc,
		"--datastore-engine", "memory",
		"--http-enabled=false",
		"--metrics-addr", s.metrics,
		"--dispatch-cluster-enabled=false",
		"--telemetry-endpoint=",
		"--skip-release-check",
		"--log-level", "warn"}
	for _, f := range s.opts.BootstrapFiles {
		args = append(args, "--datastore-bootstrap-files", f)
	}
	p, err := s.procs.Start("SpiceDB", s.opts.Binary, logPath, args...)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("starting SpiceDB: %w", err)
	}
	s.proc = p
	s.mu.Unlock()

	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := net.DialTimeout("tcp", s.grpc, time.Second)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("SpiceDB exited at start: %s", childproc.Tail(logPath, 2000))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("SpiceDB did not listen within a minute: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops SpiceDB (SIGTERM, then SIGKILL after grace); its in-memory
// data is gone.
func (s *Server) Stop(grace time.Duration) {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		_, _ = p.Stop(grace)
	}
}

// Close stops SpiceDB for good.
func (s *Server) Close() error {
	s.Stop(5 * time.Second)
	s.procs.StopAll(5 * time.Second)
	return nil
}
