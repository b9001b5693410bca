package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLoadTesterCommandLine parses the command line the load tester gives a
// replica of its plain mode (loadtest/fleet.go, replicaArgs; its test checks
// the same list from the other side): every flag must exist here, as an
// unknown flag would stop the process.
func TestLoadTesterCommandLine(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("plaincontroller", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	bindFlags(fs, &o)
	err := fs.Parse([]string{
		"--kubeconfig", "/tmp/kubeconfig",
		"--replica-id", "kshard-0",
		"--lease-namespace", "kshard-loadtest",
		"--metrics-bind-address", "127.0.0.1:2000",
		"--health-probe-bind-address", "127.0.0.1:2001",
		"--lease-duration", "15s",
		"--renew-deadline", "10s",
		"--retry-period", "5s",
		"--zap-log-level=info",
		"--config-center", "etcd",
		"--etcd-servers", "http://127.0.0.1:1234",
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.replicaID != "kshard-0" || o.leaseNamespace != "kshard-loadtest" || o.metricsAddr != "127.0.0.1:2000" ||
		o.probeAddr != "127.0.0.1:2001" || o.leaseDuration != 15*time.Second || o.retryPeriod != 5*time.Second ||
		o.configCenter != "etcd" || o.etcdServers != "http://127.0.0.1:1234" {
		t.Errorf("parsed %+v", o)
	}
	if o.workers != 16 {
		t.Errorf("--max-concurrent-reconciles defaults to %d, want kshard's 16", o.workers)
	}
	// kshard's own flags do not exist here: a load tester passing one
	// would fail loudly rather than be ignored.
	for _, kshardOnly := range []string{"--ring", "--statefulset", "--audit-log", "--sharding", "--external-mode", "--shards"} {
		fs := flag.NewFlagSet("plaincontroller", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		bindFlags(fs, &options{})
		if err := fs.Parse([]string{kshardOnly, "x"}); err == nil {
			t.Errorf("%s was accepted", kshardOnly)
		}
	}
}

func TestReadyCondition(t *testing.T) {
	for _, tc := range []struct {
		missing     []string
		unavailable error
		status      metav1.ConditionStatus
		reason      string
	}{
		{nil, nil, metav1.ConditionTrue, reasonSynced},
		{[]string{"a"}, nil, metav1.ConditionFalse, reasonKeyNotFound},
		{nil, errors.New("503"), metav1.ConditionFalse, reasonExternalUnavailable},
		// A missing key needs a person; it wins over an outage.
		{[]string{"a"}, errors.New("503"), metav1.ConditionFalse, reasonKeyNotFound},
	} {
		c := readyCondition(tc.missing, tc.unavailable, 7)
		if c.Type != conditionReady || c.Status != tc.status || c.Reason != tc.reason {
			t.Errorf("readyCondition(%v, %v) = %s %s %s, want %s %s", tc.missing, tc.unavailable, c.Type, c.Status, c.Reason, tc.status, tc.reason)
		}
	}
}

// TestCenterClient checks the config center's protocol as
// internal/configcenter serves it: the key route, the bearer token, the
// caller header, the JSON answer, and 404 versus other failures.
func TestCenterClient(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer secret" || r.Header.Get(callerHeader) != "kshard-0" {
			http.Error(w, `{"error":"a valid bearer token is required"}`, http.StatusUnauthorized)
			return
		}
		switch r.URL.EscapedPath() {
		case "/v1/domains/payments/keys/fraud-threshold":
			_, _ = io.WriteString(w, `{"value":"0.7","revision":42}`)
		case "/v1/domains/payments/keys/down":
			http.Error(w, `{"error":"outage"}`, http.StatusServiceUnavailable)
		default:
			http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	c, err := newCenterClient(srv.URL+"/", "secret", "kshard-0", time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v, err := c.get(ctx, "payments", "fraud-threshold")
	if err != nil || v.Value != "0.7" || v.Revision != 42 {
		t.Errorf("get = %+v, %v", v, err)
	}
	if _, err := c.get(ctx, "payments", "nope"); !errors.Is(err, errKeyNotFound) {
		t.Errorf("a 404 gave %v, want errKeyNotFound", err)
	}
	if _, err := c.get(ctx, "payments", "down"); err == nil || errors.Is(err, errKeyNotFound) || !strings.Contains(err.Error(), "503") {
		t.Errorf("a 503 gave %v, want an unavailable error naming the status", err)
	}
	if _, err := newCenterClient("127.0.0.1:8080", "", "x", time.Second, 1); err == nil {
		t.Error("a URL without scheme was accepted")
	}
}
