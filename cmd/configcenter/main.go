// Command configcenter runs the stand-in for the slow external config service that kshard's
// reference controller reads, so that the controller can be run, tested and load-tested against
// a real HTTP service with controllable latency, errors, throttling and outages.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kshard/kshard/internal/configcenter/standin"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "configcenter:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		opts       standin.Options
		tokenFile  string
		latency    time.Duration
		jitter     time.Duration
		retryAfter time.Duration
		zapOpts    = zap.Options{}
	)
	flag.StringVar(&opts.Addr, "listen", "127.0.0.1:8080", "address to listen on")
	flag.StringVar(&opts.Token, "token", "", "bearer token required on every route except /metrics and /healthz")
	flag.StringVar(&tokenFile, "token-file", "", "file holding the bearer token (overrides --token)")
	flag.IntVar(&opts.Seed.Domains, "seed-domains", 0, "domains to seed at start (domain-0..N-1)")
	flag.IntVar(&opts.Seed.KeysPerDomain, "keys-per-domain", 0, "keys to seed per domain (key-0..K-1)")
	flag.IntVar(&opts.Seed.ValueBytes, "value-bytes", 64, "bytes per seeded value")
	flag.DurationVar(&latency, "latency", 0, "latency added to every data request")
	flag.DurationVar(&jitter, "jitter", 0, "uniform random latency added on top of --latency")
	flag.Float64Var(&opts.Faults.ErrorRate, "error-rate", 0, "fraction of data requests answered 500")
	flag.Float64Var(&opts.Faults.RateLimit, "rate-limit", 0, "data requests per second above which 429 is answered (0: off)")
	flag.IntVar(&opts.Faults.RateBurst, "rate-burst", 0, "burst of --rate-limit (0: one second's worth)")
	flag.DurationVar(&retryAfter, "retry-after", 0, "Retry-After sent with 429 and 503 (0: computed from the rate limit)")
	flag.BoolVar(&opts.Faults.Outage, "outage", false, "answer 503 to every data request")
	flag.DurationVar(&opts.MaxPollTimeout, "max-poll-timeout", 30*time.Second, "longest wait of a change-feed poll")
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()

	log := zap.New(zap.UseFlagOptions(&zapOpts)).WithName("configcenter")
	opts.Log = log
	opts.Faults.Latency.Duration = latency
	opts.Faults.Jitter.Duration = jitter
	opts.Faults.RetryAfter.Duration = retryAfter
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("reading the token file: %w", err)
		}
		opts.Token = strings.TrimSpace(string(b))
		if opts.Token == "" {
			return fmt.Errorf("token file %s is empty", tokenFile)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := standin.Start(ctx, opts)
	if err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("Shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}
