package etcdsource

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ClientOptions say how to reach an etcd and who to be there; credentials
// come from files (a mounted Secret), so that they are neither in flags nor
// in logs. The flags of `kshard controller` name them as kube-apiserver's
// do (--etcd-servers, --etcd-cafile, …).
type ClientOptions struct {
	// Servers are the client URLs of the etcd members. Required.
	Servers []string
	// CAFile verifies the servers' certificates (https:// servers). Empty:
	// the system's roots.
	CAFile string
	// CertFile and KeyFile are the client certificate, for etcd's
	// --client-cert-auth, read again at every connection (a renewed
	// Secret takes effect without a restart). Both or neither.
	CertFile, KeyFile string
	// Username and PasswordFile log in with etcd's own authentication; the
	// file holds the password (trailing newline ignored). Both or neither.
	Username, PasswordFile string
	// MaxMessageBytes bounds a message in either direction: a Get of a value
	// larger than this fails, it does not exhaust the replica's memory.
	// Default 2 MiB (etcd's own default request limit is 1.5 MiB).
	MaxMessageBytes int
	// DialTimeout bounds the first connection. Default 5s.
	DialTimeout time.Duration
}

// reconnectBackoff paces the reconnections to an etcd that went away: from
// 250ms up to 3s, so that one back is reached within seconds.
var reconnectBackoff = backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second}

// NewClient builds an etcd client from the options. The client is the
// caller's to close.
func NewClient(o ClientOptions) (*clientv3.Client, error) {
	if len(o.Servers) == 0 {
		return nil, errors.New("etcd client: no servers")
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("etcd client: a client certificate needs both a certificate and a key file")
	}
	if (o.Username == "") != (o.PasswordFile == "") {
		return nil, errors.New("etcd client: a user needs both a name and a password file")
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = 2 << 20
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	cfg := clientv3.Config{
		Endpoints: o.Servers, DialTimeout: o.DialTimeout,
		MaxCallRecvMsgSize: o.MaxMessageBytes, MaxCallSendMsgSize: o.MaxMessageBytes,
		// Its own logs would go to stderr in another format than the
		// replica's; its errors reach the caller.
		Logger: zap.NewNop(),
		// etcd's client waits for a connection until the call's deadline
		// and then says only "context deadline exceeded"; recordAttempts
		// keeps why the connection broke for the error of the call.
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(recordAttempts),
			// gRPC's default reconnect backoff grows to 2 minutes: an etcd back
			// from an outage would go unseen that long, and every read fail.
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff, MinConnectTimeout: 5 * time.Second})},
	}
	if o.CAFile != "" || o.CertFile != "" {
		t := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.CAFile != "" {
			pem, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("etcd client: reading the CA file: %w", err)
			}
			t.RootCAs = x509.NewCertPool()
			if !t.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("etcd client: no certificate in CA file %s", o.CAFile)
			}
		}
		if o.CertFile != "" {
			if _, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile); err != nil {
				return nil, fmt.Errorf("etcd client: reading the client certificate: %w", err)
			}
			// Read at every handshake, not once: a mounted Secret's
			// certificate is renewed in place, and a replica with an
			// expired one reconnects with the new one, without a restart.
			certFile, keyFile := o.CertFile, o.KeyFile
			t.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				cert, err := tls.LoadX509KeyPair(certFile, keyFile)
				if err != nil {
					return nil, fmt.Errorf("etcd client: reading the client certificate: %w", err)
				}
				// etcd would refuse an expired one with an alert the
				// client may never read (it sees a broken pipe): say it
				// here, where the handshake's error names it.
				if now := time.Now(); now.After(cert.Leaf.NotAfter) || now.Before(cert.Leaf.NotBefore) {
					return nil, fmt.Errorf("etcd client: the client certificate %s is valid from %s to %s, not now",
						certFile, cert.Leaf.NotBefore.UTC().Format(time.RFC3339), cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
				}
				return &cert, nil
			}
		}
		cfg.TLS = t
	}
	if o.Username != "" {
		b, err := os.ReadFile(o.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("etcd client: reading the password file: %w", err)
		}
		cfg.Username, cfg.Password = o.Username, strings.TrimRight(string(b), "\r\n")
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, classify(fmt.Sprintf("etcd client for %s", strings.Join(o.Servers, ",")), err)
	}
	return c, nil
}
